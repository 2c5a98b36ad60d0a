// Client-side request throttling, so that a busy operator (a burst of reconciles after a restart,
// a crash-looping watch) cannot flood the API server.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>
#include <stop_token>

namespace vf::kube {

// A token bucket: holds up to `burst` tokens, refilled at `qps` tokens per second, one token per
// request. Waiters reserve their token first and sleep outside the lock, so they are served in
// the order they arrived and a sleeper never blocks the others. Shared by every call of a Client
// (and by several clients given the same instance). Thread-safe.
class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  // qps <= 0 disables limiting; burst is at least 1.
  RateLimiter(double qps, int burst);

  double qps() const { return qps_; }
  int burst() const { return burst_; }

  // Takes a token, sleeping until it is available. Returns false without taking one when that
  // would be after `deadline`, or (the token then counting as spent) when `stop` is requested
  // during the wait.
  bool Wait(Clock::time_point deadline, std::stop_token stop = {});

  // The arithmetic behind Wait, with the time passed in: takes a token at `now` and returns how
  // long its holder must wait before using it, or nothing (and takes nothing) when that wait
  // would end after `deadline`.
  std::optional<Clock::duration> Reserve(Clock::time_point now, Clock::time_point deadline);

 private:
  const double qps_;
  const int burst_;
  std::mutex mu_;
  // Tokens at `last_`; negative while reservations are outstanding.
  double tokens_;
  std::optional<Clock::time_point> last_;
};

// Sleeps until `until` or until `stop` is requested; returns false if stopped.
bool SleepUntil(std::chrono::steady_clock::time_point until, std::stop_token stop);

}  // namespace vf::kube
