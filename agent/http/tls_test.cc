// Certificates made with tls.h, and a TLS listener on loopback fetched with cpprest's client (the
// client the agents use).
//
// GoogleTest first: cpprest defines a macro U.
#include <gtest/gtest.h>

#include "agent/http/tls.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

// As in listener.cc: Boost.Asio's scheduler, inlined at -O2, trips GCC's -Wnull-dereference
// on a pointer it has checked elsewhere; the warning is Boost's.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#pragma GCC diagnostic pop
#include <cpprest/http_client.h>

#include "agent/http/listener.h"
#include "agent/http/test_client.h"

// As in listener_test.cc: a continuation cpprest may leave queued at exit.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name LeakSanitizer looks up.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcpprest.so\n"; }

namespace vf::http {
namespace {

using std::chrono::hours;
using web::http::status_codes;

KeyPair Ca(const std::string& name = "test CA") {
  Result<KeyPair> ca = MakeCertificateAuthority(name, hours(24));
  EXPECT_TRUE(ca.ok()) << ca.status().ToString();
  return ca.ok() ? *ca : KeyPair{};
}

KeyPair Server(const KeyPair& ca, const std::vector<std::string>& names) {
  Result<KeyPair> server = IssueServerCertificate(ca, names, hours(1));
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? *server : KeyPair{};
}

// A GET of `url` that trusts `ca_pem` only (none: cpprest's default, the system's CAs). The
// status, or -1 when no answer came. The exception's words are not read: cpprest's thread drops
// its reference to the exception as the caller reads it, and TSan, which does not see
// libstdc++'s exception reference count, reports a race (no suppression of ~http_exception
// held under the suite's load).
std::pair<int, std::string> Get(const std::string& url, const std::string& ca_pem) {
  web::http::client::http_client_config config;
  config.set_timeout(std::chrono::seconds(30));
  if (!ca_pem.empty()) {
    config.set_ssl_context_callback([ca_pem](boost::asio::ssl::context& context) {
      EXPECT_TRUE(TrustOnly(context.native_handle(), ca_pem).ok());
    });
  }
  try {
    web::http::client::http_client client(url, config);
    web::http::http_response response = client.request(web::http::methods::GET, "/x").get();
    return {response.status_code(), response.extract_utf8string().get()};
  } catch (const std::exception&) {
    return {-1, "the request failed"};
  }
}

// A TLS listener on 127.0.0.1 that counts the requests reaching its handler.
struct TlsServer {
  std::shared_ptr<ServerCredentials> credentials;
  std::unique_ptr<Listener> listener;
  std::shared_ptr<std::atomic<int>> handled = std::make_shared<std::atomic<int>>(0);

  // The handshake deadline is the listener's default unless a test shortens it: a real
  // handshake under a sanitizer on a loaded machine can take a good part of a second.
  explicit TlsServer(const KeyPair& pair, std::chrono::milliseconds handshake_timeout =
                                              Listener::Limits().handshake_timeout) {
    Result<std::shared_ptr<ServerCredentials>> made = ServerCredentials::Create(pair);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return;
    credentials = *made;
    Listener::Options options;
    options.name = "tls server";
    options.tls = credentials;
    options.limits.handshake_timeout = handshake_timeout;
    Result<std::unique_ptr<Listener>> started = Listener::Start(
        "127.0.0.1", 0, options, [count = handled](const Request&, const Responder& responder) {
          ++*count;
          responder.Send(Response::Text(codes::kOk, "hello"));
        });
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (started.ok()) listener = std::move(started).value();
  }
  std::string port() const { return std::to_string(listener->port()); }
};

TEST(CertificatesTest, AServerCertificateNamesItsHostsAndChainsToItsCa) {
  const KeyPair ca = Ca();
  const KeyPair server = Server(ca, {"coordinator.ops.svc", "10.1.2.3", "::1"});
  Result<std::vector<std::string>> names = CertificateNames(server.certificate_pem);
  ASSERT_TRUE(names.ok()) << names.status().ToString();
  EXPECT_EQ(*names, (std::vector<std::string>{"coordinator.ops.svc", "10.1.2.3", "::1"}));
  EXPECT_TRUE(CheckServerCertificate(server, ca.certificate_pem).ok());
  EXPECT_EQ(CheckServerCertificate(server, Ca("another CA").certificate_pem).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(CheckServerCertificate({server.certificate_pem, ca.key_pem}, ca.certificate_pem).code(),
            StatusCode::kFailedPrecondition);
}

TEST(CertificatesTest, ValidityIsBoundedAndNeverOutlivesTheCa) {
  const auto now = std::chrono::system_clock::now();
  const KeyPair ca = Ca();
  Result<std::chrono::system_clock::time_point> ca_end = CertificateNotAfter(ca.certificate_pem);
  ASSERT_TRUE(ca_end.ok()) << ca_end.status().ToString();
  EXPECT_GT(*ca_end, now + hours(23));
  EXPECT_LT(*ca_end, now + hours(25));
  Result<KeyPair> longer = IssueServerCertificate(ca, {"localhost"}, hours(24 * 365));
  ASSERT_TRUE(longer.ok()) << longer.status().ToString();
  EXPECT_EQ(*CertificateNotAfter(longer->certificate_pem), *ca_end);
}

TEST(CertificatesTest, BadNamesAndEmptyInputsAreRefused) {
  const KeyPair ca = Ca();
  EXPECT_EQ(IssueServerCertificate(ca, {}, hours(1)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(IssueServerCertificate(ca, {"a,DNS:evil.example"}, hours(1)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(IssueServerCertificate(ca, {"localhost"}, hours(0)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(ServerCredentials::Create({"not a certificate", ca.key_pem}).ok());
  EXPECT_FALSE(CertificateNames("garbage").ok());
}

TEST(TlsListenerTest, ServesHttpsToAClientThatTrustsItsCa) {
  const KeyPair ca = Ca();
  TlsServer server(Server(ca, {"localhost", "127.0.0.1"}));
  ASSERT_NE(server.listener, nullptr);
  EXPECT_EQ(server.listener->url().rfind("https://127.0.0.1:", 0), 0u) << server.listener->url();
  EXPECT_EQ(Get("https://127.0.0.1:" + server.port(), ca.certificate_pem).first, 200);
  EXPECT_EQ(Get("https://localhost:" + server.port(), ca.certificate_pem).first, 200);
  EXPECT_EQ(server.handled->load(), 2);
}

TEST(TlsListenerTest, PlainHttpIsRefusedAndReachesNoHandler) {
  const KeyPair ca = Ca();
  TlsServer server(Server(ca, {"127.0.0.1"}));
  ASSERT_NE(server.listener, nullptr);
  const auto [status, what] = Get("http://127.0.0.1:" + server.port(), "");
  EXPECT_EQ(status, -1) << what;
  EXPECT_EQ(server.handled->load(), 0);
}

TEST(TlsListenerTest, AnotherCaOrAnotherHostNameFailsTheHandshake) {
  const KeyPair ca = Ca();
  TlsServer server(Server(ca, {"coordinator.example"}));
  ASSERT_NE(server.listener, nullptr);
  // The right CA, but the certificate does not name 127.0.0.1.
  const auto [wrong_host, host_error] =
      Get("https://127.0.0.1:" + server.port(), ca.certificate_pem);
  EXPECT_EQ(wrong_host, -1) << host_error;
  // The system's CAs, which never signed it.
  const auto [no_ca, ca_error] = Get("https://127.0.0.1:" + server.port(), "");
  EXPECT_EQ(no_ca, -1) << ca_error;
  EXPECT_EQ(server.handled->load(), 0);
}

TEST(TlsListenerTest, ReplacedCredentialsServeTheNextHandshake) {
  const KeyPair old_ca = Ca("old CA");
  const KeyPair new_ca = Ca("new CA");
  TlsServer server(Server(old_ca, {"127.0.0.1"}));
  ASSERT_NE(server.listener, nullptr);
  const std::string url = "https://127.0.0.1:" + server.port();
  EXPECT_EQ(Get(url, new_ca.certificate_pem).first, -1);
  ASSERT_TRUE(server.credentials->Replace(Server(new_ca, {"127.0.0.1"})).ok());
  EXPECT_EQ(Get(url, new_ca.certificate_pem).first, 200);
  EXPECT_EQ(Get(url, old_ca.certificate_pem).first, -1);
}

// One client, several requests: each is served, whether the client keeps the connection or not.
TEST(TlsListenerTest, OneClientIsServedRequestAfterRequest) {
  const KeyPair ca = Ca();
  TlsServer server(Server(ca, {"127.0.0.1"}));
  ASSERT_NE(server.listener, nullptr);
  web::http::client::http_client_config config;
  config.set_timeout(std::chrono::seconds(30));
  config.set_ssl_context_callback([&ca](boost::asio::ssl::context& context) {
    EXPECT_TRUE(TrustOnly(context.native_handle(), ca.certificate_pem).ok());
  });
  web::http::client::http_client client("https://127.0.0.1:" + server.port(), config);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(client.request(web::http::methods::GET, "/x").get().status_code(), status_codes::OK);
  }
  EXPECT_EQ(server.handled->load(), 3);
}

// A client that connects and never says a word of TLS is cut off at the handshake deadline, and
// others are served meanwhile. The deadline is shortened to 3 s (the default is 10): short
// enough for a quick test, long enough for the real handshake beside the silent ones.
TEST(TlsListenerTest, AHandshakeThatNeverEndsIsCutOff) {
  const KeyPair ca = Ca();
  TlsServer server(Server(ca, {"127.0.0.1"}), std::chrono::seconds(3));
  ASSERT_NE(server.listener, nullptr);
  testing::RawConnection silent(server.listener->port());
  ASSERT_TRUE(silent.ok());
  testing::RawConnection half(server.listener->port());
  ASSERT_TRUE(half.Send(std::string("\x16\x03\x01\x00\xff\x01", 6)));  // a ClientHello's start
  EXPECT_EQ(Get("https://127.0.0.1:" + server.port(), ca.certificate_pem).first, 200);
  for (testing::RawConnection* connection : {&silent, &half}) {
    bool closed = false;
    connection->Read(std::chrono::seconds(20), &closed);
    EXPECT_TRUE(closed) << "the server kept a connection that never finished its handshake";
  }
  EXPECT_EQ(server.handled->load(), 1);
}

// A client that goes on sending a body the server refused, and reads the answer only later,
// still gets it: the server's close sends its close_notify and reads (and drops) the rest for a
// while, instead of resetting the connection under the answer.
TEST(TlsListenerTest, ARefusedBodyStillSentGetsItsAnswer) {
  const KeyPair ca = Ca();
  TlsServer server(Server(ca, {"127.0.0.1"}));
  ASSERT_NE(server.listener, nullptr);
  namespace asio = boost::asio;
  asio::io_context io;
  asio::ssl::context context(asio::ssl::context::tls_client);
  ASSERT_TRUE(TrustOnly(context.native_handle(), ca.certificate_pem).ok());
  asio::ssl::stream<asio::ip::tcp::socket> client(io, context);
  client.set_verify_mode(asio::ssl::verify_peer);
  client.lowest_layer().connect(
      {asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(server.listener->port())});
  client.handshake(asio::ssl::stream_base::client);
  const std::string head =
      "PUT /x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000000\r\n\r\n";
  asio::write(client, asio::buffer(head));
  // The server answers 413 on the head alone; the client's next 2 MB arrive after that answer.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string block(1 << 20, 'x');
  boost::system::error_code error;
  for (int i = 0; i < 2 && !error; ++i) asio::write(client, asio::buffer(block), error);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::string answer(4096, '\0');
  const size_t n = client.read_some(asio::buffer(answer), error);
  answer.resize(n);
  EXPECT_EQ(answer.rfind("HTTP/1.1 413", 0), 0u)
      << "got: " << answer << " (" << error.message() << ")";
  EXPECT_EQ(server.handled->load(), 0);
}

TEST(TlsListenerTest, TrustOnlyNeedsACertificate) {
  SSL_CTX* context = SSL_CTX_new(TLS_client_method());
  EXPECT_EQ(TrustOnly(context, "no PEM here").code(), StatusCode::kInvalidArgument);
  SSL_CTX_free(context);
}

// Handshakes on several connections at once, on the server's threads.
TEST(TlsListenerTest, ConcurrentHandshakesAllComplete) {
  const KeyPair ca = Ca();
  TlsServer server(Server(ca, {"127.0.0.1"}));
  ASSERT_NE(server.listener, nullptr);
  const std::string url = "https://127.0.0.1:" + server.port();
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        const auto [status, what] = Get(url, ca.certificate_pem);
        if (status != 200) {
          ++failed;
          ADD_FAILURE() << what;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(server.handled->load(), 40);
}

}  // namespace
}  // namespace vf::http
