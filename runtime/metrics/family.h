// A metric family: one name, help text and type, with one child metric per combination of label
// values (prometheus-cpp's Family). Families are made by a Registry (registry.h).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/metrics/metric.h"
#include "runtime/status.h"

namespace vf::metrics {

// Label name -> value, as prometheus-cpp spells it: family.Add({{"namespace", ns}, {"job", j}}).
using Labels = std::map<std::string, std::string>;

// What a family is, without its children. Value type.
struct FamilyDescriptor {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> label_names;  // in the order the family was declared with
  std::vector<double> bounds;            // histograms only: the bucket upper bounds, +Inf implied
};

// One child as a scrape reads it. Value type.
struct ChildSnapshot {
  std::vector<std::string> label_values;  // in the order of FamilyDescriptor::label_names
  double value = 0.0;                     // counters and gauges
  Histogram::Snapshot histogram;          // histograms
};

// A family as a scrape reads it: children ordered by their label values. Value type.
struct FamilySnapshot {
  FamilyDescriptor family;
  std::vector<ChildSnapshot> children;
};

// The part of a family that does not depend on the metric type, so that a Registry can hold
// families of every type. Thread-safe.
class FamilyBase {
 public:
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const FamilyDescriptor& descriptor() const { return descriptor_; }
  const std::string& name() const { return descriptor_.name; }

  // The children now present; a child added or removed meanwhile is in it or not, whole.
  virtual FamilySnapshot Collect() const = 0;
  virtual size_t size() const = 0;

 protected:
  explicit FamilyBase(FamilyDescriptor descriptor) : descriptor_(std::move(descriptor)) {}

  // The values of `labels` in the order of the label names, or InvalidArgument naming the
  // missing and the unknown label names.
  Result<std::vector<std::string>> LabelValues(const Labels& labels) const;
  // Whether the child with `values` has every label of `subset` with the same value. `subset`
  // naming a label the family does not have matches nothing.
  bool Matches(const std::vector<std::string>& values, const Labels& subset) const;

 private:
  const FamilyDescriptor descriptor_;
};

// The children of one metric family, each a T (Counter, Gauge or Histogram). Thread-safe: a
// mutex guards the set of children (Add, Remove, Collect); the children themselves are updated
// without it. A reference returned by Add stays valid until that child is removed; where another
// thread may remove it meanwhile, hold it through AddShared instead.
template <typename T>
class Family final : public FamilyBase {
 public:
  // The child with these labels, made (at zero) on first use; the same labels always give the
  // same child. `labels` must name exactly the family's label names: anything else is a bug at
  // the call site, and the process aborts with a message that says which labels were wrong.
  T& Add(const Labels& labels);
  // The same child, kept alive by the pointer even if it is removed meanwhile (an update that
  // loses that race lands on a child no longer exported, and is dropped with it).
  std::shared_ptr<T> AddShared(const Labels& labels);
  // AddShared, with wrong label names returned as InvalidArgument instead of aborting.
  Result<std::shared_ptr<T>> TryAdd(const Labels& labels);

  // Removes the child with these labels, so that its series is no longer exported (a deleted
  // job); added again, it starts from zero. References from Add dangle from here on. False if
  // there was none.
  bool Remove(const Labels& labels);
  // Removes every child whose labels include all of `subset` (e.g. {namespace, job} removes a
  // job's series for every `kind`). Returns how many were removed.
  size_t RemoveMatching(const Labels& subset);

  FamilySnapshot Collect() const override;
  size_t size() const override;

 private:
  friend class Registry;
  explicit Family(FamilyDescriptor descriptor) : FamilyBase(std::move(descriptor)) {}

  mutable std::mutex mu_;
  // Keyed by label values in label-name order: std::map makes the scrape order deterministic,
  // the pointer keeps each child at one address while others come and go.
  std::map<std::vector<std::string>, std::shared_ptr<T>> children_;
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

}  // namespace vf::metrics
