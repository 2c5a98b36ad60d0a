#include "runtime/metrics/text_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>

namespace vf::metrics {
namespace {

TEST(FormatValue, SpecialValuesAreSpelledAsPrometheusParsesThem) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(FormatValue, IntegralValuesHaveNoExponentOrFraction) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-0.0), "0");
  EXPECT_EQ(FormatValue(3), "3");
  EXPECT_EQ(FormatValue(-42), "-42");
  EXPECT_EQ(FormatValue(1e6), "1000000");
  EXPECT_EQ(FormatValue(1e15), "1000000000000000");
  EXPECT_EQ(FormatValue(9007199254740991.0), "9007199254740991");
}

TEST(FormatValue, OtherValuesAreTheShortestTextThatReadsBack) {
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.005), "0.005");
  EXPECT_EQ(FormatValue(-2.5), "-2.5");
  EXPECT_EQ(FormatValue(1.5e-7), "1.5e-07");
  EXPECT_EQ(FormatValue(1e20), "1e+20");
  for (const double v : {0.1 + 0.2, 1.0 / 3.0, 6.02214076e23, 5e-324, 1.7976931348623157e308}) {
    EXPECT_EQ(std::strtod(FormatValue(v).c_str(), nullptr), v) << FormatValue(v);
  }
}

TEST(Escape, HelpEscapesBackslashAndNewlineOnly) {
  EXPECT_EQ(EscapeHelp("a\\b\nc \"q\""), "a\\\\b\\nc \"q\"");
}

TEST(Escape, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("a\\b\nc \"q\""), "a\\\\b\\nc \\\"q\\\"");
  EXPECT_EQ(EscapeLabelValue("ünïcode ok"), "ünïcode ok");
}

FamilySnapshot GaugeFamily(std::string name, std::vector<std::string> labels,
                           std::vector<ChildSnapshot> children) {
  FamilySnapshot s;
  s.family.name = std::move(name);
  s.family.help = "Help for " + s.family.name + ".";
  s.family.type = MetricType::kGauge;
  s.family.label_names = std::move(labels);
  s.children = std::move(children);
  return s;
}

TEST(SerializeText, WritesHelpTypeAndOneLinePerSample) {
  ChildSnapshot a;
  a.label_values = {"x\"y", "1"};
  a.value = 0.5;
  const std::string text = SerializeText(
      {GaugeFamily("g", {"name", "n"}, {a}), GaugeFamily("plain", {}, {ChildSnapshot{}})});
  EXPECT_EQ(text,
            "# HELP g Help for g.\n"
            "# TYPE g gauge\n"
            "g{name=\"x\\\"y\",n=\"1\"} 0.5\n"
            "# HELP plain Help for plain.\n"
            "# TYPE plain gauge\n"
            "plain 0\n");
}

TEST(SerializeText, LeavesOutFamiliesWithNoChildren) {
  EXPECT_EQ(SerializeText({GaugeFamily("empty", {"job"}, {})}), "");
}

TEST(SerializeText, HistogramsHaveCumulativeBucketsThenSumAndCount) {
  FamilySnapshot s;
  s.family = {"d_seconds", "Durations.", MetricType::kHistogram, {"job"}, {0.5, 2}};
  ChildSnapshot c;
  c.label_values = {"j"};
  c.histogram = {{0.5, 2}, {1, 3, 4}, 4, 7.25};
  s.children = {c};
  EXPECT_EQ(SerializeText({s}),
            "# HELP d_seconds Durations.\n"
            "# TYPE d_seconds histogram\n"
            "d_seconds_bucket{job=\"j\",le=\"0.5\"} 1\n"
            "d_seconds_bucket{job=\"j\",le=\"2\"} 3\n"
            "d_seconds_bucket{job=\"j\",le=\"+Inf\"} 4\n"
            "d_seconds_sum{job=\"j\"} 7.25\n"
            "d_seconds_count{job=\"j\"} 4\n");
}

}  // namespace
}  // namespace vf::metrics
