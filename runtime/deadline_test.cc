#include "runtime/deadline.h"

#include <gtest/gtest.h>

#include <chrono>

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// DeadlineAfter(timeout) read between two clock readings lies in [before, after] + the wait.
void ExpectWaitOf(milliseconds timeout, milliseconds wait) {
  const Clock::time_point before = Clock::now();
  const Clock::time_point deadline = DeadlineAfter(timeout);
  const Clock::time_point after = Clock::now();
  EXPECT_GE(deadline, before + wait) << timeout.count() << " ms";
  EXPECT_LE(deadline, after + wait) << timeout.count() << " ms";
}

TEST(DeadlineAfter, IsNowPlusAnOrdinaryTimeout) {
  ExpectWaitOf(milliseconds(1), milliseconds(1));
  ExpectWaitOf(milliseconds(60000), milliseconds(60000));
  ExpectWaitOf(kLongestWait, kLongestWait);
}

TEST(DeadlineAfter, HasPassedAlreadyForZeroAndNegativeTimeouts) {
  ExpectWaitOf(milliseconds::zero(), milliseconds::zero());
  ExpectWaitOf(milliseconds(-5), milliseconds::zero());
  ExpectWaitOf(milliseconds::min(), milliseconds::zero());
}

TEST(DeadlineAfter, CapsHugeTimeoutsAtTheLongestWaitWithoutOverflow) {
  ExpectWaitOf(kLongestWait + milliseconds(1), kLongestWait);
  ExpectWaitOf(std::chrono::hours(24 * 365 * 1000), kLongestWait);
  ExpectWaitOf(milliseconds::max(), kLongestWait);
  // What callers compute from a deadline stays in range: the time left, and a backoff past it.
  const Clock::time_point forever = DeadlineAfter(milliseconds::max());
  EXPECT_GT(forever - Clock::now(), kLongestWait - std::chrono::hours(1));
  EXPECT_LT(forever, forever + std::chrono::hours(24 * 365 * 100));
}

}  // namespace
}  // namespace vf
