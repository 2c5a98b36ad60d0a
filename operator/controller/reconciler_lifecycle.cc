// How a job ends and pauses: success from rank 0's final report, failures, the deadline and the
// TTL, suspension, draining for a changed coordinator protocol, and its start and completion
// times.
#include "operator/controller/reconciler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/protocol/json.h"
#include "operator/controller/reconciler_internal.h"
#include "operator/controller/run_policy.h"

namespace vf::controller {

using nlohmann::json;
using reconciler_internal::ConditionsWithoutWorkers;
using reconciler_internal::FindCondition;
using reconciler_internal::MarkWorkersStopping;
using reconciler_internal::MembersFromJson;
using reconciler_internal::Now;
using reconciler_internal::NowUnix;
using reconciler_internal::Obj;
using reconciler_internal::OwnedBy;
using reconciler_internal::PodName;
using reconciler_internal::SetCondition;
using reconciler_internal::UnixSeconds;

namespace {

// When a finished job finished, as batch/v1's TTL controller reads it: the lastTransitionTime of
// its Succeeded or Failed condition, else status.completionTime; NaN when neither says.
double FinishedAt(const json& status) {
  const json conditions = status.value("conditions", json::array());
  for (const char* type : {condition::kSucceeded, condition::kFailed}) {
    const json* c = FindCondition(conditions, type);
    if (c == nullptr || c->value("status", "") != "True") continue;
    const double at = UnixSeconds(c->value("lastTransitionTime", ""));
    if (!std::isnan(at)) return at;
  }
  return UnixSeconds(status.value("completionTime", ""));
}

// spec.runPolicy.cleanPodPolicy for a finished job: deletes its pods still pending or running
// (kRunning), or all of them (kAll). `pods` are the cache's with the job's label.
Status CleanFinishedPods(kube::Client& client, CleanPodPolicy policy, const std::string& ns,
                         const std::string& name, const std::string& uid,
                         const std::vector<std::shared_ptr<const json>>& pods) {
  for (const std::shared_ptr<const json>& pod : pods) {
    if (!OwnedBy(*pod, ns, name, uid)) continue;
    const PodLife life = PodLifeOf(*pod);
    if (life == PodLife::kTerminating) continue;
    const bool ended = life == PodLife::kSucceeded || life == PodLife::kFailed;
    if (ended && policy == CleanPodPolicy::kRunning) continue;
    kube::DeleteOptions del;
    del.precondition_uid = Obj(*pod, "metadata").value("uid", "");
    auto r = client.Delete(kube::kPods, ns, PodName(*pod), del);
    if (!r.ok() && r.reason() != kube::Reason::kNotFound && r.reason() != kube::Reason::kConflict) {
      return r.status().WithContext("spec.runPolicy.cleanPodPolicy");
    }
  }
  return Status::Ok();
}

// A requeue for a deadline `seconds` away, capped at a day: the wait is only a hint to look
// again, and a far-off one would overflow.
std::chrono::milliseconds RequeueIn(double seconds) {
  constexpr double kMaxSeconds = 24 * 3600;
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(std::clamp(seconds, 0.001, kMaxSeconds) * 1000)));
}

// The final report a member sent the coordinator, if one has.
std::optional<Report> FinalReportOfCoordinator(const JobView& view) {
  for (const auto& [worker, info] : view.workers) {
    if (info.last_report.finished) return info.last_report;
  }
  return std::nullopt;
}

// The worker that was rank 0 of the job's last published plan, or "" when that plan has no
// members. Of the coordinator's plan (`coordinator_plan`, null when the coordinator does not know
// the job) unless status.assignment is of a later epoch. Both are this operator's own record:
// a plan is written to the status before the coordinator publishes it (UpdateMembership), and
// an operator that restarted, whose coordinator starts empty, restores the plan of
// status.epoch from status.assignment (EnsureCoordinatorJob). So the coordinator's plan is the
// newest while the cache has not seen this operator's own status write, and the status is the
// newest while the coordinator does not know the job (a drain, before registration); no worker
// writes either.
std::string RankZeroOfLastPlan(const Plan* coordinator_plan, const json& status) {
  std::vector<Member> members;
  const json epoch = status.value("epoch", json());
  const int64_t status_epoch = epoch.is_number_integer() ? epoch.get<int64_t>() : 0;
  if (coordinator_plan != nullptr && coordinator_plan->epoch >= status_epoch) {
    members = coordinator_plan->members;
  } else {
    members = MembersFromJson(status.value("assignment", json::array()));
  }
  for (const Member& m : members) {
    if (m.rank == 0) return m.worker;
  }
  return "";
}

// What the termination messages of a job's pods say of its outcome: the final report of the
// worker that finished the job, if one left it, and the final reports that were not taken, with
// the pod that carried each and why. Value type; `refused` points into the pods it was made of.
struct PodOutcome {
  std::optional<Report> report;
  std::vector<std::pair<const json*, std::string>> refused;
};

// Why the final report for `worker` that `pod` carries is not job `job_name`'s (UID `uid`)
// outcome, rank 0 of its last plan being `rank0`; empty when it is. Anyone who may create pods
// in the job's namespace can give one the job's label and a termination message: only a pod
// the job controls, named as the operator names its worker pods, and rank 0's, may end the job.
std::string WhyNotTheOutcome(const json& pod, const std::string& worker,
                             const std::string& job_name, const std::string& uid,
                             const std::string& rank0) {
  const std::string name = PodName(pod);
  if (!ControlledBy(pod, uid)) {
    return "the job does not control it (no owner reference with controller true to uid " + uid +
           ")";
  }
  if (!IsWorkerPodName(job_name, name)) {
    return "its name is not one the operator gives the job's worker pods";
  }
  if (worker != name) return "its report names another worker (" + worker + ")";
  if (rank0.empty()) return "the job's last plan has no rank 0 that could have finished it";
  if (name != rank0) return "it was not rank 0 of the job's last plan (" + rank0 + " was)";
  return "";
}

// The final report a worker that finished the job left in its pod's termination message
// (protocol::FinalReportMessage), if one did, among `pods` (every pod with the job's label).
// Its container has ended, usually with exit code 0; a worker that crashed after leaving the
// report (a fault while its process shut down) had finished all the same: the report is written
// after the final weights were saved. Only rank 0 of the last plan ends the job (WhyNotTheOutcome);
// any other report is refused, and a malformed one is not taken (said on stderr).
PodOutcome FinalReportOfPods(const std::string& key, const std::string& job_name,
                             const std::string& uid, const std::string& rank0,
                             const std::vector<const json*>& pods) {
  PodOutcome out;
  for (const json* pod : pods) {
    const PodLife life = PodLifeOf(*pod);
    if (life != PodLife::kSucceeded && life != PodLife::kFailed) continue;
    const json& statuses = Obj(*pod, "status").value("containerStatuses", json::array());
    if (!statuses.is_array() || statuses.empty() || !statuses[0].is_object()) continue;
    const json terminated = Obj(Obj(statuses[0], "state"), "terminated");
    const json message = terminated.value("message", json());
    if (!message.is_string()) continue;
    auto found = protocol::FinalReportFromMessage(message.get<std::string>());
    if (!found.ok()) {
      if (found.status().code() != StatusCode::kNotFound) {
        std::fprintf(stderr,
                     "virtualflow-operator: %s: pod %s: termination message not taken: %s\n",
                     key.c_str(), PodName(*pod).c_str(), found.status().message().c_str());
      }
      continue;
    }
    std::string why = WhyNotTheOutcome(*pod, found->first, job_name, uid, rank0);
    if (!why.empty()) {
      out.refused.emplace_back(pod, std::move(why));
      continue;
    }
    if (out.report) continue;
    std::fprintf(stderr,
                 "virtualflow-operator: %s: the outcome is read from pod %s's termination "
                 "message (the coordinator that received it is gone)\n",
                 key.c_str(), PodName(*pod).c_str());
    out.report = std::move(found->second);
  }
  return out;
}

// The coordinator protocol of a job's workers as its status records it. A job whose status
// shows workers but no protocol (an image, a build or a plan with members recorded by an
// operator from before the field) speaks 1, the only protocol there was then; a job without
// workers (new, suspended, or drained) has none.
std::optional<int64_t> WorkerProtocolOf(const json& status) {
  auto it = status.find("workerProtocol");
  if (it != status.end() && it->is_number_integer()) return it->get<int64_t>();
  auto assignment = status.find("assignment");
  const bool members = assignment != status.end() && assignment->is_array() && !assignment->empty();
  if (status.contains("workerImage") || status.contains("workerBuild") || members) return 1;
  return std::nullopt;
}

}  // namespace

Status Reconciler::FailInvalidSpec(Pass& p, const Status& why) {
  // The API server's schema has already checked most of it; what it cannot check fails here.
  json conditions = json::array();
  SetCondition(conditions, p.old_conditions, condition::kFailed, true, reason::kInvalidSpec,
               why.message(), p.generation);
  WritePhase(p.status, Phase::kFailed);
  p.status["message"] = why.message();
  p.status["conditions"] = conditions;
  StampTimes(p);
  if (PhaseOf(p.old_status) != Phase::kFailed)
    Event(p.job, true, event_reason::kInvalidSpec, why.message());
  return PatchStatus(p.job, p.status);
}

Result<Reconciler::Next> Reconciler::RecordSuccess(Pass& p) {
  // Rank 0's final report carries the outcome: from the coordinator, or, when the coordinator
  // that received it went before the status said so (an operator killed then), from the
  // termination message rank 0 left in its pod, which outlives any operator.
  std::optional<Report> final = FinalReportOfCoordinator(p.view);
  if (final) {
    options_.fault.At("final-report", p.key);
  } else {
    std::vector<const json*> labelled;
    auto it = p.cluster->pods_by_job.find(p.key);
    if (it != p.cluster->pods_by_job.end()) {
      for (const std::shared_ptr<const json>& pod : it->second) labelled.push_back(pod.get());
    }
    PodOutcome outcome = FinalReportOfPods(
        p.key, p.name, p.uid, RankZeroOfLastPlan(&p.view.plan, p.old_status), labelled);
    IgnoreForgedOutcomes(p, outcome.refused);
    final = std::move(outcome.report);
  }
  if (final) {
    const Report& r = *final;
    json& status = p.status;
    WritePhase(status, Phase::kSucceeded);
    StampTimes(p);
    status["step"] = r.step;
    if (p.total_steps > 0) status["totalSteps"] = p.total_steps;
    if (!r.weights_sha256.empty()) status["weightsSha256"] = r.weights_sha256;
    if (std::isfinite(r.test_accuracy)) status["testAccuracy"] = r.test_accuracy;
    if (std::isfinite(r.loss)) status["loss"] = r.loss;
    // Where the trained weights are: the final checkpoint, on the volume that holds it.
    if (json where = FinalCheckpointLocation(p.job, p.spec); !where.is_null()) {
      status["finalCheckpoint"] = where;
    }
    json conditions = json::array();
    SetCondition(conditions, p.old_conditions, condition::kCreated, true, reason::kPodsCreated,
                 "worker pods were created", p.generation);
    SetCondition(conditions, p.old_conditions, condition::kRunning, false, reason::kFinished,
                 "training finished", p.generation);
    SetCondition(
        conditions, p.old_conditions, condition::kSucceeded, true, reason::kTrainingFinished,
        "trained " + std::to_string(r.step) + " steps; weights " + r.weights_sha256.substr(0, 12),
        p.generation);
    SetResumedCondition(p, conditions);
    KeepDrainCondition(p, conditions);
    status["conditions"] = conditions;
    status["message"] = "training finished";
    VF_RETURN_IF_ERROR(PatchStatus(p.job, status));
    Event(p.job, false, event_reason::kSucceeded,
          "trained " + std::to_string(r.step) + " steps, test accuracy " +
              std::to_string(r.test_accuracy));
    (void)coordinator_.RemoveJob(p.key);
    if (hooks_.on_job_status) hooks_.on_job_status(p.key, status, p.spec);
    return Next::kDone;
  }
  return Next::kGoOn;
}

void Reconciler::IgnoreForgedOutcomes(
    Pass& p, const std::vector<std::pair<const json*, std::string>>& refused) {
  for (const auto& [pod, why] : refused) {
    const std::string name = PodName(*pod);
    bool fresh = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fresh = MemoryOf(p.key, p.uid)
                  .forged_seen.insert(Obj(*pod, "metadata").value("uid", name))
                  .second;
    }
    if (!fresh) continue;
    const std::string message =
        "the final report in the termination message of pod " + name + " is ignored: " + why;
    std::fprintf(stderr, "virtualflow-operator: %s: %s\n", p.key.c_str(), message.c_str());
    Event(p.job, true, event_reason::kForgedOutcomeIgnored, message);
  }
}

Status Reconciler::FailJob(Pass& p, const std::string& reason, const std::string& event_reason,
                           const std::string& message) {
  WritePhase(p.status, Phase::kFailed);
  p.status["message"] = message;
  json conditions = json::array();
  SetCondition(conditions, p.old_conditions, condition::kFailed, true, reason, message,
               p.generation);
  SetResumedCondition(p, conditions);
  KeepDrainCondition(p, conditions);
  p.status["conditions"] = conditions;
  StampTimes(p);
  VF_RETURN_IF_ERROR(PatchStatus(p.job, p.status));
  Event(p.job, true, event_reason, message);
  (void)coordinator_.RemoveJob(p.key);
  if (hooks_.on_job_status) hooks_.on_job_status(p.key, p.status, p.spec);
  return Status::Ok();
}

Result<Reconciler::Next> Reconciler::RecordFailures(Pass& p) {
  // The failed pods this operator or an earlier one accounted for (status.countedFailedPods,
  // written before they are deleted), so that none is counted twice, whatever restarts between.
  std::set<std::string> counted_before;
  for (const json& name : p.old_status.value("countedFailedPods", json::array())) {
    if (name.is_string()) counted_before.insert(name.get<std::string>());
  }
  json counted = json::array();  // those that still exist, after this pass
  int64_t failed = p.old_status.value("failed", int64_t{0});
  bool fresh_any = false;
  for (const json& pod : p.pods) {
    if (PodLifeOf(pod) != PodLife::kFailed) continue;
    const std::string pod_name = PodName(pod);
    if (PodExitCode(pod) == kExitAnotherBuild) {
      // Its pod ran another build than the job's workers: no failure of the job, nor of a
      // worker. Its pod goes (DeleteEndedPods) and one of the job's image takes its place.
      bool fresh = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        fresh = MemoryOf(p.key, p.uid).failures_seen.insert(pod_name).second;
      }
      if (fresh) {
        Event(p.job, true, event_reason::kWorkerRefused,
              "worker " + pod_name + " (image " + PodImage(pod) +
                  ") was refused: it runs another build than the job's workers; it is replaced "
                  "by a pod of the job's image " +
                  p.image + " (" + PodTerminationMessage(pod) + ")");
      }
      continue;
    }
    if (PodExitCode(pod) == 3) {
      // The agent found that the job itself cannot go on (diverged, bad checkpoint).
      VF_RETURN_IF_ERROR(FailJob(p, reason::kJobFailed, event_reason::kFailed,
                                 "worker " + pod_name + ": " + PodTerminationMessage(pod)));
      return Next::kDone;
    }
    counted.push_back(pod_name);
    bool fresh = counted_before.count(pod_name) == 0;
    if (fresh) {
      std::lock_guard<std::mutex> lock(mu_);
      fresh = MemoryOf(p.key, p.uid).failures_seen.insert(pod_name).second;
    }
    if (!fresh) continue;
    fresh_any = true;
    p.restarts["failure"] += 1;
    const std::string what = "worker " + pod_name + " failed (exit code " +
                             std::to_string(PodExitCode(pod)) + "): " + PodTerminationMessage(pod);
    const PodFailureVerdict verdict = MatchPodFailurePolicy(p.spec.run_policy, pod);
    const std::string rule =
        "spec.runPolicy.podFailurePolicy.rules[" + std::to_string(verdict.rule) + "]";
    if (verdict.action == PodFailureAction::kFailJob) {
      p.status["restarts"] = p.restarts;
      VF_RETURN_IF_ERROR(
          FailJob(p, "PodFailurePolicy", "PodFailurePolicy",
                  what + "; " + verdict.what + " matches " + rule + ", which fails the job"));
      return Next::kDone;
    }
    if (verdict.action == PodFailureAction::kIgnore) {
      Event(p.job, true, event_reason::kWorkerFailed,
            what + "; not counted: " + verdict.what + " matches " + rule + " (Ignore)");
      continue;
    }
    ++failed;
    p.status["lastFailureTime"] = Now();
    Event(p.job, true, event_reason::kWorkerFailed, what);
  }
  if (failed > 0) p.status["failed"] = failed;
  if (counted.empty()) {
    p.status.erase("countedFailedPods");
  } else {
    p.status["countedFailedPods"] = counted;
  }
  p.status["restarts"] = p.restarts;
  // Recorded before DeleteEndedPods deletes any of them.
  if (fresh_any) VF_RETURN_IF_ERROR(PatchStatus(p.job, p.status));
  // As batch/v1 Job's backoffLimit: the failures counted above (preemptions and leaves are
  // counted apart, and podFailurePolicy may ignore some).
  const int limit = p.spec.run_policy.backoff_limit;
  if (failed > limit) {
    VF_RETURN_IF_ERROR(FailJob(
        p, reason::kBackoffLimitExceeded, event_reason::kBackoffLimitExceeded,
        std::to_string(failed) + " worker failures, more than spec.runPolicy.backoffLimit (" +
            std::to_string(limit) + ") allows"));
    return Next::kDone;
  }
  return Next::kGoOn;
}

void Reconciler::ForgetRegistration(const std::string& key) {
  (void)coordinator_.RemoveJob(key);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = memory_.find(key);
  if (it == memory_.end()) return;
  it->second.registered = false;
  it->second.pods = Expectations{};
}

Result<Reconciler::Next> Reconciler::Suspend(Pass& p, ReconcileResult& result) {
  const json* was = FindCondition(p.old_conditions, condition::kSuspended);
  const bool was_suspended = was != nullptr && was->value("status", "") == "True";
  if (!p.spec.suspend) {
    if (was_suspended)
      Event(p.job, false, event_reason::kResumed, "job resumed (spec.suspend is false)");
    return Next::kGoOn;
  }
  // The workers go; a resumed job starts again from its checkpoint, under a fresh
  // registration with the coordinator (restored from the status's epoch, with no members).
  ForgetRegistration(p.key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    MemoryOf(p.key, p.uid).start_time.clear();
  }
  VF_ASSIGN_OR_RETURN(const int stopping, DeleteAllPods(p));
  const std::string message =
      stopping == 0
          ? "suspended (spec.suspend): no worker pods"
          : "suspended (spec.suspend): " + std::to_string(stopping) + " worker pod(s) stopping";
  json& status = p.status;
  MarkWorkersStopping(status, "Suspended", message, stopping);
  status["desiredWorkers"] = 0;
  status.erase("startTime");  // as batch/v1: the deadline counts again from the resume
  // Resumed, the job starts again from its checkpoint on the image it would start on then.
  status.erase("workerImage");
  status.erase("workerBuild");
  status.erase("workerProtocol");
  json conditions = ConditionsWithoutWorkers(p.old_conditions, condition::kSuspended);
  SetCondition(conditions, p.old_conditions, condition::kRunning, false, reason::kSuspended,
               message, p.generation);
  SetCondition(conditions, p.old_conditions, condition::kSuspended, true, reason::kJobSuspended,
               "job suspended (spec.suspend is true)", p.generation);
  status["conditions"] = conditions;
  VF_RETURN_IF_ERROR(PatchStatus(p.job, status));
  if (!was_suspended)
    Event(p.job, false, event_reason::kSuspended, "job suspended; worker pods deleted");
  if (hooks_.on_job_status) hooks_.on_job_status(p.key, status, p.spec);
  // Look again while pods are stopping, so that the status counts them down.
  if (stopping > 0) result.requeue_after = std::chrono::milliseconds(1000);
  return Next::kDone;
}

Result<Reconciler::Next> Reconciler::Drain(Pass& p, ReconcileResult& result) {
  const int64_t ours = coordinator_.protocol();
  const std::optional<int64_t> theirs = WorkerProtocolOf(p.old_status);
  if (!theirs || *theirs == ours) return Next::kGoOn;
  const std::vector<std::shared_ptr<const json>> labelled = pods_.Snapshot([&p](const json& pod) {
    const json& meta = Obj(pod, "metadata");
    return meta.value("namespace", "") == p.ns &&
           Obj(meta, "labels").value(kJobLabel, "") == p.name;
  });
  std::vector<const json*> pods;
  for (const std::shared_ptr<const json>& shared : labelled) pods.push_back(shared.get());
  // Rank 0 finished the job before the upgrade: the outcome is read from its pod as after any
  // restart (RecordSuccess), and nothing is drained.
  Result<Plan> plan = coordinator_.GetPlan(p.key);
  PodOutcome outcome = FinalReportOfPods(
      p.key, p.name, p.uid, RankZeroOfLastPlan(plan.ok() ? &*plan : nullptr, p.old_status), pods);
  IgnoreForgedOutcomes(p, outcome.refused);
  if (outcome.report) return Next::kGoOn;

  // This coordinator cannot talk to the workers: it forgets the job, so that they meet a
  // coordinator that does not know it, and leave untold when their pods are deleted, rank 0
  // writing a checkpoint of its last step.
  ForgetRegistration(p.key);
  int left = 0;
  VF_ASSIGN_OR_RETURN(const int stopping, DeleteAllPods(p, &left));
  const bool resumes = !p.spec.checkpoint.path.empty();
  const std::string image = StartingImage(p.job, options_.pods.default_image);
  const std::string why = "the job's workers speak coordinator protocol " +
                          std::to_string(*theirs) + " and this operator speaks protocol " +
                          std::to_string(ours) + ", so they cannot go on under it";
  const std::string then =
      resumes ? "on image " + image + " from its last checkpoint (" + p.spec.checkpoint.path + ")"
              : "on image " + image + " from step 0: it has no spec.checkpoint.path";
  const bool drained = left == 0;
  std::string message;
  json& status = p.status;
  if (!drained) {
    message = "draining: " + why + "; " + std::to_string(stopping) +
              " worker pod(s) stopping, then the job starts again " + then;
  } else {
    // None is left: the next pass starts the job again, like a resumed one, with pods of the
    // image a job started now gets, speaking this protocol.
    message = "drained: " + why + "; the job starts again " + then;
    status["workerProtocol"] = ours;
    status.erase("workerImage");
    status.erase("workerBuild");
    if (!resumes) {
      status["step"] = 0;
      status.erase("loss");
      ResetStep(p);
    }
  }
  MarkWorkersStopping(status, "Pending", message, stopping);
  json conditions = ConditionsWithoutWorkers(p.old_conditions, condition::kDraining);
  SetCondition(conditions, p.old_conditions, condition::kRunning, false, reason::kDraining, message,
               p.generation);
  SetCondition(conditions, p.old_conditions, condition::kDraining, !drained,
               drained
                   ? (resumes ? reason::kRestartedFromCheckpoint : reason::kRestartedFromStepZero)
                   : reason::kCoordinatorProtocolChanged,
               message, p.generation);
  status["conditions"] = conditions;
  VF_RETURN_IF_ERROR(PatchStatus(p.job, status));
  // One Event as the drain begins and one as the job starts again, however many passes the
  // cache takes to show this operator's own status write (and not again from an operator
  // restarted mid-drain, whose status already says Draining).
  const json* was = FindCondition(p.old_conditions, condition::kDraining);
  const bool was_draining = was != nullptr && was->value("status", "") == "True";
  auto first = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    return MemoryOf(p.key, p.uid).drain_events.insert(what).second;
  };
  if (!was_draining && first(event_reason::kDraining)) {
    // A warning when the job loses its progress.
    Event(p.job, !resumes, event_reason::kDraining,
          why + ": its worker pods are deleted and it starts again " + then);
  }
  if (drained && first(event_reason::kRestarted)) {
    Event(p.job, false, event_reason::kRestarted, message);
  }
  if (hooks_.on_job_status) hooks_.on_job_status(p.key, status, p.spec);
  result.requeue_after = std::chrono::milliseconds(drained ? 200 : 1000);
  return Next::kDone;
}

void Reconciler::KeepDrainCondition(Pass& p, json& conditions) {
  if (const json* drain = FindCondition(p.old_conditions, condition::kDraining); drain != nullptr) {
    conditions.push_back(*drain);
  }
}

Result<int> Reconciler::DeleteAllPods(Pass& p, int* left) {
  int stopping = 0;
  int owned = 0;
  for (const std::shared_ptr<const json>& shared : pods_.Snapshot()) {
    const json& pod = *shared;
    if (!OwnedBy(pod, p.ns, p.name, p.uid)) continue;
    ++owned;
    const PodLife life = PodLifeOf(pod);
    if (life == PodLife::kTerminating) {
      ++stopping;
      continue;
    }
    // One that ended already has nothing to stop, and nothing to keep.
    if (life != PodLife::kSucceeded && life != PodLife::kFailed) ++stopping;
    // The pod's own grace period: the kubelet sends SIGTERM, the agent leaves between steps.
    kube::DeleteOptions del;
    del.precondition_uid = Obj(pod, "metadata").value("uid", "");
    auto r = client_.Delete(kube::kPods, p.ns, PodName(pod), del);
    if (!r.ok() && r.reason() != kube::Reason::kNotFound && r.reason() != kube::Reason::kConflict) {
      p.failed_action = "FailedDeletePod";
      return r.status();
    }
  }
  if (left != nullptr) *left = owned;
  return stopping;
}

void Reconciler::SetResumedCondition(Pass& p, json& conditions) {
  const json* was = FindCondition(p.old_conditions, condition::kSuspended);
  if (was == nullptr) return;  // never suspended
  SetCondition(conditions, p.old_conditions, condition::kSuspended, false, reason::kJobResumed,
               "job resumed (spec.suspend is false)", p.generation);
}

Result<Reconciler::Next> Reconciler::EnforceDeadline(Pass& p, ReconcileResult& result) {
  const std::optional<int64_t>& limit = p.spec.run_policy.active_deadline_seconds;
  if (!limit) return Next::kGoOn;
  const double start = UnixSeconds(p.status.value("startTime", ""));
  if (std::isnan(start)) return Next::kGoOn;
  const double ran = NowUnix() - start;
  const double left = static_cast<double>(*limit) - ran;
  if (left > 0) {
    result.requeue_after = RequeueIn(left);
    return Next::kGoOn;
  }
  VF_RETURN_IF_ERROR(FailJob(p, reason::kDeadlineExceeded, event_reason::kDeadlineExceeded,
                             "the job ran " + std::to_string(static_cast<int64_t>(ran)) +
                                 " s since " + p.status.value("startTime", "") +
                                 ", past spec.runPolicy.activeDeadlineSeconds (" +
                                 std::to_string(*limit) + ")"));
  return Next::kDone;
}

Result<ReconcileResult> Reconciler::EnforceTtl(Pass& p) {
  if (p.spec.run_policy.clean_pod_policy != CleanPodPolicy::kNone) {
    std::shared_ptr<const ClusterView> view = View();
    auto labelled = view->pods_by_job.find(p.key);
    if (labelled != view->pods_by_job.end()) {
      VF_RETURN_IF_ERROR(CleanFinishedPods(client_, p.spec.run_policy.clean_pod_policy, p.ns,
                                           p.name, p.uid, labelled->second));
    }
  }
  const std::optional<int>& ttl = p.spec.run_policy.ttl_seconds_after_finished;
  if (!ttl) return ReconcileResult{};
  // A job that finished before completionTime was written counts from now.
  StampTimes(p);
  VF_RETURN_IF_ERROR(PatchStatus(p.job, p.status));
  const double completed = FinishedAt(p.status);
  if (std::isnan(completed)) return ReconcileResult{};
  const double left = completed + *ttl - NowUnix();
  if (left > 0) {
    return ReconcileResult{RequeueIn(left)};
  }
  // Its pods and Secret follow through their owner references.
  kube::DeleteOptions del;
  del.propagation_policy = "Background";
  del.precondition_uid = p.uid;  // never a newer job of the same name
  auto r = client_.Delete(kube::kVirtualFlowJobs, p.ns, p.name, del);
  if (!r.ok() && r.reason() != kube::Reason::kNotFound && r.reason() != kube::Reason::kConflict) {
    return r.status();
  }
  std::fprintf(stderr,
               "virtualflow-operator: %s: deleted %d s after it finished "
               "(spec.runPolicy.ttlSecondsAfterFinished)\n",
               p.key.c_str(), *ttl);
  return ReconcileResult{};
}

void Reconciler::StampTimes(Pass& p) {
  auto ended = [](const json& status) { return Ended(PhaseOf(status)); };
  std::lock_guard<std::mutex> lock(mu_);
  JobMemory& memory = MemoryOf(p.key, p.uid);
  // What the API server holds wins; then what this operator wrote; then now.
  auto stamp = [&p](const char* field, std::string& remembered) {
    auto it = p.old_status.find(field);
    if (it != p.old_status.end() && it->is_string()) remembered = it->get<std::string>();
    if (remembered.empty()) remembered = Now();
    p.status[field] = remembered;
  };
  // batch/v1 Job's moment: when the controller first takes the job up. A job that ended before
  // startTime existed gets none.
  const bool has_start = !ended(p.old_status) || p.old_status.contains("startTime");
  if (has_start) stamp("startTime", memory.start_time);
  // As batch/v1: on success only; a failed job's Failed condition says when.
  if (PhaseOf(p.status) == Phase::kSucceeded) stamp("completionTime", memory.completion_time);
  // The scale subresource's labelSelectorPath, for a job that may still be scaled.
  if (!ended(p.old_status)) p.status["selector"] = std::string(kJobLabel) + "=" + p.name;
}

}  // namespace vf::controller
