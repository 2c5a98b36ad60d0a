// Turns "wait at most this long" into a point on the steady clock, by one rule for every
// component that waits: the store, the coordinator and its client, the Kubernetes client.
#pragma once

#include <chrono>

namespace vf {

// The longest wait a deadline stands for. Longer timeouts, "wait forever"
// (std::chrono::milliseconds::max()) included, wait this long instead: a year outlives any job,
// and a deadline this near the present leaves room for whatever callers compute from it
// (deadline - now, now + a backoff, the time left converted to another clock's duration), where
// the steady clock's own max() or an unchecked now + timeout would overflow.
inline constexpr std::chrono::milliseconds kLongestWait = std::chrono::hours(24 * 365);

// The steady-clock time `timeout` from now: now itself for a zero or negative timeout (the wait
// has already run out), now + kLongestWait at most.
std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout);

}  // namespace vf
