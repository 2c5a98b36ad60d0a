#include "operator/policy/membership.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/split.h"

namespace vf::policy {
namespace {

bool Usable(const WorkerState& w) {
  return w.life == WorkerLife::kRunning && w.registered && w.ready && !w.leave_requested;
}

// The current members, in rank order, and what became of them. Value type (pointers into the
// input).
struct Survivors {
  std::vector<const WorkerState*> keep;  // still training, rank order
  bool lost = false;                     // a member failed, exited, vanished or went silent
  std::vector<std::string> silent;       // the members that stopped answering
  bool leaving = false;                  // a member is being stopped or asked to leave
};

Survivors SortOutMembers(const MembershipInput& in) {
  std::map<std::string, const WorkerState*> by_name;
  for (const WorkerState& w : in.workers) by_name[w.name] = &w;
  Survivors out;
  for (const std::string& name : in.members) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      out.lost = true;
      continue;
    }
    const WorkerState& w = *it->second;
    if (w.life == WorkerLife::kFailed || w.life == WorkerLife::kExited) {
      out.lost = true;
    } else if (w.life == WorkerLife::kLeaving || w.leave_requested) {
      out.leaving = true;
    } else if (!w.responsive) {
      // Its process or pod looks alive, but it stopped answering: the survivors' collectives
      // and rendezvous would wait for it forever. It is fenced by the new epoch.
      out.lost = true;
      out.silent.push_back(w.name);
    } else {
      // Running members stay even while the coordinator has not heard from them again (an
      // operator restart): only their process or pod says whether they are alive.
      out.keep.push_back(&w);
    }
  }
  return out;
}

// Workers outside the plan: those ready to join (oldest first), and whether any is still
// warming up recently enough to be worth waiting for. Value type (pointers into the input).
struct Joiners {
  std::vector<const WorkerState*> ready;
  bool warming = false;
};

Joiners FindJoiners(const MembershipInput& in) {
  const std::set<std::string> members(in.members.begin(), in.members.end());
  Joiners out;
  for (const WorkerState& w : in.workers) {
    if (members.count(w.name) != 0) continue;
    if (!w.responsive) continue;
    if (Usable(w) && w.on_schedulable_node) {
      out.ready.push_back(&w);
    } else if ((w.life == WorkerLife::kStarting || w.life == WorkerLife::kRunning) &&
               !w.leave_requested && w.age_seconds < in.join_batch_seconds) {
      out.warming = true;
    }
  }
  std::sort(out.ready.begin(), out.ready.end(), [](const WorkerState* a, const WorkerState* b) {
    return a->age_seconds != b->age_seconds ? a->age_seconds > b->age_seconds : a->name < b->name;
  });
  return out;
}

// The first `desired` of `keep`: members on nodes that are going away leave first, then the
// highest ranks. The result stays in rank order, so rank 0 stays rank 0 when it stays.
std::vector<const WorkerState*> Shrink(const std::vector<const WorkerState*>& keep, int desired) {
  std::vector<const WorkerState*> by_preference = keep;
  std::stable_sort(by_preference.begin(), by_preference.end(),
                   [](const WorkerState* a, const WorkerState* b) {
                     return a->on_schedulable_node > b->on_schedulable_node;
                   });
  by_preference.resize(static_cast<size_t>(desired));
  std::vector<const WorkerState*> staying;
  for (const WorkerState* w : keep) {
    if (std::find(by_preference.begin(), by_preference.end(), w) != by_preference.end()) {
      staying.push_back(w);
    }
  }
  return staying;
}

// The plan's members and their virtual nodes; after a lost member (`keep`), the survivors keep
// the nodes they held in `in`.
std::vector<PlannedMember> Assign(const std::vector<const WorkerState*>& chosen,
                                  const MembershipInput& in, bool keep) {
  std::vector<double> speed;
  bool measured = true;
  for (const WorkerState* w : chosen) {
    measured = measured && w->seconds_per_virtual_node > 0;
    speed.push_back(w->seconds_per_virtual_node);
  }
  if (!measured) speed = EqualTimes(static_cast<int>(chosen.size()));
  const std::vector<int> counts = SplitVirtualNodes(in.virtual_nodes, speed);
  std::vector<std::vector<int>> held;
  if (keep) {
    for (const WorkerState* w : chosen) {
      auto it = in.held.find(w->name);
      held.push_back(it == in.held.end() ? std::vector<int>{} : it->second);
    }
  }
  const std::vector<std::vector<int>> nodes =
      keep ? KeepVirtualNodes(counts, held) : ContiguousVirtualNodes(counts);
  std::vector<PlannedMember> members;
  for (size_t i = 0; i < chosen.size(); ++i) members.push_back({chosen[i]->name, nodes[i]});
  return members;
}

// Names the change in a published decision.
void Describe(const MembershipInput& in, const Survivors& s, bool shrinks, size_t to,
              MembershipDecision& out) {
  const std::string from_text = std::to_string(in.members.size());
  const std::string to_text = std::to_string(to);
  if (in.members.empty()) {
    out.kind = "start";
    out.reason = "started with " + to_text + " workers";
  } else if (!s.silent.empty()) {
    out.kind = "failure";
    std::string names;
    for (const std::string& name : s.silent) names += (names.empty() ? "" : ", ") + name;
    out.reason = names + " stopped answering; " + from_text + " -> " + to_text + " workers";
  } else if (s.lost || in.failure_reported) {
    out.kind = "failure";
    out.reason = "a worker failed; " + from_text + " -> " + to_text + " workers";
  } else if (s.leaving) {
    out.kind = "leave";
    out.reason = "a worker is leaving; " + from_text + " -> " + to_text + " workers";
  } else if (shrinks) {
    out.kind = "shrink";
    out.reason = "GPUs taken back; " + from_text + " -> " + to_text + " workers";
  } else {
    out.kind = "grow";
    out.reason = "GPUs available; " + from_text + " -> " + to_text + " workers";
  }
}

}  // namespace

MembershipDecision DecideMembership(const MembershipInput& in) {
  MembershipDecision out;
  const Survivors survivors = SortOutMembers(in);
  const Joiners joiners = FindJoiners(in);

  const int desired = std::max(0, std::min(in.desired, in.virtual_nodes));
  const bool shrinks = static_cast<int>(survivors.keep.size()) > desired;
  std::vector<const WorkerState*> chosen =
      shrinks ? Shrink(survivors.keep, desired) : survivors.keep;
  for (const WorkerState* j : joiners.ready) {
    if (shrinks || static_cast<int>(chosen.size()) >= desired) break;
    chosen.push_back(j);
  }

  const bool first = in.members.empty();
  const bool grows = chosen.size() > survivors.keep.size();
  const bool forced = survivors.lost || survivors.leaving || in.failure_reported || shrinks;
  const bool short_of_desired = static_cast<int>(chosen.size()) < desired;
  if (!forced && !grows) {
    if (joiners.warming && short_of_desired) out.reason = kWaitingForJoiners;
    return out;
  }
  out.held = true;
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
  if (joiners.warming && !forced && short_of_desired) {
    out.reason = kWaitingForJoiners;
    return out;
  }

  out.held = false;
  out.publish = true;
  const bool lost = survivors.lost || in.failure_reported;
  out.members = Assign(chosen, in, lost && !first);
  Describe(in, survivors, shrinks, chosen.size(), out);
  return out;
}

}  // namespace vf::policy
