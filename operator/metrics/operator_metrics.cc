#include "operator/metrics/operator_metrics.h"

#include <iterator>
#include <utility>

#include "agent/metrics/build_info.h"

namespace vf {
namespace {

using prometheus::Labels;

// Resize pauses: a rebalance between two steps of a small model on one machine takes tens of
// milliseconds; a grow that waits for a joiner's state transfer and an NCCL communicator takes
// seconds to a minute; a resize stuck on a timeout shows up in the last buckets (up to 10 min).
const std::vector<double> kPauseBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                           5,    10,    30,   60,  120,  300, 600};
// Reconciles read the informer cache and make a few API calls: about a millisecond when nothing
// changes, up to seconds when pods are created or the API server is slow; 30 s is a stuck call.
const std::vector<double> kReconcileBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                               0.25,  0.5,    1,     2.5,  5,     10,   30};
// API calls: a millisecond against a local API server, a second or more under throttling
// (429 retries count in the duration); 60 s is the longest timeout the client uses.
const std::vector<double> kApiBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                         0.5,   1,      2.5,   5,    10,    30,   60};

// The `kind`s of vf_operator_job_workers: the fields of WorkerCounts.
constexpr const char* kWorkerKinds[] = {"current", "desired", "ready", "min", "max"};
constexpr ResizeReason kResizeReasons[] = {ResizeReason::kGrow, ResizeReason::kShrink,
                                           ResizeReason::kFailure, ResizeReason::kLeave,
                                           ResizeReason::kRebalance};
// The `state`s of vf_operator_gpus: the fields of GpuCounts.
constexpr const char* kGpuStates[] = {"free", "allocated", "total"};

// Not `namespace` and `job`: Prometheus sets those on every series from the scrape target (the
// operator's namespace, the scrape job's name) and would rename ours to exported_*.
Labels JobLabels(std::string_view ns, std::string_view job) {
  return {{"job_namespace", std::string(ns)}, {"job_name", std::string(job)}};
}

Labels JobLabels(std::string_view ns, std::string_view job, const char* name,
                 std::string_view value) {
  Labels labels = JobLabels(ns, job);
  labels.emplace(name, std::string(value));
  return labels;
}

// Removes the child with `labels`, if there is one. prometheus-cpp removes by pointer, and Add
// finds an existing child (the `args` only make the one it would create).
template <typename T, typename... Args>
void RemoveChild(prometheus::Family<T>& family, const Labels& labels, const Args&... args) {
  if (family.Has(labels)) family.Remove(&family.Add(labels, args...));
}

}  // namespace

std::string_view ResizeReasonName(ResizeReason reason) {
  switch (reason) {
    case ResizeReason::kGrow:
      return "grow";
    case ResizeReason::kShrink:
      return "shrink";
    case ResizeReason::kFailure:
      return "failure";
    case ResizeReason::kLeave:
      return "leave";
    case ResizeReason::kRebalance:
      return "rebalance";
  }
  return "unknown";
}

OperatorMetrics::OperatorMetrics() {
  metrics::DescribedRegistry& r = families_;
  metrics::AddBuildInfo(r);
  jobs_ = &r.AddGauge("vf_operator_jobs", "VirtualFlowJobs by status phase.", {"phase"});
  job_workers_ = &r.AddGauge(
      "vf_operator_job_workers",
      "Workers of a job: current (pods), desired (policy), ready (in the plan), min and max "
      "(spec).",
      {"job_namespace", "job_name", "kind"});
  resizes_ = &r.AddCounter("vf_operator_resizes_total",
                           "Membership changes of a job, by reason: grow, shrink, failure, "
                           "leave, rebalance.",
                           {"job_namespace", "job_name", "reason"});
  resize_pause_ = &r.AddHistogram("vf_operator_resize_pause_seconds",
                                  "Time training stood still for one resize.",
                                  {"job_namespace", "job_name"}, kPauseBuckets);
  checkpoint_failures_ = &r.AddCounter(
      "vf_operator_job_checkpoint_failures_total",
      "Periodic checkpoints of a job its workers reported not written (training went on).",
      {"job_namespace", "job_name"});
  job_step_ = &r.AddGauge("vf_operator_job_step", "Last training step a job reported.",
                          {"job_namespace", "job_name"});
  job_total_steps_ =
      &r.AddGauge("vf_operator_job_total_steps", "Training steps a job runs in all, once known.",
                  {"job_namespace", "job_name"});
  job_samples_per_second_ = &r.AddGauge("vf_operator_job_samples_per_second",
                                        "Training throughput of a job, all workers together.",
                                        {"job_namespace", "job_name"});
  reconcile_duration_ =
      &r.AddHistogram("vf_operator_reconcile_duration_seconds",
                      "Time one reconcile of one job took.", {}, kReconcileBuckets)
           .Add({}, kReconcileBuckets);
  reconcile_errors_ =
      &r.AddCounter("vf_operator_reconcile_errors_total", "Reconciles that failed.").Add({});
  workqueue_depth_ =
      &r.AddGauge("vf_operator_workqueue_depth", "Jobs waiting to be reconciled.").Add({});
  api_request_duration_ =
      &r.AddHistogram("vf_operator_api_request_duration_seconds",
                      "Kubernetes API calls by verb, watches excluded.", {"verb"}, kApiBuckets);
  api_request_errors_ = &r.AddCounter(
      "vf_operator_api_request_errors_total",
      "Kubernetes API calls that failed, by verb and HTTP code (or reason, with no answer).",
      {"verb", "code"});
  gpus_ = &r.AddGauge("vf_operator_gpus", "GPUs on the cluster's nodes by product and state.",
                      {"product", "state"});
  is_leader_ =
      &r.AddGauge("vf_operator_is_leader", "1 if this replica holds the leader Lease, else 0.")
           .Add({});
  SetJobsByPhase({});
}

void OperatorMetrics::SetJobsByPhase(const std::map<std::string, int64_t>& jobs_by_phase) {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> keep;
  for (const std::string_view phase : kJobPhases) {
    keep.emplace(phase);
    auto it = jobs_by_phase.find(std::string(phase));
    jobs_->Add({{"phase", std::string(phase)}})
        .Set(it == jobs_by_phase.end() ? 0.0 : static_cast<double>(it->second));
  }
  for (const auto& [phase, count] : jobs_by_phase) {
    keep.insert(phase);
    jobs_->Add({{"phase", phase}}).Set(static_cast<double>(count));
  }
  for (const std::string& phase : phases_) {
    if (keep.count(phase) == 0) RemoveChild(*jobs_, {{"phase", phase}});
  }
  phases_ = std::move(keep);
}

void OperatorMetrics::SetJobWorkers(std::string_view ns, std::string_view job,
                                    const WorkerCounts& counts) {
  const int64_t values[] = {counts.current, counts.desired, counts.ready, counts.min, counts.max};
  static_assert(std::size(values) == std::size(kWorkerKinds));
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < std::size(kWorkerKinds); ++i) {
    job_workers_->Add(JobLabels(ns, job, "kind", kWorkerKinds[i]))
        .Set(static_cast<double>(values[i]));
  }
  // A counter or histogram series that first appears with its first event hides that event
  // from increase() and rate(): Prometheus has no earlier sample to subtract. So the job's
  // resize counters (every reason), its pause histogram and its checkpoint failure counter
  // exist, at zero, from the start.
  for (const ResizeReason reason : kResizeReasons) {
    resizes_->Add(JobLabels(ns, job, "reason", ResizeReasonName(reason)));
  }
  resize_pause_->Add(JobLabels(ns, job), kPauseBuckets);
  checkpoint_failures_->Add(JobLabels(ns, job));
}

void OperatorMetrics::SetJobProgress(std::string_view ns, std::string_view job, int64_t step,
                                     double samples_per_second, int64_t total_steps) {
  const Labels labels = JobLabels(ns, job);
  std::lock_guard<std::mutex> lock(mu_);
  job_step_->Add(labels).Set(static_cast<double>(step));
  job_samples_per_second_->Add(labels).Set(samples_per_second);
  if (total_steps > 0) {
    job_total_steps_->Add(labels).Set(static_cast<double>(total_steps));
  } else {
    RemoveChild(*job_total_steps_, labels);
  }
}

void OperatorMetrics::OnResize(std::string_view ns, std::string_view job, ResizeReason reason) {
  std::lock_guard<std::mutex> lock(mu_);
  resizes_->Add(JobLabels(ns, job, "reason", ResizeReasonName(reason))).Increment();
}

void OperatorMetrics::ObserveResizePause(std::string_view ns, std::string_view job,
                                         double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  resize_pause_->Add(JobLabels(ns, job), kPauseBuckets).Observe(seconds);
}

void OperatorMetrics::OnCheckpointFailure(std::string_view ns, std::string_view job) {
  std::lock_guard<std::mutex> lock(mu_);
  checkpoint_failures_->Add(JobLabels(ns, job)).Increment();
}

void OperatorMetrics::RemoveJob(std::string_view ns, std::string_view job) {
  const Labels labels = JobLabels(ns, job);
  std::lock_guard<std::mutex> lock(mu_);
  for (const char* kind : kWorkerKinds) {
    RemoveChild(*job_workers_, JobLabels(ns, job, "kind", kind));
  }
  for (const ResizeReason reason : kResizeReasons) {
    RemoveChild(*resizes_, JobLabels(ns, job, "reason", ResizeReasonName(reason)));
  }
  RemoveChild(*resize_pause_, labels, kPauseBuckets);
  RemoveChild(*checkpoint_failures_, labels);
  RemoveChild(*job_step_, labels);
  RemoveChild(*job_total_steps_, labels);
  RemoveChild(*job_samples_per_second_, labels);
}

void OperatorMetrics::OnReconcile(double seconds, bool failed) {
  reconcile_duration_->Observe(seconds);
  if (failed) reconcile_errors_->Increment();
}

void OperatorMetrics::SetWorkqueueDepth(int64_t depth) {
  workqueue_depth_->Set(static_cast<double>(depth));
}

void OperatorMetrics::OnApiRequest(std::string_view verb, double seconds,
                                   std::string_view error_code) {
  api_request_duration_->Add({{"verb", std::string(verb)}}, kApiBuckets).Observe(seconds);
  if (!error_code.empty()) {
    api_request_errors_->Add({{"verb", std::string(verb)}, {"code", std::string(error_code)}})
        .Increment();
  }
}

void OperatorMetrics::SetGpuInventory(const std::map<std::string, GpuCounts>& by_product) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& product : gpu_products_) {
    if (by_product.count(product) != 0) continue;
    for (const char* state : kGpuStates) {
      RemoveChild(*gpus_, {{"product", product}, {"state", state}});
    }
  }
  gpu_products_.clear();
  for (const auto& [product, counts] : by_product) {
    const int64_t values[] = {counts.free, counts.allocated, counts.total};
    static_assert(std::size(values) == std::size(kGpuStates));
    for (size_t i = 0; i < std::size(kGpuStates); ++i) {
      gpus_->Add({{"product", product}, {"state", kGpuStates[i]}})
          .Set(static_cast<double>(values[i]));
    }
    gpu_products_.insert(product);
  }
}

void OperatorMetrics::SetLeader(bool leader) { is_leader_->Set(leader ? 1.0 : 0.0); }

}  // namespace vf
