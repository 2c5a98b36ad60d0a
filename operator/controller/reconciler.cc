// The reconcile of one job and its order of steps: reading the job, registering it with the
// coordinator, patching its status and recording its Events.
#include "operator/controller/reconciler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "operator/controller/job_key.h"
#include "operator/controller/job_spec.h"
#include "operator/controller/reconciler_internal.h"

namespace vf::controller {

using nlohmann::json;
using reconciler_internal::ManagedHere;
using reconciler_internal::MembersFromJson;
using reconciler_internal::Now;
using reconciler_internal::Obj;
using reconciler_internal::OwnedBy;
using reconciler_internal::PodName;
using reconciler_internal::SetCondition;

namespace {

std::string OwnBuild() { return std::string("virtualflow ") + VF_VERSION; }

// Status without the timestamps that change on every write, to tell whether a write is needed.
json Comparable(json status) {
  if (status.contains("conditions")) {
    for (json& c : status["conditions"]) c.erase("lastTransitionTime");
  }
  return status;
}

// The job's length once known: from the spec when it counts steps, else from the agents, who
// loaded the training set and know its size (0 until one has reported).
int64_t KnownTotalSteps(const JobSpec& spec, const JobView& view) {
  int64_t total = TotalSteps(spec, /*train_samples=*/0);
  for (const auto& [worker, info] : view.workers) {
    total = std::max(total, info.last_report.total_steps);
  }
  return total;
}

}  // namespace

Result<std::unique_ptr<Reconciler>> Reconciler::Create(
    kube::Client& client, const Informer& jobs, const Informer& pods, const Informer& nodes,
    Coordinator& coordinator, ReconcilerOptions options, ReconcilerHooks hooks,
    const Informer* workloads, const Informer* network_policies) {
  if (options.job_key.size() < kMinJobKeyBytes) {
    return InvalidArgument("the job key must be at least " + std::to_string(kMinJobKeyBytes) +
                           " bytes");
  }
  if (options.network_policy && network_policies == nullptr) {
    return InvalidArgument("NetworkPolicies per job need an informer of NetworkPolicies");
  }
  policy::PolicyOptions popts;
  popts.cooldown_seconds = 0;  // each job's own cooldown (spec.elasticity) applies
  VF_ASSIGN_OR_RETURN(auto policy, policy::CreatePolicy(options.policy, popts));
  return std::unique_ptr<Reconciler>(
      new Reconciler(client, jobs, pods, nodes, workloads, network_policies, coordinator,
                     std::move(options), std::move(hooks), std::move(policy)));
}

Reconciler::Reconciler(kube::Client& client, const Informer& jobs, const Informer& pods,
                       const Informer& nodes, const Informer* workloads,
                       const Informer* network_policies, Coordinator& coordinator,
                       ReconcilerOptions options, ReconcilerHooks hooks,
                       std::unique_ptr<policy::Policy> policy)
    : client_(client),
      jobs_(jobs),
      pods_(pods),
      nodes_(nodes),
      workloads_(workloads),
      network_policies_(network_policies),
      coordinator_(coordinator),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      policy_(std::move(policy)),
      events_(client, kube::kVirtualFlowJobs) {
  if (options_.fault.armed("state-transfer")) {
    coordinator_.ObserveKeySets([this](const std::string& job, const std::string& key) {
      InjectStateTransferFault(job, key);
    });
  }
}

Reconciler::~Reconciler() {
  // Test-only, and a term ends at most once in a test: a key set at that very moment may still
  // call the observer, which only reads this object's fault settings under its mutex.
  if (options_.fault.armed("state-transfer")) coordinator_.ObserveKeySets(nullptr);
}

Result<std::string> Reconciler::JobSecret(const json& job) const {
  return DeriveJobSecret(options_.job_key, Obj(job, "metadata").value("uid", ""));
}

Status Reconciler::EnsureCoordinatorJob(const std::string& key, const json& job,
                                        const std::string& token, const std::string& fingerprint) {
  const std::string uid = job.at("metadata").value("uid", "");
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (MemoryOf(key, uid).registered) return Status::Ok();
  }
  // A job whose workers train under an earlier operator (a restart, an upgrade) expects their
  // build, as its status recorded it, so that a pod that registers before they do again is not
  // refused; a job that has none yet takes its first worker's (Coordinator::RegisterWorker).
  std::string build = Obj(job, "status").value("workerBuild", "");
  if (build.empty()) build = options_.build.empty() ? OwnBuild() : options_.build;
  Status added = coordinator_.AddJob(key, token, fingerprint, build);
  if (added.code() == StatusCode::kFailedPrecondition) {
    // An earlier job of the same name: its state is of no use to this one.
    (void)coordinator_.RemoveJob(key);
    added = coordinator_.AddJob(key, token, fingerprint, build);
  }
  VF_RETURN_IF_ERROR(added.WithContext("coordinator"));
  // After an operator restart the plan the workers train under is in the status: restore it,
  // epoch included, so that they carry on without a switch.
  const json& status = Obj(job, "status");
  const int64_t epoch = status.value("epoch", int64_t{0});
  const Phase phase = PhaseOf(status);
  VF_ASSIGN_OR_RETURN(Plan current, coordinator_.GetPlan(key));
  if (epoch > current.epoch && !Ended(phase)) {
    std::vector<Member> members = MembersFromJson(status.value("assignment", json::array()));
    auto restored = coordinator_.PublishPlanWithEpoch(key, epoch, members);
    if (!restored.ok()) {
      std::fprintf(stderr, "virtualflow-operator: %s: cannot restore plan %lld: %s\n", key.c_str(),
                   static_cast<long long>(epoch), restored.status().message().c_str());
    } else {
      std::fprintf(stderr, "virtualflow-operator: %s: restored plan of epoch %lld (%zu workers)\n",
                   key.c_str(), static_cast<long long>(epoch), members.size());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  MemoryOf(key, uid).registered = true;
  return Status::Ok();
}

Status Reconciler::PatchStatus(const json& job, const json& status_in) {
  const json& meta = job.at("metadata");
  const std::string key = ObjectKey(job);
  const std::string uid = meta.value("uid", "");
  const std::string version = meta.value("resourceVersion", "");
  // status.step never goes back. Every pass starts from the cached status, and the cache may not
  // show this operator's last write yet: a pass that writes for another reason (a new plan, a
  // condition) would write the older step back (seen: 62, then 33, while Kueue evicted two
  // units). A drain that starts the job from nothing resets what is remembered (ResetStep).
  json status = status_in;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t written = MemoryOf(key, uid).step_written;
    const auto step = status.find("step");
    if (step != status.end() && step->is_number_integer() && step->get<int64_t>() < written) {
      *step = written;
    }
  }
  json wanted = Comparable(status);
  if (wanted == Comparable(Obj(job, "status"))) return Status::Ok();
  {
    // The cache has not seen this operator's last write yet: the job is still at the version
    // that write was made over, so the API server holds what was written (a change by anyone
    // else would have moved the version). Writing the same status again would only cost a
    // request, for each job, each time its pods change before its own write comes back.
    std::lock_guard<std::mutex> lock(mu_);
    const JobMemory& memory = MemoryOf(key, uid);
    if (!version.empty() && memory.written_over_version == version &&
        memory.written_status == wanted) {
      return Status::Ok();
    }
  }
  // The whole status each time, so fields that no longer apply are cleared (null deletes).
  json patch_status = status;
  for (const auto& [k, v] : Obj(job, "status").items()) {
    if (!patch_status.contains(k)) patch_status[k] = nullptr;
  }
  auto r = client_.PatchStatus(kube::kVirtualFlowJobs, meta.value("namespace", ""),
                               meta.value("name", ""), json{{"status", patch_status}});
  if (r.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    JobMemory& memory = MemoryOf(key, uid);
    const auto step = status.find("step");
    if (step != status.end() && step->is_number_integer()) {
      memory.step_written = step->get<int64_t>();
    }
    if (!version.empty()) {
      memory.written_over_version = version;
      memory.written_status = std::move(wanted);
    }
  }
  return r.status();
}

void Reconciler::ResetStep(const Pass& p) {
  std::lock_guard<std::mutex> lock(mu_);
  MemoryOf(p.key, p.uid).step_written = 0;
}

void Reconciler::Event(const json& job, bool warning, const std::string& reason,
                       const std::string& message) {
  events_.Record(job, warning ? kube::EventType::kWarning : kube::EventType::kNormal, reason,
                 message);
}

Reconciler::JobMemory& Reconciler::MemoryOf(const std::string& key, const std::string& uid) {
  JobMemory& memory = memory_[key];
  if (memory.uid != uid) {
    memory = JobMemory{};
    memory.uid = uid;
  }
  return memory;
}

Result<ReconcileResult> Reconciler::Reconcile(const std::string& key) {
  std::optional<json> found = jobs_.Get(key);
  if (!found || Obj(*found, "metadata").contains("deletionTimestamp")) return Forget(key);
  // Another controller runs it (spec.managedBy: MultiKueue, on another cluster): hands off.
  if (!ManagedHere(*found)) return Forget(key);
  Pass p(key, std::move(*found));
  Begin(p);
  Result<JobSpec> spec = *CachedSpecOf(p.job);
  if (spec.ok()) {
    // What the CRD's schema cannot check about the pod template.
    if (Status t = ValidateTemplate(p.job); !t.ok()) spec = t;
  }
  if (!spec.ok()) {
    VF_RETURN_IF_ERROR(FailInvalidSpec(p, spec.status()));
    return ReconcileResult{};
  }
  p.spec = std::move(spec).value();
  if (Ended(PhaseOf(p.old_status))) {
    (void)coordinator_.RemoveJob(key);
    if (hooks_.on_job_status) hooks_.on_job_status(key, p.old_status, p.spec);
    if (Status finished = FinishWorkload(p); !finished.ok()) {
      RecordBlocked(p, finished);
      return finished;
    }
    return EnforceTtl(p);
  }
  Result<ReconcileResult> result = Advance(p);
  if (!result.ok()) RecordBlocked(p, result.status());
  return result;
}

Result<ReconcileResult> Reconciler::Advance(Pass& p) {
  // Marks what a failing step was doing; the steps that call the API for a reason of their
  // own (creating and deleting pods) set it themselves.
  auto doing = [&p](const char* action, Status s) {
    if (!s.ok() && p.failed_action.empty()) p.failed_action = action;
    return s;
  };
  ReconcileResult suspended;
  VF_ASSIGN_OR_RETURN(const Next after_suspend, Suspend(p, suspended));
  if (after_suspend == Next::kDone) return suspended;
  ReconcileResult deadline;
  VF_ASSIGN_OR_RETURN(const Next after_deadline, EnforceDeadline(p, deadline));
  if (after_deadline == Next::kDone) return ReconcileResult{};
  ReconcileResult drained;
  VF_ASSIGN_OR_RETURN(const Next after_drain, Drain(p, drained));
  if (after_drain == Next::kDone) return drained;
  ReconcileResult evicted;
  VF_ASSIGN_OR_RETURN(const Next after_eviction, DrainEvicted(p, evicted));
  if (after_eviction == Next::kDone) return evicted;

  Result<std::string> token = JobSecret(p.job);
  VF_RETURN_IF_ERROR(doing("FailedJobSecret", token.status()));
  VF_RETURN_IF_ERROR(doing("CoordinatorRefusedJob",
                           EnsureCoordinatorJob(p.key, p.job, *token, p.spec.Fingerprint())));
  // Before any pod: a worker is never reachable by other pods while its job's policy is due.
  VF_RETURN_IF_ERROR(doing("FailedNetworkPolicy", EnsureNetworkPolicy(p)));
  // Every live worker plus a replacement for each (a dead member stays registered until a plan
  // without it is out); only pods the operator created hold credentials to register with.
  VF_RETURN_IF_ERROR(coordinator_.SetWorkerLimit(
      p.key, std::min(2 * static_cast<size_t>(std::max(p.spec.replicas_max, 1)),
                      Coordinator::kMaxWorkersPerJob)));
  VF_RETURN_IF_ERROR(Observe(p));
  VF_ASSIGN_OR_RETURN(const Next after_kueue, AdmitThroughKueue(p));
  if (after_kueue == Next::kDone) return ReconcileResult{std::chrono::seconds(1)};
  VF_ASSIGN_OR_RETURN(const Next after_success, RecordSuccess(p));
  if (after_success == Next::kDone) return ReconcileResult{};
  VF_ASSIGN_OR_RETURN(const Next after_failures, RecordFailures(p));
  if (after_failures == Next::kDone) return ReconcileResult{};
  VF_RETURN_IF_ERROR(doing("FailedPublishPlan", UpdateMembership(p)));
  VF_RETURN_IF_ERROR(ReconcilePods(p));
  VF_RETURN_IF_ERROR(doing("FailedUpdateStatus", WriteProgress(p)));

  // Membership moves with the workers' reports; look again soon while anything is in motion.
  ReconcileResult result;
  result.requeue_after =
      std::chrono::milliseconds(PhaseOf(p.status) == Phase::kRunning ? 2000 : 500);
  if (deadline.requeue_after.count() > 0) {
    result.requeue_after = std::min(result.requeue_after, deadline.requeue_after);
  }
  return result;
}

void Reconciler::RecordBlocked(Pass& p, const Status& error) {
  // A job deleted under the pass: nothing to tell anyone.
  if (error.code() == StatusCode::kNotFound) return;
  const std::string reason = p.failed_action.empty() ? "ReconcileFailed" : p.failed_action;
  std::string message = error.message();
  // New pods get random names: without them, every retry reads the same, and its Event is
  // one Event with a count.
  if (!p.failed_pod.empty()) {
    for (size_t at = message.find(p.failed_pod); at != std::string::npos;
         at = message.find(p.failed_pod, at)) {
      const std::string pattern = p.name + "-worker-*";
      message.replace(at, p.failed_pod.size(), pattern);
      at += pattern.size();
    }
  }
  json status = p.old_status;
  status["observedGeneration"] = p.generation;
  json conditions = json::array();
  for (const json& c : p.old_conditions) {
    if (c.value("type", "") != "ReconcileError") conditions.push_back(c);
  }
  SetCondition(conditions, p.old_conditions, "ReconcileError", true, reason, message, p.generation);
  status["conditions"] = conditions;
  if (Status patched = PatchStatus(p.job, status); !patched.ok()) {
    std::fprintf(stderr, "virtualflow-operator: %s: condition ReconcileError not recorded: %s\n",
                 p.key.c_str(), patched.message().c_str());
  }
  Event(p.job, true, reason, message);
}

Result<ReconcileResult> Reconciler::Forget(const std::string& key) {
  // Gone: its pods and Secret follow through their owner references.
  (void)coordinator_.RemoveJob(key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    memory_.erase(key);  // all that was kept for the job
  }
  if (hooks_.on_job_gone) hooks_.on_job_gone(key);
  return ReconcileResult{};
}

void Reconciler::Begin(Pass& p) {
  const json& meta = p.job.at("metadata");
  p.ns = meta.value("namespace", "");
  p.name = meta.value("name", "");
  p.uid = meta.value("uid", "");
  p.generation = meta.value("generation", int64_t{0});
  p.old_status = Obj(p.job, "status");
  p.old_conditions = p.old_status.value("conditions", json::array());
  p.status = p.old_status;
  p.status["observedGeneration"] = p.generation;
  StampTimes(p);
}

Status Reconciler::Observe(Pass& p) {
  p.cluster = View();
  if (hooks_.on_inventory) hooks_.on_inventory(p.gpus());
  auto labelled = p.cluster->pods_by_job.find(p.key);
  if (labelled != p.cluster->pods_by_job.end()) {
    for (const std::shared_ptr<const json>& pod : labelled->second) {
      if (OwnedBy(*pod, p.ns, p.name, p.uid)) p.pods.push_back(*pod);
    }
  }
  for (const json& pod : p.pods) p.by_name[PodName(pod)] = &pod;

  VF_ASSIGN_OR_RETURN(p.view, coordinator_.GetJob(p.key));
  Desired desired = DesiredWorkers(p, *p.cluster);
  p.desired = desired.workers;
  p.fit = desired.fit;
  p.policy_reason = std::move(desired.reason);
  p.allocation = std::move(desired.allocation);
  p.total_steps = KnownTotalSteps(p.spec, p.view);
  p.epoch = p.view.plan.epoch;
  p.members = p.view.plan.members;
  for (const Member& m : p.members) p.in_plan.insert(m.worker);
  p.admitted = AdmittedWorkers(p);
  VF_RETURN_IF_ERROR(coordinator_.RestrictWorkers(p.key, p.admitted));
  p.image = WorkerImage(p.job, p.pods, p.in_plan, options_.pods.default_image);
  for (const auto& [k, v] : Obj(p.old_status, "restarts").items()) {
    if (v.is_number_integer()) p.restarts[k] = v.get<int64_t>();
  }
  return Status::Ok();
}

}  // namespace vf::controller
