// The operator's metrics: jobs, workers, progress, resizes, reconciles, API calls, GPUs,
// leadership and the build. A job's series are labelled job_namespace and job_name, never
// `namespace` or `job`, which Prometheus sets from the scrape target.
// The names are an interface (dashboards and alerts use them); docs/metrics.md lists them, and a
// test keeps that list and these families the same.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/metrics/described_registry.h"

namespace vf {

// The job phases a VirtualFlowJob's status can hold; vf_operator_jobs has a series for each.
inline constexpr std::string_view kJobPhases[] = {"Pending",   "Running",   "Resizing",
                                                  "Suspended", "Succeeded", "Failed"};

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
// GET /metrics. Thread-safe: the unlabelled children are fixed at construction; the children of
// the per-job, per-phase and per-GPU-product families come and go, and prometheus-cpp frees a
// removed child at once, so one mutex serialises every method that adds to or removes from those
// families (which also keeps two callers of SetJobsByPhase or SetGpuInventory from leaving a mix
// of both).
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

  prometheus::Registry& registry() { return families_.registry(); }
  const prometheus::Registry& registry() const { return families_.registry(); }
  // Every family, sorted by name: what docs/metrics.md lists.
  std::vector<metrics::FamilyInfo> Describe() const { return families_.Describe(); }

  // ---- Jobs ----

  // Sets vf_operator_jobs for every phase: each of kJobPhases (0 where `jobs_by_phase` has no
  // entry), and any other phase it names; a phase neither known nor named is dropped.
  void SetJobsByPhase(const std::map<std::string, int64_t>& jobs_by_phase);
  // Also creates the job's resize counters (every reason), pause histogram and checkpoint
  // failure counter at zero, so that Prometheus' increase() counts the first event.
  void SetJobWorkers(std::string_view ns, std::string_view job, const WorkerCounts& counts);
  // The job's last step, its throughput and its length in steps. `total_steps` 0 means not
  // known yet (a job of epochs whose agents have not loaded the training set): then the job has
  // no vf_operator_job_total_steps series, rather than one that makes step / total infinite.
  void SetJobProgress(std::string_view ns, std::string_view job, int64_t step,
                      double samples_per_second, int64_t total_steps);
  void OnResize(std::string_view ns, std::string_view job, ResizeReason reason);
  // The time training stood still for one resize, from the agents' reports.
  void ObserveResizePause(std::string_view ns, std::string_view job, double seconds);
  // A periodic checkpoint of the job that a worker reported it failed to write.
  void OnCheckpointFailure(std::string_view ns, std::string_view job);
  // Removes every series of the job (workers, resizes, pauses, checkpoint failures, step, total
  // steps, samples per second), so that a deleted job leaves nothing behind. A later call about the
  // job brings its series back: call this after the last one.
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

  // ---- The unlabelled children, for what the methods above do not cover ----
  // (The labelled families are reached through the methods only: a child taken from one could be
  // freed by RemoveJob, SetJobsByPhase or SetGpuInventory on another thread.)

  prometheus::Histogram& reconcile_duration_seconds() { return *reconcile_duration_; }
  prometheus::Counter& reconcile_errors() { return *reconcile_errors_; }
  prometheus::Gauge& workqueue_depth() { return *workqueue_depth_; }
  prometheus::Gauge& is_leader() { return *is_leader_; }

 private:
  metrics::DescribedRegistry families_;
  // Held by every method that adds children to the families below or removes them, for as long
  // as it uses a child it got from Family::Add.
  std::mutex mu_;
  std::set<std::string> phases_;        // the phases vf_operator_jobs has a series for
  std::set<std::string> gpu_products_;  // the products vf_operator_gpus has series for
  prometheus::Family<prometheus::Gauge>* jobs_ = nullptr;
  prometheus::Family<prometheus::Gauge>* job_workers_ = nullptr;
  prometheus::Family<prometheus::Counter>* resizes_ = nullptr;
  prometheus::Family<prometheus::Histogram>* resize_pause_ = nullptr;
  prometheus::Family<prometheus::Counter>* checkpoint_failures_ = nullptr;
  prometheus::Family<prometheus::Gauge>* job_step_ = nullptr;
  prometheus::Family<prometheus::Gauge>* job_total_steps_ = nullptr;
  prometheus::Family<prometheus::Gauge>* job_samples_per_second_ = nullptr;
  prometheus::Family<prometheus::Gauge>* gpus_ = nullptr;
  // Never removed from: their children are used without mu_.
  prometheus::Family<prometheus::Histogram>* api_request_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* api_request_errors_ = nullptr;
  // Fixed at construction.
  prometheus::Histogram* reconcile_duration_ = nullptr;
  prometheus::Counter* reconcile_errors_ = nullptr;
  prometheus::Gauge* workqueue_depth_ = nullptr;
  prometheus::Gauge* is_leader_ = nullptr;
};

}  // namespace vf
