// CoordinatorClient against the project's HTTP server with a handler of the test's own, which
// records the connection (the client's address and port) each request came on.
#include "agent/protocol/client.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/http/listener.h"
#include "agent/http/tls.h"

namespace vf {
namespace {

using std::chrono::hours;
using std::chrono::milliseconds;

// A server that answers every request 200 "{}" and keeps the peer of each.
class RecordingServer {
 public:
  explicit RecordingServer(std::shared_ptr<http::ServerCredentials> tls = nullptr,
                           milliseconds idle_timeout = milliseconds(10'000)) {
    http::Listener::Options options;
    options.name = "test coordinator";
    options.tls = std::move(tls);
    options.limits.head_timeout = idle_timeout;
    Result<std::unique_ptr<http::Listener>> started = http::Listener::Start(
        "127.0.0.1", 0, options, [this](const http::Request& request, const http::Responder& r) {
          {
            std::lock_guard<std::mutex> lock(mu_);
            peers_.push_back(request.peer);
          }
          r.Send(http::Response::With(200, "{}", "application/json"));
        });
    EXPECT_TRUE(started.ok()) << started.status().ToString();
    if (started.ok()) listener_ = std::move(started).value();
  }
  ~RecordingServer() {
    if (listener_ != nullptr) listener_->Stop();
  }

  std::string url() const { return listener_ == nullptr ? "" : listener_->url(); }
  std::vector<std::string> peers() const {
    std::lock_guard<std::mutex> lock(mu_);
    return peers_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> peers_;  // guarded by mu_
  std::unique_ptr<http::Listener> listener_;
};

// A file in a folder of this process's own, removed when it exits: the plain, ASan and TSan
// builds of a test run at the same time, and another's CA file would fail the handshake.
std::string TempPath(const std::string& name) {
  static const struct Folder {
    std::string path;
    Folder() {
      std::string pattern = testing::TempDir() + "vf_client_test_XXXXXX";
      path = mkdtemp(pattern.data()) != nullptr ? pattern : testing::TempDir();
    }
    ~Folder() {
      if (path != testing::TempDir()) std::filesystem::remove_all(path);
    }
  } folder;
  return folder.path + "/" + name;
}

void WriteFile(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fwrite(text.data(), 1, text.size(), f), text.size());
  ASSERT_EQ(std::fclose(f), 0);
}

constexpr size_t kRounds = 5;
constexpr size_t kCalls = 4 * kRounds;

// A worker's calls one after another, kRounds times: register, report, leave, acknowledge.
void MakeCalls(CoordinatorClient& client) {
  for (size_t round = 0; round < kRounds; ++round) {
    ASSERT_TRUE(client.Register("fingerprint", "build", true).ok());
    vf::Report report;
    report.epoch = 1;
    report.step = 3;
    ASSERT_TRUE(client.Report(report).ok());
    ASSERT_TRUE(client.Leave().ok());
    ASSERT_TRUE(client.Ack(2).ok());
  }
}

size_t Connections(const std::vector<std::string>& peers) {
  return std::set<std::string>(peers.begin(), peers.end()).size();
}

// Each new connection costs a TCP connection, with TLS a handshake and cpprest's load of the
// system's CA store, so a client keeps one open for its next call. Not always: cpprest puts a
// connection back for reuse a moment after the answer's body was read, and a call made within
// that moment opens another. So the test asks for most calls (three in four) to reuse one.
TEST(CoordinatorClientTest, CallsOneAfterAnotherMostlyReuseOneConnection) {
  RecordingServer server;
  ASSERT_FALSE(server.url().empty());
  CoordinatorClient client(server.url(), "ns/job", "token", "w-0", milliseconds(5000));
  MakeCalls(client);
  const std::vector<std::string> peers = server.peers();
  ASSERT_EQ(peers.size(), kCalls);
  std::printf("%zu calls on %zu connections\n", kCalls, Connections(peers));
  EXPECT_LE(Connections(peers), kCalls / 4);
}

// A kept connection the server has since closed (it closes one idle past its head timeout, and
// every one when it restarts) costs the next call nothing but a new connection.
TEST(CoordinatorClientTest, ACallAfterTheServerClosedTheKeptConnectionSucceedsOnANewOne) {
  RecordingServer server(nullptr, milliseconds(200));
  ASSERT_FALSE(server.url().empty());
  CoordinatorClient client(server.url(), "ns/job", "token", "w-0", milliseconds(5000));
  ASSERT_TRUE(client.Leave().ok());
  std::this_thread::sleep_for(milliseconds(600));
  const auto start = std::chrono::steady_clock::now();
  const Status second = client.Leave();
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(second.ok()) << second.ToString();
  const std::vector<std::string> peers = server.peers();
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_NE(peers[0], peers[1]);
  std::printf("the call after the close took %.3f s\n", took);
}

// "127.0.0.1:PORT" -> PORT.
std::string PortOf(const std::string& address) { return address.substr(address.rfind(':') + 1); }

// A kept connection whose peer vanished without a word (an operator pod replaced: its address
// is gone, and nothing answers or resets): iptables drops what the client sends on it. The
// call's one attempt may take the whole request timeout, and without a bound on unacknowledged
// data it does and fails; the client gives up on the connection long before and the call goes
// through on a new one.
TEST(CoordinatorClientTest, ACallOnAKeptConnectionWhosePeerVanishedGoesThroughOnANewOne) {
  if (geteuid() != 0 || std::system("iptables -w -L OUTPUT -n >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "needs root and iptables to make a connection's peer vanish";
  }
  RecordingServer server(nullptr, milliseconds(60'000));
  ASSERT_FALSE(server.url().empty());
  CoordinatorClient client(server.url(), "ns/job", "token", "w-0", milliseconds(20'000));
  // Until a connection has carried a second request, which sets the bound on it (a new
  // connection's first request is made before it has a socket to set it on).
  std::vector<std::string> peers;
  while (peers.size() < 2 || peers[peers.size() - 1] != peers[peers.size() - 2]) {
    ASSERT_LT(peers.size(), 20u) << "no two calls in a row shared a connection";
    ASSERT_TRUE(client.Leave().ok());
    peers = server.peers();
  }
  const size_t before_vanishing = peers.size();
  const std::string rule = "INPUT -p tcp -s 127.0.0.1 --sport " + PortOf(peers.back()) +
                           " --dport " + PortOf(server.url()) + " -j DROP";
  ASSERT_EQ(std::system(("iptables -w -I " + rule).c_str()), 0);
  const auto before = std::chrono::steady_clock::now();
  const Status third = client.Leave();
  std::printf("the call took %.3f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count());
  ASSERT_EQ(std::system(("iptables -w -D " + rule).c_str()), 0);
  ASSERT_TRUE(third.ok()) << third.ToString();
  peers = server.peers();
  ASSERT_EQ(peers.size(), before_vanishing + 1);
  EXPECT_NE(peers.back(), peers[before_vanishing - 1]);
}

TEST(CoordinatorClientTest, CallsOverTlsMostlyReuseOneConnectionAndTrustOnlyTheCa) {
  Result<http::KeyPair> ca = http::MakeCertificateAuthority("test coordinator CA", hours(1));
  ASSERT_TRUE(ca.ok()) << ca.status().ToString();
  Result<http::KeyPair> pair = http::IssueServerCertificate(*ca, {"127.0.0.1"}, hours(1));
  ASSERT_TRUE(pair.ok()) << pair.status().ToString();
  Result<std::shared_ptr<http::ServerCredentials>> credentials =
      http::ServerCredentials::Create(*pair);
  ASSERT_TRUE(credentials.ok()) << credentials.status().ToString();
  RecordingServer server(*credentials);
  ASSERT_EQ(server.url().rfind("https://", 0), 0u) << server.url();

  const std::string ca_file = TempPath("coordinator-ca.crt");
  ASSERT_NO_FATAL_FAILURE(WriteFile(ca_file, ca->certificate_pem));
  CoordinatorClient client(server.url(), "ns/job", "token", "w-0", milliseconds(5000), ca_file);
  MakeCalls(client);
  const std::vector<std::string> peers = server.peers();
  ASSERT_EQ(peers.size(), kCalls);
  std::printf("%zu calls on %zu connections\n", kCalls, Connections(peers));
  EXPECT_LE(Connections(peers), kCalls / 4);

  // Another CA's client gets no answer from it: the kept connections do not skip the check.
  Result<http::KeyPair> other = http::MakeCertificateAuthority("another CA", hours(1));
  ASSERT_TRUE(other.ok());
  const std::string other_file = TempPath("another-ca.crt");
  ASSERT_NO_FATAL_FAILURE(WriteFile(other_file, other->certificate_pem));
  CoordinatorClient stranger(server.url(), "ns/job", "token", "w-1", milliseconds(500), other_file);
  const Status refused = stranger.Leave();
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToString();
  EXPECT_NE(refused.message().find("TLS handshake failed"), std::string::npos) << refused.message();
  EXPECT_EQ(server.peers().size(), kCalls);
}

}  // namespace
}  // namespace vf
