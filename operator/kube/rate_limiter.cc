#include "operator/kube/rate_limiter.h"

#include <algorithm>
#include <condition_variable>
#include <thread>

namespace vf::kube {

RateLimiter::RateLimiter(double qps, int burst)
    : qps_(qps), burst_(std::max(burst, 1)), tokens_(std::max(burst, 1)) {}

std::optional<RateLimiter::Clock::duration> RateLimiter::Reserve(Clock::time_point now,
                                                                 Clock::time_point deadline) {
  if (qps_ <= 0) return Clock::duration::zero();
  std::lock_guard<std::mutex> lock(mu_);
  // Time never runs backwards for the bucket, even if callers pass slightly stale `now`s.
  if (last_.has_value() && now < *last_) now = *last_;
  if (last_.has_value()) {
    const double elapsed = std::chrono::duration<double>(now - *last_).count();
    tokens_ = std::min(static_cast<double>(burst_), tokens_ + elapsed * qps_);
  }
  last_ = now;
  const double after = tokens_ - 1;
  Clock::duration wait = Clock::duration::zero();
  if (after < 0) {
    wait = std::chrono::ceil<Clock::duration>(std::chrono::duration<double>(-after / qps_));
  }
  if (now + wait > deadline) return std::nullopt;
  tokens_ = after;
  return wait;
}

bool RateLimiter::Wait(Clock::time_point deadline, std::stop_token stop) {
  const Clock::time_point now = Clock::now();
  const std::optional<Clock::duration> wait = Reserve(now, deadline);
  if (!wait.has_value()) return false;
  if (*wait <= Clock::duration::zero()) return true;
  return SleepUntil(now + *wait, stop);
}

bool SleepUntil(std::chrono::steady_clock::time_point until, std::stop_token stop) {
  if (!stop.stop_possible()) {
    std::this_thread::sleep_until(until);
    return true;
  }
  std::mutex mu;
  std::condition_variable_any cv;
  std::unique_lock<std::mutex> lock(mu);
  // The predicate is only "stopped": wait_until returns at `until` or as soon as stop comes.
  cv.wait_until(lock, stop, until, [] { return false; });
  return !stop.stop_requested();
}

}  // namespace vf::kube
