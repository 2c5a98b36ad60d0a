// The set of metric families one process exports (prometheus-cpp's Registry), and its text form.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/metrics/family.h"
#include "runtime/metrics/metric.h"
#include "runtime/status.h"

namespace vf::metrics {

// Whether `name` is a valid metric name: [a-zA-Z_:][a-zA-Z0-9_:]*.
bool IsValidMetricName(std::string_view name);
// Whether `name` is a valid label name: [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__"
// (reserved for Prometheus' own labels).
bool IsValidLabelName(std::string_view name);

// Owns metric families and writes them out. Thread-safe: a mutex guards the set of families;
// each family guards its own children (the lock order is registry, then family). Families live
// as long as the registry, so the pointers it returns stay valid that long.
class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Registers a family. InvalidArgument for an invalid metric or label name, a label name given
  // twice, "le" on a histogram, bucket bounds that are not finite and strictly increasing, or a
  // name already taken: by another family, or by a histogram's _bucket, _sum or _count series.
  Result<Family<Counter>*> AddCounter(std::string name, std::string help,
                                      std::vector<std::string> label_names = {});
  Result<Family<Gauge>*> AddGauge(std::string name, std::string help,
                                  std::vector<std::string> label_names = {});
  Result<Family<Histogram>*> AddHistogram(std::string name, std::string help,
                                          std::vector<std::string> label_names,
                                          std::vector<double> bounds);

  // Every family with its descriptor, sorted by name, children included.
  std::vector<FamilySnapshot> Collect() const;
  // Every family's descriptor, sorted by name.
  std::vector<FamilyDescriptor> Describe() const;
  // Collect() in the Prometheus text exposition format 0.0.4 (text_format.h); deterministic for
  // the same contents.
  std::string Serialize() const;

 private:
  Status Check(const FamilyDescriptor& descriptor) const;  // mu_ held
  // The sample names a family writes: its name, and for a histogram the _bucket, _sum and
  // _count series.
  static std::vector<std::string> SeriesNames(const FamilyDescriptor& descriptor);

  template <typename T>
  Result<Family<T>*> Add(FamilyDescriptor descriptor);

  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>> families_;
  std::set<std::string> series_names_;
};

}  // namespace vf::metrics
