// Kueue: a job with a queue label runs as Kueue admits its Workloads (a core and a unit per
// worker above it, kueue.h), shrinks when Kueue takes units back, drains and requeues when
// Kueue evicts the core, keeps the Workloads' PodsReady, and finishes them at its end.
#include "operator/controller/reconciler.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "operator/controller/job_status.h"
#include "operator/controller/kueue_contract.h"
#include "operator/controller/reconciler_internal.h"

namespace vf::controller {

using nlohmann::json;
using reconciler_internal::ConditionsWithoutWorkers;
using reconciler_internal::FindCondition;
using reconciler_internal::MarkWorkersStopping;
using reconciler_internal::Now;
using reconciler_internal::Obj;
using reconciler_internal::SetCondition;

namespace {

// The unit Workloads of `job` as `workloads` mirrors them: element i - 1 is unit i, null where
// there is none.
std::vector<json> CachedUnits(const Informer& workloads, const json& job, const JobSpec& spec) {
  const std::string ns = Obj(job, "metadata").value("namespace", "");
  std::vector<json> units;
  for (int i = 1; i <= UnitWorkloads(spec); ++i) {
    std::optional<json> unit = workloads.Get(ns + "/" + UnitWorkloadName(job, i));
    units.push_back(unit ? std::move(*unit) : json(nullptr));
  }
  return units;
}

// Pods that hold a node's GPUs: those that have not ended (a terminating pod still does).
int HoldingPods(const std::vector<json>& pods) {
  int holding = 0;
  for (const json& pod : pods) {
    const PodLife life = PodLifeOf(pod);
    if (life != PodLife::kSucceeded && life != PodLife::kFailed) ++holding;
  }
  return holding;
}

// Writes a Workload's status back when `update` changed it. A conflict (Kueue wrote in between)
// or a Workload gone is left to the next pass, which reads it again.
Status WriteWorkloadStatus(kube::Client& client, const std::string& ns,
                           const WorkloadUpdate& update) {
  if (!update.changed) return Status::Ok();
  kube::ApiResult<json> r = client.ReplaceStatus(kube::kWorkloads, ns, update.workload);
  if (r.ok() || r.reason() == kube::Reason::kConflict || r.reason() == kube::Reason::kNotFound) {
    return Status::Ok();
  }
  return r.status().WithContext("Kueue Workload " +
                                Obj(update.workload, "metadata").value("name", std::string()));
}

// Gives `workload` its priority, as Kueue's integrations do: the class the job names
// (kueue_contract.h PriorityClassOf) and its value, plus `offset` (a unit is one below its
// core, so that Kueue preempts units first). Without a class, only a non-zero offset is set.
Status SetPriority(kube::Client& client, const json& job, const json& worker_pod, int offset,
                   json& workload) {
  const std::optional<PriorityClassRef> ref = PriorityClassOf(job, worker_pod);
  int64_t value = 0;
  if (ref) {
    const bool kueue_class = ref->group == "kueue.x-k8s.io";
    kube::ApiResult<json> got = client.Get(
        kueue_class ? kube::kWorkloadPriorityClasses : kube::kPriorityClasses, "", ref->name);
    if (!got.ok()) return got.status().WithContext(ref->kind + " " + ref->name);
    VF_ASSIGN_OR_RETURN(const int32_t class_value, PriorityValueOf(*got));
    value = class_value;
  }
  value = std::max<int64_t>(value + offset, std::numeric_limits<int32_t>::min());
  if (ref && offset == 0) {
    SetWorkloadPriority(workload, *ref, static_cast<int32_t>(value));
  } else if (value != 0) {
    // A unit takes the number only: its class's value is the core's.
    workload["spec"]["priority"] = static_cast<int32_t>(value);
  }
  return Status::Ok();
}

}  // namespace

std::optional<int> Reconciler::KueueCap(const json& job, const JobSpec& spec) const {
  if (QueueNameOf(job).empty()) {
    // Under an operator that leaves every GPU to Kueue, a job Kueue never saw gets none.
    return options_.require_queue ? std::optional<int>(0) : std::nullopt;
  }
  if (workloads_ == nullptr || !workloads_->synced()) return std::nullopt;
  const std::string ns = Obj(job, "metadata").value("namespace", "");
  std::optional<json> core = workloads_->Get(ns + "/" + WorkloadName(job));
  return KueueWorkerLimit(job, core ? *core : json(nullptr), CachedUnits(*workloads_, job, spec),
                          spec);
}

Result<json> Reconciler::FindWorkload(const Pass& p) {
  const std::string name = WorkloadName(p.job);
  if (std::optional<json> cached = workloads_->Get(p.ns + "/" + name)) return *cached;
  // Not in the cache: not created yet, or created a moment ago and not yet seen.
  kube::ApiResult<json> got = client_.Get(kube::kWorkloads, p.ns, name);
  if (got.ok()) return *got;
  if (got.reason() == kube::Reason::kNotFound) return json(nullptr);
  return got.status().WithContext("Kueue Workload " + p.ns + "/" + name);
}

Result<Reconciler::Next> Reconciler::AdmitThroughKueue(Pass& p) {
  const std::string queue = QueueNameOf(p.job);
  if (queue.empty()) {
    if (options_.require_queue) {
      p.kueue = KueueAdmission{};
      p.kueue->reason = kNoQueueName;
      p.kueue->message =
          "this operator runs every job through Kueue (--require-kueue-queue): label the job " +
          std::string(kQueueNameLabel) + ": <LocalQueue of its namespace>";
    }
    return Next::kGoOn;
  }
  if (workloads_ == nullptr) {
    p.failed_action = "KueueUnavailable";
    return FailedPrecondition("the job names a Kueue LocalQueue (" + std::string(kQueueNameLabel) +
                              "), but this operator does not watch Kueue's Workloads");
  }
  if (!workloads_->synced()) {
    // Until the Workloads are mirrored, what Kueue admitted is unknown: the job is left as it
    // is. Kueue not installed shows here, as the reason the list fails.
    if (std::optional<std::string> error = workloads_->last_error()) {
      p.failed_action = "KueueUnavailable";
      return FailedPrecondition("cannot read Kueue's Workloads (is Kueue installed?): " + *error);
    }
    return Next::kDone;
  }
  VF_ASSIGN_OR_RETURN(json workload, FindWorkload(p));
  if (workload.is_null()) {
    const json pod = BuildWorkerPod(p.job, p.spec, p.name + "-worker", options_.pods);
    json core = BuildWorkload(p.job, p.spec, pod);
    if (Status priority = SetPriority(client_, p.job, pod, 0, core); !priority.ok()) {
      p.failed_action = "FailedWorkloadPriority";
      return priority.WithContext("the priority of Kueue Workload " + WorkloadName(p.job));
    }
    kube::ApiResult<json> created = client_.Create(kube::kWorkloads, p.ns, core);
    if (!created.ok() && created.reason() != kube::Reason::kAlreadyExists) {
      p.failed_action = "FailedCreateWorkload";
      if (created.reason() == kube::Reason::kNotFound) {
        return FailedPrecondition("Kueue's Workload API (" + std::string(kWorkloadApiVersion) +
                                  ") is not served: is Kueue installed? " +
                                  created.status().message());
      }
      return created.status().WithContext("Kueue Workload");
    }
    if (created.ok()) {
      workload = *created;
      Event(p.job, false, event_reason::kWorkloadCreated,
            "created Kueue Workload " + WorkloadName(p.job) + " in LocalQueue " + queue);
    }
  }
  const std::vector<json> units = CachedUnits(*workloads_, p.job, p.spec);
  const JobAdmission admission = JobAdmissionOf(workload, units, p.spec);
  VF_RETURN_IF_ERROR(KeepUnits(p, admission, units));
  VF_RETURN_IF_ERROR(ReleaseEvictedUnits(p, admission, units));
  VF_RETURN_IF_ERROR(WritePodsReady(p, workload, units));
  p.kueue = admission.admission;
  if (!p.kueue->admitted && p.kueue->message.empty()) {
    p.kueue->reason = kNotSeenByKueue;
    p.kueue->message = "the Workload was just created";
  }
  return Next::kGoOn;
}

Status Reconciler::KeepUnits(Pass& p, const JobAdmission& admission,
                             const std::vector<json>& units) {
  // Units hold quota only beside an admitted core: without it they would keep GPUs the job
  // cannot use, so they go (and come again once the core is admitted).
  if (!admission.admission.admitted) {
    for (size_t i = 0; i < units.size(); ++i) {
      if (units[i].is_null()) continue;
      kube::ApiResult<json> r =
          client_.Delete(kube::kWorkloads, p.ns, UnitWorkloadName(p.job, static_cast<int>(i) + 1));
      if (!r.ok() && r.reason() != kube::Reason::kNotFound) {
        p.failed_action = "FailedDeleteWorkload";
        return r.status().WithContext("Kueue Workload");
      }
    }
    return Status::Ok();
  }
  // The units the job can use: one for each worker above its core that fits on the nodes its
  // template allows (others' pods counted) and that spec.replicas.desired asks for. A unit
  // beyond them that no worker holds goes, so that a job shrunk for another reason than Kueue
  // (GPUs taken by other pods, a node drained, kubectl scale) gives its quota back, as
  // reclaimablePods does for Kueue's own integrations; it comes again when the job can grow.
  const int core = CoreWorkers(p.spec);
  const int usable = std::min(p.fit, p.spec.replicas_desired.value_or(p.spec.replicas_max));
  const int wanted = std::clamp(usable - core, 0, static_cast<int>(units.size()));
  const int keep = std::max(wanted, std::max(0, HoldingPods(p.pods) - core));
  int existing = static_cast<int>(
      std::count_if(units.begin(), units.end(), [](const json& u) { return !u.is_null(); }));
  VF_RETURN_IF_ERROR(DeleteSurplusUnits(p, units, keep, existing));
  if (existing >= wanted) return Status::Ok();
  // A unit asks for the nodes of its core's flavors, so that Kueue charges it to one of them
  // and its worker lands beside the others.
  json pod = BuildWorkerPod(p.job, p.spec, p.name + "-worker", options_.pods);
  p.kueue = admission.admission;
  VF_ASSIGN_OR_RETURN(const std::optional<PodSetPlacement> placement, KueuePlacement(p));
  if (placement) VF_RETURN_IF_ERROR(ApplyPlacement(*placement, pod));
  for (size_t i = 0; i < units.size() && existing < wanted; ++i) {
    if (!units[i].is_null()) continue;
    const int index = static_cast<int>(i) + 1;
    json unit = BuildUnitWorkload(p.job, p.spec, pod, index);
    if (Status priority = SetPriority(client_, p.job, pod, -1, unit); !priority.ok()) {
      p.failed_action = "FailedWorkloadPriority";
      return priority.WithContext("the priority of Kueue Workload " +
                                  UnitWorkloadName(p.job, index));
    }
    kube::ApiResult<json> created = client_.Create(kube::kWorkloads, p.ns, unit);
    if (!created.ok() && created.reason() != kube::Reason::kAlreadyExists) {
      p.failed_action = "FailedCreateWorkload";
      return created.status().WithContext("Kueue Workload");
    }
    ++existing;
  }
  return Status::Ok();
}

Status Reconciler::DeleteSurplusUnits(Pass& p, const std::vector<json>& units, int keep,
                                      int& existing) {
  // Units waiting in the queue go first, then admitted ones, the last first; a unit Kueue
  // evicted that still holds its reservation is ReleaseEvictedUnits's to release.
  for (const bool admitted : {false, true}) {
    for (size_t i = units.size(); i-- > 0 && existing > keep;) {
      const json& unit = units[i];
      if (unit.is_null() || !EvictionReason(unit).empty()) continue;
      if (AdmissionOf(unit, p.spec).admitted != admitted) continue;
      const std::string name = UnitWorkloadName(p.job, static_cast<int>(i) + 1);
      kube::ApiResult<json> r = client_.Delete(kube::kWorkloads, p.ns, name);
      if (!r.ok() && r.reason() != kube::Reason::kNotFound) {
        p.failed_action = "FailedDeleteWorkload";
        return r.status().WithContext("Kueue Workload " + name);
      }
      --existing;
      std::fprintf(stderr, "virtualflow-operator: %s: Kueue Workload %s deleted: not usable now\n",
                   p.key.c_str(), name.c_str());
    }
  }
  return Status::Ok();
}

Status Reconciler::ReleaseEvictedUnits(Pass& p, const JobAdmission& admission,
                                       const std::vector<json>& units) {
  if (admission.units_evicted.empty()) return Status::Ok();
  // The evicted units still in use: the pods beyond what the rest of the admission covers
  // (the policy has already taken the evicted workers out of the plan; their pods go as they
  // leave at a step boundary).
  const int in_use = std::max(0, HoldingPods(p.pods) - admission.admission.workers);
  const int release = static_cast<int>(admission.units_evicted.size()) - in_use;
  for (int k = 0; k < release; ++k) {
    const int index = admission.units_evicted[admission.units_evicted.size() - 1 - k];
    const WorkloadUpdate update = RequeuedAfterEviction(units[index - 1], Now());
    VF_RETURN_IF_ERROR(WriteWorkloadStatus(client_, p.ns, update));
    if (update.changed) {
      std::fprintf(stderr,
                   "virtualflow-operator: %s: released Kueue Workload %s after its eviction\n",
                   p.key.c_str(), UnitWorkloadName(p.job, index).c_str());
    }
  }
  return Status::Ok();
}

Status Reconciler::WritePodsReady(Pass& p, const json& core, const std::vector<json>& units) {
  int training = 0;
  for (const Member& m : p.members) {
    auto it = p.by_name.find(m.worker);
    if (it != p.by_name.end() && PodLifeOf(*it->second) == PodLife::kRunning) ++training;
  }
  // The core is ready once its workers train; the k-th admitted unit once one more does.
  int needed = CoreWorkers(p.spec);
  const std::string trains = std::to_string(training) + " worker(s) train";
  VF_RETURN_IF_ERROR(WriteWorkloadStatus(
      client_, p.ns,
      WithPodsReady(core, training >= needed, trains + ", " + std::to_string(needed) + " needed",
                    Now())));
  for (const json& unit : units) {
    if (unit.is_null()) continue;
    const bool admitted = AdmissionOf(unit, p.spec).admitted;
    if (admitted) ++needed;
    VF_RETURN_IF_ERROR(WriteWorkloadStatus(
        client_, p.ns,
        WithPodsReady(unit, admitted && training >= needed,
                      trains + ", " + std::to_string(needed) + " needed", Now())));
  }
  return Status::Ok();
}

Result<Reconciler::Next> Reconciler::DrainEvicted(Pass& p, ReconcileResult& result) {
  if (QueueNameOf(p.job).empty() || workloads_ == nullptr || !workloads_->synced()) {
    return Next::kGoOn;
  }
  std::optional<json> core = workloads_->Get(p.ns + "/" + WorkloadName(p.job));
  if (!core) return Next::kGoOn;
  const WorkloadUpdate requeued = RequeuedAfterEviction(*core, Now());
  if (!requeued.changed) return Next::kGoOn;  // not evicted, or already requeued
  const std::string evicted_for = EvictionReason(*core);
  const json core_conditions = Obj(*core, "status").value("conditions", json::array());
  const json* evicted = FindCondition(core_conditions, "Evicted");
  const std::string why = evicted != nullptr ? evicted->value("message", "") : "";
  // As for spec.suspend: the workers leave at a step boundary, rank 0 writing a checkpoint (its
  // coordinator no longer knows the job), and the job starts again from it when readmitted.
  ForgetRegistration(p.key);
  VF_ASSIGN_OR_RETURN(const int stopping, DeleteAllPods(p));
  const std::string message = "evicted by Kueue (" + evicted_for + (why.empty() ? "" : ": " + why) +
                              "): " +
                              (stopping > 0 ? std::to_string(stopping) + " worker pod(s) stopping"
                                            : "its workers stopped; the Workload is requeued");
  json& status = p.status;
  MarkWorkersStopping(status, "Pending", message, stopping);
  status["desiredWorkers"] = 0;
  json conditions = ConditionsWithoutWorkers(p.old_conditions, condition::kAdmitted);
  SetCondition(conditions, p.old_conditions, condition::kRunning, false, reason::kEvictedByKueue,
               message, p.generation);
  SetCondition(conditions, p.old_conditions, condition::kAdmitted, false, evicted_for, message,
               p.generation);
  status["conditions"] = conditions;
  VF_RETURN_IF_ERROR(PatchStatus(p.job, status));
  const json* was = FindCondition(p.old_conditions, condition::kAdmitted);
  if (was == nullptr || was->value("status", "") == "True") {
    Event(p.job, true, event_reason::kEvictedByKueue, message);
  }
  if (stopping == 0) {
    // Its units go with it; the core's reservation is cleared so that Kueue counts the quota
    // free and queues the Workload again.
    VF_RETURN_IF_ERROR(KeepUnits(p, JobAdmission{}, CachedUnits(*workloads_, p.job, p.spec)));
    VF_RETURN_IF_ERROR(WriteWorkloadStatus(client_, p.ns, requeued));
    Event(p.job, false, event_reason::kRequeued,
          "Kueue Workload " + WorkloadName(p.job) + " requeued");
  }
  if (hooks_.on_job_status) hooks_.on_job_status(p.key, status, p.spec);
  result.requeue_after = std::chrono::milliseconds(stopping > 0 ? 500 : 1000);
  return Next::kDone;
}

Result<std::optional<PodSetPlacement>> Reconciler::KueuePlacement(Pass& p) {
  if (!p.kueue || !p.kueue->admitted) return std::optional<PodSetPlacement>();
  VF_ASSIGN_OR_RETURN(const json core, FindWorkload(p));
  if (core.is_null()) return std::optional<PodSetPlacement>();
  std::map<std::string, json> flavors;
  for (const std::string& name : AdmittedFlavors(core, kWorkersPodSet)) {
    kube::ApiResult<json> got = client_.Get(kube::kResourceFlavors, "", name);
    if (!got.ok()) {
      p.failed_action = "FailedKueuePlacement";
      return got.status().WithContext("ResourceFlavor " + name);
    }
    flavors[name] = *got;
  }
  Result<PodSetPlacement> placement = PlacementOf(core, kWorkersPodSet, flavors);
  if (!placement.ok()) {
    p.failed_action = "FailedKueuePlacement";
    return placement.status().WithContext("Kueue Workload " + WorkloadName(p.job));
  }
  return std::optional<PodSetPlacement>(std::move(placement).value());
}

void Reconciler::SetAdmittedCondition(Pass& p, json& conditions) {
  if (!p.kueue) return;
  const KueueAdmission& k = *p.kueue;
  const std::string queue = QueueNameOf(p.job);
  if (k.admitted) {
    SetCondition(conditions, p.old_conditions, condition::kAdmitted, true, reason::kAdmitted,
                 "Kueue admitted " + std::to_string(k.workers) + " worker(s) in ClusterQueue " +
                     k.cluster_queue + " (LocalQueue " + queue + ")",
                 p.generation);
    return;
  }
  const std::string message = queue.empty()
                                  ? "waiting for a queue: " + k.message
                                  : "waiting for Kueue to admit Workload " + WorkloadName(p.job) +
                                        " in LocalQueue " + queue + ": " + k.message;
  SetCondition(conditions, p.old_conditions, condition::kAdmitted, false,
               k.reason.empty() ? kNotSeenByKueue : k.reason, message, p.generation);
  if (p.members.empty()) p.status["message"] = message;
}

Status Reconciler::FinishWorkload(Pass& p) {
  if (QueueNameOf(p.job).empty() || workloads_ == nullptr || !workloads_->synced()) {
    return Status::Ok();
  }
  // The units' quota goes back at once; the core is marked finished, as Kueue asks.
  VF_RETURN_IF_ERROR(KeepUnits(p, JobAdmission{}, CachedUnits(*workloads_, p.job, p.spec)));
  VF_ASSIGN_OR_RETURN(json workload, FindWorkload(p));
  const bool succeeded = p.old_status.value("phase", "") == "Succeeded";
  const std::string message = "VirtualFlowJob " + p.old_status.value("phase", "") + ": " +
                              p.old_status.value("message", "");
  // A PUT conditional on the version read, so that Kueue's own conditions stay as they are;
  // when Kueue wrote in between (the cache lags), once more from the API server's copy.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (workload.is_null() || AdmissionOf(workload, p.spec).finished) return Status::Ok();
    kube::ApiResult<json> r = client_.ReplaceStatus(
        kube::kWorkloads, p.ns, FinishedWorkload(workload, succeeded, message, Now()));
    if (r.reason() == kube::Reason::kNotFound) return Status::Ok();  // gone with the job
    if (r.ok()) {
      std::fprintf(stderr, "virtualflow-operator: %s: Kueue Workload %s finished\n", p.key.c_str(),
                   WorkloadName(p.job).c_str());
      return Status::Ok();
    }
    if (r.reason() != kube::Reason::kConflict || attempt > 0) {
      p.failed_action = "FailedFinishWorkload";
      return r.status().WithContext("Kueue Workload " + WorkloadName(p.job));
    }
    kube::ApiResult<json> fresh = client_.Get(kube::kWorkloads, p.ns, WorkloadName(p.job));
    if (fresh.reason() == kube::Reason::kNotFound) return Status::Ok();
    if (!fresh.ok()) return fresh.status().WithContext("Kueue Workload " + WorkloadName(p.job));
    workload = *fresh;
  }
  return Status::Ok();
}

}  // namespace vf::controller
