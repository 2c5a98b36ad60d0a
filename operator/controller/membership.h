// Who trains in a job's next membership plan: the operator's decision, as a pure function of
// the current plan, the job's workers (their pods and what the coordinator knows of them) and
// the number of workers the policy wants. The reconciler publishes what this returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "operator/controller/worker_pod.h"
#include "operator/coordinator/coordinator.h"

namespace vf::controller {

// One worker of a job as the membership decision sees it. Value type.
struct WorkerState {
  std::string name;  // pod name, also the worker's name at the coordinator
  PodLife life = PodLife::kStarting;
  bool registered = false;  // known to the coordinator
  bool ready = false;       // warmed up
  bool leave_requested = false;
  bool on_schedulable_node = true;      // false once its node is cordoned or not ready
  double age_seconds = 0;               // since the pod was created
  double seconds_per_virtual_node = 0;  // measured; 0 when unknown
};

// Value type.
struct MembershipInput {
  Plan plan;  // the current plan (epoch 0: none yet)
  int desired = 0;
  int min_workers = 1;
  int virtual_nodes = 1;
  bool failure_reported = false;  // a member reported a failed collective in the current epoch
  std::vector<WorkerState> workers;
  // Joiners still warming up younger than this are waited for, so that several arriving
  // together cost one switch rather than one each.
  double join_batch_seconds = 20;
};

// What changes, if anything. Value type.
struct MembershipDecision {
  bool publish = false;
  std::vector<Member> members;  // the next plan's members, ranks 0..n-1 (when publish)
  // grow | shrink | failure | leave | start: low-cardinality, for metrics and Events.
  std::string kind;
  std::string reason;  // a sentence for people (also why nothing changes, when it waits)
};

// Rules: a member that is gone (its pod failed, finished without leaving, or vanished) or that
// reported a failed collective forces a new plan at once; a member that is leaving (its pod is
// being deleted, or it asked) is left out of the next plan; ready joiners are added up to
// `desired`, waiting up to join_batch_seconds for joiners still warming up; survivors keep
// their order so that rank 0 always holds the training state; when the job must shrink, members
// on nodes that are going away leave first, then the highest ranks. The first plan waits until
// `min_workers` are ready. Virtual nodes are split in proportion to measured speed when every
// member has a measurement, evenly otherwise.
MembershipDecision DecideMembership(const MembershipInput& input);

}  // namespace vf::controller
