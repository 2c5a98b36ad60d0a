// The listener shell over real HTTP on loopback, fetched with cpprest's client.
//
// GoogleTest first: cpprest (listener.h includes it) defines a macro U, which breaks
// GoogleTest's templates with a parameter of that name when it comes first.
#include <gtest/gtest.h>

#include "agent/http/listener.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cpprest/http_client.h>
#include <cpprest/producerconsumerstream.h>

// As in operator/coordinator/server_test.cc: cpprest can leave a continuation of its own
// connection handling queued when a process exits right after a listener closed, and
// LeakSanitizer reports it; it is not a per-request leak.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name LeakSanitizer looks up.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcpprest.so\n"; }

namespace vf::http {
namespace {

using std::chrono::milliseconds;
using web::http::http_request;
using web::http::http_response;
using web::http::status_codes;

struct Reply {
  int status = 0;
  std::string content_type;
  std::string body;
};

Reply Fetch(const std::string& url, const std::string& path,
            const web::http::method& method = web::http::methods::GET,
            const std::string& body = "") {
  web::http::client::http_client_config config;
  config.set_timeout(std::chrono::seconds(30));
  web::http::client::http_client client(url, config);
  http_request request(method);
  request.set_request_uri(web::uri(path));
  if (!body.empty()) {
    request.set_body(std::vector<unsigned char>(body.begin(), body.end()));
  }
  http_response response = client.request(request).get();
  const std::vector<unsigned char> bytes = response.extract_vector().get();
  Reply reply;
  reply.status = response.status_code();
  response.headers().match(web::http::header_names::content_type, reply.content_type);
  reply.body.assign(bytes.begin(), bytes.end());
  return reply;
}

Listener::Options Named(const std::string& name) {
  Listener::Options options;
  options.name = name;
  return options;
}

std::unique_ptr<Listener> StartOrNull(Listener::Handler handler,
                                      Listener::Options options = Named("test server")) {
  Result<std::unique_ptr<Listener>> listener =
      Listener::Start("127.0.0.1", 0, std::move(options), std::move(handler));
  EXPECT_TRUE(listener.ok()) << listener.status().ToString();
  return listener.ok() ? std::move(listener).value() : nullptr;
}

void AnswerPath(const http_request& request, const InFlight& /*in_flight*/) {
  Send(request, TextResponse(status_codes::OK, "path " + request.request_uri().path()));
}

// ---- Ports and addresses ----

TEST(ListenTest, PicksAPortOnLoopback) {
  Result<int> port = PickFreePort("127.0.0.1");
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  EXPECT_GT(*port, 0);
  EXPECT_LT(*port, 65536);
}

TEST(ListenTest, UnresolvableHostIsInvalidArgument) {
  Result<int> port = PickFreePort("no such host .invalid");
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(port.status().message().find("no such host"), std::string::npos);
}

TEST(ListenTest, OpenOnPortRetriesPickedPortsAndReturnsTheLastFailure) {
  std::vector<int> tried;
  Status s = OpenOnPort("127.0.0.1", 0, [&](int port) {
    tried.push_back(port);
    return tried.size() < 3 ? Unavailable("taken") : Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(tried.size(), 3u);
  for (int port : tried) EXPECT_GT(port, 0);
  tried.clear();
  s = OpenOnPort("127.0.0.1", 0, [&](int port) {
    tried.push_back(port);
    return Unavailable("taken " + std::to_string(tried.size()));
  });
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "taken 5");
}

TEST(ListenTest, OpenOnPortTriesAGivenPortOnce) {
  std::vector<int> tried;
  const Status s = OpenOnPort("127.0.0.1", 8123, [&](int port) {
    tried.push_back(port);
    return Unavailable("in use");
  });
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(tried, std::vector<int>{8123});
}

TEST(ListenTest, Ipv6HostsGoInBrackets) {
  EXPECT_EQ(HostForUri("::1"), "[::1]");
  EXPECT_EQ(HostForUri("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(HostForUri("localhost"), "localhost");
}

// ---- Answers ----

TEST(AnswersTest, StatusCodesMapToHttpCodes) {
  EXPECT_EQ(HttpCode(InvalidArgument("x")), status_codes::BadRequest);
  EXPECT_EQ(HttpCode(NotFound("x")), status_codes::NotFound);
  EXPECT_EQ(HttpCode(FailedPrecondition("x")), status_codes::Conflict);
  EXPECT_EQ(HttpCode(DeadlineExceeded("x")), status_codes::RequestTimeout);
  EXPECT_EQ(HttpCode(Unavailable("x")), status_codes::ServiceUnavailable);
  EXPECT_EQ(HttpCode(Unauthenticated("x")), status_codes::Unauthorized);
  EXPECT_EQ(HttpCode(PermissionDenied("x")), status_codes::Forbidden);
  EXPECT_EQ(HttpCode(Internal("x")), status_codes::InternalError);
  EXPECT_EQ(HttpCode(DataLoss("x")), status_codes::InternalError);
}

TEST(AnswersTest, TextAnswersAreOneLine) {
  EXPECT_EQ(OneLine("a\nb\r\nc"), "a b  c");
  http_response response = TextResponse(status_codes::NotFound, "no\nsuch");
  EXPECT_EQ(response.status_code(), status_codes::NotFound);
  EXPECT_EQ(response.headers().content_type(), "text/plain; charset=utf-8");
  const std::vector<unsigned char> body = response.extract_vector().get();
  EXPECT_EQ(std::string(body.begin(), body.end()), "no such\n");
}

// ---- The listener ----

TEST(ListenerTest, ServesTheHandlerOnAPickedPort) {
  auto listener = StartOrNull(AnswerPath);
  ASSERT_NE(listener, nullptr);
  EXPECT_GT(listener->port(), 0);
  EXPECT_EQ(listener->host(), "127.0.0.1");
  EXPECT_EQ(listener->url(), "http://127.0.0.1:" + std::to_string(listener->port()));
  const Reply reply = Fetch(listener->url(), "/some/where?x=1");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "path /some/where\n");
}

TEST(ListenerTest, ATakenPortIsUnavailableAndSaysWhose) {
  auto first = StartOrNull(AnswerPath);
  ASSERT_NE(first, nullptr);
  Result<std::unique_ptr<Listener>> second =
      Listener::Start("127.0.0.1", first->port(), Named("second server"), AnswerPath);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(second.status().message().rfind("second server: ", 0), 0u) << second.status().message();
}

TEST(ListenerTest, RefusesBadArguments) {
  EXPECT_EQ(Listener::Start("", 0, Named("x"), AnswerPath).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Listener::Start("127.0.0.1", -1, Named("x"), AnswerPath).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(Listener::Start("127.0.0.1", 70000, Named("x"), AnswerPath).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ListenerTest, AHandlerThatThrowsIsAnswered500) {
  auto listener = StartOrNull(
      [](const http_request&, const InFlight&) { throw std::runtime_error("boom\nat line 2"); });
  ASSERT_NE(listener, nullptr);
  const Reply reply = Fetch(listener->url(), "/");
  EXPECT_EQ(reply.status, 500);
  EXPECT_EQ(reply.content_type, "text/plain; charset=utf-8");
  EXPECT_EQ(reply.body, "test server failed: boom at line 2\n");
}

TEST(ListenerTest, TheErrorResponseShapesTheListenersOwnAnswers) {
  Listener::Options options = Named("json server");
  options.error_response = [](web::http::status_code code, const std::string& message) {
    http_response response(code);
    SetBody(response, "{\"error\":\"" + message + "\"}", "application/json");
    return response;
  };
  auto listener = StartOrNull(
      [](const http_request&, const InFlight&) { throw std::runtime_error("boom"); }, options);
  ASSERT_NE(listener, nullptr);
  Reply reply = Fetch(listener->url(), "/");
  EXPECT_EQ(reply.status, 500);
  EXPECT_EQ(reply.content_type, "application/json");
  EXPECT_EQ(reply.body, "{\"error\":\"json server failed: boom\"}");
  listener->Stop([&] { reply = Fetch(listener->url(), "/"); });
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(reply.body, "{\"error\":\"json server is shutting down\"}");
}

TEST(ListenerTest, StopWaitsForAHandlerThatIsRunning) {
  std::promise<void> entered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> finished{false};
  auto listener = StartOrNull([&](const http_request& request, const InFlight&) {
    entered.set_value();
    released.wait();
    Send(request, TextResponse(status_codes::OK, "late"));
    finished = true;
  });
  ASSERT_NE(listener, nullptr);
  // Closing cuts the connection, so the client may or may not see the late answer.
  auto fetch = std::async(std::launch::async, [&] {
    try {
      Fetch(listener->url(), "/");
    } catch (const web::http::http_exception&) {
    }
  });
  entered.get_future().wait();
  auto stop = std::async(std::launch::async, [&] { listener->Stop(); });
  EXPECT_EQ(stop.wait_for(milliseconds(300)), std::future_status::timeout)
      << "Stop returned while a handler was running";
  release.set_value();
  EXPECT_EQ(stop.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(finished.load());
  fetch.get();
}

TEST(ListenerTest, StopWaitsForACopyOfInFlightHeldAfterTheHandlerReturned) {
  std::mutex mu;
  std::optional<InFlight> kept;  // guarded by mu
  auto listener = StartOrNull([&](const http_request& request, const InFlight& in_flight) {
    {
      std::lock_guard<std::mutex> lock(mu);
      kept = in_flight;
    }
    Send(request, TextResponse(status_codes::OK, "answered"));
  });
  ASSERT_NE(listener, nullptr);
  EXPECT_EQ(Fetch(listener->url(), "/").status, 200);
  auto stop = std::async(std::launch::async, [&] { listener->Stop(); });
  EXPECT_EQ(stop.wait_for(milliseconds(300)), std::future_status::timeout)
      << "Stop returned while a request was still counted";
  {
    std::lock_guard<std::mutex> lock(mu);
    kept.reset();
  }
  EXPECT_EQ(stop.wait_for(std::chrono::seconds(30)), std::future_status::ready);
}

TEST(ListenerTest, StoppingAnswers503WithoutTheHandlerAndRunsBeforeCloseOnce) {
  std::atomic<int> handled{0};
  auto listener = StartOrNull([&](const http_request& request, const InFlight& in_flight) {
    ++handled;
    AnswerPath(request, in_flight);
  });
  ASSERT_NE(listener, nullptr);
  const std::string url = listener->url();
  EXPECT_EQ(Fetch(url, "/").status, 200);
  int before_close_calls = 0;
  Reply while_stopping;
  listener->Stop([&] {
    ++before_close_calls;
    while_stopping = Fetch(url, "/", web::http::methods::POST, "a body that is drained");
  });
  EXPECT_EQ(while_stopping.status, 503);
  EXPECT_EQ(while_stopping.body, "test server is shutting down\n");
  EXPECT_EQ(handled.load(), 1);
  listener->Stop([&] { ++before_close_calls; });
  EXPECT_EQ(before_close_calls, 1);
  EXPECT_THROW(Fetch(url, "/"), web::http::http_exception);
}

TEST(ListenerTest, BodiesOverTheListenersLimitAre413WithoutReachingTheHandler) {
  std::atomic<int> calls{0};
  Listener::Options options = Named("small server");
  options.max_body_bytes = 16;
  auto listener = StartOrNull(
      [&](const http_request& request, const InFlight& in_flight) {
        ++calls;
        AnswerPath(request, in_flight);
      },
      options);
  ASSERT_NE(listener, nullptr);
  Reply reply = Fetch(listener->url(), "/", web::http::methods::PUT, std::string(17, 'x'));
  EXPECT_EQ(reply.status, 413);
  EXPECT_EQ(reply.body, "small server: request body is 17 bytes; the limit is 16 bytes\n");
  reply = Fetch(listener->url(), "/", web::http::methods::PUT, std::string(4 << 20, 'x'));
  EXPECT_EQ(reply.status, 413);
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(Fetch(listener->url(), "/a", web::http::methods::PUT, std::string(16, 'x')).status,
            200);
  EXPECT_EQ(calls.load(), 1);
}

TEST(ListenerTest, AListenerThatTakesNoBodyRefusesChunkedOnes) {
  std::atomic<int> calls{0};
  Listener::Options options = Named("bodyless server");
  options.max_body_bytes = 0;
  auto listener = StartOrNull(
      [&](const http_request& request, const InFlight& in_flight) {
        ++calls;
        AnswerPath(request, in_flight);
      },
      options);
  ASSERT_NE(listener, nullptr);
  // cpprest's client sends a body from a stream of unknown length chunked.
  web::http::client::http_client client(listener->url());
  http_request request(web::http::methods::POST);
  request.set_request_uri(web::uri("/"));
  auto buffer = concurrency::streams::producer_consumer_buffer<uint8_t>();
  request.set_body(buffer.create_istream());
  const std::string data(100000, 'c');
  buffer.putn_nocopy(reinterpret_cast<const uint8_t*>(data.data()), data.size()).wait();
  buffer.close(std::ios_base::out).wait();
  http_response response = client.request(request).get();
  EXPECT_EQ(response.status_code(), 413);
  EXPECT_EQ(Fetch(listener->url(), "/b", web::http::methods::PUT, "x").status, 413);
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(Fetch(listener->url(), "/c").status, 200);
  EXPECT_EQ(calls.load(), 1);
}

TEST(ListenerTest, ReadBodyKeepsBodiesUpToTheLimitAndDropsLargerOnes) {
  auto listener = StartOrNull([](const http_request& request, const InFlight& in_flight) {
    // The InFlight travels with the continuation that answers.
    ReadBody(request, 8).then([request, in_flight](pplx::task<Body> read) {
      const Body body = read.get();
      if (!body.error.empty()) {
        Send(request, TextResponse(status_codes::BadRequest, body.error));
      } else if (body.too_large) {
        Send(request, TextResponse(status_codes::RequestEntityTooLarge, "too large"));
      } else {
        Send(request, TextResponse(status_codes::OK, "got '" + body.data + "'"));
      }
    });
  });
  ASSERT_NE(listener, nullptr);
  Reply reply = Fetch(listener->url(), "/", web::http::methods::PUT, "12345678");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "got '12345678'\n");
  reply = Fetch(listener->url(), "/", web::http::methods::PUT, std::string(100000, 'x'));
  EXPECT_EQ(reply.status, 413);
  reply = Fetch(listener->url(), "/", web::http::methods::GET);
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "got ''\n");
}

TEST(ListenerTest, ConcurrentRequestsAllReachTheHandler) {
  std::atomic<int> handled{0};
  auto listener = StartOrNull([&](const http_request& request, const InFlight& in_flight) {
    ++handled;
    AnswerPath(request, in_flight);
  });
  ASSERT_NE(listener, nullptr);
  std::vector<std::future<int>> fetches;
  for (int i = 0; i < 16; ++i) {
    fetches.push_back(std::async(std::launch::async, [&, i] {
      return Fetch(listener->url(), "/" + std::to_string(i)).status;
    }));
  }
  for (auto& f : fetches) EXPECT_EQ(f.get(), 200);
  EXPECT_EQ(handled.load(), 16);
}

}  // namespace
}  // namespace vf::http
