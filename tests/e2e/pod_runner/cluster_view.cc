#include "tests/e2e/pod_runner/cluster_view.h"

#include <utility>

#include "tests/e2e/pod_runner/pod_json.h"

namespace vf::podrunner {

using nlohmann::json;

std::string PodKey(const json& pod) {
  const PodRef ref = RefOf(pod);
  return ref.uid.empty() ? ref.ToString() : ref.uid;
}

void ClusterView::Changed() {
  ++version_;
  cv_.notify_all();
}

void ClusterView::SyncPods(std::vector<json> items) {
  std::map<std::string, PodPtr> pods;
  for (auto& item : items) {
    std::string key = PodKey(item);
    pods[std::move(key)] = std::make_shared<const json>(std::move(item));
  }
  std::lock_guard<std::mutex> lock(mu_);
  pods_ = std::move(pods);
  pods_synced_ = true;
  Changed();
}

void ClusterView::SyncNodes(const std::vector<json>& items) {
  std::set<std::string> nodes;
  for (const auto& item : items) {
    std::string name = StringAt(item, {"metadata", "name"});
    if (!name.empty()) nodes.insert(std::move(name));
  }
  std::lock_guard<std::mutex> lock(mu_);
  nodes_ = std::move(nodes);
  nodes_synced_ = true;
  Changed();
}

void ClusterView::ApplyPodEvent(kube::WatchEvent event) {
  std::string key = PodKey(event.object);
  std::lock_guard<std::mutex> lock(mu_);
  switch (event.type) {
    case kube::WatchEventType::kAdded:
    case kube::WatchEventType::kModified:
      pods_[std::move(key)] = std::make_shared<const json>(std::move(event.object));
      break;
    case kube::WatchEventType::kDeleted:
      pods_.erase(key);
      break;
    default:
      return;
  }
  Changed();
}

void ClusterView::ApplyNodeEvent(const kube::WatchEvent& event) {
  std::string name = StringAt(event.object, {"metadata", "name"});
  if (name.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  switch (event.type) {
    case kube::WatchEventType::kAdded:
    case kube::WatchEventType::kModified:
      // Node status changes are frequent and change nothing here.
      if (!nodes_.insert(std::move(name)).second) return;
      break;
    case kube::WatchEventType::kDeleted:
      nodes_.erase(name);
      break;
    default:
      return;
  }
  Changed();
}

ClusterView::Snapshot ClusterView::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Snapshot{version_, pods_synced_ && nodes_synced_, pods_, nodes_};
}

void ClusterView::WaitForChange(uint64_t seen, std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t wakes = wakes_;
  cv_.wait_until(lock, until, [&] { return version_ != seen || wakes_ != wakes; });
}

void ClusterView::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  ++wakes_;
  cv_.notify_all();
}

}  // namespace vf::podrunner
