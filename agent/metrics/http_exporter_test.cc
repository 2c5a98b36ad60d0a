// The exporter over real HTTP on loopback, fetched with cpprest's client.
#include "agent/metrics/http_exporter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <cpprest/http_client.h>

#include "agent/http/test_client.h"
#include "agent/metrics/test_util.h"

// As in operator/coordinator/server_test.cc: cpprest can leave a continuation of its own
// connection handling queued when a process exits right after a listener closed, and
// LeakSanitizer reports it; it is not a per-request leak.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name LeakSanitizer looks up.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcpprest.so\n"; }

namespace vf {
namespace {

struct Reply {
  int status = 0;
  std::string content_type;
  std::string allow;
  std::string body;
};

Reply Fetch(const std::string& url, const std::string& path,
            const web::http::method& method = web::http::methods::GET,
            const std::string& body = "") {
  web::http::client::http_client_config config;
  config.set_timeout(std::chrono::seconds(30));
  web::http::client::http_client client(url, config);
  web::http::http_request request(method);
  request.set_request_uri(web::uri(path));
  if (!body.empty()) request.set_body(std::vector<unsigned char>(body.begin(), body.end()));
  web::http::http_response response = client.request(request).get();
  const std::vector<unsigned char> bytes = response.extract_vector().get();
  Reply reply;
  reply.status = response.status_code();
  response.headers().match(web::http::header_names::content_type, reply.content_type);
  response.headers().match(U("Allow"), reply.allow);
  reply.body.assign(bytes.begin(), bytes.end());
  return reply;
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prometheus::BuildCounter()
        .Name("demo_steps_total")
        .Help("Steps.")
        .Register(registry_)
        .Add({{"job", "mnist"}})
        .Increment(42);
  }

  std::unique_ptr<MetricsServer> Start(const std::string& host = "127.0.0.1",
                                       MetricsServer::ReadinessCheck readiness = nullptr) {
    Result<std::unique_ptr<MetricsServer>> server =
        MetricsServer::Start(registry_, host, 0, std::move(readiness));
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    return server.ok() ? std::move(server).value() : nullptr;
  }

  prometheus::Registry registry_;
};

TEST_F(MetricsServerTest, ServesMetricsOnAPickedPort) {
  Result<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(registry_, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_GT((*server)->port(), 0);
  EXPECT_EQ((*server)->url(), "http://127.0.0.1:" + std::to_string((*server)->port()));
  const Reply reply = Fetch((*server)->url(), "/metrics");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(reply.body, metrics::Exposition(registry_));
  EXPECT_NE(reply.body.find("demo_steps_total{job=\"mnist\"} 42\n"), std::string::npos);
}

TEST_F(MetricsServerTest, EachScrapeReadsTheRegistryAfresh) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  prometheus::BuildGauge()
      .Name("demo_late")
      .Help("Registered after Start.")
      .Register(registry_)
      .Add({})
      .Set(7);
  EXPECT_NE(Fetch(server->url(), "/metrics").body.find("demo_late 7\n"), std::string::npos);
}

TEST_F(MetricsServerTest, HealthzIsOkWhileAlive) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  const Reply reply = Fetch(server->url(), "/healthz");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "ok\n");
}

TEST_F(MetricsServerTest, ReadyzFollowsTheReadinessCheck) {
  std::atomic<bool> ready{false};
  auto server = Start("127.0.0.1", [&ready]() -> Status {
    if (ready.load()) return Status::Ok();
    return Unavailable("informer caches not synced\nyet");
  });
  ASSERT_NE(server, nullptr);
  Reply reply = Fetch(server->url(), "/readyz");
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(reply.body, "not ready: informer caches not synced yet\n");
  ready = true;
  reply = Fetch(server->url(), "/readyz");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, "ok\n");
}

TEST_F(MetricsServerTest, ReadyzWithoutACheckIsAlwaysReady) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Fetch(server->url(), "/readyz").status, 200);
}

TEST_F(MetricsServerTest, UnknownPathsAre404AndOtherMethods405) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  const Reply root = Fetch(server->url(), "/");
  EXPECT_EQ(root.status, 404);
  EXPECT_EQ(root.body, "no such path: / (try /metrics, /healthz or /readyz)\n");
  EXPECT_EQ(Fetch(server->url(), "/metrics/extra").status, 404);
  EXPECT_EQ(Fetch(server->url(), "/nope", web::http::methods::POST).status, 404);
  const Reply post = Fetch(server->url(), "/metrics", web::http::methods::POST);
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.allow, "GET");
  EXPECT_EQ(post.body, "method POST is not allowed here; use GET\n");
  EXPECT_EQ(Fetch(server->url(), "/healthz", web::http::methods::DEL).status, 405);
  // A query string does not change the path.
  EXPECT_EQ(Fetch(server->url(), "/metrics?x=1").status, 200);
}

TEST_F(MetricsServerTest, RequestsWithABodyAre413AndScrapesGoOn) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  // 8 MiB declared: refused on the header alone, before any of it is read.
  http::testing::RawConnection big(server->port());
  ASSERT_TRUE(big.Send("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 8388608\r\n\r\nxx"));
  const std::string reply = big.Read(std::chrono::seconds(10), nullptr, /*until_answer=*/true);
  EXPECT_EQ(http::testing::StatusOf(reply), 413) << reply;
  EXPECT_EQ(http::testing::BodyOf(reply),
            "metrics server: request has a body; this server takes none\n");
  EXPECT_EQ(Fetch(server->url(), "/healthz", web::http::methods::POST, "x").status, 413);
  const Reply scrape = Fetch(server->url(), "/metrics");
  EXPECT_EQ(scrape.status, 200);
  EXPECT_NE(scrape.body.find("demo_steps_total"), std::string::npos);
}

TEST_F(MetricsServerTest, ConcurrentScrapesAllSucceed) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  std::vector<std::future<int>> scrapes;
  for (int i = 0; i < 16; ++i) {
    scrapes.push_back(std::async(std::launch::async, [&, i] {
      return Fetch(server->url(), i % 2 == 0 ? "/metrics" : "/healthz").status;
    }));
  }
  for (auto& s : scrapes) EXPECT_EQ(s.get(), 200);
}

TEST_F(MetricsServerTest, ListensOnAllInterfacesForScrapesFromOtherPods) {
  auto server = Start("0.0.0.0");
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(Fetch("http://127.0.0.1:" + std::to_string(server->port()), "/healthz").status, 200);
}

TEST_F(MetricsServerTest, AnExplicitPortIsUsedAndATakenOneIsAnError) {
  auto first = Start();
  ASSERT_NE(first, nullptr);
  Result<std::unique_ptr<MetricsServer>> second =
      MetricsServer::Start(registry_, "127.0.0.1", first->port());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find("metrics server"), std::string::npos);
}

TEST_F(MetricsServerTest, RefusesBadArguments) {
  EXPECT_EQ(MetricsServer::Start(registry_, "", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsServer::Start(registry_, "127.0.0.1", 70000).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(MetricsServerTest, StopIsIdempotentAndClosesThePort) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  const std::string url = server->url();
  EXPECT_EQ(Fetch(url, "/healthz").status, 200);
  server->Stop();
  server->Stop();
  EXPECT_THROW(Fetch(url, "/healthz"), web::http::http_exception);
}

}  // namespace
}  // namespace vf
