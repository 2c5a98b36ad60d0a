#include "tests/e2e/pod_runner/cluster_view.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace vf::podrunner {
namespace {

using kube::WatchEvent;
using kube::WatchEventType;
using nlohmann::json;

json Pod(const std::string& name, const std::string& uid, const std::string& node = "") {
  return {{"metadata", {{"name", name}, {"namespace", "ns"}, {"uid", uid}}},
          {"spec", {{"nodeName", node}}}};
}
json Node(const std::string& name) { return {{"metadata", {{"name", name}}}}; }

TEST(ClusterViewTest, SyncedOnlyAfterBothLists) {
  ClusterView view;
  EXPECT_FALSE(view.Get().synced);
  view.SyncPods({});
  EXPECT_FALSE(view.Get().synced);
  view.SyncNodes({Node("gpu-1")});
  EXPECT_TRUE(view.Get().synced);
  EXPECT_EQ(view.Get().nodes, (std::set<std::string>{"gpu-1"}));
}

TEST(ClusterViewTest, PodsAreKeyedByUidSoAReplacementIsADifferentPod) {
  ClusterView view;
  view.SyncPods({Pod("a", "u1")});
  view.ApplyPodEvent({WatchEventType::kDeleted, Pod("a", "u1")});
  view.ApplyPodEvent({WatchEventType::kAdded, Pod("a", "u2", "gpu-1")});
  const auto s = view.Get();
  ASSERT_EQ(s.pods.size(), 1u);
  EXPECT_EQ(s.pods.count("u2"), 1u);
  EXPECT_EQ((*s.pods.at("u2"))["spec"]["nodeName"], "gpu-1");
}

TEST(ClusterViewTest, AListReplacesEverythingAndSnapshotsStayAsTaken) {
  ClusterView view;
  view.SyncPods({Pod("a", "u1"), Pod("b", "u2")});
  const auto before = view.Get();
  view.SyncPods({Pod("b", "u2")});
  const auto after = view.Get();
  EXPECT_EQ(before.pods.size(), 2u);
  EXPECT_EQ(after.pods.size(), 1u);
  EXPECT_GT(after.version, before.version);
}

TEST(ClusterViewTest, NodeEventsTrackTheLabelledSet) {
  ClusterView view;
  view.SyncNodes({Node("a")});
  const uint64_t v = view.Get().version;
  view.ApplyNodeEvent({WatchEventType::kModified, Node("a")});  // a heartbeat: no change
  EXPECT_EQ(view.Get().version, v);
  view.ApplyNodeEvent({WatchEventType::kAdded, Node("b")});
  view.ApplyNodeEvent({WatchEventType::kDeleted, Node("a")});  // or lost its label
  EXPECT_EQ(view.Get().nodes, (std::set<std::string>{"b"}));
}

TEST(ClusterViewTest, ObjectsWithoutMetadataDoNotBreakIt) {
  ClusterView view;
  view.SyncPods({json(), json::array(), Pod("a", "")});
  view.ApplyPodEvent({WatchEventType::kAdded, json("garbage")});
  view.ApplyNodeEvent({WatchEventType::kAdded, json::object()});
  EXPECT_EQ(view.Get().pods.count("ns/a"), 1u);
}

TEST(ClusterViewTest, WaitForChangeWakesOnAChangeAndOnWake) {
  ClusterView view;
  const auto far = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  const uint64_t v = view.Get().version;
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    view.SyncPods({});
  });
  view.WaitForChange(v, far);
  writer.join();
  EXPECT_GT(view.Get().version, v);

  const uint64_t v2 = view.Get().version;
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    view.Wake();
  });
  const auto start = std::chrono::steady_clock::now();
  view.WaitForChange(v2, far);
  waker.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

}  // namespace
}  // namespace vf::podrunner
