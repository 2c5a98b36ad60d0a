#include "runtime/metrics/registry.h"

#include <gtest/gtest.h>

#include <limits>
#include <optional>
#include <string>

#include "runtime/metrics/promtool.h"

namespace vf::metrics {
namespace {

TEST(Names, MetricNames) {
  for (const char* ok : {"a", "vf_operator_jobs", "_x", "ns:rule:rate5m", "A1_b2"}) {
    EXPECT_TRUE(IsValidMetricName(ok)) << ok;
  }
  for (const char* bad : {"", "1a", "a-b", "a b", "a.b", "é"}) {
    EXPECT_FALSE(IsValidMetricName(bad)) << bad;
  }
}

TEST(Names, LabelNames) {
  for (const char* ok : {"job", "_x", "namespace", "A1_b2", "_"}) {
    EXPECT_TRUE(IsValidLabelName(ok)) << ok;
  }
  for (const char* bad : {"", "1a", "a:b", "a-b", "__name__", "__x"}) {
    EXPECT_FALSE(IsValidLabelName(bad)) << bad;
  }
}

TEST(Registry, RefusesInvalidNames) {
  Registry registry;
  Result<Family<Counter>*> bad_name = registry.AddCounter("bad-name", "x");
  ASSERT_FALSE(bad_name.ok());
  EXPECT_EQ(bad_name.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_name.status().message().find("'bad-name' is not a valid metric name"),
            std::string::npos)
      << bad_name.status().message();
  EXPECT_FALSE(registry.AddGauge("g", "x", {"__reserved"}).ok());
  EXPECT_FALSE(registry.AddGauge("g", "x", {"a-b"}).ok());
  Result<Family<Gauge>*> twice = registry.AddGauge("g", "x", {"job", "job"});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("label 'job' given twice"), std::string::npos);
  // None of the refused families was registered.
  EXPECT_TRUE(registry.Describe().empty());
}

TEST(Registry, RefusesDuplicateNamesWhateverTheType) {
  Registry registry;
  ASSERT_TRUE(registry.AddCounter("x_total", "x").ok());
  Result<Family<Gauge>*> again = registry.AddGauge("x_total", "x");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().message(),
            "registering metric family 'x_total': a metric named 'x_total' is already registered");
}

TEST(Registry, RefusesNamesThatCollideWithHistogramSeries) {
  Registry registry;
  ASSERT_TRUE(registry.AddHistogram("d_seconds", "x", {}, {1}).ok());
  EXPECT_FALSE(registry.AddGauge("d_seconds_count", "x").ok());
  EXPECT_FALSE(registry.AddCounter("d_seconds_bucket", "x").ok());
  ASSERT_TRUE(registry.AddCounter("e_sum", "x").ok());
  Result<Family<Histogram>*> h = registry.AddHistogram("e", "x", {}, {1});
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("series 'e_sum' of this histogram is already taken"),
            std::string::npos);
}

TEST(Registry, RefusesBadHistogramsLabelLeAndBounds) {
  Registry registry;
  EXPECT_FALSE(registry.AddHistogram("h", "x", {"le"}, {1}).ok());
  EXPECT_FALSE(registry.AddHistogram("h", "x", {}, {2, 1}).ok());
  EXPECT_FALSE(
      registry.AddHistogram("h", "x", {}, {1, std::numeric_limits<double>::infinity()}).ok());
  // "le" is only reserved on histograms.
  EXPECT_TRUE(registry.AddGauge("g", "x", {"le"}).ok());
}

TEST(Registry, DescribeListsFamiliesSortedByName) {
  Registry registry;
  ASSERT_TRUE(registry.AddGauge("b", "B.", {"job"}).ok());
  ASSERT_TRUE(registry.AddHistogram("a_seconds", "A.", {"verb"}, {1, 2}).ok());
  ASSERT_TRUE(registry.AddCounter("c_total", "C.").ok());
  const std::vector<FamilyDescriptor> families = registry.Describe();
  ASSERT_EQ(families.size(), 3u);
  EXPECT_EQ(families[0].name, "a_seconds");
  EXPECT_EQ(families[0].type, MetricType::kHistogram);
  EXPECT_EQ(families[0].label_names, (std::vector<std::string>{"verb"}));
  EXPECT_EQ(families[0].bounds, (std::vector<double>{1, 2}));
  EXPECT_EQ(families[1].name, "b");
  EXPECT_EQ(families[1].help, "B.");
  EXPECT_EQ(families[2].name, "c_total");
  EXPECT_EQ(families[2].type, MetricType::kCounter);
}

TEST(Registry, SerializeIsDeterministicAndSortedByNameThenLabels) {
  Registry registry;
  Family<Gauge>& workers = **registry.AddGauge("workers", "Workers by kind.", {"job", "kind"});
  Family<Counter>& errors = **registry.AddCounter("errors_total", "Errors.");
  workers.Add({{"job", "b"}, {"kind", "current"}}).Set(2);
  workers.Add({{"job", "a"}, {"kind", "desired"}}).Set(4);
  errors.Add({}).Increment(3);
  const std::string expected =
      "# HELP errors_total Errors.\n"
      "# TYPE errors_total counter\n"
      "errors_total 3\n"
      "# HELP workers Workers by kind.\n"
      "# TYPE workers gauge\n"
      "workers{job=\"a\",kind=\"desired\"} 4\n"
      "workers{job=\"b\",kind=\"current\"} 2\n";
  EXPECT_EQ(registry.Serialize(), expected);
  EXPECT_EQ(registry.Serialize(), expected);
}

TEST(Registry, RemovedSeriesDisappearFromTheOutput) {
  Registry registry;
  Family<Gauge>& step = **registry.AddGauge("step", "Step.", {"namespace", "job"});
  step.Add({{"namespace", "n"}, {"job", "a"}}).Set(10);
  step.Add({{"namespace", "n"}, {"job", "b"}}).Set(20);
  step.Remove({{"namespace", "n"}, {"job", "a"}});
  EXPECT_EQ(registry.Serialize(),
            "# HELP step Step.\n# TYPE step gauge\nstep{namespace=\"n\",job=\"b\"} 20\n");
  step.RemoveMatching({{"job", "b"}});
  EXPECT_EQ(registry.Serialize(), "");
}

// Prometheus' own parser and linter read what we write: every type, escapes in help and label
// values, unicode, special values, histograms with and without labels.
TEST(Registry, RichExpositionPassesPromtool) {
  const std::optional<std::string> promtool = FindPromtool();
  if (!promtool) {
    GTEST_SKIP() << "promtool not found on PATH (it comes with the Debian package 'prometheus'; "
                    "scripts/setup.sh installs it): the exposition was not checked by Prometheus";
  }
  Registry registry;
  Family<Counter>& requests = **registry.AddCounter(
      "demo_requests_total", "Requests, by path \\ method.\nSecond line.", {"path", "method"});
  requests.Add({{"path", "/a\"b\\c\nd"}, {"method", "GET"}}).Increment(3);
  requests.Add({{"path", "/ünïcode ✓"}, {"method", "POST"}}).Increment(0.5);
  requests.Add({{"path", ""}, {"method", "PUT"}});
  Family<Gauge>& values = **registry.AddGauge("demo_value", "Special values.", {"kind"});
  values.Add({{"kind", "nan"}}).Set(std::numeric_limits<double>::quiet_NaN());
  values.Add({{"kind", "inf"}}).Set(std::numeric_limits<double>::infinity());
  values.Add({{"kind", "neg_inf"}}).Set(-std::numeric_limits<double>::infinity());
  values.Add({{"kind", "big"}}).Set(1e300);
  values.Add({{"kind", "tiny"}}).Set(-1.5e-300);
  values.Add({{"kind", "int"}}).Set(123456789);
  (**registry.AddGauge("demo_up", "No labels.")).Add({}).Set(1);
  Family<Histogram>& durations = **registry.AddHistogram("demo_duration_seconds", "Durations.",
                                                         {"job"}, {0.001, 0.01, 0.1, 1, 10, 60});
  for (const double v : {0.0005, 0.02, 0.3, 5.0, 100.0, 0.001}) {
    durations.Add({{"job", "a"}}).Observe(v);
  }
  durations.Add({{"job", "b"}});
  (**registry.AddHistogram("demo_size_bytes", "Sizes.", {}, {1024, 1048576})).Add({}).Observe(4096);
  (**registry.AddHistogram("demo_only_inf_seconds", "No bounds.", {}, {})).Add({}).Observe(2);

  const std::string text = registry.Serialize();
  Result<PromtoolReport> report = PromtoolCheckMetrics(*promtool, text);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->clean()) << "promtool exit " << report->exit_code << ":\n"
                               << report->output << "\nexposition:\n"
                               << text;
}

// The check is real: promtool does fail output that is wrong.
TEST(Registry, PromtoolRejectsBrokenExpositions) {
  const std::optional<std::string> promtool = FindPromtool();
  if (!promtool) GTEST_SKIP() << "promtool not found on PATH (Debian package 'prometheus')";
  Result<PromtoolReport> report = PromtoolCheckMetrics(*promtool, "x{a=\"unterminated} 1\n");
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->clean());
}

}  // namespace
}  // namespace vf::metrics
