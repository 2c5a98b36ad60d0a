// Follows the coordinator's membership plans in the background, so the training loop only
// reads an atomic between steps and never waits on the network.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "agent/protocol/client.h"

namespace vf {

// Long-polls for newer plans on its own thread and keeps every plan it has seen. Thread-safe.
class PlanWatcher {
 public:
  // `after_poll`, if any, runs on the watcher's thread after every poll, answered or not: the
  // agent holds its rendezvous keys true there (CoordinatorStore::Reassert), whatever its
  // training thread is doing meanwhile.
  explicit PlanWatcher(CoordinatorClient& client, std::function<void()> after_poll = {});
  ~PlanWatcher();
  PlanWatcher(const PlanWatcher&) = delete;
  PlanWatcher& operator=(const PlanWatcher&) = delete;

  // Newest epoch seen so far (0: none).
  int64_t latest_epoch() const { return latest_.load(); }
  // The newest plan with epoch > `after`, waiting up to `timeout`; nullopt on timeout.
  std::optional<Plan> WaitNewer(int64_t after, std::chrono::milliseconds timeout);
  // Plan `epoch` exactly if seen (the members agreed on it in-band), else the newest one newer.
  std::optional<Plan> WaitFor(int64_t epoch, std::chrono::milliseconds timeout);

 private:
  void Run();

  CoordinatorClient& client_;
  const std::function<void()> after_poll_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> latest_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, Plan> plans_;
  std::thread thread_;
};

}  // namespace vf
