// The next membership plan: what the membership decision is told of the job's workers, and
// publishing its plan (the status first, then the coordinator).
#include "operator/controller/reconciler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "operator/controller/reconciler_internal.h"

namespace vf::controller {

using nlohmann::json;
using reconciler_internal::Now;
using reconciler_internal::NowUnix;
using reconciler_internal::Obj;
using reconciler_internal::PlanJson;
using reconciler_internal::PodName;
using reconciler_internal::UnixSeconds;

namespace {

// The plan's workers in rank order, as the membership decision takes them.
std::vector<std::string> RankOrder(const Plan& plan) {
  std::vector<const Member*> ranked;
  for (const Member& m : plan.members) ranked.push_back(&m);
  std::sort(ranked.begin(), ranked.end(),
            [](const Member* a, const Member* b) { return a->rank < b->rank; });
  std::vector<std::string> names;
  for (const Member* m : ranked) names.push_back(m->worker);
  return names;
}

// The members of the plan a membership decision publishes: ranks are positions.
std::vector<Member> PlanMembers(const std::vector<policy::PlannedMember>& planned) {
  std::vector<Member> members;
  for (size_t i = 0; i < planned.size(); ++i) {
    members.push_back({planned[i].worker, static_cast<int>(i), planned[i].virtual_nodes});
  }
  return members;
}

}  // namespace

std::optional<ResizeKind> ResizeKindOf(std::string_view kind) {
  if (kind == "grow") return ResizeKind::kGrow;
  if (kind == "shrink") return ResizeKind::kShrink;
  if (kind == "failure") return ResizeKind::kFailure;
  if (kind == "leave") return ResizeKind::kLeave;
  return std::nullopt;
}

policy::MembershipInput Reconciler::MembershipInputOf(const Pass& p) const {
  policy::MembershipInput in;
  in.members = RankOrder(p.view.plan);
  for (const Member& m : p.view.plan.members) in.held[m.worker] = m.virtual_nodes;
  in.desired = p.desired;
  in.min_workers = p.spec.replicas_min;
  in.virtual_nodes = p.spec.virtual_nodes;
  in.join_batch_seconds = options_.join_batch_seconds;
  for (const auto& [worker, info] : p.view.workers) {
    in.failure_reported =
        in.failure_reported || (p.view.plan.epoch > 0 && info.failure_epoch >= p.view.plan.epoch &&
                                p.in_plan.count(worker) != 0);
  }
  const double now_unix = NowUnix();
  for (const json& pod : p.pods) {
    policy::WorkerState w;
    w.name = PodName(pod);
    w.life = WorkerLifeOf(PodLifeOf(pod));
    auto it = p.view.workers.find(w.name);
    if (it != p.view.workers.end()) {
      w.registered = true;
      w.ready = it->second.ready;
      w.leave_requested = it->second.leave_requested;
      w.responsive = !it->second.silent;
      w.seconds_per_virtual_node = it->second.last_report.seconds_per_virtual_node;
    }
    const std::string node = Obj(pod, "spec").value("nodeName", "");
    // A GPU job's pod needs a schedulable node with its accelerator; a CPU-only job's any
    // schedulable one.
    w.on_schedulable_node =
        node.empty() || (p.spec.gpus_per_worker > 0
                             ? !TypeOnNode(p.gpus(), node, AcceleratorResource(p.spec)).empty()
                             : p.gpus().nodes.count(node) != 0);
    const double created = UnixSeconds(Obj(pod, "metadata").value("creationTimestamp", ""));
    w.age_seconds = std::isnan(created) ? 0 : now_unix - created;
    in.workers.push_back(w);
  }
  return in;
}

void Reconciler::InjectFault(const Pass& p) {
  const OperatorFault& fault = options_.fault;
  const Plan& plan = p.view.plan;
  for (const auto& [worker, info] : p.view.workers) {
    const bool member = p.in_plan.count(worker) != 0;
    if (!member && !info.ready && plan.epoch > 0) fault.At("joiners-warming", p.key);
    if (!member && info.leave_requested && info.acked_epoch < plan.epoch) {
      fault.At("acks-pending", p.key);
    }
  }
}

void Reconciler::InjectStateTransferFault(const std::string& job, const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto memory = memory_.find(job);
  if (memory != memory_.end() && !memory->second.published_joiners.empty() &&
      KeyEpoch(key) == memory->second.published_epoch) {
    options_.fault.At("state-transfer", job);
  }
}

Status Reconciler::UpdateMembership(Pass& p) {
  // Once the members have trained the last step they exit one by one while rank 0 evaluates;
  // that is the end of the job, not a failure, so membership and pods are left alone.
  for (const auto& [worker, info] : p.view.workers) {
    p.finishing = p.finishing || (p.total_steps > 0 && p.in_plan.count(worker) != 0 &&
                                  info.last_report.step >= p.total_steps);
  }
  InjectFault(p);
  if (p.finishing) return Status::Ok();
  p.decision = policy::DecideMembership(MembershipInputOf(p));
  if (!p.decision.publish) return Status::Ok();

  const std::vector<Member> next = PlanMembers(p.decision.members);
  const int from = static_cast<int>(p.members.size());
  const int to = static_cast<int>(next.size());
  const std::string& kind = p.decision.kind;
  p.epoch = p.view.plan.epoch + 1;
  // Intent first: the status names the plan before any worker can see it, so an operator
  // that restarts in between restores a plan the workers can follow.
  p.status["epoch"] = p.epoch;
  p.status["assignment"] = PlanJson(next);
  p.status["workers"] = to;
  if (kind != "start") {
    p.status["lastResize"] = {{"time", Now()},
                              {"from", from},
                              {"to", to},
                              {"reason", p.decision.reason},
                              {"pauseSeconds", 0.0}};
  }
  if (kind == "leave") p.restarts["preemption"] += 1;
  p.status["restarts"] = p.restarts;
  VF_RETURN_IF_ERROR(PatchStatus(p.job, p.status));
  VF_RETURN_IF_ERROR(coordinator_.PublishPlanWithEpoch(p.key, p.epoch, next).status());
  std::fprintf(stderr, "virtualflow-operator: %s: epoch %lld: %s\n", p.key.c_str(),
               static_cast<long long>(p.epoch), p.decision.reason.c_str());
  // A recovery names what the members reported, so that a failure that recurs (a plan whose
  // communicator cannot be built) shows its cause among the job's events.
  const std::string reported = kind == "failure" ? ReportedFailure(p.view, p.view.plan.epoch) : "";
  Event(p.job, kind == "failure",
        kind == "start" ? event_reason::kStarted
                        : (kind == "failure" ? event_reason::kRecovered : event_reason::kResized),
        p.decision.reason + (reported.empty() ? "" : "; " + reported));
  if (kind != "start") {
    if (const std::optional<ResizeKind> resize = ResizeKindOf(kind); !resize) {
      std::fprintf(stderr, "virtualflow-operator: %s: membership change of unknown kind %s\n",
                   p.key.c_str(), kind.c_str());
    } else if (hooks_.on_resize) {
      hooks_.on_resize(p.key, *resize, from, to);
    }
  }
  if (kind != "start") options_.fault.At("plan-published", p.key);
  // The members this plan drops are to acknowledge it before they exit (a pod deleted, a
  // node drained: the operator plans without them as soon as it sees that, before they ask).
  if (kind == "leave") options_.fault.At("acks-pending", p.key);
  if (options_.fault.armed("state-transfer")) {
    std::set<std::string> joiners;
    for (const Member& m : next) {
      if (p.in_plan.count(m.worker) == 0) joiners.insert(m.worker);
    }
    std::lock_guard<std::mutex> lock(mu_);
    JobMemory& memory = MemoryOf(p.key, p.uid);
    memory.published_epoch = p.epoch;
    memory.published_joiners = std::move(joiners);
  }
  p.members = next;
  p.in_plan.clear();
  for (const Member& m : p.members) p.in_plan.insert(m.worker);
  return Status::Ok();
}

}  // namespace vf::controller
