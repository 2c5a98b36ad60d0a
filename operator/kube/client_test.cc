// The client over real HTTP(S) against a scripted server: what goes on the wire, how answers and
// failures come back, how watch streams are read, stopped and timed out, and how the reflector
// reacts. (tests/e2e/test_kube_client.py runs the same client against a real API server.)
#include "operator/kube/client.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/kube/reflector.h"
#include "operator/kube/test_util.h"

// When a process exits right after a request was cancelled, cpprest can still have a
// continuation of its own queued on its thread pool, and LeakSanitizer reports it; the
// coordinator's tests see the same. It is not a per-request leak.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name LeakSanitizer looks up.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcpprest.so\n"; }

namespace vf::kube {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Connection;
using testing::FakeServer;
using testing::HoldUntil;
using testing::KeyPair;
using testing::Request;
using testing::TestCa;
using Clock = std::chrono::steady_clock;

std::unique_ptr<Client> NewClient(const std::string& url, ClientOptions options = {}) {
  Config config;
  config.server = url;
  config.token = "secret-token";
  Result<std::unique_ptr<Client>> client = Client::Create(config, std::move(options));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return std::move(client).value();
}

std::string Event(const char* type, const std::string& name, const std::string& rv) {
  return json{{"type", type},
              {"object",
               {{"kind", "ConfigMap"}, {"metadata", {{"name", name}, {"resourceVersion", rv}}}}}}
             .dump() +
         "\n";
}

constexpr char kNotFound[] = R"({"kind":"Status","apiVersion":"v1","status":"Failure","message":)"
                             R"("configmaps \"a\" not found","reason":"NotFound","code":404})";

// Records requests for the test to look at. Thread-safe.
class Recorder {
 public:
  void Add(const Request& request) {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(request);
  }
  std::vector<Request> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }

 private:
  std::mutex mu_;
  std::vector<Request> requests_;
};

TEST(ClientTest, GetSendsCredentialsAndReturnsTheObject) {
  Recorder recorder;
  FakeServer server([&](const Request& request, Connection& c, std::stop_token) {
    recorder.Add(request);
    c.Respond(200, R"({"kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":"v"}})");
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  ApiResult<json> object = client->Get(kConfigMaps, "ns", "a");
  ASSERT_TRUE(object.ok()) << object.status().ToString();
  EXPECT_EQ((*object)["data"]["k"], "v");
  const std::vector<Request> requests = recorder.Get();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].method, "GET");
  EXPECT_EQ(requests[0].target, "/api/v1/namespaces/ns/configmaps/a");
  EXPECT_EQ(requests[0].Header("Authorization"), "Bearer secret-token");
  EXPECT_EQ(requests[0].Header("Accept"), "application/json");
  EXPECT_EQ(requests[0].Header("User-Agent"), "virtualflow-operator");
  EXPECT_EQ(client->requests_sent(), 1u);
}

TEST(ClientTest, ServerErrorsComeBackWithReasonMessageAndContext) {
  FakeServer server(
      [&](const Request&, Connection& c, std::stop_token) { c.Respond(404, kNotFound); });
  std::unique_ptr<Client> client = NewClient(server.url());
  ApiResult<json> object = client->Get(kConfigMaps, "ns", "a");
  ASSERT_FALSE(object.ok());
  EXPECT_EQ(object.reason(), Reason::kNotFound);
  EXPECT_EQ(object.error().http_code, 404);
  EXPECT_EQ(object.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(object.status().message(),
            "get configmaps ns/a: NotFound: configmaps \"a\" not found (HTTP 404)");
}

TEST(ClientTest, WritesSendTheirContentTypesAndBodies) {
  Recorder recorder;
  FakeServer server([&](const Request& request, Connection& c, std::stop_token) {
    recorder.Add(request);
    c.Respond(200, R"({"kind":"Status","status":"Success"})");
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  ASSERT_TRUE(client->Create(kConfigMaps, "ns", json{{"metadata", {{"name", "a"}}}}).ok());
  ASSERT_TRUE(client->MergePatch(kConfigMaps, "ns", "a", json{{"data", {{"k", nullptr}}}}).ok());
  ASSERT_TRUE(
      client->Replace(kLeases, "ns", json{{"metadata", {{"name", "l"}, {"resourceVersion", "7"}}}})
          .ok());
  DeleteOptions options;
  options.propagation_policy = "Foreground";
  options.precondition_uid = "uid-1";
  options.grace_period_seconds = 0;
  ASSERT_TRUE(client->Delete(kPods, "ns", "p", options).ok());
  ASSERT_TRUE(client->PatchStatus(kNodes, "", "n", json{{"status", {{"phase", "x"}}}}).ok());
  ASSERT_TRUE(
      client->ReplaceStatus(kVirtualFlowJobs, "ns", json{{"metadata", {{"name", "j"}}}}).ok());

  const std::vector<Request> r = recorder.Get();
  ASSERT_EQ(r.size(), 6u);
  EXPECT_EQ(r[0].method, "POST");
  EXPECT_EQ(r[0].target, "/api/v1/namespaces/ns/configmaps");
  EXPECT_EQ(r[0].Header("Content-Type"), "application/json");
  EXPECT_EQ(json::parse(r[0].body), (json{{"apiVersion", "v1"},
                                          {"kind", "ConfigMap"},
                                          {"metadata", {{"name", "a"}, {"namespace", "ns"}}}}));
  EXPECT_EQ(r[1].method, "PATCH");
  EXPECT_EQ(r[1].Header("Content-Type"), "application/merge-patch+json");
  EXPECT_EQ(json::parse(r[1].body), (json{{"data", {{"k", nullptr}}}}));
  EXPECT_EQ(r[2].method, "PUT");
  EXPECT_EQ(r[2].target, "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l");
  EXPECT_EQ(json::parse(r[2].body)["apiVersion"], "coordination.k8s.io/v1");
  EXPECT_EQ(r[3].method, "DELETE");
  EXPECT_EQ(json::parse(r[3].body), (json{{"apiVersion", "v1"},
                                          {"kind", "DeleteOptions"},
                                          {"propagationPolicy", "Foreground"},
                                          {"preconditions", {{"uid", "uid-1"}}},
                                          {"gracePeriodSeconds", 0}}));
  EXPECT_EQ(r[4].target, "/api/v1/nodes/n/status");
  EXPECT_EQ(r[4].Header("Content-Type"), "application/merge-patch+json");
  EXPECT_EQ(r[5].method, "PUT");
  EXPECT_EQ(r[5].target, "/apis/virtualflow.io/v1alpha1/namespaces/ns/virtualflowjobs/j/status");
}

TEST(ClientTest, ReplaceWithoutANameFailsBeforeSending) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token) { c.Respond(200, "{}"); });
  std::unique_ptr<Client> client = NewClient(server.url());
  ApiResult<json> result = client->Replace(kLeases, "ns", json{{"spec", json::object()}});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.reason(), Reason::kInvalid);
  EXPECT_EQ(client->requests_sent(), 0u);
}

TEST(ClientTest, ListFollowsPagesAndFillsInKinds) {
  Recorder recorder;
  FakeServer server([&](const Request& request, Connection& c, std::stop_token) {
    recorder.Add(request);
    if (request.Query().find("continue=") == std::string::npos) {
      c.Respond(200, R"({"kind":"PodList","metadata":{"resourceVersion":"50","continue":"t1"},)"
                     R"("items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]})");
    } else {
      c.Respond(200, R"({"kind":"PodList","metadata":{"resourceVersion":"50"},)"
                     R"("items":[{"metadata":{"name":"c"}}]})");
    }
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  ListOptions options;
  options.page_size = 2;
  options.label_selector = "app=w,tier!=x";
  options.resource_version = "0";
  ApiResult<ObjectList> list = client->List(kPods, "ns", options);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->items.size(), 3u);
  EXPECT_EQ(list->items[2]["metadata"]["name"], "c");
  EXPECT_EQ(list->items[0]["kind"], "Pod");
  EXPECT_EQ(list->items[0]["apiVersion"], "v1");
  EXPECT_EQ(list->resource_version, "50");
  const std::vector<Request> r = recorder.Get();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].Query(), "labelSelector=app%3Dw%2Ctier%21%3Dx&limit=2&resourceVersion=0");
  EXPECT_EQ(r[1].Query(), "labelSelector=app%3Dw%2Ctier%21%3Dx&limit=2&continue=t1");
}

TEST(ClientTest, ListStartsOverUnpagedWhenTheContinueTokenExpires) {
  Recorder recorder;
  FakeServer server([&](const Request& request, Connection& c, std::stop_token) {
    recorder.Add(request);
    const std::string query = request.Query();
    if (query.find("continue=") != std::string::npos) {
      c.Respond(410, R"({"kind":"Status","reason":"Expired","message":"continue expired",)"
                     R"("code":410})");
    } else if (query.find("limit=") != std::string::npos) {
      c.Respond(200, R"({"metadata":{"resourceVersion":"5","continue":"t"},)"
                     R"("items":[{"metadata":{"name":"a"}}]})");
    } else {
      c.Respond(200, R"({"metadata":{"resourceVersion":"9"},"items":[{"metadata":{"name":"a"}},)"
                     R"({"metadata":{"name":"b"}}]})");
    }
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  ApiResult<ObjectList> list = client->List(kPods, "ns");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->items.size(), 2u);
  EXPECT_EQ(list->resource_version, "9");
  EXPECT_EQ(recorder.Get().size(), 3u);
}

TEST(ClientTest, ThrottledCallsAreRetriedAfterRetryAfter) {
  std::atomic<int> calls{0};
  FakeServer server([&](const Request&, Connection& c, std::stop_token) {
    if (calls++ == 0) {
      c.Respond(429,
                R"({"kind":"Status","reason":"TooManyRequests","message":"slow down",)"
                R"("code":429})",
                "Retry-After: 1\r\n");
    } else {
      c.Respond(200, R"({"metadata":{"name":"a"}})");
    }
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  const Clock::time_point start = Clock::now();
  ApiResult<json> object = client->Get(kConfigMaps, "ns", "a");
  ASSERT_TRUE(object.ok()) << object.status().ToString();
  EXPECT_GE(Clock::now() - start, seconds(1));
  EXPECT_EQ(client->requests_sent(), 2u);
}

TEST(ClientTest, ThrottlingPastTheTimeoutIsReturned) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token) {
    c.Respond(429, R"({"kind":"Status","reason":"TooManyRequests","message":"slow down"})",
              "Retry-After: 30\r\n");
  });
  ClientOptions options;
  options.timeout = milliseconds(2000);
  std::unique_ptr<Client> client = NewClient(server.url(), options);
  ApiResult<json> object = client->Get(kConfigMaps, "ns", "a");
  ASSERT_FALSE(object.ok());
  EXPECT_EQ(object.reason(), Reason::kTooManyRequests);
  EXPECT_EQ(object.error().retry_after, seconds(30));
}

TEST(ClientTest, SilentServerHitsTheCallTimeout) {
  FakeServer server([&](const Request&, Connection&, std::stop_token stop) {
    HoldUntil(stop, [] { return false; });
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  CallOptions options;
  options.timeout = milliseconds(300);
  const Clock::time_point start = Clock::now();
  ApiResult<json> object = client->Get(kConfigMaps, "ns", "a", options);
  ASSERT_FALSE(object.ok());
  EXPECT_EQ(object.reason(), Reason::kDeadlineExceeded);
  EXPECT_EQ(object.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(Clock::now() - start, milliseconds(300));
  EXPECT_LT(Clock::now() - start, seconds(5));
}

TEST(ClientTest, RefusedConnectionIsATransportError) {
  int port;
  {
    FakeServer server([](const Request&, Connection&, std::stop_token) {});
    port = server.port();
  }
  std::unique_ptr<Client> client = NewClient("http://127.0.0.1:" + std::to_string(port));
  ApiResult<json> object = client->Get(kConfigMaps, "ns", "a");
  ASSERT_FALSE(object.ok());
  EXPECT_EQ(object.reason(), Reason::kTransport);
  EXPECT_EQ(object.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(object.status().message().find("get configmaps ns/a: Transport: "), std::string::npos);
}

TEST(ClientTest, NonJsonSuccessIsABadResponse) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token) {
    c.Respond(200, "<html>proxy</html>");
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  ApiResult<json> object = client->Get(kConfigMaps, "ns", "a");
  ASSERT_FALSE(object.ok());
  EXPECT_EQ(object.reason(), Reason::kBadResponse);
}

TEST(ClientTest, SharedRateLimiterBoundsTheRequestRate) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token) { c.Respond(200, "{}"); });
  ClientOptions options;
  options.qps = 20;
  options.burst = 1;
  std::unique_ptr<Client> client = NewClient(server.url(), options);
  constexpr int kCalls = 11;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kCalls; ++i) ASSERT_TRUE(client->Get(kConfigMaps, "ns", "a").ok());
  EXPECT_GE(Clock::now() - start, milliseconds((kCalls - 1) * 50));
  EXPECT_EQ(client->requests_sent(), static_cast<uint64_t>(kCalls));
}

// What a RequestObserver was told. Thread-safe.
class ObservedRequests {
 public:
  RequestObserver Observer() {
    return [this](std::string_view verb, int status, double took) {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(std::string(verb) + " " + std::to_string(status));
      seconds_.push_back(took);
    };
  }
  std::vector<std::string> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  std::vector<double> Seconds() {
    std::lock_guard<std::mutex> lock(mu_);
    return seconds_;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> seen_;
  std::vector<double> seconds_;
};

TEST(RequestObserverTest, ReportsEachRequestWithItsKubernetesVerbAndStatus) {
  FakeServer server([&](const Request& request, Connection& c, std::stop_token) {
    if (request.Query().find("watch=true") != std::string::npos) {
      c.StartChunked();
      c.Chunk(Event("ADDED", "a", "2"));
      c.EndChunked();
    } else if (request.method == "GET" && request.Path().ends_with("/configmaps")) {
      c.Respond(200, R"({"metadata":{"resourceVersion":"1"},"items":[]})");
    } else if (request.method == "GET") {
      c.Respond(404, kNotFound);
    } else if (request.method == "POST") {
      c.Respond(201, R"({"metadata":{"name":"a"}})");
    } else if (request.method == "PUT") {
      c.Respond(409, R"({"kind":"Status","reason":"Conflict","message":"modified","code":409})");
    } else {
      c.Respond(200, R"({"metadata":{"name":"a"}})");
    }
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  ObservedRequests observed;
  client->set_request_observer(observed.Observer());
  EXPECT_EQ(client->Get(kConfigMaps, "ns", "a").reason(), Reason::kNotFound);
  EXPECT_TRUE(client->List(kConfigMaps, "ns").ok());
  EXPECT_TRUE(client->Create(kConfigMaps, "ns", json{{"metadata", {{"name", "a"}}}}).ok());
  EXPECT_EQ(client->Replace(kConfigMaps, "ns", json{{"metadata", {{"name", "a"}}}}).reason(),
            Reason::kConflict);
  EXPECT_EQ(client->ReplaceStatus(kConfigMaps, "ns", json{{"metadata", {{"name", "a"}}}}).reason(),
            Reason::kConflict);
  EXPECT_TRUE(client->MergePatch(kConfigMaps, "ns", "a", json::object()).ok());
  EXPECT_TRUE(client->PatchStatus(kConfigMaps, "ns", "a", json::object()).ok());
  EXPECT_TRUE(client->Delete(kConfigMaps, "ns", "a").ok());
  EXPECT_TRUE(client->Watch(kConfigMaps, "ns", {}, [](const WatchEvent&) {}).ok());
  EXPECT_EQ(observed.Get(), (std::vector<std::string>{"get 404", "list 200", "create 201",
                                                      "update 409", "update 409", "patch 200",
                                                      "patch 200", "delete 200", "watch 200"}));
  for (double took : observed.Seconds()) {
    EXPECT_GE(took, 0.0);
    EXPECT_LT(took, 30.0);
  }
}

TEST(RequestObserverTest, ReportsEveryPageAndEveryThrottledRetry) {
  std::atomic<int> calls{0};
  FakeServer server([&](const Request& request, Connection& c, std::stop_token) {
    if (calls++ == 0) {
      c.Respond(429, R"({"kind":"Status","reason":"TooManyRequests","code":429})",
                "Retry-After: 1\r\n");
    } else if (request.Query().find("continue=") == std::string::npos) {
      c.Respond(200, R"({"metadata":{"resourceVersion":"1","continue":"next"},"items":[]})");
    } else {
      c.Respond(200, R"({"metadata":{"resourceVersion":"1"},"items":[]})");
    }
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  ObservedRequests observed;
  client->set_request_observer(observed.Observer());
  ASSERT_TRUE(client->List(kConfigMaps, "ns").ok());
  EXPECT_EQ(observed.Get(), (std::vector<std::string>{"list 429", "list 200", "list 200"}));
}

TEST(RequestObserverTest, ARequestWithoutAnAnswerIsReportedWithStatusZero) {
  int port;
  {
    FakeServer server([](const Request&, Connection&, std::stop_token) {});
    port = server.port();
  }
  std::unique_ptr<Client> client = NewClient("http://127.0.0.1:" + std::to_string(port));
  ObservedRequests observed;
  client->set_request_observer(observed.Observer());
  EXPECT_EQ(client->Get(kConfigMaps, "ns", "a").reason(), Reason::kTransport);
  EXPECT_EQ(client->Watch(kConfigMaps, "ns", {}, [](const WatchEvent&) {}).reason(),
            Reason::kTransport);
  EXPECT_EQ(observed.Get(), (std::vector<std::string>{"get 0", "watch 0"}));
  // And none once it is taken away.
  client->set_request_observer(nullptr);
  EXPECT_FALSE(client->Get(kConfigMaps, "ns", "a").ok());
  EXPECT_EQ(observed.Get().size(), 2u);
}

TEST(WatchTest, EventsArriveAsSentWhateverTheChunking) {
  Recorder recorder;
  std::atomic<bool> first_seen{false};
  std::atomic<bool> delivered_while_streaming{false};
  FakeServer server([&](const Request& request, Connection& c, std::stop_token stop) {
    recorder.Add(request);
    c.StartChunked();
    const std::string first = Event("ADDED", "a", "11");
    c.Chunk(first.substr(0, 10));
    c.Chunk(first.substr(10));
    // The next events are held back until the client has handled the first: a client that
    // waited for more data before handing out what it has would never see it.
    const Clock::time_point give_up = Clock::now() + seconds(10);
    HoldUntil(stop, [&] { return first_seen.load() || Clock::now() > give_up; });
    delivered_while_streaming = first_seen.load();
    c.Chunk(Event("MODIFIED", "a", "12") + Event("BOOKMARK", "", "13") +
            Event("DELETED", "a", "14"));
    c.EndChunked();
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  WatchOptions options;
  options.resource_version = "10";
  options.timeout_seconds = 30;
  std::vector<std::pair<WatchEventType, std::string>> events;
  ApiStatus result = client->Watch(kConfigMaps, "ns", options, [&](const WatchEvent& event) {
    events.emplace_back(event.type, ResourceVersionOf(event.object));
    first_seen = true;
  });
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  const std::vector<std::pair<WatchEventType, std::string>> expected = {
      {WatchEventType::kAdded, "11"},
      {WatchEventType::kModified, "12"},
      {WatchEventType::kBookmark, "13"},
      {WatchEventType::kDeleted, "14"}};
  EXPECT_EQ(events, expected);
  EXPECT_TRUE(delivered_while_streaming.load());
  ASSERT_EQ(recorder.Get().size(), 1u);
  EXPECT_EQ(recorder.Get()[0].target,
            "/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=10&"
            "allowWatchBookmarks=true&timeoutSeconds=30");
}

TEST(WatchTest, ErrorEventIsHandledAndReturned) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token) {
    c.StartChunked();
    c.Chunk(
        R"({"type":"ERROR","object":{"kind":"Status","status":"Failure",)"
        R"json("message":"too old resource version: 1 (500)","reason":"Expired","code":410}})json"
        "\n");
    c.EndChunked();
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  std::vector<WatchEventType> types;
  ApiStatus result = client->Watch(kConfigMaps, "ns", {},
                                   [&](const WatchEvent& event) { types.push_back(event.type); });
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.reason(), Reason::kGone);
  EXPECT_NE(result.status().message().find("watch configmaps in ns: Expired: too old resource"),
            std::string::npos)
      << result.status().message();
  EXPECT_EQ(types, std::vector<WatchEventType>{WatchEventType::kError});
}

TEST(WatchTest, HttpErrorBeforeTheStream) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token) {
    c.Respond(403, R"({"kind":"Status","reason":"Forbidden","message":"no watching","code":403})");
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  ApiStatus result = client->Watch(kPods, "", {}, [](const WatchEvent&) {});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.reason(), Reason::kForbidden);
  EXPECT_EQ(result.status().message(),
            "watch pods in all namespaces: Forbidden: no watching (HTTP 403)");
}

TEST(WatchTest, StopEndsABlockedWatchPromptly) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token stop) {
    c.StartChunked();
    c.Chunk(Event("ADDED", "a", "1"));
    HoldUntil(stop, [] { return false; });
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  std::stop_source stop;
  std::promise<void> first;
  std::atomic<int> events{0};
  auto done = std::async(std::launch::async, [&] {
    return client->Watch(
        kConfigMaps, "ns", {},
        [&](const WatchEvent&) {
          if (events++ == 0) first.set_value();
        },
        stop.get_token());
  });
  first.get_future().wait();
  const Clock::time_point start = Clock::now();
  stop.request_stop();
  ASSERT_EQ(done.wait_for(seconds(5)), std::future_status::ready);
  EXPECT_TRUE(done.get().ok());
  EXPECT_LT(Clock::now() - start, seconds(2));
  EXPECT_EQ(events.load(), 1);
}

TEST(WatchTest, StopFromTheHandler) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token stop) {
    c.StartChunked();
    c.Chunk(Event("ADDED", "a", "1") + Event("ADDED", "b", "2"));
    HoldUntil(stop, [] { return false; });
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  std::stop_source stop;
  int events = 0;
  ApiStatus result = client->Watch(
      kConfigMaps, "ns", {},
      [&](const WatchEvent&) {
        ++events;
        stop.request_stop();
      },
      stop.get_token());
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(events, 1);
}

TEST(WatchTest, QuietStreamHitsTheIdleTimeout) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token stop) {
    c.StartChunked();
    HoldUntil(stop, [] { return false; });
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  WatchOptions options;
  options.idle_timeout = milliseconds(500);
  const Clock::time_point start = Clock::now();
  ApiStatus result = client->Watch(kConfigMaps, "ns", options, [](const WatchEvent&) {});
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.reason(), Reason::kDeadlineExceeded);
  EXPECT_LT(Clock::now() - start, seconds(5));
}

TEST(WatchTest, StreamCutMidEventIsAnError) {
  FakeServer server([&](const Request&, Connection& c, std::stop_token) {
    c.StartChunked();
    c.Chunk(Event("ADDED", "a", "1") + "{\"type\":\"ADD");
    // The connection closes without the last chunk.
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  int events = 0;
  ApiStatus result = client->Watch(kConfigMaps, "ns", {}, [&](const WatchEvent&) { ++events; });
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(events, 1);
}

// ---- TLS ----

class TlsTest : public ::testing::Test {
 protected:
  TestCa ca_;
  KeyPair server_cert_ = ca_.Issue("kube-apiserver", /*server=*/true, {"IP:127.0.0.1"});
  KeyPair client_cert_ = ca_.Issue("vf-admin", /*server=*/false);
};

TEST_F(TlsTest, VerifiesTheServerByItsIpAndPresentsTheClientCertificate) {
  std::string peer;
  FakeServer server(
      [&](const Request&, Connection& c, std::stop_token) {
        peer = c.peer_cn();
        c.Respond(200, R"({"metadata":{"name":"a"}})");
      },
      &server_cert_, ca_.cert_pem());
  Config config;
  config.server = server.url();
  config.ca_pem = ca_.cert_pem();
  config.client_cert_pem = client_cert_.cert_pem;
  config.client_key_pem = client_cert_.key_pem;
  Result<std::unique_ptr<Client>> client = Client::Create(config);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ApiResult<json> object = (*client)->Get(kConfigMaps, "ns", "a");
  ASSERT_TRUE(object.ok()) << object.status().ToString();
  EXPECT_EQ(peer, "vf-admin");
}

TEST_F(TlsTest, RefusesAServerSignedByAnotherCa) {
  TestCa other("other-ca");
  FakeServer server([&](const Request&, Connection& c, std::stop_token) { c.Respond(200, "{}"); },
                    &server_cert_);
  Config config;
  config.server = server.url();
  config.ca_pem = other.cert_pem();
  Result<std::unique_ptr<Client>> client = Client::Create(config);
  ASSERT_TRUE(client.ok());
  ApiResult<json> object = (*client)->Get(kConfigMaps, "ns", "a");
  ASSERT_FALSE(object.ok());
  EXPECT_EQ(object.reason(), Reason::kTransport);
}

TEST_F(TlsTest, RefusesACertificateForAnotherAddress) {
  KeyPair elsewhere = ca_.Issue("kube-apiserver", /*server=*/true, {"IP:10.0.0.1", "DNS:x"});
  FakeServer server([&](const Request&, Connection& c, std::stop_token) { c.Respond(200, "{}"); },
                    &elsewhere);
  Config config;
  config.server = server.url();
  config.ca_pem = ca_.cert_pem();
  Result<std::unique_ptr<Client>> client = Client::Create(config);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->Get(kConfigMaps, "ns", "a").reason(), Reason::kTransport);
  // tls-server-name: the certificate is checked against that name instead.
  config.tls_server_name = "x";
  client = Client::Create(config);
  ASSERT_TRUE(client.ok());
  ApiResult<json> object = (*client)->Get(kConfigMaps, "ns", "a");
  EXPECT_TRUE(object.ok()) << object.status().ToString();
}

TEST_F(TlsTest, InsecureSkipsVerification) {
  TestCa other("other-ca");
  FakeServer server([&](const Request&, Connection& c, std::stop_token) { c.Respond(200, "{}"); },
                    &server_cert_);
  Config config;
  config.server = server.url();
  config.insecure_skip_tls_verify = true;
  Result<std::unique_ptr<Client>> client = Client::Create(config);
  ASSERT_TRUE(client.ok());
  EXPECT_TRUE((*client)->Get(kConfigMaps, "ns", "a").ok());
}

TEST_F(TlsTest, WatchStreamsOverTls) {
  FakeServer server(
      [&](const Request&, Connection& c, std::stop_token) {
        c.StartChunked();
        c.Chunk(Event("ADDED", "a", "1"));
        c.Chunk(Event("DELETED", "a", "2"));
        c.EndChunked();
      },
      &server_cert_);
  Config config;
  config.server = server.url();
  config.ca_pem = ca_.cert_pem();
  Result<std::unique_ptr<Client>> client = Client::Create(config);
  ASSERT_TRUE(client.ok());
  std::vector<WatchEventType> types;
  ApiStatus result = (*client)->Watch(
      kConfigMaps, "ns", {}, [&](const WatchEvent& event) { types.push_back(event.type); });
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(types, (std::vector<WatchEventType>{WatchEventType::kAdded, WatchEventType::kDeleted}));
}

// ---- Events ----

TEST(EventTest, DescribesTheInvolvedObject) {
  const json pod = {
      {"metadata",
       {{"name", "w-0"}, {"namespace", "team"}, {"uid", "u-1"}, {"resourceVersion", "77"}}}};
  const auto now = std::chrono::system_clock::from_time_t(1700000000);
  const json event = MakeEvent(kPods, pod, EventType::kWarning, "Evicted", "node drained",
                               "virtualflow-operator", now);
  EXPECT_EQ(event["metadata"]["namespace"], "team");
  EXPECT_EQ(event["metadata"]["name"].get<std::string>().rfind("w-0.", 0), 0u);
  EXPECT_EQ(event["involvedObject"], (json{{"apiVersion", "v1"},
                                           {"kind", "Pod"},
                                           {"name", "w-0"},
                                           {"namespace", "team"},
                                           {"uid", "u-1"},
                                           {"resourceVersion", "77"}}));
  EXPECT_EQ(event["type"], "Warning");
  EXPECT_EQ(event["reason"], "Evicted");
  EXPECT_EQ(event["count"], 1);
  EXPECT_EQ(event["firstTimestamp"], "2023-11-14T22:13:20Z");
  EXPECT_EQ(event["source"]["component"], "virtualflow-operator");

  const json node_event = MakeEvent(kNodes, json{{"metadata", {{"name", "gpu-1"}}}},
                                    EventType::kNormal, "R", std::string(5000, 'm'), "c", now);
  EXPECT_EQ(node_event["metadata"]["namespace"], "default");
  EXPECT_FALSE(node_event["involvedObject"].contains("namespace"));
  EXPECT_EQ(node_event["message"].get<std::string>().size(), 1024u);
}

// ---- Reflector ----

// A fake API server for one resource: lists answer from a script, watches from another.
class ScriptedApi {
 public:
  using ListReply = std::string;
  // Each watch gets the next script: the events to send, then either end the stream normally or
  // hold it open.
  struct WatchScript {
    std::string events;
    bool hold = false;
  };

  ScriptedApi(std::vector<ListReply> lists, std::vector<WatchScript> watches)
      : lists_(std::move(lists)),
        watches_(std::move(watches)),
        server_([this](const Request& r, Connection& c, std::stop_token s) { Serve(r, c, s); }) {}

  std::string url() const { return server_.url(); }
  std::vector<std::string> watch_versions() {
    std::lock_guard<std::mutex> lock(mu_);
    return watch_versions_;
  }

 private:
  void Serve(const Request& request, Connection& c, std::stop_token stop) {
    std::unique_lock<std::mutex> lock(mu_);
    const std::string query = request.Query();
    if (query.find("watch=true") == std::string::npos) {
      const std::string reply = lists_.at(std::min(list_calls_++, lists_.size() - 1));
      lock.unlock();
      c.Respond(200, reply);
      return;
    }
    const size_t rv = query.find("resourceVersion=");
    watch_versions_.push_back(
        rv == std::string::npos ? "" : query.substr(rv + 16, query.find('&', rv) - rv - 16));
    const WatchScript script = watches_.at(std::min(watch_calls_++, watches_.size() - 1));
    lock.unlock();
    c.StartChunked();
    if (!script.events.empty()) c.Chunk(script.events);
    if (script.hold) {
      HoldUntil(stop, [] { return false; });
    } else {
      c.EndChunked();
    }
  }

  std::mutex mu_;
  std::vector<ListReply> lists_;
  std::vector<WatchScript> watches_;
  size_t list_calls_ = 0;
  size_t watch_calls_ = 0;
  std::vector<std::string> watch_versions_;
  FakeServer server_;
};

constexpr char kGoneEvent[] =
    R"({"type":"ERROR","object":{"kind":"Status","reason":"Expired","message":"too old",)"
    R"("code":410}})"
    "\n";

// Runs a reflector on its own thread until `done` says so (or 10 s pass).
template <typename Done>
ReflectorStats RunReflector(Client& client, ReflectorOptions options, ReflectorHandlers handlers,
                            Done done) {
  Reflector reflector(client, kConfigMaps, "ns", std::move(options), std::move(handlers));
  std::jthread thread([&](std::stop_token stop) { reflector.Run(stop); });
  const Clock::time_point deadline = Clock::now() + seconds(10);
  while (!done(reflector) && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_TRUE(done(reflector)) << "the reflector did not get there in 10 s";
  thread.request_stop();
  thread.join();
  return reflector.stats();
}

TEST(ReflectorTest, ListsWatchesAndListsAgainOnGone) {
  ScriptedApi api(
      {R"({"metadata":{"resourceVersion":"10"},"items":[{"metadata":{"name":"a"}}]})",
       R"({"metadata":{"resourceVersion":"20"},"items":[{"metadata":{"name":"b"}}]})"},
      {{Event("ADDED", "c", "11") + kGoneEvent, false}, {Event("ADDED", "d", "21"), true}});
  std::unique_ptr<Client> client = NewClient(api.url());
  std::mutex mu;
  std::vector<std::string> log;
  ReflectorHandlers handlers;
  handlers.on_sync = [&](const std::vector<json>& items, const std::string& rv) {
    std::lock_guard<std::mutex> lock(mu);
    std::string names;
    for (const json& item : items) names += item["metadata"]["name"].get<std::string>();
    log.push_back("sync " + names + "@" + rv);
  };
  handlers.on_event = [&](WatchEvent event) {
    std::lock_guard<std::mutex> lock(mu);
    log.push_back(std::string(WatchEventTypeName(event.type)) + " " +
                  event.object["metadata"]["name"].get<std::string>());
  };
  ReflectorOptions options;
  options.initial_backoff = milliseconds(10);
  const ReflectorStats stats = RunReflector(
      *client, options, handlers, [&](Reflector& r) { return r.resource_version() == "21"; });
  EXPECT_EQ(log, (std::vector<std::string>{"sync a@10", "ADDED c", "sync b@20", "ADDED d"}));
  EXPECT_EQ(stats.lists, 2u);
  EXPECT_EQ(stats.gone, 1u);
  EXPECT_EQ(api.watch_versions(), (std::vector<std::string>{"10", "20"}));
}

TEST(ReflectorTest, ResumesFromTheLastVersionWhenTheServerEndsTheStream) {
  ScriptedApi api({R"({"metadata":{"resourceVersion":"10"},"items":[]})"},
                  {{Event("ADDED", "a", "11"), false},
                   {Event("BOOKMARK", "", "15"), false},
                   {Event("MODIFIED", "a", "16"), true}});
  std::unique_ptr<Client> client = NewClient(api.url());
  std::atomic<int> events{0};
  ReflectorHandlers handlers;
  handlers.on_event = [&](const WatchEvent&) { ++events; };
  const ReflectorStats stats = RunReflector(
      *client, {}, handlers, [&](Reflector& r) { return r.resource_version() == "16"; });
  EXPECT_EQ(stats.lists, 1u);
  EXPECT_EQ(stats.watches, 3u);
  EXPECT_EQ(stats.bookmarks, 1u);
  EXPECT_EQ(events.load(), 2);  // bookmarks are not passed on
  EXPECT_EQ(api.watch_versions(), (std::vector<std::string>{"10", "11", "15"}));
}

TEST(ReflectorTest, ResumeFromSkipsTheFirstListUntilGone) {
  ScriptedApi api({R"({"metadata":{"resourceVersion":"30"},"items":[]})"},
                  {{kGoneEvent, false}, {"", true}});
  std::unique_ptr<Client> client = NewClient(api.url());
  ReflectorOptions options;
  options.resume_from = "1";
  std::atomic<int> syncs{0};
  ReflectorHandlers handlers;
  handlers.on_sync = [&](const std::vector<json>&, const std::string&) { ++syncs; };
  // Done once the server has seen the second watch (the reflector counts it just before).
  const ReflectorStats stats = RunReflector(
      *client, options, handlers, [&](Reflector&) { return api.watch_versions().size() >= 2; });
  EXPECT_EQ(syncs.load(), 1);
  EXPECT_EQ(stats.gone, 1u);
  EXPECT_EQ(api.watch_versions(), (std::vector<std::string>{"1", "30"}));
}

TEST(ReflectorTest, BacksOffAndRetriesAFailingList) {
  std::atomic<int> calls{0};
  FakeServer server([&](const Request& request, Connection& c, std::stop_token stop) {
    if (request.Query().find("watch=true") != std::string::npos) {
      c.StartChunked();
      HoldUntil(stop, [] { return false; });
      return;
    }
    if (calls++ < 2) {
      c.Respond(500, R"({"kind":"Status","reason":"InternalError","message":"etcd down"})");
    } else {
      c.Respond(200, R"({"metadata":{"resourceVersion":"5"},"items":[]})");
    }
  });
  std::unique_ptr<Client> client = NewClient(server.url());
  std::vector<std::string> errors;
  ReflectorHandlers handlers;
  handlers.on_error = [&](const ApiError& error) { errors.push_back(error.ToString()); };
  ReflectorOptions options;
  options.initial_backoff = milliseconds(20);
  const ReflectorStats stats =
      RunReflector(*client, options, handlers, [&](Reflector& r) { return r.stats().lists == 1; });
  EXPECT_EQ(stats.errors, 2u);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0], "list configmaps in ns: InternalError: etcd down (HTTP 500)");
}

}  // namespace
}  // namespace vf::kube
