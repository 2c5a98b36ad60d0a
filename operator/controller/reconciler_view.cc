// What every reconcile reads of the whole cluster (ClusterView): the GPU inventory, every job's
// pods and spec, and the policy's decision for every job.
#include "operator/controller/reconciler.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "operator/controller/job_spec.h"
#include "operator/controller/reconciler_internal.h"

namespace vf::controller {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using reconciler_internal::ManagedHere;
using reconciler_internal::NowUnix;
using reconciler_internal::Obj;
using reconciler_internal::TemplateOf;
using reconciler_internal::UnixSeconds;

std::shared_ptr<const Result<JobSpec>> Reconciler::CachedSpecOf(const json& job) {
  const json& meta = Obj(job, "metadata");
  const std::string key = ObjectKey(job);
  const std::string uid = meta.value("uid", "");
  const std::string version = meta.value("resourceVersion", "");
  if (!uid.empty() && !version.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    // Only for a job that still exists: Forget erased the memory of one that is gone.
    if (jobs_.Has(key)) {
      const JobMemory& memory = MemoryOf(key, uid);
      if (memory.spec && memory.spec_version == version) return memory.spec;
    }
  }
  auto parsed = std::make_shared<const Result<JobSpec>>(JobSpecOf(job));
  if (!uid.empty() && !version.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.Has(key)) {
      JobMemory& memory = MemoryOf(key, uid);
      memory.spec_version = version;
      memory.spec = parsed;
    }
  }
  return parsed;
}

std::optional<policy::PolicyJob> Reconciler::PolicyJobOf(const json& job, const ClusterGpus& gpus,
                                                         PolicyContext& context) {
  const json& status = Obj(job, "status");
  if (Ended(PhaseOf(status))) return std::nullopt;
  if (Obj(job, "metadata").contains("deletionTimestamp")) return std::nullopt;
  if (!ManagedHere(job)) return std::nullopt;  // it runs elsewhere; it takes no GPUs here
  // A job whose spec does not parse is failed by its own reconcile; it takes no GPUs.
  const std::shared_ptr<const Result<JobSpec>> spec = CachedSpecOf(job);
  if (!spec->ok()) return std::nullopt;
  const JobSpec& s = spec->value();
  policy::PolicyJob p;
  p.id = ObjectKey(job);
  p.virtual_nodes = s.virtual_nodes;
  p.min_workers = s.replicas_min;
  p.max_workers = s.replicas_max;
  const bool cpu_only = s.gpus_per_worker == 0;
  if (cpu_only) {
    // CPU-only workers are counted in the CPU pool, in millicores.
    p.gpus_per_worker = static_cast<int>(WorkerCpuMillis(job));
    p.allowed_types = {kCpuPool};
    p.unit = "CPU millicores";
  } else {
    p.gpus_per_worker = s.gpus_per_worker;
    const json& pod_template = TemplateOf(job);
    const std::string template_key = pod_template.dump();
    auto known = context.products_by_template.find(template_key);
    if (known == context.products_by_template.end()) {
      known =
          context.products_by_template.emplace(template_key, EligibleProducts(gpus, pod_template))
              .first;
    }
    p.allowed_types = known->second;
    // No eligible node at all: a type no inventory has, so that the job gets nothing (an
    // empty list would mean every type).
    if (p.allowed_types.empty()) p.allowed_types = {"(no eligible node)"};
  }
  if (s.suspend) return std::nullopt;  // holds nothing and wants nothing
  if (std::optional<int> cap = KueueCap(job, s)) {
    // Waiting for Kueue: no GPUs; admitted: no more workers than Kueue admitted.
    if (*cap <= 0) return std::nullopt;
    p.max_workers = std::min(p.max_workers, *cap);
    p.min_workers = std::min(p.min_workers, p.max_workers);
  }
  // The job's own policy when its manifest names one (the API server defaults it only inside a
  // given spec.elasticity); otherwise the operator's --policy decides it.
  if (Obj(Obj(job, "spec"), "elasticity").contains("policy")) p.policy = s.elasticity.policy;
  p.cooldown_seconds = s.elasticity.cooldown_seconds;
  p.arrival_time = UnixSeconds(Obj(job, "metadata").value("creationTimestamp", ""));
  if (std::isnan(p.arrival_time)) p.arrival_time = 0;
  const double last = UnixSeconds(Obj(status, "lastResize").value("time", ""));
  p.last_resize_time = std::isnan(last) ? p.arrival_time : last;
  p.resize_pause_seconds = Obj(status, "lastResize").value("pauseSeconds", 0.0);
  // What it holds: its live pods, by the product of the node they are bound to.
  auto own = context.pods_by_job->find(p.id);
  if (own == context.pods_by_job->end()) return p;
  for (const std::shared_ptr<const json>& pod : own->second) {
    const PodLife life = PodLifeOf(*pod);
    if (life != PodLife::kStarting && life != PodLife::kRunning) continue;
    const std::string node = Obj(*pod, "spec").value("nodeName", "");
    // A pod the scheduler has not bound yet is the job's too: without it, a job whose pods
    // are bound one by one would look smaller than it is and lose its newest pods.
    if (node.empty()) {
      ++p.unbound_workers;
      continue;
    }
    if (cpu_only) {
      if (gpus.nodes.count(node) != 0) p.current[kCpuPool] += 1;
      continue;
    }
    // The type the job's accelerator counts in on that node (a product, or a MIG profile).
    const std::string type = TypeOnNode(gpus, node, AcceleratorResource(s));
    if (!type.empty()) p.current[type] += 1;
  }
  return p;
}

std::shared_ptr<const Reconciler::ClusterView> Reconciler::View() {
  std::lock_guard<std::mutex> lock(view_mu_);
  const uint64_t jobs_version = jobs_.version();
  const uint64_t pods_version = pods_.version();
  const uint64_t nodes_version = nodes_.version();
  const uint64_t workloads_version = workloads_ != nullptr ? workloads_->version() : 0;
  if (view_ && view_->jobs_version == jobs_version && view_->pods_version == pods_version &&
      view_->nodes_version == nodes_version && view_->workloads_version == workloads_version &&
      Clock::now() - view_->made < kViewMaxAge) {
    return view_;
  }
  view_ = MakeView(jobs_version, pods_version, nodes_version, workloads_version);
  return view_;
}

std::shared_ptr<const Reconciler::ClusterView> Reconciler::MakeView(uint64_t jobs_version,
                                                                    uint64_t pods_version,
                                                                    uint64_t nodes_version,
                                                                    uint64_t workloads_version) {
  auto view = std::make_shared<ClusterView>();
  view->jobs_version = jobs_version;
  view->pods_version = pods_version;
  view->nodes_version = nodes_version;
  view->workloads_version = workloads_version;
  view->made = Clock::now();
  // Shared with the caches, not copied.
  const std::vector<std::shared_ptr<const json>> all_pods = pods_.Snapshot();
  view->gpus = CountGpus(nodes_.Snapshot(), all_pods);
  for (const std::shared_ptr<const json>& pod : all_pods) {
    const json& meta = Obj(*pod, "metadata");
    const json& labels = Obj(meta, "labels");
    auto label = labels.find(kJobLabel);
    if (label == labels.end() || !label->is_string()) continue;
    view->pods_by_job[meta.value("namespace", "") + "/" + label->get<std::string>()].push_back(pod);
  }
  PolicyContext context{&view->pods_by_job, {}};
  std::vector<policy::PolicyJob> jobs;
  for (const std::shared_ptr<const json>& job : jobs_.Snapshot()) {
    std::optional<policy::PolicyJob> p = PolicyJobOf(*job, view->gpus, context);
    if (p) jobs.push_back(std::move(*p));
  }
  policy::GpuInventory inventory;
  const ClusterGpus& gpus = view->gpus;
  for (const auto& [product, count] : gpus.products) {
    auto held = gpus.held_by_others.find(product);
    auto waiting = gpus.pending_demand.find(product);
    // What other workloads hold, and what their pending pods wait for: left to them.
    inventory.gpus[product] =
        std::max(0, count.total - (held == gpus.held_by_others.end() ? 0 : held->second) -
                        (waiting == gpus.pending_demand.end() ? 0 : waiting->second));
  }
  int64_t cpu = 0;
  for (const auto& [node, millis] : gpus.cpu_allocatable) {
    auto held = gpus.cpu_held_by_others.find(node);
    cpu +=
        std::max<int64_t>(0, millis - (held == gpus.cpu_held_by_others.end() ? 0 : held->second));
  }
  inventory.gpus[kCpuPool] = static_cast<int>(std::min<int64_t>(cpu, 1 << 30));
  view->decision = policy_->Decide(jobs, inventory, NowUnix());
  return view;
}

Reconciler::Desired Reconciler::DesiredWorkers(const Pass& p, const ClusterView& view) {
  // The policy counts GPUs by product across the cluster; the scheduler places a pod only on
  // a node its template allows, with room on that node.
  const int64_t cpu_millis = WorkerCpuMillis(p.job);
  const std::string fit_key = TemplateOf(p.job).dump() + '\n' +
                              std::to_string(p.spec.gpus_per_worker) + '\n' +
                              std::to_string(cpu_millis);
  std::optional<int> known;
  {
    std::lock_guard<std::mutex> lock(view.fit_mu);
    auto it = view.fit.find(fit_key);
    if (it != view.fit.end()) known = it->second;
  }
  const int fit =
      known ? *known
            : EligibleWorkers(view.gpus, TemplateOf(p.job), p.spec.gpus_per_worker, cpu_millis);
  if (!known) {
    std::lock_guard<std::mutex> lock(view.fit_mu);
    view.fit.emplace(fit_key, fit);
  }
  if (!view.decision.ok()) return {0, view.decision.status().message(), {}, fit};
  const policy::JobDecision* mine = view.decision->Find(p.key);
  if (mine == nullptr) return {0, "not scheduled", {}, fit};
  Desired out{policy::TotalWorkers(mine->workers), mine->reason, mine->workers, fit};
  if (out.workers > fit) {
    out.workers = fit;
    out.reason += "; " + std::to_string(fit) +
                  " fit on the nodes its nodeSelector, affinity and tolerations allow";
  }
  // spec.replicas.desired (the scale subresource) caps it; it never adds workers that do not fit.
  const std::optional<int>& asked = p.spec.replicas_desired;
  if (asked && out.workers > *asked) {
    out.workers = *asked;
    out.reason += "; spec.replicas.desired is " + std::to_string(*asked);
  }
  return out;
}

}  // namespace vf::controller
