#include "agent/plan_watcher.h"

#include <utility>

namespace vf {

PlanWatcher::PlanWatcher(CoordinatorClient& client, std::function<void()> after_poll)
    : client_(client), after_poll_(std::move(after_poll)) {
  thread_ = std::thread([this] { Run(); });
}

PlanWatcher::~PlanWatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_.notify_all();
  // The poll in progress ends now rather than at its timeout: the process is leaving.
  client_.CancelWaits();
  thread_.join();
}

void PlanWatcher::Run() {
  // The coordinator answers at once when a plan is newer; a stop cancels the poll in progress.
  constexpr auto kPoll = std::chrono::milliseconds(1000);
  auto backoff = std::chrono::milliseconds(50);
  while (!stop_.load()) {
    auto plan = client_.WaitForPlan(latest_.load(), kPoll);
    if (stop_.load()) break;
    if (after_poll_) after_poll_();
    if (!plan.ok()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, backoff, [this] { return stop_.load(); });
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
      continue;
    }
    backoff = std::chrono::milliseconds(50);
    if (plan->epoch > latest_.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      plans_[plan->epoch] = *plan;
      // Old plans are never needed again once a newer one exists for long.
      while (plans_.size() > 64) plans_.erase(plans_.begin());
      latest_.store(plan->epoch);
      cv_.notify_all();
    }
  }
}

std::optional<Plan> PlanWatcher::WaitNewer(int64_t after, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return latest_.load() > after; })) return std::nullopt;
  return plans_.rbegin()->second;
}

std::optional<Plan> PlanWatcher::WaitFor(int64_t epoch, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return latest_.load() >= epoch; })) return std::nullopt;
  auto it = plans_.find(epoch);
  return it != plans_.end() ? it->second : plans_.rbegin()->second;
}

}  // namespace vf
