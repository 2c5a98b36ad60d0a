// Kueue: a job with a queue label runs as Kueue admits its Workload, and finishes it at its end.
#include "operator/controller/reconciler.h"

#include <cstdio>
#include <optional>
#include <string>

#include "operator/controller/reconciler_internal.h"

namespace vf::controller {

using nlohmann::json;
using reconciler_internal::Now;
using reconciler_internal::Obj;
using reconciler_internal::SetCondition;

std::optional<int> Reconciler::KueueCap(const json& job, const JobSpec& spec) const {
  if (QueueNameOf(job).empty() || workloads_ == nullptr || !workloads_->synced()) {
    return std::nullopt;
  }
  const std::string ns = Obj(job, "metadata").value("namespace", "");
  std::optional<json> workload = workloads_->Get(ns + "/" + WorkloadName(job));
  return KueueWorkerLimit(job, workload ? *workload : json(nullptr), spec);
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
  if (queue.empty()) return Next::kGoOn;
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
    kube::ApiResult<json> created =
        client_.Create(kube::kWorkloads, p.ns, BuildWorkload(p.job, p.spec, pod));
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
      Event(p.job, false, "WorkloadCreated",
            "created Kueue Workload " + WorkloadName(p.job) + " in LocalQueue " + queue);
    }
  }
  p.kueue = workload.is_null() ? KueueAdmission{} : AdmissionOf(workload, p.spec);
  if (!p.kueue->admitted && p.kueue->message.empty()) {
    p.kueue->reason = kNotSeenByKueue;
    p.kueue->message = "the Workload was just created";
  }
  return Next::kGoOn;
}

void Reconciler::SetAdmittedCondition(Pass& p, json& conditions) {
  if (!p.kueue) return;
  const KueueAdmission& k = *p.kueue;
  const std::string queue = QueueNameOf(p.job);
  if (k.admitted) {
    SetCondition(conditions, p.old_conditions, "Admitted", true, "Admitted",
                 "Kueue admitted " + std::to_string(k.workers) + " worker(s) in ClusterQueue " +
                     k.cluster_queue + " (LocalQueue " + queue + ")",
                 p.generation);
    return;
  }
  const std::string message = "waiting for Kueue to admit Workload " + WorkloadName(p.job) +
                              " in LocalQueue " + queue + ": " + k.message;
  SetCondition(conditions, p.old_conditions, "Admitted", false,
               k.reason.empty() ? kNotSeenByKueue : k.reason, message, p.generation);
  if (p.members.empty()) p.status["message"] = message;
}

Status Reconciler::FinishWorkload(Pass& p) {
  if (QueueNameOf(p.job).empty() || workloads_ == nullptr || !workloads_->synced()) {
    return Status::Ok();
  }
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
