// The operator's metrics: jobs, workers, resizes, reconciles, API calls, GPUs and leadership.
// The names are an interface (dashboards and alerts use them); docs/metrics.md lists them, and a
// test keeps that list and these families the same.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "runtime/metrics/family.h"
#include "runtime/metrics/metric.h"
#include "runtime/metrics/registry.h"

namespace vf {

// The job phases a VirtualFlowJob's status can hold; vf_operator_jobs has a series for each.
inline constexpr std::string_view kJobPhases[] = {"Pending", "Running", "Resizing", "Succeeded",
                                                  "Failed"};

// Why a job's membership changed: the `reason` label of vf_operator_resizes_total.
enum class ResizeReason {
  kGrow,       // more workers: capacity came free or a job finished
  kShrink,     // fewer workers: capacity went to another job
  kFailure,    // a worker failed and the job went on without it
  kLeave,      // a worker asked to leave (its pod is being deleted)
  kRebalance,  // same workers, virtual nodes moved between them
};

// "grow", "shrink", "failure", "leave", "rebalance".
std::string_view ResizeReasonName(ResizeReason reason);

// Owns the operator's metric families in their own Registry, which the operator serves on
// GET /metrics. Thread-safe: the families are, the unlabelled children are fixed at construction,
// and the methods that replace a whole family's contents (SetJobsByPhase, SetGpuInventory) are
// serialised so that two callers cannot leave a mix of both.
class OperatorMetrics {
 public:
  // vf_operator_job_workers{kind}, one series per field.
  struct WorkerCounts {
    int64_t current = 0;  // worker pods that exist
    int64_t desired = 0;  // what the policy gives the job now
    int64_t ready = 0;    // workers registered and in the current plan
    int64_t min = 0;      // spec.minWorkers
    int64_t max = 0;      // spec.maxWorkers
  };

  // vf_operator_gpus{product}, one series per field.
  struct GpuCounts {
    int64_t free = 0;
    int64_t allocated = 0;
    int64_t total = 0;
  };

  OperatorMetrics();
  OperatorMetrics(const OperatorMetrics&) = delete;
  OperatorMetrics& operator=(const OperatorMetrics&) = delete;

  metrics::Registry& registry() { return registry_; }
  const metrics::Registry& registry() const { return registry_; }

  // ---- Jobs ----

  // Sets vf_operator_jobs for every phase: each of kJobPhases (0 where `jobs_by_phase` has no
  // entry), and any other phase it names; a phase neither known nor named is dropped.
  void SetJobsByPhase(const std::map<std::string, int64_t>& jobs_by_phase);
  // Also creates the job's resize counters (every reason) and pause histogram at zero, so that
  // Prometheus' increase() counts the first resize.
  void SetJobWorkers(std::string_view ns, std::string_view job, const WorkerCounts& counts);
  void SetJobProgress(std::string_view ns, std::string_view job, int64_t step,
                      double samples_per_second);
  void OnResize(std::string_view ns, std::string_view job, ResizeReason reason);
  // The time training stood still for one resize, from the agents' reports.
  void ObserveResizePause(std::string_view ns, std::string_view job, double seconds);
  // Removes every series of the job (workers, resizes, pauses, step, samples per second), so
  // that a deleted job leaves nothing behind. A later call about the job brings its series back:
  // call this after the last one.
  void RemoveJob(std::string_view ns, std::string_view job);

  // ---- Control loop ----

  void OnReconcile(double seconds, bool failed);
  void SetWorkqueueDepth(int64_t depth);
  // One Kubernetes API call (watches excluded: they are open for minutes by design). `verb` is
  // get|list|create|update|patch|delete|...; `error_code` is empty on success, else the HTTP
  // status ("409") or, when there was no HTTP answer, the reason ("Transport",
  // "DeadlineExceeded"). Keep both to small fixed sets: each value is a series.
  void OnApiRequest(std::string_view verb, double seconds, std::string_view error_code = {});
  // Replaces vf_operator_gpus: one free/allocated/total triple per GPU product (the
  // nvidia.com/gpu.product label); products not in `by_product` are dropped.
  void SetGpuInventory(const std::map<std::string, GpuCounts>& by_product);
  void SetLeader(bool leader);

  // ---- The families, for what the methods above do not cover ----
  // Labels: jobs {phase}; job_workers {namespace, job, kind}; resizes {namespace, job, reason};
  // resize_pause_seconds, job_step, job_samples_per_second {namespace, job};
  // api_request_duration_seconds {verb}; api_request_errors {verb, code}; gpus {product, state}.
  // The unlabelled ones are given as their single child.

  metrics::Family<metrics::Gauge>& jobs() { return *jobs_; }
  metrics::Family<metrics::Gauge>& job_workers() { return *job_workers_; }
  metrics::Family<metrics::Counter>& resizes() { return *resizes_; }
  metrics::Family<metrics::Histogram>& resize_pause_seconds() { return *resize_pause_; }
  metrics::Family<metrics::Gauge>& job_step() { return *job_step_; }
  metrics::Family<metrics::Gauge>& job_samples_per_second() { return *job_samples_per_second_; }
  metrics::Histogram& reconcile_duration_seconds() { return *reconcile_duration_; }
  metrics::Counter& reconcile_errors() { return *reconcile_errors_; }
  metrics::Gauge& workqueue_depth() { return *workqueue_depth_; }
  metrics::Family<metrics::Histogram>& api_request_duration_seconds() {
    return *api_request_duration_;
  }
  metrics::Family<metrics::Counter>& api_request_errors() { return *api_request_errors_; }
  metrics::Family<metrics::Gauge>& gpus() { return *gpus_; }
  metrics::Gauge& is_leader() { return *is_leader_; }

 private:
  metrics::Registry registry_;
  std::mutex replace_mu_;  // held by SetJobsByPhase and SetGpuInventory
  metrics::Family<metrics::Gauge>* jobs_ = nullptr;
  metrics::Family<metrics::Gauge>* job_workers_ = nullptr;
  metrics::Family<metrics::Counter>* resizes_ = nullptr;
  metrics::Family<metrics::Histogram>* resize_pause_ = nullptr;
  metrics::Family<metrics::Gauge>* job_step_ = nullptr;
  metrics::Family<metrics::Gauge>* job_samples_per_second_ = nullptr;
  metrics::Histogram* reconcile_duration_ = nullptr;
  metrics::Counter* reconcile_errors_ = nullptr;
  metrics::Gauge* workqueue_depth_ = nullptr;
  metrics::Family<metrics::Histogram>* api_request_duration_ = nullptr;
  metrics::Family<metrics::Counter>* api_request_errors_ = nullptr;
  metrics::Family<metrics::Gauge>* gpus_ = nullptr;
  metrics::Gauge* is_leader_ = nullptr;
};

}  // namespace vf
