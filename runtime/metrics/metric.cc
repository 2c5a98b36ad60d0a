#include "runtime/metrics/metric.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

namespace vf::metrics {

std::string_view MetricTypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void Counter::Increment(double v) {
  // !(v >= 0) is true for NaN as well.
  if (!(v >= 0.0)) return;
  value_.fetch_add(v, std::memory_order_relaxed);
}

Status Histogram::ValidateBounds(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      return InvalidArgument("histogram bucket bound " + std::to_string(i) +
                             " is not finite (+Inf is implied and must not be listed)");
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      return InvalidArgument("histogram bucket bounds must be strictly increasing; bound " +
                             std::to_string(i) + " (" + std::to_string(bounds[i]) +
                             ") is not above bound " + std::to_string(i - 1) + " (" +
                             std::to_string(bounds[i - 1]) + ")");
    }
  }
  return Status::Ok();
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  // "le": the first bound >= v; past the end is the +Inf bucket.
  const size_t bucket =
      static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot snapshot;
  snapshot.bounds = bounds_;
  snapshot.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    snapshot.cumulative[i] = running;
  }
  // The count is derived from the buckets rather than kept apart, so that a scrape never shows
  // a +Inf bucket that disagrees with _count.
  snapshot.count = running;
  snapshot.sum = sum_.load(std::memory_order_relaxed);
  return snapshot;
}

}  // namespace vf::metrics
