// Who trains in a job's next membership plan: one pure decision, from the current plan's
// members, the job's workers as the control plane sees them and the number of workers the
// policy wants. The Kubernetes operator (operator/controller) and `vf run`'s local runner
// (operator/local) both publish what this returns, so a job changes membership the same way
// wherever it runs.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace vf::policy {

// How long the next plan waits for joiners still warming up, so that several arriving together
// cost one switch (one pause of every member) rather than one each. The operator's
// --join-batch-seconds defaults to it and `vf run` uses it as is.
inline constexpr double kJoinBatchSeconds = 20.0;

// MembershipDecision::reason while joiners still warming up are waited for.
inline constexpr char kWaitingForJoiners[] = "waiting for joining workers to warm up";

// How long a registered worker may go without any request to the coordinator before the
// membership leaves it out as unresponsive. Agents poll the plan every second while they live,
// so only a process that cannot run or cannot reach the coordinator stays silent this long.
inline constexpr double kUnresponsiveSeconds = 10.0;

// Where a worker is in its life, as the membership decision needs to know it.
enum class WorkerLife {
  kStarting,  // not yet running (a pod pending or being started)
  kRunning,   // runs (it may still be warming up: see WorkerState::ready)
  kLeaving,   // being stopped (its pod is being deleted, or a plan left it out)
  kExited,    // ended cleanly: finished, or left after acknowledging a plan without it
  kFailed,    // ended any other way, or could not run
};

// One worker of a job as the membership decision sees it. Value type.
struct WorkerState {
  std::string name;  // the worker's name at the coordinator (on Kubernetes, its pod's)
  WorkerLife life = WorkerLife::kStarting;
  bool registered = false;  // known to the coordinator
  bool ready = false;       // warmed up
  bool leave_requested = false;
  bool on_schedulable_node = true;  // false once its node is cordoned or not ready
  // False when the coordinator has not heard from a registered worker for kUnresponsiveSeconds
  // (every agent asks for the plan at least once a second): a stopped (SIGSTOP), hung or
  // partitioned process whose process or pod still looks alive.
  bool responsive = true;
  double age_seconds = 0;               // since it was started
  double seconds_per_virtual_node = 0;  // measured; 0 when unknown
};

// What the decision is made from. Value type.
struct MembershipInput {
  std::vector<std::string> members;  // the current plan's workers in rank order (empty: none yet)
  // The current plan's virtual nodes by worker (empty: not known). A plan after a lost member
  // leaves each survivor the nodes it holds as far as its count allows (KeepVirtualNodes).
  std::map<std::string, std::vector<int>> held;
  int desired = 0;
  int min_workers = 1;
  int virtual_nodes = 1;
  bool failure_reported = false;  // a member reported a failed collective in the current plan
  std::vector<WorkerState> workers;
  // Joiners still warming up younger than this are waited for.
  double join_batch_seconds = kJoinBatchSeconds;
};

// One member of the next plan; its rank is its position in the plan. Value type.
struct PlannedMember {
  std::string worker;
  std::vector<int> virtual_nodes;
};

// What changes, if anything. Value type.
struct MembershipDecision {
  bool publish = false;
  // A change is due (a member lost, leaving or failed, a shrink or a growth) but held back:
  // joiners are still warming up, the first plan waits for its minimum, or nobody is ready.
  // False when the current plan simply stands.
  bool held = false;
  std::vector<PlannedMember> members;  // the next plan's members, rank order (when publish)
  // grow | shrink | failure | leave | start: low-cardinality, for metrics and Events.
  std::string kind;
  std::string reason;  // a sentence for people (also why nothing changes, when it waits)
};

// Rules: a member that is gone (failed, exited without leaving, or no longer among the workers)
// or unresponsive, or that reported a failed collective, forces a new plan at once (an
// unresponsive worker is not taken as a joiner either, until it is heard from again); a member that
// is leaving (being stopped, or it asked) is left out of the next plan; ready joiners are added up
// to `desired`, oldest first, waiting up to join_batch_seconds for joiners still warming up;
// survivors keep their order so that rank 0 always holds the training state; when the job must
// shrink, members on nodes that are going away leave first, then the highest ranks. The first plan
// waits until `min_workers` are ready. Virtual nodes are split (runtime/split.h) in proportion to
// measured speed when every member has a measurement, evenly otherwise; as contiguous lists,
// except after a lost member, when the survivors keep the nodes they held (`held`) and share out
// the lost member's: they had computed theirs in the failed step.
MembershipDecision DecideMembership(const MembershipInput& input);

}  // namespace vf::policy
