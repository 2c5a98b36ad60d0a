// The client against a real kube-apiserver. tests/e2e/test_kube_client.py starts a control plane
// and runs this binary with the environment each suite needs; without it every test skips:
//
//   KubeconfigE2E  VF_TEST_KUBECONFIG: a kubeconfig with client certificates (the admin's)
//   TokenE2E       VF_TEST_TOKEN_KUBECONFIG: a kubeconfig whose contexts "token" and "token-file"
//                  authenticate a service account (VF_TEST_SA_NAMESPACE/VF_TEST_TOKEN_SA) by
//                  bearer token, inline and from a file; the account may only touch ConfigMaps
//   InClusterE2E   VF_TEST_IN_CLUSTER=1 with VF_SERVICEACCOUNT_DIR and KUBERNETES_SERVICE_HOST/
//                  PORT set up as in a pod, for a service account (VF_TEST_IN_CLUSTER_SA) that
//                  may only read ConfigMaps
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/kube/client.h"
#include "operator/kube/config.h"
#include "operator/kube/leader_election.h"
#include "operator/kube/reflector.h"

// See client_test.cc: cpprest's exit-time continuation, not a leak per request.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name LeakSanitizer looks up.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcpprest.so\n"; }

namespace vf::kube {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr char kNs[] = "kube-client-e2e";

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// A name no earlier run or test has used, so tests share the namespace without colliding.
std::string Unique(const std::string& prefix) {
  static std::atomic<int> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return prefix + "-" +
         std::to_string(std::chrono::duration_cast<milliseconds>(now).count() % 1000000) + "-" +
         std::to_string(counter++);
}

json ConfigMap(const std::string& name, json data = json::object(), json labels = nullptr) {
  json object = {{"metadata", {{"name", name}}}, {"data", std::move(data)}};
  if (!labels.is_null()) object["metadata"]["labels"] = std::move(labels);
  return object;
}

// Polls `done` until true or `timeout`; returns whether it came true.
template <typename Done>
bool WaitFor(Done done, milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return true;
}

// Collects watch events from a thread. Thread-safe.
class EventLog {
 public:
  void Add(WatchEvent event) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  std::vector<WatchEvent> Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  // (type, name) of events about objects named `name`.
  std::vector<std::string> For(const std::string& name) {
    std::vector<std::string> out;
    for (const WatchEvent& event : Get()) {
      const json& metadata = event.object["metadata"];
      if (metadata.value("name", "") == name) {
        out.push_back(std::string(WatchEventTypeName(event.type)));
      }
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<WatchEvent> events_;
};

class KubeconfigE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = Env("VF_TEST_KUBECONFIG");
    if (path.empty()) return;
    Result<Config> config = LoadKubeconfig(path);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    Result<std::unique_ptr<Client>> client = Client::Create(*config);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(client).value().release();
    ApiResult<json> ns = client_->Create(kNamespaces, "", json{{"metadata", {{"name", kNs}}}});
    ASSERT_TRUE(ns.ok() || ns.reason() == Reason::kAlreadyExists) << ns.status().ToString();
  }
  static void TearDownTestSuite() {
    delete client_;
    client_ = nullptr;
  }
  void SetUp() override {
    if (Env("VF_TEST_KUBECONFIG").empty()) {
      GTEST_SKIP() << "VF_TEST_KUBECONFIG is not set: run through tests/e2e/test_kube_client.py, "
                      "which starts a real API server";
    }
    ASSERT_NE(client_, nullptr);
  }
  Client& client() { return *client_; }

  static Client* client_;
};
Client* KubeconfigE2E::client_ = nullptr;

TEST_F(KubeconfigE2E, AdminKubeconfigUsesClientCertificates) {
  EXPECT_FALSE(client().config().client_cert_pem.empty());
  EXPECT_FALSE(client().config().ca_pem.empty());
  EXPECT_TRUE(client().config().token.empty());
  ApiResult<json> ns = client().Get(kNamespaces, "", "default");
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  EXPECT_EQ((*ns)["kind"], "Namespace");
}

TEST_F(KubeconfigE2E, ConfigMapCreateGetListPatchDelete) {
  const std::string name = Unique("cm");
  const std::string label = Unique("run");
  ApiResult<json> created =
      client().Create(kConfigMaps, kNs, ConfigMap(name, {{"a", "1"}}, {{"run", label}}));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ((*created)["metadata"]["namespace"], kNs);
  EXPECT_FALSE((*created)["metadata"]["uid"].get<std::string>().empty());

  ApiResult<json> got = client().Get(kConfigMaps, kNs, name);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)["data"]["a"], "1");

  ListOptions options;
  options.label_selector = "run=" + label;
  ApiResult<ObjectList> list = client().List(kConfigMaps, kNs, options);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->items.size(), 1u);
  EXPECT_EQ(list->items[0]["metadata"]["name"], name);
  EXPECT_EQ(list->items[0]["kind"], "ConfigMap");
  EXPECT_FALSE(list->resource_version.empty());

  ApiResult<json> patched =
      client().MergePatch(kConfigMaps, kNs, name, json{{"data", {{"a", nullptr}, {"b", "2"}}}});
  ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  EXPECT_FALSE((*patched)["data"].contains("a"));
  EXPECT_EQ((*patched)["data"]["b"], "2");

  DeleteOptions del;
  del.propagation_policy = "Background";
  ApiResult<json> deleted = client().Delete(kConfigMaps, kNs, name, del);
  ASSERT_TRUE(deleted.ok()) << deleted.status().ToString();
  ApiResult<json> gone = client().Get(kConfigMaps, kNs, name);
  EXPECT_EQ(gone.reason(), Reason::kNotFound);
}

TEST_F(KubeconfigE2E, ListFollowsPages) {
  const std::string label = Unique("page");
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(client()
                    .Create(kConfigMaps, kNs,
                            ConfigMap(label + "-" + std::to_string(i), {}, {{"page", label}}))
                    .ok());
  }
  ListOptions options;
  options.label_selector = "page=" + label;
  options.page_size = 3;
  const uint64_t before = client().requests_sent();
  ApiResult<ObjectList> list = client().List(kConfigMaps, kNs, options);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_EQ(list->items.size(), 7u);
  EXPECT_EQ(client().requests_sent() - before, 3u);
}

TEST_F(KubeconfigE2E, SecretCreatePatchAndPreconditionedDelete) {
  const std::string name = Unique("secret");
  ApiResult<json> created = client().Create(
      kSecrets, kNs,
      json{{"metadata", {{"name", name}}}, {"type", "Opaque"}, {"stringData", {{"token", "abc"}}}});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ((*created)["data"]["token"], "YWJj");  // base64("abc")
  const std::string uid = (*created)["metadata"]["uid"];

  ApiResult<json> patched =
      client().MergePatch(kSecrets, kNs, name, json{{"stringData", {{"extra", "x"}}}});
  ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  EXPECT_EQ((*patched)["data"]["extra"], "eA==");

  DeleteOptions wrong;
  wrong.precondition_uid = "00000000-0000-0000-0000-000000000000";
  ApiResult<json> refused = client().Delete(kSecrets, kNs, name, wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.reason(), Reason::kConflict);
  EXPECT_NE(refused.error().message.find("does not match the UID in record"), std::string::npos)
      << refused.error().message;

  DeleteOptions right;
  right.precondition_uid = uid;
  ASSERT_TRUE(client().Delete(kSecrets, kNs, name, right).ok());
  EXPECT_EQ(client().Get(kSecrets, kNs, name).reason(), Reason::kNotFound);
}

TEST_F(KubeconfigE2E, ServerErrorsCarryReasonAndMessage) {
  ApiResult<json> missing = client().Get(kConfigMaps, kNs, "no-such-thing");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.reason(), Reason::kNotFound);
  EXPECT_EQ(missing.error().http_code, 404);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            std::string("get configmaps ") + kNs +
                "/no-such-thing: NotFound: configmaps \"no-such-thing\" not found (HTTP 404)");

  const std::string name = Unique("dup");
  ASSERT_TRUE(client().Create(kConfigMaps, kNs, ConfigMap(name)).ok());
  ApiResult<json> again = client().Create(kConfigMaps, kNs, ConfigMap(name));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.reason(), Reason::kAlreadyExists);
  EXPECT_NE(again.error().message.find("already exists"), std::string::npos);

  ApiResult<json> current = client().Get(kConfigMaps, kNs, name);
  ASSERT_TRUE(current.ok());
  json stale = *current;
  json update = *current;
  update["data"] = {{"v", "1"}};
  ASSERT_TRUE(client().Replace(kConfigMaps, kNs, update).ok());
  stale["data"] = {{"v", "2"}};
  ApiResult<json> conflict = client().Replace(kConfigMaps, kNs, stale);
  ASSERT_FALSE(conflict.ok());
  EXPECT_EQ(conflict.reason(), Reason::kConflict);
  EXPECT_NE(conflict.error().message.find("the object has been modified"), std::string::npos);

  ApiResult<json> invalid = client().Create(kConfigMaps, kNs, ConfigMap("Not_A_Valid_Name"));
  ASSERT_FALSE(invalid.ok());
  EXPECT_EQ(invalid.reason(), Reason::kInvalid);
  EXPECT_EQ(invalid.error().http_code, 422);
  EXPECT_NE(invalid.error().message.find("metadata.name: Invalid value"), std::string::npos)
      << invalid.error().message;
  ASSERT_TRUE(invalid.error().details["causes"].is_array());
  EXPECT_EQ(invalid.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(KubeconfigE2E, NodeStatusGoesThroughTheStatusSubresource) {
  const std::string name = Unique("node");
  ApiResult<json> created =
      client().Create(kNodes, "", json{{"metadata", {{"name", name}, {"labels", {{"e2e", "1"}}}}}});
  ASSERT_TRUE(created.ok()) << created.status().ToString();

  const json condition = {{"type", "Ready"},
                          {"status", "True"},
                          {"reason", "KubeletReady"},
                          {"message", "fake node"},
                          {"lastHeartbeatTime", FormatTime(std::chrono::system_clock::now())},
                          {"lastTransitionTime", FormatTime(std::chrono::system_clock::now())}};
  ApiResult<json> patched = client().PatchStatus(
      kNodes, "", name,
      json{{"status", {{"conditions", json::array({condition})}, {"capacity", {{"cpu", "8"}}}}}});
  ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  EXPECT_EQ((*patched)["status"]["conditions"][0]["type"], "Ready");
  EXPECT_EQ((*patched)["status"]["capacity"]["cpu"], "8");

  // The main resource ignores status: a patch there leaves it as it was.
  ApiResult<json> main =
      client().MergePatch(kNodes, "", name, json{{"status", {{"capacity", {{"cpu", "64"}}}}}});
  ASSERT_TRUE(main.ok()) << main.status().ToString();
  EXPECT_EQ((*main)["status"]["capacity"]["cpu"], "8");

  // A full write of the status, conditional on the version read. Controllers (the TTL
  // controller annotates every node) may write the node in between: read, modify, write, and
  // again on a conflict, as a controller would.
  json node;
  ApiResult<json> replaced = client().Get(kNodes, "", name);
  for (int attempt = 0; attempt < 5; ++attempt) {
    ApiResult<json> current = client().Get(kNodes, "", name);
    ASSERT_TRUE(current.ok()) << current.status().ToString();
    node = *current;
    node["status"]["capacity"]["cpu"] = "16";
    replaced = client().ReplaceStatus(kNodes, "", node);
    if (replaced.reason() != Reason::kConflict) break;
  }
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  EXPECT_EQ((*replaced)["status"]["capacity"]["cpu"], "16");
  // `node` carries the version before that write.
  ApiResult<json> stale = client().ReplaceStatus(kNodes, "", node);
  EXPECT_EQ(stale.reason(), Reason::kConflict);

  ASSERT_TRUE(client().Delete(kNodes, "", name).ok());
}

TEST_F(KubeconfigE2E, EventsAreRecordedAboutAnObject) {
  const std::string name = Unique("evented");
  ApiResult<json> cm = client().Create(kConfigMaps, kNs, ConfigMap(name));
  ASSERT_TRUE(cm.ok()) << cm.status().ToString();
  ApiResult<json> event = client().CreateEvent(kConfigMaps, *cm, EventType::kWarning, "Resized",
                                               "workers 2 -> 3 (node gpu-1 joined)");
  ASSERT_TRUE(event.ok()) << event.status().ToString();

  ListOptions options;
  options.field_selector = "involvedObject.name=" + name;
  ApiResult<ObjectList> events = client().List(kEvents, kNs, options);
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  ASSERT_EQ(events->items.size(), 1u);
  const json& recorded = events->items[0];
  EXPECT_EQ(recorded["reason"], "Resized");
  EXPECT_EQ(recorded["message"], "workers 2 -> 3 (node gpu-1 joined)");
  EXPECT_EQ(recorded["type"], "Warning");
  EXPECT_EQ(recorded["count"], 1);
  EXPECT_EQ(recorded["involvedObject"]["kind"], "ConfigMap");
  EXPECT_EQ(recorded["involvedObject"]["uid"], (*cm)["metadata"]["uid"]);
  EXPECT_EQ(recorded["source"]["component"], "virtualflow-operator");
}

TEST_F(KubeconfigE2E, WatchSeesAddedModifiedDeletedInOrder) {
  const std::string name = Unique("watched");
  ApiResult<ObjectList> list = client().List(kConfigMaps, kNs);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EventLog log;
  std::stop_source stop;
  WatchOptions options;
  options.resource_version = list->resource_version;
  auto watch = std::async(std::launch::async, [&] {
    return client().Watch(
        kConfigMaps, kNs, options, [&](WatchEvent event) { log.Add(std::move(event)); },
        stop.get_token());
  });
  ASSERT_TRUE(client().Create(kConfigMaps, kNs, ConfigMap(name, {{"v", "1"}})).ok());
  ASSERT_TRUE(client().MergePatch(kConfigMaps, kNs, name, json{{"data", {{"v", "2"}}}}).ok());
  ASSERT_TRUE(client().Delete(kConfigMaps, kNs, name).ok());
  EXPECT_TRUE(WaitFor([&] { return log.For(name).size() >= 3; }, seconds(30)));
  stop.request_stop();
  ASSERT_EQ(watch.wait_for(seconds(10)), std::future_status::ready);
  ApiStatus result = watch.get();
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(log.For(name), (std::vector<std::string>{"ADDED", "MODIFIED", "DELETED"}));
  // Each event's version is newer than the list's: nothing from before was replayed.
  for (const WatchEvent& event : log.Get()) {
    EXPECT_GT(std::stoull(ResourceVersionOf(event.object)), std::stoull(list->resource_version));
  }
}

TEST_F(KubeconfigE2E, BookmarksArriveWhenAsked) {
  // What bookmarks are for: a watch that filters out every event still learns how far the
  // store has moved. The API server sends one 2 s before a watch's timeout (and about once a
  // minute) when its resource has moved past the watch's version, which the write below does.
  const std::string selector = "bookmark-test=" + Unique("none");
  ListOptions list_options;
  list_options.label_selector = selector;
  ApiResult<ObjectList> list = client().List(kConfigMaps, kNs, list_options);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  WatchOptions options;
  options.resource_version = list->resource_version;
  options.label_selector = selector;
  options.allow_bookmarks = true;
  options.timeout_seconds = 10;
  std::atomic<bool> started{false};
  std::atomic<uint64_t> written{0};
  std::thread writer([&] {
    WaitFor([&] { return started.load(); }, seconds(30));
    std::this_thread::sleep_for(milliseconds(500));
    ApiResult<json> unrelated = client().Create(kConfigMaps, kNs, ConfigMap(Unique("unseen")));
    EXPECT_TRUE(unrelated.ok()) << unrelated.status().ToString();
    if (unrelated.ok()) written = std::stoull(ResourceVersionOf(*unrelated));
  });
  int events = 0;
  uint64_t bookmark = 0;
  // Until a bookmark covers the write (one from before it may come first).
  const Clock::time_point deadline = Clock::now() + seconds(90);
  while ((written.load() == 0 || bookmark < written.load()) && Clock::now() < deadline) {
    started = true;
    ApiStatus result = client().Watch(kConfigMaps, kNs, options, [&](WatchEvent event) {
      if (event.type != WatchEventType::kBookmark) {
        ++events;
        return;
      }
      // A bookmark is an object of the watched kind with nothing but its version.
      EXPECT_EQ(event.object["kind"], "ConfigMap");
      bookmark = std::max<uint64_t>(bookmark, std::stoull(ResourceVersionOf(event.object)));
    });
    ASSERT_TRUE(result.ok()) << result.status().ToString();
  }
  writer.join();
  ASSERT_GT(bookmark, 0u) << "no bookmark within 90 s";
  EXPECT_GE(bookmark, written.load());
  EXPECT_EQ(events, 0);
}

// A custom resource made by the test. A watch cache starts with the history from its own start,
// and the built-in resources' caches started with the API server, on an empty store: for them
// even version "1" is still in the window. A CRD's cache starts when the CRD is made, so older
// versions are refused with 410, as they are on any long-running cluster.
constexpr Resource kCrds{"apiextensions.k8s.io", "v1", "customresourcedefinitions",
                         "CustomResourceDefinition", false};
constexpr Resource kWidgets{"e2e.virtualflow.io", "v1", "widgets", "Widget", true};

void EnsureWidgets(Client& client) {
  const json crd = json::parse(R"({
    "metadata": {"name": "widgets.e2e.virtualflow.io"},
    "spec": {
      "group": "e2e.virtualflow.io", "scope": "Namespaced",
      "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
      "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object",
                                                   "x-kubernetes-preserve-unknown-fields": true}}}]
    }})");
  ApiResult<json> created = client.Create(kCrds, "", crd);
  ASSERT_TRUE(created.ok() || created.reason() == Reason::kAlreadyExists)
      << created.status().ToString();
  // Served once established; until then the path is NotFound.
  EXPECT_TRUE(WaitFor([&] { return client.List(kWidgets, kNs).ok(); }, seconds(60)));
}

TEST_F(KubeconfigE2E, WatchFromAVersionOlderThanTheCacheIsGone) {
  EnsureWidgets(client());
  WatchOptions options;
  options.resource_version = "1";
  options.timeout_seconds = 30;
  std::vector<WatchEventType> types;
  ApiStatus result = client().Watch(kWidgets, kNs, options,
                                    [&](const WatchEvent& event) { types.push_back(event.type); });
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.reason(), Reason::kGone) << result.status().ToString();
  EXPECT_EQ(result.error().server_reason, "Expired");
  EXPECT_EQ(result.error().http_code, 410);
  EXPECT_NE(result.error().message.find("too old resource version: 1"), std::string::npos)
      << result.error().message;
  EXPECT_EQ(types, std::vector<WatchEventType>{WatchEventType::kError});
}

TEST_F(KubeconfigE2E, ReflectorListsAgainAfterGone) {
  EnsureWidgets(client());
  const std::string name = Unique("reflected");
  ASSERT_TRUE(client().Create(kWidgets, kNs, json{{"metadata", {{"name", name}}}}).ok());
  std::atomic<int> synced_with_object{0};
  EventLog log;
  ReflectorOptions options;
  options.resume_from = "1";  // older than the cache: the first watch is refused with 410
  ReflectorHandlers handlers;
  handlers.on_sync = [&](const std::vector<json>& items, const std::string&) {
    for (const json& item : items) {
      if (item["metadata"]["name"] == name) ++synced_with_object;
    }
  };
  handlers.on_event = [&](WatchEvent event) { log.Add(std::move(event)); };
  Reflector reflector(client(), kWidgets, kNs, options, handlers);
  std::jthread thread([&](std::stop_token stop) { reflector.Run(stop); });
  ASSERT_TRUE(WaitFor([&] { return synced_with_object.load() > 0; }, seconds(30)));
  EXPECT_EQ(reflector.stats().gone, 1u);
  EXPECT_EQ(reflector.stats().lists, 1u);
  // And it watches from the new list's version on.
  const std::string later = Unique("later");
  ASSERT_TRUE(client().Create(kWidgets, kNs, json{{"metadata", {{"name", later}}}}).ok());
  EXPECT_TRUE(WaitFor([&] { return !log.For(later).empty(); }, seconds(30)));
  EXPECT_EQ(log.For(later), std::vector<std::string>{"ADDED"});
  thread.request_stop();
}

TEST_F(KubeconfigE2E, CustomResourceStatusSubresource) {
  EnsureWidgets(client());
  const std::string name = Unique("widget");
  ApiResult<json> created = client().Create(
      kWidgets, kNs,
      json{{"metadata", {{"name", name}}}, {"spec", {{"size", 3}}}, {"status", {{"phase", "x"}}}});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  // With a status subresource, status written through the main resource is dropped...
  EXPECT_FALSE(created->contains("status"));
  // ...and written through the subresource, where spec changes are dropped instead.
  ApiResult<json> patched = client().PatchStatus(
      kWidgets, kNs, name, json{{"spec", {{"size", 9}}}, {"status", {{"phase", "Running"}}}});
  ASSERT_TRUE(patched.ok()) << patched.status().ToString();
  EXPECT_EQ((*patched)["status"]["phase"], "Running");
  EXPECT_EQ((*patched)["spec"]["size"], 3);
  json object = *patched;
  object["status"]["phase"] = "Succeeded";
  ApiResult<json> replaced = client().ReplaceStatus(kWidgets, kNs, object);
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  EXPECT_EQ((*replaced)["status"]["phase"], "Succeeded");
  EXPECT_EQ(client().ReplaceStatus(kWidgets, kNs, object).reason(), Reason::kConflict);
}

TEST_F(KubeconfigE2E, ReflectorReconnectsWhenTheServerEndsTheStream) {
  EventLog log;
  ReflectorOptions options;
  options.min_watch_timeout = seconds(1);  // every watch ends after 1-2 s
  ReflectorHandlers handlers;
  handlers.on_event = [&](WatchEvent event) { log.Add(std::move(event)); };
  Reflector reflector(client(), kConfigMaps, kNs, options, handlers);
  std::jthread thread([&](std::stop_token stop) { reflector.Run(stop); });
  ASSERT_TRUE(WaitFor([&] { return reflector.stats().lists == 1; }, seconds(30)));
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    names.push_back(Unique("across"));
    ASSERT_TRUE(client().Create(kConfigMaps, kNs, ConfigMap(names.back())).ok());
    std::this_thread::sleep_for(milliseconds(1500));
  }
  for (const std::string& name : names) {
    EXPECT_TRUE(WaitFor([&] { return !log.For(name).empty(); }, seconds(30))) << name;
    EXPECT_EQ(log.For(name), std::vector<std::string>{"ADDED"}) << name;
  }
  const ReflectorStats stats = reflector.stats();
  EXPECT_GE(stats.watches, 3u);
  EXPECT_EQ(stats.lists, 1u);  // resumed each time, never listed again
  EXPECT_EQ(stats.gone, 0u);
  thread.request_stop();
}

TEST_F(KubeconfigE2E, LeaseReplaceIsOptimisticallyConcurrent) {
  const std::string name = Unique("leader");
  // metav1.MicroTime: RFC 3339 with exactly six fractional digits.
  std::string now = FormatTime(std::chrono::system_clock::now());
  now.insert(now.size() - 1, ".000000");
  ApiResult<json> created = client().Create(kLeases, kNs,
                                            json{{"metadata", {{"name", name}}},
                                                 {"spec",
                                                  {{"holderIdentity", "operator-a"},
                                                   {"leaseDurationSeconds", 15},
                                                   {"acquireTime", now},
                                                   {"renewTime", now}}}});
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  json lease = *created;
  EXPECT_EQ(lease["apiVersion"], "coordination.k8s.io/v1");

  json renewed = lease;
  renewed["spec"]["leaseTransitions"] = 1;
  ApiResult<json> first = client().Replace(kLeases, kNs, renewed);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_NE(ResourceVersionOf(*first), ResourceVersionOf(lease));

  // A second candidate that read the lease before the renewal loses.
  json usurper = lease;
  usurper["spec"]["holderIdentity"] = "operator-b";
  ApiResult<json> second = client().Replace(kLeases, kNs, usurper);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.reason(), Reason::kConflict);
  EXPECT_NE(second.status().message().find("replace leases.coordination.k8s.io"),
            std::string::npos);
  ApiResult<json> current = client().Get(kLeases, kNs, name);
  ASSERT_TRUE(current.ok());
  EXPECT_EQ((*current)["spec"]["holderIdentity"], "operator-a");
}

TEST_F(KubeconfigE2E, RateLimiterBoundsTheRequestRate) {
  Result<Config> config = LoadKubeconfig(Env("VF_TEST_KUBECONFIG"));
  ASSERT_TRUE(config.ok());
  ClientOptions options;
  options.qps = 20;
  options.burst = 1;
  Result<std::unique_ptr<Client>> limited = Client::Create(*config, options);
  ASSERT_TRUE(limited.ok());
  constexpr int kCalls = 21;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kCalls; ++i) {
    ApiResult<json> ns = (*limited)->Get(kNamespaces, "", kNs);
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  }
  // 20 intervals of 1/20 s after the first, free, token.
  EXPECT_GE(Clock::now() - start, milliseconds((kCalls - 1) * 1000 / 20));
  EXPECT_EQ((*limited)->requests_sent(), static_cast<uint64_t>(kCalls));
}

TEST_F(KubeconfigE2E, WrongTokenIsUnauthorized) {
  Config config = client().config();
  config.client_cert_pem.clear();
  config.client_key_pem.clear();
  config.token = "not-a-real-token";
  Result<std::unique_ptr<Client>> anonymous = Client::Create(config);
  ASSERT_TRUE(anonymous.ok());
  ApiResult<json> ns = (*anonymous)->Get(kNamespaces, "", "default");
  ASSERT_FALSE(ns.ok());
  EXPECT_EQ(ns.reason(), Reason::kUnauthorized);
  EXPECT_EQ(ns.error().http_code, 401);
}

TEST_F(KubeconfigE2E, RequestObserverSeesEachVerbAndStatus) {
  Result<Config> config = LoadKubeconfig(Env("VF_TEST_KUBECONFIG"));
  ASSERT_TRUE(config.ok());
  Result<std::unique_ptr<Client>> observed = Client::Create(*config);
  ASSERT_TRUE(observed.ok());
  std::mutex mu;
  std::vector<std::string> seen;
  (*observed)->set_request_observer([&](std::string_view verb, int status, double took) {
    EXPECT_GE(took, 0.0);
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(std::string(verb) + " " + std::to_string(status));
  });
  Client& c = **observed;
  const std::string name = Unique("observed");
  ApiResult<json> created = c.Create(kConfigMaps, kNs, ConfigMap(name));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_TRUE(c.Get(kConfigMaps, kNs, name).ok());
  EXPECT_EQ(c.Get(kConfigMaps, kNs, name + "-missing").reason(), Reason::kNotFound);
  // A write that changes nothing leaves the version as it was: change something, so that the
  // second write is stale.
  json changed = *created;
  changed["data"] = {{"k", "1"}};
  EXPECT_TRUE(c.Replace(kConfigMaps, kNs, changed).ok());
  EXPECT_EQ(c.Replace(kConfigMaps, kNs, changed).reason(), Reason::kConflict);
  EXPECT_TRUE(c.MergePatch(kConfigMaps, kNs, name, json{{"data", {{"k", "v"}}}}).ok());
  ListOptions list;
  list.page_size = 0;
  EXPECT_TRUE(c.List(kConfigMaps, kNs, list).ok());
  WatchOptions watch;
  watch.timeout_seconds = 1;
  EXPECT_TRUE(c.Watch(kConfigMaps, kNs, watch, [](const WatchEvent&) {}).ok());
  EXPECT_TRUE(c.Delete(kConfigMaps, kNs, name).ok());
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(seen, (std::vector<std::string>{"create 201", "get 200", "get 404", "update 200",
                                            "update 409", "patch 200", "list 200", "watch 200",
                                            "delete 200"}));
}

// ---- Leader election on a real Lease ----

// One candidate: an elector on a client of its own, run on a thread, its callbacks recorded.
// Short durations keep the tests quick: lease 2 s, renew deadline 1.5 s, retry every 0.2 s.
// Thread-safe.
class Candidate {
 public:
  Candidate(const std::string& lease, const std::string& identity, bool release_on_cancel = true) {
    Result<Config> config = LoadKubeconfig(Env("VF_TEST_KUBECONFIG"));
    EXPECT_TRUE(config.ok()) << config.status().ToString();
    Result<std::unique_ptr<Client>> client = Client::Create(*config);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(client).value();
    LeaderElectionConfig election;
    election.ns = kNs;
    election.name = lease;
    election.identity = identity;
    election.lease_duration = seconds(2);
    election.renew_deadline = milliseconds(1500);
    election.retry_period = milliseconds(200);
    election.release_on_cancel = release_on_cancel;
    election.on_started_leading = [this](std::stop_token) { ++started_; };
    election.on_stopped_leading = [this] { ++stopped_; };
    election.on_new_leader = [this](const std::string& leader) {
      std::lock_guard<std::mutex> lock(mu_);
      leaders_.push_back(leader);
    };
    Result<std::unique_ptr<LeaderElector>> elector = LeaderElector::Create(*client_, election);
    EXPECT_TRUE(elector.ok()) << elector.status().ToString();
    elector_ = std::move(elector).value();
  }
  ~Candidate() { Stop(); }

  void Start() {
    result_ = std::async(std::launch::async, [this] { return elector_->Run(stop_.get_token()); });
  }
  void Stop() {
    stop_.request_stop();
    if (result_.valid()) result_.wait();
  }
  // Run's result, once it has returned within `timeout`.
  std::optional<Status> Outcome(milliseconds timeout = milliseconds(10000)) {
    if (!result_.valid() || result_.wait_for(timeout) != std::future_status::ready) {
      return std::nullopt;
    }
    return result_.get();
  }
  bool leading() const { return elector_->IsLeader(); }
  int started() const { return started_.load(); }
  int stopped() const { return stopped_.load(); }
  std::vector<std::string> leaders() {
    std::lock_guard<std::mutex> lock(mu_);
    return leaders_;
  }

 private:
  std::unique_ptr<Client> client_;
  std::unique_ptr<LeaderElector> elector_;
  std::stop_source stop_;
  std::future<Status> result_;
  std::atomic<int> started_{0};
  std::atomic<int> stopped_{0};
  std::mutex mu_;
  std::vector<std::string> leaders_;
};

TEST_F(KubeconfigE2E, LeaderElectionOfTwoCandidatesExactlyOneLeads) {
  const std::string lease = Unique("election");
  Candidate a(lease, "a");
  Candidate b(lease, "b");
  a.Start();
  b.Start();
  ASSERT_TRUE(WaitFor([&] { return a.leading() || b.leading(); }, seconds(20)));
  // For a few lease durations: never both, never neither.
  for (int i = 0; i < 60; ++i) {
    EXPECT_NE(a.leading(), b.leading()) << "at " << i * 100 << " ms";
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_EQ(a.started() + b.started(), 1);
  EXPECT_EQ(a.stopped() + b.stopped(), 0);
  const std::string leader = a.leading() ? "a" : "b";
  ApiResult<json> current = client().Get(kLeases, kNs, lease);
  ASSERT_TRUE(current.ok()) << current.status().ToString();
  EXPECT_EQ((*current)["spec"]["holderIdentity"], leader);
  EXPECT_EQ((*current)["spec"]["leaseDurationSeconds"], 2);
  // Both learned who leads.
  EXPECT_EQ(a.leaders(), std::vector<std::string>{leader});
  EXPECT_EQ(b.leaders(), std::vector<std::string>{leader});
}

TEST_F(KubeconfigE2E, LeaderElectionReleaseOnCancelHandsOverPromptly) {
  const std::string lease = Unique("election");
  Candidate a(lease, "a");
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.leading(); }, seconds(20)));
  Candidate b(lease, "b");
  b.Start();
  ASSERT_TRUE(WaitFor([&] { return b.leaders() == std::vector<std::string>{"a"}; }, seconds(20)));
  EXPECT_FALSE(b.leading());

  a.Stop();
  const Clock::time_point released = Clock::now();
  std::optional<Status> result = a.Outcome();
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->ok()) << result->ToString();
  EXPECT_EQ(a.stopped(), 1);
  // Taken over within b's retry period (plus jitter), not after the 2 s lease.
  ASSERT_TRUE(WaitFor([&] { return b.leading(); }, seconds(10)));
  EXPECT_LT(Clock::now() - released, milliseconds(1500));
  ApiResult<json> current = client().Get(kLeases, kNs, lease);
  ASSERT_TRUE(current.ok());
  EXPECT_EQ((*current)["spec"]["holderIdentity"], "b");
  EXPECT_EQ((*current)["spec"]["leaseTransitions"], 1);
  EXPECT_EQ(b.leaders(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(KubeconfigE2E, LeaderElectionTakeoverAfterExpiryIncrementsLeaseTransitions) {
  const std::string lease = Unique("election");
  {
    Candidate a(lease, "a", /*release_on_cancel=*/false);
    a.Start();
    ASSERT_TRUE(WaitFor([&] { return a.leading(); }, seconds(20)));
  }  // stopped without releasing: the Lease stays a's until it expires
  ApiResult<json> left = client().Get(kLeases, kNs, lease);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ((*left)["spec"]["holderIdentity"], "a");
  EXPECT_EQ((*left)["spec"]["leaseTransitions"], 0);

  Candidate b(lease, "b");
  const Clock::time_point start = Clock::now();
  b.Start();
  ASSERT_TRUE(WaitFor([&] { return b.leading(); }, seconds(20)));
  // b first saw a's record when it started, and waited the lease out by its own clock.
  EXPECT_GE(Clock::now() - start, milliseconds(2000));
  ApiResult<json> current = client().Get(kLeases, kNs, lease);
  ASSERT_TRUE(current.ok());
  EXPECT_EQ((*current)["spec"]["holderIdentity"], "b");
  EXPECT_EQ((*current)["spec"]["leaseTransitions"], 1);
  EXPECT_NE((*current)["spec"]["acquireTime"], (*left)["spec"]["acquireTime"]);
}

TEST_F(KubeconfigE2E, LeaderElectionLeaderWhoseLeaseIsTakenStopsLeading) {
  const std::string lease = Unique("election");
  Candidate a(lease, "a");
  a.Start();
  ASSERT_TRUE(WaitFor([&] { return a.leading(); }, seconds(20)));
  // Someone else writes the Lease as theirs (as if a's renewals had been lost): read, modify,
  // write, again on a conflict with a's renewals.
  ApiResult<json> replaced = client().Get(kLeases, kNs, lease);
  for (int attempt = 0; attempt < 10; ++attempt) {
    ApiResult<json> current = client().Get(kLeases, kNs, lease);
    ASSERT_TRUE(current.ok()) << current.status().ToString();
    json usurped = *current;
    usurped["spec"]["holderIdentity"] = "usurper";
    std::string now = FormatMicroTime(std::chrono::system_clock::now());
    usurped["spec"]["renewTime"] = now;
    usurped["spec"]["acquireTime"] = now;
    replaced = client().Replace(kLeases, kNs, usurped);
    if (replaced.reason() != Reason::kConflict) break;
  }
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  const Clock::time_point taken = Clock::now();
  std::optional<Status> result = a.Outcome();
  ASSERT_TRUE(result.has_value()) << "a kept running";
  EXPECT_EQ(result->code(), StatusCode::kFailedPrecondition) << result->ToString();
  EXPECT_NE(result->message().find("now held by usurper"), std::string::npos) << result->ToString();
  // At its next renewal, well within the renew deadline.
  EXPECT_LT(Clock::now() - taken, milliseconds(1500));
  EXPECT_FALSE(a.leading());
  EXPECT_EQ(a.started(), 1);
  EXPECT_EQ(a.stopped(), 1);
  EXPECT_EQ(a.leaders(), (std::vector<std::string>{"a", "usurper"}));
  // And a left the usurper's record alone.
  ApiResult<json> current = client().Get(kLeases, kNs, lease);
  ASSERT_TRUE(current.ok());
  EXPECT_EQ((*current)["spec"]["holderIdentity"], "usurper");
}

// ---- Bearer tokens from a kubeconfig ----

class TokenE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = Env("VF_TEST_TOKEN_KUBECONFIG");
    if (path_.empty()) {
      GTEST_SKIP() << "VF_TEST_TOKEN_KUBECONFIG is not set: run through "
                      "tests/e2e/test_kube_client.py";
    }
    ns_ = Env("VF_TEST_SA_NAMESPACE");
    sa_ = Env("VF_TEST_TOKEN_SA");
  }
  void CheckWorks(const std::string& context) {
    Result<Config> config = LoadKubeconfig(path_, context);
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    EXPECT_FALSE(config->token.empty());
    EXPECT_TRUE(config->client_cert_pem.empty());
    EXPECT_EQ(config->default_namespace, ns_);
    Result<std::unique_ptr<Client>> client = Client::Create(*config);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    const std::string name = Unique(context);
    ApiResult<json> created = (*client)->Create(kConfigMaps, ns_, ConfigMap(name));
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    ASSERT_TRUE((*client)->List(kConfigMaps, ns_).ok());
    ASSERT_TRUE((*client)->Delete(kConfigMaps, ns_, name).ok());
    // The account may not read Secrets; the refusal names it.
    ApiResult<json> secret = (*client)->Get(kSecrets, ns_, "anything");
    ASSERT_FALSE(secret.ok());
    EXPECT_EQ(secret.reason(), Reason::kForbidden);
    EXPECT_NE(secret.error().message.find("system:serviceaccount:" + ns_ + ":" + sa_),
              std::string::npos)
        << secret.error().message;
    EXPECT_NE(secret.status().message().find("get secrets " + ns_ + "/anything: Forbidden: "),
              std::string::npos)
        << secret.status().message();
  }
  std::string path_;
  std::string ns_;
  std::string sa_;
};

TEST_F(TokenE2E, InlineToken) { CheckWorks("token"); }
TEST_F(TokenE2E, TokenFile) { CheckWorks("token-file"); }

// ---- In-cluster configuration ----

class InClusterE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Env("VF_TEST_IN_CLUSTER") != "1") {
      GTEST_SKIP() << "VF_TEST_IN_CLUSTER is not set: run through tests/e2e/test_kube_client.py";
    }
    Result<Config> config = InClusterConfig();
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    config_ = *config;
    Result<std::unique_ptr<Client>> client = Client::Create(config_);
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    client_ = std::move(client).value();
  }
  Config config_;
  std::unique_ptr<Client> client_;
};

TEST_F(InClusterE2E, ServiceAccountReadsItsNamespace) {
  EXPECT_EQ(config_.default_namespace, Env("VF_TEST_SA_NAMESPACE"));
  EXPECT_EQ(config_.token_file, ServiceAccountDir() + "/token");
  ApiResult<ObjectList> list = client_->List(kConfigMaps, config_.default_namespace);
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  // Every namespace gets the cluster's CA bundle as a ConfigMap.
  bool root_ca = false;
  for (const json& item : list->items) root_ca |= item["metadata"]["name"] == "kube-root-ca.crt";
  EXPECT_TRUE(root_ca);
}

TEST_F(InClusterE2E, RbacDenialIsForbiddenWithTheServersMessage) {
  const std::string ns = config_.default_namespace;
  const std::string sa = Env("VF_TEST_IN_CLUSTER_SA");
  ApiResult<json> created = client_->Create(kConfigMaps, ns, ConfigMap(Unique("denied")));
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.reason(), Reason::kForbidden);
  EXPECT_EQ(created.error().http_code, 403);
  EXPECT_NE(created.error().message.find("User \"system:serviceaccount:" + ns + ":" + sa +
                                         "\" cannot create resource \"configmaps\""),
            std::string::npos)
      << created.error().message;

  ApiResult<ObjectList> secrets = client_->List(kSecrets, ns);
  ASSERT_FALSE(secrets.ok());
  EXPECT_EQ(secrets.reason(), Reason::kForbidden);
  EXPECT_EQ(secrets.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(secrets.status().message().find("list secrets in " + ns + ": Forbidden: "),
            std::string::npos)
      << secrets.status().message();

  ApiStatus watch = client_->Watch(kPods, "", {}, [](const WatchEvent&) {});
  ASSERT_FALSE(watch.ok());
  EXPECT_EQ(watch.reason(), Reason::kForbidden);
}

}  // namespace
}  // namespace vf::kube
