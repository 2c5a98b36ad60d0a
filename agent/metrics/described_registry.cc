#include "agent/metrics/described_registry.h"

#include <prometheus/check_names.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <set>
#include <utility>

namespace vf::metrics {
namespace {

[[noreturn]] void Fail(const std::string& name, const std::string& why) {
  std::fprintf(stderr, "metrics: cannot register %s: %s\n", name.c_str(), why.c_str());
  std::abort();
}

// Registers through prometheus-cpp's builder, which reports a clash by throwing.
template <typename Builder>
auto& Register(Builder builder, const FamilyInfo& info, prometheus::Registry& registry) {
  try {
    return builder.Name(info.name).Help(info.help).Register(registry);
  } catch (const std::exception& e) {
    Fail(info.name, e.what());
  }
}

}  // namespace

std::string_view TypeName(prometheus::MetricType type) {
  switch (type) {
    case prometheus::MetricType::Counter:
      return "counter";
    case prometheus::MetricType::Gauge:
      return "gauge";
    case prometheus::MetricType::Histogram:
      return "histogram";
    case prometheus::MetricType::Summary:
      return "summary";
    default:
      return "untyped";
  }
}

void DescribedRegistry::Record(const FamilyInfo& info) {
  if (!prometheus::CheckMetricName(info.name)) Fail(info.name, "invalid metric name");
  if (info.help.find_first_of("\\\n") != std::string::npos) {
    Fail(info.name, "help text has a backslash or a line break");
  }
  std::set<std::string> seen;
  for (const std::string& label : info.label_names) {
    if (!prometheus::CheckLabelName(label)) Fail(info.name, "invalid label name '" + label + "'");
    if (!seen.insert(label).second) Fail(info.name, "label '" + label + "' given twice");
    if (info.type == prometheus::MetricType::Histogram && label == "le") {
      Fail(info.name, "a histogram cannot have a label 'le'");
    }
  }
  for (size_t i = 0; i < info.buckets.size(); ++i) {
    if (!std::isfinite(info.buckets[i]) || (i > 0 && info.buckets[i] <= info.buckets[i - 1])) {
      Fail(info.name, "bucket bounds must be finite and strictly increasing");
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  families_.push_back(info);
}

prometheus::Family<prometheus::Counter>& DescribedRegistry::AddCounter(
    std::string name, std::string help, std::vector<std::string> label_names) {
  const FamilyInfo info{std::move(name),
                        std::move(help),
                        prometheus::MetricType::Counter,
                        std::move(label_names),
                        {}};
  Record(info);
  return Register(prometheus::BuildCounter(), info, registry_);
}

prometheus::Family<prometheus::Gauge>& DescribedRegistry::AddGauge(
    std::string name, std::string help, std::vector<std::string> label_names) {
  const FamilyInfo info{
      std::move(name), std::move(help), prometheus::MetricType::Gauge, std::move(label_names), {}};
  Record(info);
  return Register(prometheus::BuildGauge(), info, registry_);
}

prometheus::Family<prometheus::Histogram>& DescribedRegistry::AddHistogram(
    std::string name, std::string help, std::vector<std::string> label_names,
    std::vector<double> buckets) {
  const FamilyInfo info{std::move(name), std::move(help), prometheus::MetricType::Histogram,
                        std::move(label_names), std::move(buckets)};
  Record(info);
  return Register(prometheus::BuildHistogram(), info, registry_);
}

std::vector<FamilyInfo> DescribedRegistry::Describe() const {
  std::vector<FamilyInfo> families;
  {
    std::lock_guard<std::mutex> lock(mu_);
    families = families_;
  }
  std::sort(families.begin(), families.end(),
            [](const FamilyInfo& a, const FamilyInfo& b) { return a.name < b.name; });
  return families;
}

}  // namespace vf::metrics
