// The job's status while it runs: progress, phase, worker counts and conditions.
#include "operator/controller/reconciler.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "operator/controller/reconciler_internal.h"

namespace vf::controller {

using nlohmann::json;
using reconciler_internal::FindCondition;
using reconciler_internal::Obj;
using reconciler_internal::PlanJson;
using reconciler_internal::PodName;
using reconciler_internal::SetCondition;

namespace {

// What the members' latest reports say about the job's progress under plan `epoch`. Value type.
struct Progress {
  int64_t step = 0;
  double loss = std::nan("");
  double samples_per_second = 0;
  bool all_switched = false;  // every member reported from the plan of `epoch`
  double pause_seconds = 0;   // the longest switch pause a member reported
};

Progress ProgressOf(const std::vector<Member>& members, int64_t epoch, const JobView& view) {
  Progress out;
  out.all_switched = !members.empty();
  for (const Member& m : members) {
    auto it = view.workers.find(m.worker);
    if (it == view.workers.end() || it->second.last_report.epoch != epoch) {
      out.all_switched = false;
      continue;
    }
    const Report& r = it->second.last_report;
    out.pause_seconds = std::max(out.pause_seconds, r.pause_seconds);
    if (r.step >= out.step) {
      out.step = r.step;
      if (std::isfinite(r.loss)) out.loss = r.loss;
      out.samples_per_second = std::max(out.samples_per_second, r.samples_per_second);
    }
  }
  return out;
}

}  // namespace

json Reconciler::WorkerCounts(const Pass& p) const {
  int pending = 0;
  int joining = 0;
  int training = 0;
  int leaving = 0;
  int failed = 0;
  for (const json& pod : p.pods) {
    const std::string name = PodName(pod);
    switch (PodLifeOf(pod)) {
      case PodLife::kStarting:
        ++pending;
        break;
      case PodLife::kRunning: {
        auto it = p.view.workers.find(name);
        const bool asked_to_leave = it != p.view.workers.end() && it->second.leave_requested;
        if (p.in_plan.count(name) == 0) {
          ++joining;
        } else if (asked_to_leave) {
          ++leaving;
        } else {
          ++training;
        }
        break;
      }
      case PodLife::kTerminating:
        ++leaving;
        break;
      case PodLife::kFailed:
        ++failed;
        break;
      case PodLife::kSucceeded:
        break;  // finished, or left after acknowledging a plan
    }
  }
  // Created, this pass or an earlier one, and not in the cache yet: a pass that runs before
  // the cache shows them says what the one that created them said.
  pending += p.created + p.unseen;
  return {{"pending", pending},
          {"joining", joining},
          {"training", training},
          {"leaving", leaving},
          {"failed", failed}};
}

Status Reconciler::WriteProgress(Pass& p) {
  const Progress progress = ProgressOf(p.members, p.epoch, p.view);
  int ready = 0;
  for (const auto& [worker, info] : p.view.workers) {
    auto it = p.by_name.find(worker);
    if (info.ready && it != p.by_name.end() && PodLifeOf(*it->second) == PodLife::kRunning) {
      ++ready;
    }
  }
  json& status = p.status;
  status["workers"] = static_cast<int>(p.members.size());
  status["readyWorkers"] = ready;
  status["desiredWorkers"] = p.desired;
  status["workerCounts"] = WorkerCounts(p);
  if (p.total_steps > 0) status["totalSteps"] = p.total_steps;  // once an agent has said
  status["epoch"] = p.epoch;
  status["assignment"] = PlanJson(p.members);
  status["restarts"] = p.restarts;
  // Recorded with the job's first pods (WorkerImage keeps it while the job trains), and with
  // it the coordinator protocol they speak: this coordinator's, which takes no other.
  if (!p.pods.empty() || p.created > 0 || p.unseen > 0) {
    status["workerImage"] = p.image;
    status["workerProtocol"] = coordinator_.protocol();
  }
  // The job's build is its members' once one has registered with this coordinator.
  for (const Member& m : p.members) {
    if (p.view.workers.count(m.worker) != 0) status["workerBuild"] = p.view.build;
  }
  if (progress.step > 0 || !status.contains("step")) {
    status["step"] = std::max<int64_t>(progress.step, p.old_status.value("step", int64_t{0}));
  }
  if (std::isfinite(progress.loss)) status["loss"] = progress.loss;
  if (progress.samples_per_second > 0) status["samplesPerSecond"] = progress.samples_per_second;
  if (progress.all_switched && status.contains("lastResize") &&
      Obj(status, "lastResize").value("pauseSeconds", 0.0) == 0.0 && progress.pause_seconds > 0) {
    status["lastResize"]["pauseSeconds"] = progress.pause_seconds;
    if (hooks_.on_resize_pause) hooks_.on_resize_pause(p.key, progress.pause_seconds);
  }
  SetPhase(p, progress.all_switched);
  VF_RETURN_IF_ERROR(PatchStatus(p.job, status));
  if (hooks_.on_job_status) hooks_.on_job_status(p.key, status, p.spec);
  return Status::Ok();
}

void Reconciler::SetPhase(Pass& p, bool all_switched) {
  const size_t workers = p.members.size();
  Phase phase = Phase::kPending;
  std::string message;
  if (workers == 0) {
    // Before the first plan every worker is a joiner: whether the membership decision still
    // waits for them (kJoinBatchSeconds) or has none yet (this pass created them) is the same
    // thing to the job's user, and one message saves a status write for every new job.
    const std::string& why = p.decision.reason;
    message = p.desired == 0 ? "waiting for GPUs: " + p.policy_reason
              : why.empty() || why == policy::kWaitingForJoiners ? "waiting for workers to warm up"
                                                                 : why;
  } else if (!all_switched) {
    phase = Phase::kResizing;
    message = "switching to membership epoch " + std::to_string(p.epoch);
  } else {
    phase = Phase::kRunning;
    message = "training on " + std::to_string(workers) + " workers";
  }
  WritePhase(p.status, phase);
  p.status["message"] = message;
  const bool has_pods = !p.pods.empty() || p.created > 0 || p.unseen > 0;
  const json& old = p.old_conditions;
  json conditions = json::array();
  SetCondition(conditions, old, condition::kCreated, has_pods,
               has_pods ? reason::kPodsCreated : reason::kWaitingForGpus,
               has_pods ? "worker pods were created" : message, p.generation);
  SetCondition(conditions, old, condition::kRunning, workers > 0,
               workers == 0
                   ? (p.desired == 0 ? reason::kWaitingForGpus : reason::kWaitingForWorkers)
                   : reason::kTraining,
               message, p.generation);
  SetCondition(conditions, old, condition::kResizing, phase == Phase::kResizing,
               phase == Phase::kResizing ? reason::kMembershipChange : reason::kStable, message,
               p.generation);
  const bool degraded = workers > 0 && static_cast<int>(workers) < p.spec.replicas_min;
  SetCondition(
      conditions, old, condition::kDegraded, degraded,
      degraded ? reason::kBelowMinimum : reason::kAtLeastMinimum,
      std::to_string(workers) + " of at least " + std::to_string(p.spec.replicas_min) + " workers",
      p.generation);
  // Shown once a pass has failed; this one did not.
  if (FindCondition(old, condition::kReconcileError) != nullptr) {
    SetCondition(conditions, old, condition::kReconcileError, false, reason::kReconciled,
                 "the last reconcile succeeded", p.generation);
  }
  SetCheckpointCondition(p, conditions);
  SetImageCondition(p, conditions);
  SetResumedCondition(p, conditions);
  SetAdmittedCondition(p, conditions);
  KeepDrainCondition(p, conditions);
  p.status["conditions"] = conditions;
}

void Reconciler::SetImageCondition(Pass& p, json& conditions) {
  const std::string starting = StartingImage(p.job, options_.pods.default_image);
  const bool kept = p.status.contains("workerImage") && p.image != starting;
  if (kept) {
    SetCondition(conditions, p.old_conditions, condition::kImageKept, true, reason::kJobStartedOnIt,
                 "the workers run " + p.image +
                     ", the image the job started on, and so does every new pod of the job; a "
                     "job started now would run " +
                     starting + ". Suspend and resume the job to move it to that image",
                 p.generation);
  } else if (FindCondition(p.old_conditions, condition::kImageKept) != nullptr) {
    SetCondition(conditions, p.old_conditions, condition::kImageKept, false, reason::kStartingImage,
                 "the workers run " + p.image + ", the image a job started now would run",
                 p.generation);
  }
}

void Reconciler::SetCheckpointCondition(Pass& p, json& conditions) {
  // Rank 0 writes the checkpoints, and rank 0 changes with the membership: the newest outcome
  // any worker reported is the job's.
  const Report* newest = nullptr;
  for (const auto& [worker, info] : p.view.workers) {
    if (info.last_report.checkpoint_step > 0 &&
        (newest == nullptr || info.last_report.checkpoint_step > newest->checkpoint_step)) {
      newest = &info.last_report;
    }
  }
  const json* old = FindCondition(p.old_conditions, condition::kCheckpointFailing);
  if (newest == nullptr) {
    // Nothing reported since the coordinator (re)started: keep what was shown.
    if (old != nullptr) conditions.push_back(*old);
    return;
  }
  const std::string step = std::to_string(newest->checkpoint_step);
  if (!newest->checkpoint_error.empty()) {
    const std::string what =
        "training goes on and the next checkpoint tries again: " + newest->checkpoint_error;
    const std::string message = "checkpoint at step " + step + " not written; " + what;
    // One Event per failed checkpoint seen (the cache may not show this operator's own status
    // write yet, so it remembers), all in one series (count) while the error stays the same.
    bool fresh = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      int64_t& seen = MemoryOf(p.key, p.uid).checkpoint_failure_seen;
      fresh = seen != newest->checkpoint_step;
      seen = newest->checkpoint_step;
    }
    if (fresh) {
      Event(p.job, true, event_reason::kCheckpointFailed, "checkpoint not written; " + what);
      if (hooks_.on_checkpoint_failure) hooks_.on_checkpoint_failure(p.key);
    }
    SetCondition(conditions, p.old_conditions, condition::kCheckpointFailing, true,
                 reason::kCheckpointWriteFailed, message, p.generation);
    return;
  }
  if (old == nullptr) return;  // never failed: no condition to show
  if (old->value("status", "") == "True") {
    Event(p.job, false, event_reason::kCheckpointWritten,
          "checkpoint written again at step " + step);
  }
  SetCondition(conditions, p.old_conditions, condition::kCheckpointFailing, false,
               reason::kCheckpointWritten, "checkpoint at step " + step + " written", p.generation);
}

}  // namespace vf::controller
