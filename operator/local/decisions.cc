#include "operator/local/decisions.h"

#include <algorithm>

#include "runtime/split.h"

namespace vf::local {
namespace {

// The local slots, as the policies see them: one "GPU type".
constexpr char kSlotType[] = "cpu";
// A rebalance pays for its pause only when the predicted step time falls below this fraction of
// the current split's (a cut of more than 15%).
constexpr double kRebalanceBelow = 0.85;
// Smoothing of the speed estimates, and the samples one needs before it is acted on.
constexpr double kSpeedAlpha = 0.3;
constexpr int kMinSpeedSamples = 4;

}  // namespace

Result<CapacitySchedule> SlotSchedule(const std::string& capacity, int workers, const JobSpec& job,
                                      int cores) {
  if (!capacity.empty()) return CapacitySchedule::Parse(capacity);
  if (workers > 0) return CapacitySchedule::Constant(workers);
  return CapacitySchedule::Constant(std::min(job.replicas_max, std::max(cores, 1)));
}

Result<Desired> DesiredWorkers(const policy::Policy& policy, const JobSpec& job, int members,
                               int slots, double last_resize_time, double now) {
  // The same decision code the Kubernetes operator runs.
  policy::PolicyJob pj;
  pj.id = job.namespace_name + "/" + job.name;
  pj.min_workers = job.replicas_min;
  pj.max_workers = job.replicas_max;
  pj.requested_workers = job.replicas_max;
  pj.virtual_nodes = job.virtual_nodes;
  pj.gpus_per_worker = 1;
  if (members > 0) pj.current[kSlotType] = members;
  pj.last_resize_time = last_resize_time;
  pj.cooldown_seconds = job.elasticity.cooldown_seconds;
  policy::GpuInventory inventory;
  inventory.gpus[kSlotType] = slots;
  VF_ASSIGN_OR_RETURN(policy::Decision decision, policy.Decide({pj}, inventory, now));
  const policy::JobDecision* mine = decision.Find(pj.id);
  if (mine == nullptr) return Desired{};
  return Desired{policy::TotalWorkers(mine->workers), mine->reason};
}

std::vector<int> SlotsToFill(const std::vector<int>& taken, int live, int usable, int desired,
                             int slots) {
  std::vector<int> out;
  for (int slot = 0; usable < desired && live < slots; ++slot) {
    if (std::find(taken.begin(), taken.end(), slot) != taken.end()) continue;
    out.push_back(slot);
    ++live;
    ++usable;
  }
  return out;
}

bool Usable(const ProcessView& p) {
  return p.alive && p.responsive && !p.asked_to_leave && !p.leave_requested;
}

policy::WorkerState WorkerStateOf(const ProcessView& p) {
  policy::WorkerState w;
  w.name = p.name;
  if (!p.alive) {
    w.life = p.exited_cleanly ? policy::WorkerLife::kExited : policy::WorkerLife::kFailed;
  } else {
    // A process runs from the moment it is started; warming up shows as not ready.
    w.life = p.asked_to_leave ? policy::WorkerLife::kLeaving : policy::WorkerLife::kRunning;
  }
  w.registered = p.registered;
  w.ready = p.ready;
  w.leave_requested = p.leave_requested;
  w.responsive = p.responsive;
  w.age_seconds = p.age_seconds;
  return w;
}

bool FailureReported(const std::vector<int64_t>& failure_epochs, int64_t plan_epoch,
                     int64_t handled_failure_epoch) {
  if (plan_epoch <= handled_failure_epoch) return false;
  return std::any_of(failure_epochs.begin(), failure_epochs.end(),
                     [&](int64_t e) { return e >= plan_epoch; });
}

std::string PlanReason(const std::string& kind, const std::string& policy_reason, int slots,
                       const std::string& membership_reason) {
  if (kind == "start") return "start";
  if (kind == "failure") {
    // Its first clause ("worker-2 stopped answering; 3 -> 2 workers"): the sizes are shown apart.
    const std::string what = membership_reason.substr(0, membership_reason.find(';'));
    return what.find("stopped answering") != std::string::npos ? what : "a worker failed";
  }
  if (kind == "leave") return "a worker asked to leave";
  const std::string have = std::to_string(slots) + " slots";
  return policy_reason.empty() ? have : policy_reason + ", " + have;
}

void FoldSpeed(int64_t epoch, int64_t step, double seconds_per_virtual_node, SpeedEstimate& e) {
  if (seconds_per_virtual_node <= 0 || step == e.step) return;
  if (epoch != e.epoch) {
    e.epoch = epoch;
    e.samples = 0;
  }
  e.seconds_per_virtual_node = e.samples == 0 ? seconds_per_virtual_node
                                              : kSpeedAlpha * seconds_per_virtual_node +
                                                    (1 - kSpeedAlpha) * e.seconds_per_virtual_node;
  ++e.samples;
  e.step = step;
}

bool Settled(const SpeedEstimate& e, int64_t epoch) {
  return e.epoch == epoch && e.samples >= kMinSpeedSamples;
}

std::optional<Rebalance> ProposeRebalance(int virtual_nodes, const std::vector<int>& counts,
                                          const std::vector<double>& seconds_per_virtual_node) {
  Rebalance r;
  r.counts = SplitVirtualNodes(virtual_nodes, seconds_per_virtual_node);
  if (r.counts.empty() || r.counts == counts) return std::nullopt;
  r.step_seconds_before = SplitStepSeconds(counts, seconds_per_virtual_node);
  r.step_seconds_after = SplitStepSeconds(r.counts, seconds_per_virtual_node);
  if (!(r.step_seconds_after < kRebalanceBelow * r.step_seconds_before)) return std::nullopt;
  return r;
}

}  // namespace vf::local
