// The runner's informer cache: every pod, and the names of the nodes it plays the kubelet for,
// as the two reflectors last delivered them, with a signal when anything changes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/kube/watch.h"

namespace vf::podrunner {

// Pods by uid and managed node names. The reflectors' threads write, the reconcile thread takes
// snapshots (cheap: pods are shared, immutable JSON). Thread-safe.
class ClusterView {
 public:
  using PodPtr = std::shared_ptr<const nlohmann::json>;

  // An immutable copy of the view. Value type; thread-compatible.
  struct Snapshot {
    uint64_t version = 0;                // grows with every change
    bool synced = false;                 // both pods and nodes have been listed at least once
    std::map<std::string, PodPtr> pods;  // by metadata.uid
    std::set<std::string> nodes;         // managed node names
  };

  // A full list replaces everything known of that kind (objects missing from it are gone).
  void SyncPods(std::vector<nlohmann::json> items);
  void SyncNodes(const std::vector<nlohmann::json>& items);
  // One ADDED / MODIFIED / DELETED event.
  void ApplyPodEvent(kube::WatchEvent event);
  void ApplyNodeEvent(const kube::WatchEvent& event);

  Snapshot Get() const;

  // Returns when the version moves past `seen`, at `until`, or when Wake() is called.
  void WaitForChange(uint64_t seen, std::chrono::steady_clock::time_point until);
  void Wake();

 private:
  void Changed();  // with mu_ held

  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t version_ = 0;
  uint64_t wakes_ = 0;
  bool pods_synced_ = false;
  bool nodes_synced_ = false;
  std::map<std::string, PodPtr> pods_;
  std::set<std::string> nodes_;
};

// The key a pod is held under: its uid, or namespace/name for an object without one.
std::string PodKey(const nlohmann::json& pod);

}  // namespace vf::podrunner
