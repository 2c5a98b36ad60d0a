#include "operator/metrics/controller_metrics.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace vf {
namespace {

// Exhaustive: a kind added to ResizeKind does not compile until it has a reason here.
ResizeReason ReasonOf(controller::ResizeKind kind) {
  switch (kind) {
    case controller::ResizeKind::kGrow:
      return ResizeReason::kGrow;
    case controller::ResizeKind::kShrink:
      return ResizeReason::kShrink;
    case controller::ResizeKind::kFailure:
      return ResizeReason::kFailure;
    case controller::ResizeKind::kLeave:
      return ResizeReason::kLeave;
  }
  return ResizeReason::kFailure;  // not reached: every kind is above
}

// "namespace/name" -> {namespace, name}.
std::pair<std::string, std::string> SplitJobKey(const std::string& key) {
  const size_t slash = key.find('/');
  return std::make_pair(key.substr(0, slash), key.substr(slash + 1));
}

// The phase of every job the controller knows, for vf_operator_jobs. Thread-safe.
class Phases {
 public:
  explicit Phases(OperatorMetrics& metrics) : metrics_(metrics) {}

  void Set(const std::string& job, const std::string& phase) {
    std::lock_guard<std::mutex> lock(mu_);
    phases_[job] = phase;
    Publish();
  }
  void Erase(const std::string& job) {
    std::lock_guard<std::mutex> lock(mu_);
    phases_.erase(job);
    Publish();
  }

 private:
  // Under mu_, so that two publications never interleave.
  void Publish() {
    std::map<std::string, int64_t> counts;
    for (const auto& [job, phase] : phases_) counts[phase] += 1;
    metrics_.SetJobsByPhase(counts);
  }

  OperatorMetrics& metrics_;
  std::mutex mu_;
  std::map<std::string, std::string> phases_;  // "namespace/name" -> status.phase
};

}  // namespace

void ReportControllerMetrics(controller::ControllerOptions& options, OperatorMetrics& metrics) {
  options.on_reconcile = [&metrics](double s, bool failed) { metrics.OnReconcile(s, failed); };
  options.on_queue_depth = [&metrics](size_t d) {
    metrics.SetWorkqueueDepth(static_cast<int64_t>(d));
  };
  auto phases = std::make_shared<Phases>(metrics);
  controller::ReconcilerHooks& hooks = options.hooks;
  hooks.on_resize = [&metrics](const std::string& job, controller::ResizeKind kind, int, int) {
    auto [job_ns, name] = SplitJobKey(job);
    metrics.OnResize(job_ns, name, ReasonOf(kind));
  };
  hooks.on_resize_pause = [&metrics](const std::string& job, double seconds) {
    auto [job_ns, name] = SplitJobKey(job);
    metrics.ObserveResizePause(job_ns, name, seconds);
  };
  hooks.on_checkpoint_failure = [&metrics](const std::string& job) {
    auto [job_ns, name] = SplitJobKey(job);
    metrics.OnCheckpointFailure(job_ns, name);
  };
  hooks.on_job_status = [&metrics, phases](const std::string& job, const nlohmann::json& status,
                                           const JobSpec& spec) {
    auto [job_ns, name] = SplitJobKey(job);
    OperatorMetrics::WorkerCounts counts;
    counts.current = status.value("workers", 0);
    counts.desired = status.value("desiredWorkers", 0);
    counts.ready = status.value("readyWorkers", 0);
    counts.min = spec.replicas_min;
    counts.max = spec.replicas_max;
    metrics.SetJobWorkers(job_ns, name, counts);
    metrics.SetJobProgress(job_ns, name, status.value("step", int64_t{0}),
                           status.value("samplesPerSecond", 0.0),
                           status.value("totalSteps", int64_t{0}));
    phases->Set(job, status.value("phase", "Pending"));
  };
  // The reconciler calls this last for a job that is gone: deleted by a user, or by the
  // operator once its TTL after finishing ran out. Nothing of it stays in the registry.
  hooks.on_job_gone = [&metrics, phases](const std::string& job) {
    auto [job_ns, name] = SplitJobKey(job);
    metrics.RemoveJob(job_ns, name);
    phases->Erase(job);
  };
  hooks.on_inventory = [&metrics](const controller::ClusterGpus& gpus) {
    std::map<std::string, OperatorMetrics::GpuCounts> by_product;
    for (const auto& [product, c] : gpus.products) {
      by_product[product] = {c.free(), c.allocated, c.total};
    }
    metrics.SetGpuInventory(by_product);
  };
}

}  // namespace vf
