#include "operator/kube/workqueue.h"

#include <algorithm>
#include <cmath>

namespace vf::kube {

ManualWorkQueueClock::ManualWorkQueueClock()
    : now_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::hours(1)).count()) {
}

WorkQueueClock::TimePoint ManualWorkQueueClock::Now() const {
  return TimePoint(
      std::chrono::duration_cast<TimePoint::duration>(std::chrono::nanoseconds(now_ns_.load())));
}

uint64_t ManualWorkQueueClock::Subscribe(std::function<void()> on_advance) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  subscribers_.emplace(id, std::move(on_advance));
  return id;
}

void ManualWorkQueueClock::Unsubscribe(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  subscribers_.erase(id);
}

void ManualWorkQueueClock::Advance(std::chrono::nanoseconds by) {
  // The time moves before anyone is told, so a subscriber's waiters see the new time whether
  // they look before or after the call reaches them.
  now_ns_ += by.count();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, on_advance] : subscribers_) on_advance();
}

WorkQueue::WorkQueue(WorkQueueOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : std::make_shared<SteadyWorkQueueClock>()),
      bucket_(options_.qps, options_.burst) {
  subscription_ = clock_->Subscribe([this] {
    // Taking the lock orders this after any Get that has looked at the old time and is about
    // to wait: it is then waiting, and the notification reaches it.
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  });
}

WorkQueue::~WorkQueue() { clock_->Unsubscribe(subscription_); }

void WorkQueue::AddLocked(const std::string& key) {
  if (!dirty_.insert(key).second) return;  // queued already, or re-added while processing
  // Being processed: Done queues it again, so that it never runs on two workers at once.
  if (processing_.count(key) > 0) return;
  queue_.push_back(key);
  cv_.notify_one();
}

void WorkQueue::Add(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  AddLocked(key);
}

void WorkQueue::AddAfter(const std::string& key, std::chrono::nanoseconds delay) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  if (delay <= std::chrono::nanoseconds::zero()) {
    AddLocked(key);
    return;
  }
  // Far enough to mean "never", near enough not to overflow the clock.
  delay = std::min<std::chrono::nanoseconds>(delay, std::chrono::hours(24 * 365));
  const TimePoint due = clock_->Now() + std::chrono::duration_cast<TimePoint::duration>(delay);
  auto it = waiting_until_.find(key);
  if (it != waiting_until_.end()) {
    if (it->second <= due) return;
    waiting_.erase({it->second, key});
    it->second = due;
  } else {
    waiting_until_.emplace(key, due);
  }
  waiting_.emplace(due, key);
  // A getter may be asleep until a later due time, or with none at all.
  cv_.notify_all();
}

std::chrono::nanoseconds WorkQueue::BackoffLocked(const std::string& key) const {
  auto it = failures_.find(key);
  const int failures = it == failures_.end() ? 0 : it->second;
  const double delay = static_cast<double>(options_.base_delay.count()) * std::pow(2.0, failures);
  if (delay >= static_cast<double>(options_.max_delay.count())) return options_.max_delay;
  return std::chrono::nanoseconds(static_cast<int64_t>(delay));
}

void WorkQueue::AddRateLimited(const std::string& key) {
  std::chrono::nanoseconds delay;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return;
    delay = BackoffLocked(key);
    ++failures_[key];
    // Every retry takes a token, whichever wait is longer, as client-go's MaxOfRateLimiter does.
    const std::optional<RateLimiter::Clock::duration> bucket =
        bucket_.Reserve(clock_->Now(), RateLimiter::Clock::time_point::max());
    if (bucket.has_value()) {
      delay = std::max(delay, std::chrono::duration_cast<std::chrono::nanoseconds>(*bucket));
    }
  }
  AddAfter(key, delay);
}

void WorkQueue::Forget(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  failures_.erase(key);
}

int WorkQueue::NumRequeues(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = failures_.find(key);
  return it == failures_.end() ? 0 : it->second;
}

std::chrono::nanoseconds WorkQueue::Backoff(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return BackoffLocked(key);
}

void WorkQueue::PromoteReadyLocked(TimePoint now) {
  while (!waiting_.empty() && waiting_.begin()->first <= now) {
    const std::string key = waiting_.begin()->second;
    waiting_.erase(waiting_.begin());
    waiting_until_.erase(key);
    AddLocked(key);
  }
}

std::optional<std::string> WorkQueue::Get() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!shutting_down_) PromoteReadyLocked(clock_->Now());
    if (!queue_.empty()) break;
    if (shutting_down_) return std::nullopt;
    if (waiting_.empty()) {
      cv_.wait(lock);
    } else {
      // In real time; a clock that jumps wakes the wait through its subscription instead.
      const auto remaining = waiting_.begin()->first - clock_->Now();
      cv_.wait_until(lock, std::chrono::steady_clock::now() + remaining);
    }
  }
  std::string key = std::move(queue_.front());
  queue_.pop_front();
  processing_.insert(key);
  dirty_.erase(key);
  return key;
}

void WorkQueue::Done(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  processing_.erase(key);
  if (dirty_.count(key) > 0) {
    queue_.push_back(key);
    cv_.notify_one();
  }
}

size_t WorkQueue::Len() const {
  std::lock_guard<std::mutex> lock(mu_);
  // Keys whose delay has passed count as queued, whether or not a Get has moved them yet.
  size_t ready = 0;
  if (!shutting_down_) {
    const TimePoint now = clock_->Now();
    for (auto it = waiting_.begin(); it != waiting_.end() && it->first <= now; ++it) {
      if (dirty_.count(it->second) == 0 && processing_.count(it->second) == 0) ++ready;
    }
  }
  return queue_.size() + ready;
}

void WorkQueue::ShutDown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutting_down_ = true;
  waiting_.clear();
  waiting_until_.clear();
  cv_.notify_all();
}

bool WorkQueue::ShuttingDown() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutting_down_;
}

}  // namespace vf::kube
