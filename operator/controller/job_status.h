// A VirtualFlowJob's status as the operator writes it, typed: its phase, its conditions (types
// and reasons as named constants), the Event reasons it records, and the status patch that
// takes the API server from one status to the next. No HTTP; the reconciler fills it in.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace vf::controller {

// status.phase; the CRD's enum lists the same values.
enum class Phase { kPending, kRunning, kResizing, kSuspended, kSucceeded, kFailed };

// "Pending", "Running", ...: as status.phase writes it.
std::string_view PhaseName(Phase phase);
// The phase `name` names; nullopt for any other string.
std::optional<Phase> ParsePhase(std::string_view name);
// Succeeded or Failed: the job is over and nothing of it runs again.
bool Ended(Phase phase);
// status.phase of a status object; kPending when it has none (a job not reconciled yet) or one
// this operator does not know.
Phase PhaseOf(const nlohmann::json& status);
// Writes status.phase.
void WritePhase(nlohmann::json& status, Phase phase);

// The condition types of status.conditions.
namespace condition {
inline constexpr char kCreated[] = "Created";
inline constexpr char kRunning[] = "Running";
inline constexpr char kResizing[] = "Resizing";
inline constexpr char kDegraded[] = "Degraded";
inline constexpr char kSucceeded[] = "Succeeded";
inline constexpr char kFailed[] = "Failed";
inline constexpr char kSuspended[] = "Suspended";
inline constexpr char kDraining[] = "Draining";
inline constexpr char kReconcileError[] = "ReconcileError";
inline constexpr char kCheckpointFailing[] = "CheckpointFailing";
inline constexpr char kImageKept[] = "ImageKept";
inline constexpr char kAdmitted[] = "Admitted";
}  // namespace condition

// The reasons of the conditions above (a failed job's reason is also its Event's, FailJob).
namespace reason {
inline constexpr char kPodsCreated[] = "PodsCreated";
inline constexpr char kWaitingForGpus[] = "WaitingForGPUs";
inline constexpr char kWaitingForWorkers[] = "WaitingForWorkers";
inline constexpr char kTraining[] = "Training";
inline constexpr char kFinished[] = "Finished";
inline constexpr char kTrainingFinished[] = "TrainingFinished";
inline constexpr char kMembershipChange[] = "MembershipChange";
inline constexpr char kStable[] = "Stable";
inline constexpr char kBelowMinimum[] = "BelowMinimum";
inline constexpr char kAtLeastMinimum[] = "AtLeastMinimum";
inline constexpr char kReconciled[] = "Reconciled";
inline constexpr char kInvalidSpec[] = "InvalidSpec";
inline constexpr char kJobFailed[] = "JobFailed";
inline constexpr char kBackoffLimitExceeded[] = "BackoffLimitExceeded";
inline constexpr char kDeadlineExceeded[] = "DeadlineExceeded";
inline constexpr char kSuspended[] = "Suspended";
inline constexpr char kJobSuspended[] = "JobSuspended";
inline constexpr char kJobResumed[] = "JobResumed";
inline constexpr char kDraining[] = "Draining";
inline constexpr char kCoordinatorProtocolChanged[] = "CoordinatorProtocolChanged";
inline constexpr char kRestartedFromCheckpoint[] = "RestartedFromCheckpoint";
inline constexpr char kRestartedFromStepZero[] = "RestartedFromStepZero";
inline constexpr char kCheckpointWriteFailed[] = "CheckpointWriteFailed";
inline constexpr char kCheckpointWritten[] = "CheckpointWritten";
inline constexpr char kJobStartedOnIt[] = "JobStartedOnIt";
inline constexpr char kStartingImage[] = "StartingImage";
inline constexpr char kAdmitted[] = "Admitted";
// Kueue evicted the whole job (its core Workload): it drains and is requeued.
inline constexpr char kEvictedByKueue[] = "EvictedByKueue";
}  // namespace reason

// The reasons of the Events recorded on a job (those of a blocked reconcile, named for the
// action that failed, are in the reconciler's steps).
namespace event_reason {
inline constexpr char kStarted[] = "Started";
inline constexpr char kResized[] = "Resized";
inline constexpr char kRecovered[] = "Recovered";
inline constexpr char kSucceeded[] = "Succeeded";
inline constexpr char kFailed[] = "Failed";
inline constexpr char kInvalidSpec[] = "InvalidSpec";
inline constexpr char kWorkerFailed[] = "WorkerFailed";
inline constexpr char kWorkerRefused[] = "WorkerRefused";
inline constexpr char kWorkersCreated[] = "WorkersCreated";
inline constexpr char kForgedOutcomeIgnored[] = "ForgedOutcomeIgnored";
inline constexpr char kCredentialSecretMissing[] = "CredentialSecretMissing";
inline constexpr char kSuspended[] = "Suspended";
inline constexpr char kResumed[] = "Resumed";
inline constexpr char kDraining[] = "Draining";
inline constexpr char kRestarted[] = "Restarted";
inline constexpr char kCheckpointFailed[] = "CheckpointFailed";
inline constexpr char kCheckpointWritten[] = "CheckpointWritten";
inline constexpr char kWorkloadCreated[] = "WorkloadCreated";
inline constexpr char kEvictedByKueue[] = "EvictedByKueue";
inline constexpr char kRequeued[] = "Requeued";
inline constexpr char kReconcileFailed[] = "ReconcileFailed";
inline constexpr char kDeadlineExceeded[] = "DeadlineExceeded";
inline constexpr char kBackoffLimitExceeded[] = "BackoffLimitExceeded";
}  // namespace event_reason

// One entry of status.conditions, as metav1.Condition has it. Value type.
struct Condition {
  std::string type;
  bool status = false;  // "True" or "False"
  std::string reason;
  std::string message;
  std::string last_transition_time;  // RFC 3339
  int64_t observed_generation = 0;

  nlohmann::json ToJson() const;
  // Fails on a condition that is not an object or whose status is neither "True" nor "False".
  static Result<Condition> FromJson(const nlohmann::json& j);
  friend bool operator==(const Condition&, const Condition&) = default;
};

// Sets `c` in `conditions` as meta.SetStatusCondition does: an existing condition of its type
// is updated in place, keeping its lastTransitionTime when its status does not change; a new
// one is appended. A transition (or a new condition) is dated `now`, unless `c` carries a time.
void SetCondition(std::vector<Condition>& conditions, Condition c, std::string_view now);
// The condition of `type`, or null.
const Condition* FindCondition(const std::vector<Condition>& conditions, std::string_view type);

// status.workerCounts. Value type.
struct WorkerCounts {
  int64_t pending = 0;
  int64_t joining = 0;
  int64_t training = 0;
  int64_t leaving = 0;
  int64_t failed = 0;
  friend bool operator==(const WorkerCounts&, const WorkerCounts&) = default;
};

// One member of status.assignment: the plan the workers train under. Value type.
struct AssignedWorker {
  std::string worker;
  int64_t rank = 0;
  std::vector<int> virtual_nodes;
  friend bool operator==(const AssignedWorker&, const AssignedWorker&) = default;
};

// status.lastResize. Value type.
struct LastResize {
  std::string time;
  int64_t from = 0;
  int64_t to = 0;
  std::string reason;
  double pause_seconds = 0;
  friend bool operator==(const LastResize&, const LastResize&) = default;
};

// The status subresource of a VirtualFlowJob. A field unset is absent from the status. Fields
// this struct does not model (written by a newer operator, or by hand) are kept in `other` and
// written back as they were. Value type.
struct JobStatus {
  std::optional<Phase> phase;
  std::optional<std::string> message;
  std::vector<Condition> conditions;
  std::optional<int64_t> observed_generation;
  std::optional<std::string> start_time;
  std::optional<std::string> completion_time;
  std::optional<int64_t> workers;
  std::optional<int64_t> ready_workers;
  std::optional<int64_t> desired_workers;
  std::optional<WorkerCounts> worker_counts;
  std::optional<int64_t> epoch;
  std::optional<std::vector<AssignedWorker>> assignment;
  std::optional<std::string> worker_image;
  std::optional<std::string> worker_build;
  std::optional<int64_t> worker_protocol;
  std::optional<int64_t> step;
  std::optional<int64_t> total_steps;
  std::optional<double> loss;
  std::optional<double> samples_per_second;
  std::optional<std::string> weights_sha256;
  std::optional<double> test_accuracy;
  std::optional<LastResize> last_resize;
  std::optional<std::map<std::string, int64_t>> restarts;
  nlohmann::json other = nlohmann::json::object();

  nlohmann::json ToJson() const;
  // Fails, naming the field, on a modelled field of the wrong type.
  static Result<JobStatus> FromJson(const nlohmann::json& status);
};

// The merge patch of the status subresource that takes `from` to `to`: each field that `to`
// sets differently, and null for each field `from` has and `to` does not (a merge patch deletes
// with null). An empty object when nothing changes. Lists (conditions, assignment) are written
// whole, as a merge patch replaces lists.
nlohmann::json StatusPatch(const JobStatus& from, const JobStatus& to);
// The same over status objects as read and written (JobStatus::ToJson).
nlohmann::json StatusPatch(const nlohmann::json& from, const nlohmann::json& to);

}  // namespace vf::controller
