#include "operator/controller/membership.h"

#include <algorithm>
#include <map>
#include <set>

#include "runtime/split.h"

namespace vf::controller {
namespace {

bool Usable(const WorkerState& w) {
  return w.life == PodLife::kRunning && w.registered && w.ready && !w.leave_requested;
}

std::vector<Member> Assign(const std::vector<const WorkerState*>& chosen, int virtual_nodes) {
  std::vector<double> speed;
  bool measured = true;
  for (const WorkerState* w : chosen) {
    measured = measured && w->seconds_per_virtual_node > 0;
    speed.push_back(w->seconds_per_virtual_node);
  }
  if (!measured) speed = EqualTimes(static_cast<int>(chosen.size()));
  const std::vector<std::vector<int>> nodes =
      ContiguousVirtualNodes(SplitVirtualNodes(virtual_nodes, speed));
  std::vector<Member> members;
  for (size_t i = 0; i < chosen.size(); ++i) {
    members.push_back({chosen[i]->name, static_cast<int>(i), nodes[i]});
  }
  return members;
}

}  // namespace

MembershipDecision DecideMembership(const MembershipInput& in) {
  MembershipDecision out;
  std::map<std::string, const WorkerState*> by_name;
  for (const WorkerState& w : in.workers) by_name[w.name] = &w;

  // The current members, in rank order, and what became of them.
  std::vector<const Member*> ranked;
  for (const Member& m : in.plan.members) ranked.push_back(&m);
  std::sort(ranked.begin(), ranked.end(),
            [](const Member* a, const Member* b) { return a->rank < b->rank; });
  std::vector<const WorkerState*> keep;
  bool lost = false;
  bool leaving = false;
  for (const Member* m : ranked) {
    auto it = by_name.find(m->worker);
    if (it == by_name.end()) {
      lost = true;
      continue;
    }
    const WorkerState& w = *it->second;
    if (w.life == PodLife::kFailed || w.life == PodLife::kSucceeded) {
      lost = true;
    } else if (w.life == PodLife::kTerminating || w.leave_requested) {
      leaving = true;
    } else {
      // Running members stay even while the coordinator has not heard from them again (an
      // operator restart): only their pod says whether they are alive.
      keep.push_back(&w);
    }
  }

  std::set<std::string> members_now;
  for (const Member& m : in.plan.members) members_now.insert(m.worker);
  std::vector<const WorkerState*> joiners;
  bool warming = false;
  for (const WorkerState& w : in.workers) {
    if (members_now.count(w.name) != 0) continue;
    if (Usable(w) && w.on_schedulable_node) {
      joiners.push_back(&w);
    } else if ((w.life == PodLife::kStarting || w.life == PodLife::kRunning) &&
               !w.leave_requested && w.age_seconds < in.join_batch_seconds) {
      warming = true;
    }
  }
  std::sort(joiners.begin(), joiners.end(), [](const WorkerState* a, const WorkerState* b) {
    return a->age_seconds != b->age_seconds ? a->age_seconds > b->age_seconds : a->name < b->name;
  });

  const int desired = std::max(0, std::min(in.desired, in.virtual_nodes));
  std::vector<const WorkerState*> chosen;
  bool shrinks = false;
  if (static_cast<int>(keep.size()) > desired) {
    // Members on nodes that are going away leave first, then the highest ranks.
    std::stable_sort(keep.begin(), keep.end(), [](const WorkerState* a, const WorkerState* b) {
      return a->on_schedulable_node > b->on_schedulable_node;
    });
    std::vector<const WorkerState*> staying(keep.begin(), keep.begin() + desired);
    // Back to rank order so rank 0 stays rank 0 when it stays.
    std::vector<const WorkerState*> ordered;
    for (const WorkerState* w : keep) {
      if (std::find(staying.begin(), staying.end(), w) != staying.end()) ordered.push_back(w);
    }
    std::vector<const WorkerState*> rank_order;
    for (const Member* m : ranked) {
      for (const WorkerState* w : ordered) {
        if (w->name == m->worker) rank_order.push_back(w);
      }
    }
    chosen = rank_order;
    shrinks = true;
  } else {
    chosen = keep;
    for (const WorkerState* j : joiners) {
      if (static_cast<int>(chosen.size()) >= desired) break;
      chosen.push_back(j);
    }
  }

  const bool first = in.plan.epoch == 0 || in.plan.members.empty();
  const bool grows = chosen.size() > keep.size();
  const bool changed = lost || leaving || in.failure_reported || shrinks || grows;
  if (!changed) {
    if (warming && static_cast<int>(chosen.size()) < desired) {
      out.reason = "waiting for joining workers to warm up";
    }
    return out;
  }
  if (chosen.empty()) {
    out.reason = "no worker is ready to train";
    return out;
  }
  if (first && static_cast<int>(chosen.size()) < in.min_workers) {
    out.reason = "waiting for " + std::to_string(in.min_workers) + " workers to be ready (" +
                 std::to_string(chosen.size()) + " are)";
    return out;
  }
  // Joiners still warming up are worth waiting for unless something forces a plan now.
  if (warming && !lost && !leaving && !in.failure_reported && !shrinks &&
      static_cast<int>(chosen.size()) < desired) {
    out.reason = "waiting for joining workers to warm up";
    return out;
  }

  out.publish = true;
  out.members = Assign(chosen, in.virtual_nodes);
  const std::string from = std::to_string(in.plan.members.size());
  const std::string to = std::to_string(chosen.size());
  if (first) {
    out.kind = "start";
    out.reason = "started with " + to + " workers";
  } else if (lost || in.failure_reported) {
    out.kind = "failure";
    out.reason = "a worker failed; " + from + " -> " + to + " workers";
  } else if (leaving) {
    out.kind = "leave";
    out.reason = "a worker is leaving; " + from + " -> " + to + " workers";
  } else if (shrinks) {
    out.kind = "shrink";
    out.reason = "GPUs taken back; " + from + " -> " + to + " workers";
  } else {
    out.kind = "grow";
    out.reason = "GPUs available; " + from + " -> " + to + " workers";
  }
  return out;
}

}  // namespace vf::controller
