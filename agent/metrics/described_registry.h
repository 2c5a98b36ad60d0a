// A prometheus-cpp Registry together with what each of its families is. prometheus-cpp keeps
// label names and histogram buckets per child, not per family, and a family with no child yet
// is not exported at all; but the metrics reference (docs/metrics.md, checked by a test against
// Describe()) and the tests need every family's type, help, label names and buckets from the
// start.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_type.h>
#include <prometheus/registry.h>

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace vf::metrics {

// What a metric family is, as registered. Value type.
struct FamilyInfo {
  std::string name;
  std::string help;
  prometheus::MetricType type = prometheus::MetricType::Untyped;
  std::vector<std::string> label_names;  // in the order they were given
  std::vector<double> buckets;           // histograms: the upper bounds, +Inf implied
};

// "counter", "gauge", "histogram", "summary", "untyped": the word of the text format's # TYPE
// line.
std::string_view TypeName(prometheus::MetricType type);

// Registers metric families and remembers what each is. The families of this project are
// fixed in the code, so a registration that fails is a bug there and the process aborts with a
// message that says which family and why: an invalid metric or label name, a label name given
// twice, "le" on a histogram, buckets that are not finite and strictly increasing, a name taken
// twice, or help text with a backslash or a line break (prometheus-cpp 1.0 writes help text
// unescaped). Thread-safe.
class DescribedRegistry {
 public:
  DescribedRegistry() = default;
  DescribedRegistry(const DescribedRegistry&) = delete;
  DescribedRegistry& operator=(const DescribedRegistry&) = delete;

  prometheus::Family<prometheus::Counter>& AddCounter(std::string name, std::string help,
                                                      std::vector<std::string> label_names = {});
  prometheus::Family<prometheus::Gauge>& AddGauge(std::string name, std::string help,
                                                  std::vector<std::string> label_names = {});
  // Each child of the family must be added with these same `buckets`.
  prometheus::Family<prometheus::Histogram>& AddHistogram(std::string name, std::string help,
                                                          std::vector<std::string> label_names,
                                                          std::vector<double> buckets);

  prometheus::Registry& registry() { return registry_; }
  const prometheus::Registry& registry() const { return registry_; }

  // Every family registered, sorted by name.
  std::vector<FamilyInfo> Describe() const;

 private:
  // Aborts unless `info` can be registered; then records it. Takes mu_.
  void Record(const FamilyInfo& info);

  // Throw, not Merge: a name registered twice is a bug to report, not a family to share.
  prometheus::Registry registry_{prometheus::Registry::InsertBehavior::Throw};
  mutable std::mutex mu_;  // guards families_
  std::vector<FamilyInfo> families_;
};

}  // namespace vf::metrics
