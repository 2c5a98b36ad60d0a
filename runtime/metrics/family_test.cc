#include "runtime/metrics/family.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "runtime/metrics/registry.h"

namespace vf::metrics {
namespace {

Family<Counter>& MakeCounters(Registry& registry) {
  Result<Family<Counter>*> family =
      registry.AddCounter("resizes_total", "Resizes.", {"namespace", "job", "reason"});
  EXPECT_TRUE(family.ok()) << family.status().ToString();
  return **family;
}

TEST(Family, SameLabelsGiveTheSameChild) {
  Registry registry;
  Family<Counter>& family = MakeCounters(registry);
  Counter& a = family.Add({{"namespace", "team"}, {"job", "mnist"}, {"reason", "grow"}});
  Counter& b = family.Add({{"reason", "grow"}, {"job", "mnist"}, {"namespace", "team"}});
  Counter& c = family.Add({{"namespace", "team"}, {"job", "mnist"}, {"reason", "shrink"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  EXPECT_EQ(family.size(), 2u);
}

TEST(Family, ChildrenKeepTheirAddressWhileOthersComeAndGo) {
  Registry registry;
  Family<Counter>& family = MakeCounters(registry);
  Counter& kept = family.Add({{"namespace", "a"}, {"job", "j"}, {"reason", "grow"}});
  kept.Increment(7);
  for (int i = 0; i < 100; ++i) {
    family.Add({{"namespace", "b" + std::to_string(i)}, {"job", "j"}, {"reason", "grow"}});
  }
  family.RemoveMatching({{"job", "j"}, {"reason", "grow"}, {"namespace", "b5"}});
  EXPECT_EQ(&family.Add({{"namespace", "a"}, {"job", "j"}, {"reason", "grow"}}), &kept);
  EXPECT_EQ(kept.Value(), 7);
}

TEST(Family, TryAddNamesMissingAndUnknownLabels) {
  Registry registry;
  Family<Counter>& family = MakeCounters(registry);
  Result<std::shared_ptr<Counter>> child = family.TryAdd({{"namespace", "team"}, {"pod", "p-0"}});
  ASSERT_FALSE(child.ok());
  EXPECT_EQ(child.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(child.status().message(),
            "metric family resizes_total: missing label(s) job, reason; unknown label(s) pod");
  EXPECT_EQ(family.size(), 0u);
}

TEST(FamilyDeathTest, AddWithWrongLabelsAbortsNamingThem) {
  Registry registry;
  Family<Counter>& family = MakeCounters(registry);
  EXPECT_DEATH(family.Add({{"namespace", "team"}}), "missing label\\(s\\) job, reason");
}

TEST(Family, WithoutLabelsHasOneChild) {
  Registry registry;
  Family<Gauge>& family = **registry.AddGauge("depth", "Depth.");
  Gauge& a = family.Add({});
  a.Set(3);
  EXPECT_EQ(&family.Add({}), &a);
  EXPECT_FALSE(family.TryAdd({{"x", "y"}}).ok());
}

TEST(Family, RemoveDropsOneChild) {
  Registry registry;
  Family<Counter>& family = MakeCounters(registry);
  family.Add({{"namespace", "team"}, {"job", "a"}, {"reason", "grow"}}).Increment(5);
  family.Add({{"namespace", "team"}, {"job", "b"}, {"reason", "grow"}});
  EXPECT_TRUE(family.Remove({{"namespace", "team"}, {"job", "a"}, {"reason", "grow"}}));
  EXPECT_FALSE(family.Remove({{"namespace", "team"}, {"job", "a"}, {"reason", "grow"}}));
  EXPECT_FALSE(family.Remove({{"namespace", "team"}}));
  EXPECT_EQ(family.size(), 1u);
  // Added again, it starts over from zero.
  EXPECT_EQ(family.Add({{"namespace", "team"}, {"job", "a"}, {"reason", "grow"}}).Value(), 0);
}

TEST(Family, AddSharedKeepsARemovedChildAliveButNotExported) {
  Registry registry;
  Family<Counter>& family = MakeCounters(registry);
  const Labels labels = {{"namespace", "team"}, {"job", "a"}, {"reason", "grow"}};
  std::shared_ptr<Counter> held = family.AddShared(labels);
  EXPECT_EQ(held.get(), &family.Add(labels));
  EXPECT_TRUE(family.Remove(labels));
  held->Increment(3);  // no use after free: the pointer still owns it
  EXPECT_EQ(held->Value(), 3);
  EXPECT_EQ(registry.Serialize(), "");
  EXPECT_NE(family.AddShared(labels), held);
}

TEST(Family, RemoveMatchingDropsEveryChildOfAJob) {
  Registry registry;
  Family<Counter>& family = MakeCounters(registry);
  for (const char* reason : {"grow", "shrink", "failure"}) {
    family.Add({{"namespace", "team"}, {"job", "a"}, {"reason", reason}});
    family.Add({{"namespace", "team"}, {"job", "b"}, {"reason", reason}});
    family.Add({{"namespace", "other"}, {"job", "a"}, {"reason", reason}});
  }
  EXPECT_EQ(family.RemoveMatching({{"namespace", "team"}, {"job", "a"}}), 3u);
  EXPECT_EQ(family.size(), 6u);
  // A label the family does not have matches nothing.
  EXPECT_EQ(family.RemoveMatching({{"pod", "x"}}), 0u);
  // An empty subset matches everything.
  EXPECT_EQ(family.RemoveMatching({}), 6u);
}

TEST(Family, CollectOrdersChildrenByLabelValues) {
  Registry registry;
  Family<Gauge>& family = **registry.AddGauge("workers", "Workers.", {"job", "kind"});
  family.Add({{"job", "b"}, {"kind", "min"}}).Set(1);
  family.Add({{"job", "a"}, {"kind", "max"}}).Set(2);
  family.Add({{"job", "a"}, {"kind", "current"}}).Set(3);
  const FamilySnapshot snapshot = family.Collect();
  EXPECT_EQ(snapshot.family.name, "workers");
  EXPECT_EQ(snapshot.family.type, MetricType::kGauge);
  EXPECT_EQ(snapshot.family.label_names, (std::vector<std::string>{"job", "kind"}));
  ASSERT_EQ(snapshot.children.size(), 3u);
  EXPECT_EQ(snapshot.children[0].label_values, (std::vector<std::string>{"a", "current"}));
  EXPECT_EQ(snapshot.children[0].value, 3);
  EXPECT_EQ(snapshot.children[1].label_values, (std::vector<std::string>{"a", "max"}));
  EXPECT_EQ(snapshot.children[2].label_values, (std::vector<std::string>{"b", "min"}));
}

TEST(Family, HistogramChildrenUseTheFamilyBounds) {
  Registry registry;
  Family<Histogram>& family = **registry.AddHistogram("pause_seconds", "Pauses.", {"job"}, {1, 2});
  family.Add({{"job", "a"}}).Observe(1.5);
  const FamilySnapshot snapshot = family.Collect();
  ASSERT_EQ(snapshot.children.size(), 1u);
  EXPECT_EQ(snapshot.children[0].histogram.bounds, (std::vector<double>{1, 2}));
  EXPECT_EQ(snapshot.children[0].histogram.cumulative, (std::vector<uint64_t>{0, 1, 1}));
}

// Jobs come and go on some threads while others update their series and a scraper serializes:
// under TSan this is the check that the family's lock covers what it must.
TEST(Family, ConcurrentAddRemoveUpdateAndSerialize) {
  Registry registry;
  Family<Counter>& counters = MakeCounters(registry);
  Family<Histogram>& pauses =
      **registry.AddHistogram("pause_seconds", "Pauses.", {"namespace", "job"}, {0.1, 1});
  Family<Gauge>& depth = **registry.AddGauge("depth", "Depth.");
  depth.Add({});  // present from the start, so that every scrape shows it
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    size_t scrapes = 0;
    while (!done.load()) {
      const std::string text = registry.Serialize();
      ASSERT_NE(text.find("# TYPE depth gauge"), std::string::npos);
      ++scrapes;
    }
    EXPECT_GT(scrapes, 0u);
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // The thread's own job stays; a shared churning job is added and removed by everyone.
      const Labels own = {{"namespace", "ns"}, {"job", "own-" + std::to_string(t)}};
      for (int i = 0; i < kRounds; ++i) {
        Labels labels = own;
        labels["reason"] = "grow";
        counters.Add(labels).Increment();
        pauses.Add(own).Observe(0.5);
        depth.Add({}).Increment();
        Labels churn = {{"namespace", "ns"}, {"job", "churn"}, {"reason", "shrink"}};
        counters.AddShared(churn)->Increment();
        if (i % 3 == 0) counters.RemoveMatching({{"job", "churn"}});
      }
    });
  }
  for (std::thread& t : threads) t.join();
  done = true;
  scraper.join();
  for (int t = 0; t < kThreads; ++t) {
    const Labels own = {{"namespace", "ns"}, {"job", "own-" + std::to_string(t)}};
    Labels labels = own;
    labels["reason"] = "grow";
    EXPECT_EQ(counters.Add(labels).Value(), kRounds);
    EXPECT_EQ(pauses.Add(own).Collect().count, static_cast<uint64_t>(kRounds));
  }
  EXPECT_EQ(depth.Add({}).Value(), kThreads * kRounds);
}

}  // namespace
}  // namespace vf::metrics
