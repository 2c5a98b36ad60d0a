#include "operator/controller/expectations.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

namespace vf::controller {
namespace {

using Clock = Expectations::Clock;
using std::chrono::seconds;

TEST(ExpectationsTest, ACreatedPodIsAwaitedUntilTheCacheShowsIt) {
  Expectations e;
  const Clock::time_point t0 = Clock::now();
  e.ExpectCreation("job-worker-a", t0);
  e.ExpectCreation("job-worker-b", t0);
  std::set<std::string> cache;
  auto in_cache = [&cache](const std::string& name) { return cache.count(name) != 0; };
  EXPECT_EQ(e.Observe(in_cache, t0 + seconds(1)), 2);
  cache.insert("job-worker-a");
  EXPECT_EQ(e.Observe(in_cache, t0 + seconds(2)), 1);
  EXPECT_EQ(e.Pending(), std::vector<std::string>{"job-worker-b"});
  // Seen once is enough: a pod the cache later drops is not awaited again.
  cache.clear();
  EXPECT_EQ(e.Observe(in_cache, t0 + seconds(3)), 1);
}

TEST(ExpectationsTest, APodTheCacheNeverShowsIsNoLongerAwaitedAfterTheTimeout) {
  Expectations e(seconds(10));
  const Clock::time_point t0 = Clock::now();
  e.ExpectCreation("job-worker-a", t0);
  e.ExpectCreation("job-worker-b", t0 + seconds(5));
  auto never = [](const std::string&) { return false; };
  EXPECT_EQ(e.Observe(never, t0 + seconds(10)), 2);  // the timeout itself still waits
  EXPECT_EQ(e.Observe(never, t0 + seconds(11)), 1);
  EXPECT_EQ(e.Pending(), std::vector<std::string>{"job-worker-b"});
  EXPECT_EQ(e.Observe(never, t0 + seconds(16)), 0);
  EXPECT_TRUE(e.empty());
}

TEST(ExpectationsTest, PendingKeepsTimedOutPodsUntilObserved) {
  Expectations e(seconds(1));
  const Clock::time_point t0 = Clock::now();
  e.ExpectCreation("job-worker-a", t0);
  EXPECT_EQ(e.Pending().size(), 1u);
  EXPECT_FALSE(e.empty());
  EXPECT_EQ(e.Observe([](const std::string&) { return false; }, t0 + seconds(2)), 0);
  EXPECT_TRUE(e.Pending().empty());
}

TEST(ExpectationsTest, CreatingAgainRestartsTheWait) {
  Expectations e(seconds(10));
  const Clock::time_point t0 = Clock::now();
  e.ExpectCreation("job-worker-a", t0);
  e.ExpectCreation("job-worker-a", t0 + seconds(8));
  EXPECT_EQ(e.Observe([](const std::string&) { return false; }, t0 + seconds(15)), 1);
}

}  // namespace
}  // namespace vf::controller
