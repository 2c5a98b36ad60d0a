#include "runtime/metrics/metric.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace vf::metrics {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(Counter, StartsAtZeroAndAddsIncrements) {
  Counter c;
  EXPECT_EQ(c.Value(), 0);
  c.Increment();
  c.Increment(2.5);
  c.Increment(0);
  EXPECT_EQ(c.Value(), 3.5);
}

TEST(Counter, IgnoresNegativeAndNaNIncrements) {
  Counter c;
  c.Increment(4);
  c.Increment(-1);
  c.Increment(kNaN);
  c.Increment(-kInf);
  EXPECT_EQ(c.Value(), 4);
}

TEST(Gauge, SetsIncrementsAndDecrements) {
  Gauge g;
  g.Set(10);
  g.Increment();
  g.Increment(4);
  g.Decrement();
  g.Decrement(20);
  EXPECT_EQ(g.Value(), -6);
  g.Set(kNaN);
  EXPECT_TRUE(std::isnan(g.Value()));
}

TEST(Histogram, CountsAValueEqualToABoundIntoThatBucket) {
  Histogram h({0.1, 1, 10});
  h.Observe(0.1);
  h.Observe(1);
  h.Observe(1.0000001);
  h.Observe(100);
  h.Observe(-5);
  const Histogram::Snapshot s = h.Collect();
  EXPECT_EQ(s.bounds, (std::vector<double>{0.1, 1, 10}));
  // Cumulative: <=0.1: {0.1, -5}; <=1: +{1}; <=10: +{1.0000001}; +Inf: +{100}.
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3, 4, 5}));
  EXPECT_EQ(s.count, 5u);
  EXPECT_DOUBLE_EQ(s.sum, 0.1 + 1 + 1.0000001 + 100 - 5);
}

TEST(Histogram, InfinitiesGoToTheEndsAndNaNIsIgnored) {
  Histogram h({1});
  h.Observe(kInf);
  h.Observe(-kInf);
  h.Observe(kNaN);
  const Histogram::Snapshot s = h.Collect();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.count, 2u);
}

TEST(Histogram, WithNoBoundsHasOnlyTheInfBucket) {
  Histogram h({});
  h.Observe(3);
  h.Observe(4);
  const Histogram::Snapshot s = h.Collect();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2}));
  EXPECT_EQ(s.sum, 7);
}

TEST(Histogram, ValidateBoundsRefusesUnorderedDuplicateAndInfiniteBounds) {
  EXPECT_TRUE(Histogram::ValidateBounds({}).ok());
  EXPECT_TRUE(Histogram::ValidateBounds({-1, 0, 0.5, 1e9}).ok());
  EXPECT_EQ(Histogram::ValidateBounds({1, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Histogram::ValidateBounds({2, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Histogram::ValidateBounds({1, kInf}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Histogram::ValidateBounds({kNaN}).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(Histogram::ValidateBounds({1, kInf}).message().find("+Inf is implied"),
            std::string::npos);
}

TEST(MetricTypeName, IsTheWordOfTheTypeLine) {
  EXPECT_EQ(MetricTypeName(MetricType::kCounter), "counter");
  EXPECT_EQ(MetricTypeName(MetricType::kGauge), "gauge");
  EXPECT_EQ(MetricTypeName(MetricType::kHistogram), "histogram");
}

TEST(Metrics, ConcurrentUpdatesAreNotLost) {
  Counter counter;
  Gauge gauge;
  Histogram histogram({0.5, 1.5});
  constexpr int kThreads = 8;
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  // A reader scraping meanwhile must never see the +Inf bucket disagree with the count, nor a
  // bucket above the next one.
  std::thread reader([&] {
    while (!done.load()) {
      const Histogram::Snapshot s = histogram.Collect();
      ASSERT_EQ(s.cumulative.back(), s.count);
      for (size_t i = 1; i < s.cumulative.size(); ++i)
        ASSERT_LE(s.cumulative[i - 1], s.cumulative[i]);
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        counter.Increment();
        gauge.Increment(2);
        gauge.Decrement();
        histogram.Observe(t % 2 == 0 ? 1.0 : 2.0);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  done = true;
  reader.join();
  constexpr double kTotal = static_cast<double>(kThreads) * kPerThread;
  EXPECT_EQ(counter.Value(), kTotal);
  EXPECT_EQ(gauge.Value(), kTotal);
  const Histogram::Snapshot s = histogram.Collect();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{0, static_cast<uint64_t>(kTotal / 2),
                                                 static_cast<uint64_t>(kTotal)}));
  EXPECT_EQ(s.sum, kTotal / 2 * 1.0 + kTotal / 2 * 2.0);
}

}  // namespace
}  // namespace vf::metrics
