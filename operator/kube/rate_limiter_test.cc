// The token bucket: its arithmetic with the clock passed in, and the waits it imposes.
#include "operator/kube/rate_limiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace vf::kube {
namespace {

using Clock = RateLimiter::Clock;
using std::chrono::milliseconds;

TEST(RateLimiterTest, BurstIsFreeThenOneTokenPerInterval) {
  RateLimiter limiter(10, 3);
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point far = t0 + std::chrono::hours(1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(limiter.Reserve(t0, far), Clock::duration::zero());
  // The 4th and 5th wait for the 1st and 2nd refill: 100 ms and 200 ms.
  EXPECT_EQ(limiter.Reserve(t0, far), milliseconds(100));
  EXPECT_EQ(limiter.Reserve(t0, far), milliseconds(200));
}

TEST(RateLimiterTest, RefillsUpToBurstOnly) {
  RateLimiter limiter(10, 2);
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point far = t0 + std::chrono::hours(1);
  EXPECT_EQ(limiter.Reserve(t0, far), Clock::duration::zero());
  EXPECT_EQ(limiter.Reserve(t0, far), Clock::duration::zero());
  // An hour idle buys 2 tokens, not 36000.
  const Clock::time_point later = t0 + std::chrono::hours(1);
  EXPECT_EQ(limiter.Reserve(later, later + std::chrono::hours(1)), Clock::duration::zero());
  EXPECT_EQ(limiter.Reserve(later, later + std::chrono::hours(1)), Clock::duration::zero());
  EXPECT_EQ(limiter.Reserve(later, later + std::chrono::hours(1)), milliseconds(100));
}

TEST(RateLimiterTest, RefusesWithoutTakingWhenTheWaitPassesTheDeadline) {
  RateLimiter limiter(1, 1);
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(limiter.Reserve(t0, t0), Clock::duration::zero());
  EXPECT_FALSE(limiter.Reserve(t0, t0 + milliseconds(500)).has_value());
  // Nothing was taken by the refusal: the next token is still 1 s after the first.
  EXPECT_EQ(limiter.Reserve(t0, t0 + std::chrono::seconds(2)), std::chrono::seconds(1));
}

TEST(RateLimiterTest, ZeroQpsIsUnlimited) {
  RateLimiter limiter(0, 1);
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(limiter.Reserve(t0, t0), Clock::duration::zero());
}

// The property the client relies on: N calls at QPS q with burst 1 take at least (N - 1) / q.
TEST(RateLimiterTest, WaitBoundsTheRate) {
  RateLimiter limiter(20, 1);
  constexpr int kCalls = 21;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(limiter.Wait(Clock::time_point::max()));
  }
  EXPECT_GE(Clock::now() - start, milliseconds((kCalls - 1) * 1000 / 20));
}

TEST(RateLimiterTest, WaitBoundsTheRateAcrossThreads) {
  RateLimiter limiter(100, 1);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 10;
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  std::atomic<int> granted{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        if (limiter.Wait(Clock::time_point::max())) ++granted;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(granted.load(), kThreads * kPerThread);
  EXPECT_GE(Clock::now() - start, milliseconds((kThreads * kPerThread - 1) * 10));
}

TEST(RateLimiterTest, WaitReturnsEarlyWhenStopped) {
  RateLimiter limiter(0.1, 1);  // the second token is 10 s away
  ASSERT_TRUE(limiter.Wait(Clock::time_point::max()));
  std::stop_source stop;
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(50));
    stop.request_stop();
  });
  const Clock::time_point start = Clock::now();
  EXPECT_FALSE(limiter.Wait(Clock::time_point::max(), stop.get_token()));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  stopper.join();
}

TEST(RateLimiterTest, WaitRefusesPastTheDeadlineAtOnce) {
  RateLimiter limiter(0.1, 1);
  ASSERT_TRUE(limiter.Wait(Clock::time_point::max()));
  const Clock::time_point start = Clock::now();
  EXPECT_FALSE(limiter.Wait(start + milliseconds(100)));
  EXPECT_LT(Clock::now() - start, milliseconds(100));
}

}  // namespace
}  // namespace vf::kube
