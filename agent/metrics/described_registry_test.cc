#include "agent/metrics/described_registry.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "agent/metrics/test_util.h"

namespace vf::metrics {
namespace {

using prometheus::MetricType;

TEST(DescribedRegistry, DescribesEveryFamilySortedByNameBeforeItHasChildren) {
  DescribedRegistry r;
  r.AddGauge("b_gauge", "B.", {"x", "y"});
  r.AddHistogram("a_seconds", "A.", {"job"}, {0.1, 1, 10});
  r.AddCounter("c_total", "C.");
  const std::vector<FamilyInfo> families = r.Describe();
  ASSERT_EQ(families.size(), 3u);
  EXPECT_EQ(families[0].name, "a_seconds");
  EXPECT_EQ(families[0].type, MetricType::Histogram);
  EXPECT_EQ(families[0].buckets, (std::vector<double>{0.1, 1, 10}));
  EXPECT_EQ(families[1].name, "b_gauge");
  EXPECT_EQ(families[1].help, "B.");
  EXPECT_EQ(families[1].label_names, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(families[2].name, "c_total");
  EXPECT_EQ(families[2].type, MetricType::Counter);
  EXPECT_TRUE(families[2].label_names.empty());
  // prometheus-cpp exports a family only once it has a child.
  EXPECT_TRUE(r.registry().Collect().empty());
}

TEST(DescribedRegistry, TypeNamesAreTheTextFormatsWords) {
  EXPECT_EQ(TypeName(MetricType::Counter), "counter");
  EXPECT_EQ(TypeName(MetricType::Gauge), "gauge");
  EXPECT_EQ(TypeName(MetricType::Histogram), "histogram");
  EXPECT_EQ(TypeName(MetricType::Summary), "summary");
  EXPECT_EQ(TypeName(MetricType::Untyped), "untyped");
}

TEST(DescribedRegistry, FamiliesAreRegisteredOnThePrometheusRegistry) {
  DescribedRegistry r;
  r.AddCounter("demo_total", "Demo.", {"job"}).Add({{"job", "j"}}).Increment(3);
  EXPECT_EQ(Exposition(r.registry()),
            "# HELP demo_total Demo.\n# TYPE demo_total counter\ndemo_total{job=\"j\"} 3\n");
}

// A family that cannot be registered is a bug in the code that registers it.
TEST(DescribedRegistryDeathTest, AbortsSayingWhichFamilyAndWhy) {
  EXPECT_DEATH(DescribedRegistry().AddGauge("bad name", "x"),
               "cannot register bad name: invalid metric name");
  EXPECT_DEATH(DescribedRegistry().AddGauge("g", "x", {"__reserved"}),
               "cannot register g: invalid label name '__reserved'");
  EXPECT_DEATH(DescribedRegistry().AddGauge("g", "x", {"job", "job"}),
               "cannot register g: label 'job' given twice");
  EXPECT_DEATH(DescribedRegistry().AddHistogram("h", "x", {"le"}, {1}),
               "cannot register h: a histogram cannot have a label 'le'");
  EXPECT_DEATH(DescribedRegistry().AddHistogram("h", "x", {}, {1, 1}),
               "cannot register h: bucket bounds must be finite and strictly increasing");
  EXPECT_DEATH(
      DescribedRegistry().AddHistogram("h", "x", {}, {1, std::numeric_limits<double>::infinity()}),
      "cannot register h: bucket bounds must be finite");
  EXPECT_DEATH(DescribedRegistry().AddGauge("g", "two\nlines"),
               "cannot register g: help text has a backslash or a line break");
  EXPECT_DEATH(
      {
        DescribedRegistry r;
        r.AddGauge("taken", "x");
        r.AddCounter("taken", "y");
      },
      "cannot register taken: ");
  EXPECT_DEATH(
      {
        DescribedRegistry r;
        r.AddGauge("taken", "x");
        r.AddGauge("taken", "x");
      },
      "cannot register taken: ");
}

// The check the metrics classes' tests use must see each kind of difference.
TEST(ExportMismatches, NamesEachDifference) {
  DescribedRegistry r;
  r.AddGauge("ok", "Fine.", {"job"}).Add({{"job", "j"}}).Set(1);
  r.AddGauge("wrong_labels", "Labels.", {"job"}).Add({{"pod", "p"}}).Set(1);
  r.AddHistogram("wrong_buckets", "Buckets.", {}, {1, 2}).Add({}, std::vector<double>{1, 3});
  r.AddCounter("no_child_yet", "Not exported.");
  prometheus::BuildGauge().Name("undeclared").Help("U.").Register(r.registry()).Add({}).Set(1);
  std::vector<std::string> problems = ExportMismatches(r.registry(), r.Describe());
  std::sort(problems.begin(), problems.end());
  const std::vector<std::string> want = {
      "undeclared: exported but not declared",
      "wrong_buckets: a series with other buckets than declared",
      "wrong_labels: a series labelled {pod}, not with the declared label names",
  };
  EXPECT_EQ(problems, want);
  EXPECT_EQ(ExportedChildren(r.registry(), "ok"), 1u);
  EXPECT_EQ(ExportedChildren(r.registry(), "no_child_yet"), 0u);
}

}  // namespace
}  // namespace vf::metrics
