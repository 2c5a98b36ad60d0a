// The metric types of the metrics model: Counter, Gauge and Histogram. The model knows nothing of
// HTTP; Family and Registry (family.h, registry.h) group metrics and write them out.
//
// No Prometheus C++ client is packaged on this platform, so the model is the project's own. Its
// interface is shaped like prometheus-cpp's (Registry / Family / Counter, Gauge, Histogram, with
// Increment, Set, Observe, Family::Add and Remove), so that call sites would change little if it
// were swapped for that library later.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace vf::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge", "histogram": the words of the text format's # TYPE line.
std::string_view MetricTypeName(MetricType type);

// A value that only goes up (requests served, seconds spent), reset only by a process restart,
// which Prometheus' rate() and increase() allow for. Thread-safe and lock-free (one atomic).
class Counter {
 public:
  static constexpr MetricType kType = MetricType::kCounter;

  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `v`. A negative or NaN `v` is ignored: a counter that went down would read to rate() as
  // a restart, and a NaN would stick for the life of the process.
  void Increment(double v = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue depth, workers, loss). Thread-safe and lock-free (one
// atomic).
class Gauge {
 public:
  static constexpr MetricType kType = MetricType::kGauge;

  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Increment(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void Decrement(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A distribution of observations (durations, sizes) counted into fixed buckets. Thread-safe and
// lock-free: one atomic count per bucket and an atomic sum. A snapshot taken while observations
// are under way is consistent in its counts (the +Inf bucket always equals the count, the
// buckets never decrease) but may lag in its sum by the observations in flight.
class Histogram {
 public:
  static constexpr MetricType kType = MetricType::kHistogram;

  // What a scrape reads. Value type.
  struct Snapshot {
    std::vector<double> bounds;        // upper bounds, +Inf not included
    std::vector<uint64_t> cumulative;  // observations <= bounds[i]; one more entry for +Inf
    uint64_t count = 0;                // == cumulative.back()
    double sum = 0.0;
  };

  // OK if `bounds` (the upper bounds, "le") are finite and strictly increasing. +Inf is implied
  // and must not be listed. An empty list is allowed (a histogram of only +Inf: a count and a
  // sum).
  static Status ValidateBounds(const std::vector<double>& bounds);

  // `bounds` must pass ValidateBounds (the Registry checks before it makes a family).
  explicit Histogram(std::vector<double> bounds);
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `v` into the first bucket whose bound is >= v. NaN is ignored: it belongs in no
  // bucket, and would make the sum NaN for good.
  void Observe(double v);

  Snapshot Collect() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  const std::vector<double> bounds_;
  // Per bucket, not cumulative: bounds_.size() + 1 entries, the last for +Inf.
  const std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0.0};
};

}  // namespace vf::metrics
