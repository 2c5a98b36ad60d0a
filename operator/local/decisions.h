// The local runner's decisions (operator/local/launcher.cc), as pure functions of what it knows,
// so that `vf run`'s behaviour is covered by unit tests without starting a process: the slots a
// run has, the workers the policy wants on them, where new workers go, how a worker process
// looks to the membership decision (operator/policy/membership.h), why a plan changes, and when
// the virtual nodes are worth rebalancing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "operator/local/capacity.h"
#include "operator/policy/membership.h"
#include "operator/policy/policy.h"
#include "runtime/job/spec.h"
#include "runtime/status.h"

namespace vf::local {

// The slot schedule a run starts with: `capacity` when given (a schedule), else `workers` slots
// (> 0), else min(spec.replicas.max, cores).
Result<CapacitySchedule> SlotSchedule(const std::string& capacity, int workers, const JobSpec& job,
                                      int cores);

// The workers the job's policy wants on the local slots, the only "GPU type", and why. Value type.
struct Desired {
  int workers = 0;
  std::string reason;  // the policy's one line ("grew: ..."); empty when nothing happened
};
// `members` is how many members of the current plan may stay (0: none, or no plan yet);
// `last_resize_time` and `now` are seconds since the run started.
Result<Desired> DesiredWorkers(const policy::Policy& policy, const JobSpec& job, int members,
                               int slots, double last_resize_time, double now);

// The slots to start new workers on: the lowest ones no live process holds (`taken`), as many as
// bring the usable workers up to `desired` while the live processes (`live`, joiners and leavers
// included, each holds a slot) stay within `slots`.
std::vector<int> SlotsToFill(const std::vector<int>& taken, int live, int usable, int desired,
                             int slots);

// One local worker process and what the coordinator knows of it. Value type.
struct ProcessView {
  std::string name;
  bool alive = true;
  bool exited_cleanly = false;   // when not alive: exit code 0
  bool asked_to_leave = false;   // a plan left it out; it is acknowledging and exiting
  double age_seconds = 0;        // since it was started
  bool registered = false;       // known to the coordinator
  bool ready = false;            // warmed up
  bool leave_requested = false;  // it asked to leave (SIGTERM)
  bool responsive = true;        // the coordinator heard from it lately (not stopped or hung)
};

// Whether the process can train from the next plan on: alive and answering, and neither leaving
// nor asked to.
bool Usable(const ProcessView& p);

// The process as the membership decision sees it. Speeds are left unknown, so that plans split
// the virtual nodes evenly: the runner rebalances on its own smoothed measurements.
policy::WorkerState WorkerStateOf(const ProcessView& p);

// Whether a failed collective that no plan has answered yet was reported: a failure in the
// current plan `plan_epoch` (one of `failure_epochs`, the workers' last failures, -1: none),
// unless a plan published for an earlier failure already is the current one.
bool FailureReported(const std::vector<int64_t>& failure_epochs, int64_t plan_epoch,
                     int64_t handled_failure_epoch);

// The reason `vf run` gives for a plan (resize lines and --summary-json): "start", "a worker
// failed" (or, for a silent member, the membership's "worker-2 stopped answering"), "a worker
// asked to leave", or the policy's reason with the slots it had. `membership_reason` is the
// decision's reason.
std::string PlanReason(const std::string& kind, const std::string& policy_reason, int slots,
                       const std::string& membership_reason = "");

// A worker's smoothed seconds per virtual node under one plan. Single reports are noisy (a busy
// machine, a pause); a rebalance costs every member a pause, so it acts on averages only. Value
// type.
struct SpeedEstimate {
  double seconds_per_virtual_node = 0.0;
  int samples = 0;
  int64_t epoch = -1;  // the plan the samples were measured under
  int64_t step = -1;   // the step of the last report folded in
};
// Folds in a report of `seconds_per_virtual_node` (<= 0: none measured) at `step` under plan
// `epoch`; a report of a new plan starts over, a repeated one changes nothing.
void FoldSpeed(int64_t epoch, int64_t step, double seconds_per_virtual_node, SpeedEstimate& e);
// Whether the estimate has enough samples under plan `epoch` to act on.
bool Settled(const SpeedEstimate& e, int64_t epoch);

// A move of virtual nodes between the same members. Value type.
struct Rebalance {
  std::vector<int> counts;  // virtual nodes per rank from now on
  double step_seconds_before = 0.0;
  double step_seconds_after = 0.0;
};
// The split by measured speed when it would cut the predicted step time of the current split
// `counts` by more than 15% (worth the pause); nothing otherwise.
std::optional<Rebalance> ProposeRebalance(int virtual_nodes, const std::vector<int>& counts,
                                          const std::vector<double>& seconds_per_virtual_node);

}  // namespace vf::local
