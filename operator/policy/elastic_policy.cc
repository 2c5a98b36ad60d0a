// The default policy: weighted fair share by priority within each job's min..max.
#include <algorithm>
#include <cstdio>
#include <string>

#include "operator/policy/policy_internal.h"

namespace vf::policy::internal {
namespace {

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f s", s);
  return buf;
}

// Every admitted job first gets its minimum; the rest of the GPUs go one worker at a time to
// the job with the fewest GPUs per unit of weight (water-filling), so idle GPUs are always
// lent out and flow back as soon as a new job needs its minimum. Resizes are held back by the
// cooldown and whenever the measured pause would cost more work than the resize gains.
// Immutable; safe to share between threads.
class ElasticPolicy final : public Policy {
 public:
  explicit ElasticPolicy(const PolicyOptions& options) : options_(options) {}

  const std::string& name() const override {
    static const std::string kName = "elastic";
    return kName;
  }

  Result<Decision> Decide(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                          double now) const override {
    VF_RETURN_IF_ERROR(ValidateInput(jobs, inventory, now));
    const MinimumPass m = ReserveMinimums(jobs, inventory, options_);
    std::vector<std::string> hold(jobs.size());
    const std::vector<Allocation> target = Allocate(jobs, m, now, hold);
    return Explain(jobs, m, target, hold);
  }

 private:
  // The workers of every job: fair shares, except that jobs frozen at (at most) what they hold
  // (in cooldown, or a resize that does not pay) keep that. `hold` says why a job was frozen.
  std::vector<Allocation> Allocate(const std::vector<PolicyJob>& jobs, const MinimumPass& m,
                                   double now, std::vector<std::string>& hold) const {
    const size_t n = jobs.size();
    std::vector<bool> pinned(n, false);
    for (size_t i = 0; i < n; ++i) {
      if (m.running[i] && CooldownLeft(jobs[i], options_, now) > 0.0) pinned[i] = true;
    }
    std::vector<Allocation> target;
    // Each round either settles or pins one more job, so n + 1 rounds always suffice.
    for (size_t round = 0; round <= n; ++round) {
      target = Share(jobs, m, pinned);
      // A running job grows or moves only if the resize pays for its pause.
      bool settled = true;
      for (size_t i : m.order) {
        if (!m.running[i] || pinned[i]) continue;
        const Allocation& cur = jobs[i].current;
        if (target[i] == cur || TotalWorkers(target[i]) < TotalWorkers(cur)) continue;
        if (!ResizePaysOff(jobs[i], cur, target[i])) {
          pinned[i] = true;
          hold[i] = "held: a resize would not repay its " + Seconds(jobs[i].resize_pause_seconds) +
                    " pause";
          settled = false;
        }
      }
      if (settled) break;
    }
    return target;
  }

  // One round: pinned jobs keep what they hold, the rest share what is left by weight.
  std::vector<Allocation> Share(const std::vector<PolicyJob>& jobs, const MinimumPass& m,
                                const std::vector<bool>& pinned) const {
    const size_t n = jobs.size();
    const bool mixed = options_.allow_mixed_types;
    GpuPool pool = m.pool;
    std::vector<Allocation> target = m.base;
    // Pinned jobs keep the extra workers they hold, unless a starting job took them.
    for (size_t i : m.order) {
      if (!pinned[i]) continue;
      const int gpw = jobs[i].gpus_per_worker;
      for (const auto& [type, extra] : Minus(jobs[i].current, m.base[i])) {
        const int room = jobs[i].max_workers - TotalWorkers(target[i]);  // max may have dropped
        const int keep = std::min({extra, pool.Free(type) / gpw, room});
        if (keep > 0 && pool.TakeExact({{type, keep}}, gpw)) target[i][type] += keep;
      }
    }
    // Then the workers they asked for that are not placed yet, on what is still free.
    for (size_t i : m.order) {
      if (pinned[i]) KeepUnbound(jobs[i], jobs[i].max_workers, m.types[i], mixed, pool, target[i]);
    }
    // Water-filling: the next worker goes to the job furthest below its weighted share.
    while (true) {
      size_t best = n;
      double best_share = 0.0;
      for (size_t i : m.order) {
        const PolicyJob& j = jobs[i];
        if (!m.admitted(i) || pinned[i] || TotalWorkers(target[i]) >= j.max_workers) continue;
        GpuPool probe = pool;
        Allocation next = target[i];
        if (!probe.AddOne(next, j.gpus_per_worker, j.current, m.types[i], mixed)) continue;
        const double share = TotalWorkers(target[i]) * j.gpus_per_worker / Weight(j);
        if (best == n || share < best_share) {
          best = i;
          best_share = share;
        }
      }
      if (best == n) break;
      pool.AddOne(target[best], jobs[best].gpus_per_worker, jobs[best].current, m.types[best],
                  mixed);
    }
    return target;
  }

  // Each job's decision with its one line for people.
  static Decision Explain(const std::vector<PolicyJob>& jobs, const MinimumPass& m,
                          const std::vector<Allocation>& target,
                          const std::vector<std::string>& hold) {
    const size_t n = jobs.size();
    Decision d;
    d.jobs.resize(n);
    // The job that gained most recently in service order explains why others shrank.
    std::string gainer;
    for (size_t i : m.order) {
      if (m.started[i] ||
          (m.running[i] && TotalWorkers(target[i]) > TotalWorkers(jobs[i].current))) {
        gainer = jobs[i].id + " (priority " + std::to_string(jobs[i].priority) + ")";
        break;
      }
    }
    for (size_t i = 0; i < n; ++i) {
      JobDecision& out = d.jobs[i];
      out.id = jobs[i].id;
      if (!m.admitted(i)) {
        out.reason = m.reason[i];
        continue;
      }
      out.workers = target[i];
      // Workers not placed yet count as held: keeping them is no resize.
      const int before = TotalWorkers(jobs[i].current) + jobs[i].unbound_workers;
      const int after = TotalWorkers(target[i]);
      const std::string counts = std::to_string(before) + " -> " + std::to_string(after);
      // Workers beyond what the job asked for are lent: they go back first.
      const int requested =
          jobs[i].requested_workers > 0 ? jobs[i].requested_workers : jobs[i].max_workers;
      if (m.started[i]) {
        out.reason =
            "started: " + Describe(target[i]) + (after > requested ? " (idle GPUs lent)" : "");
      } else if (after > before) {
        out.reason = "grew: " + counts + " workers (" +
                     (after > requested ? "idle GPUs lent" : "GPUs free again") + ")";
      } else if (after < before) {
        out.reason = "shrank: " + counts + " workers (GPUs returned" +
                     (gainer.empty() ? std::string(")") : " to job " + gainer + ")");
      } else if (target[i] != jobs[i].current && jobs[i].unbound_workers == 0) {
        out.reason = "moved: " + Describe(jobs[i].current) + " -> " + Describe(target[i]);
      } else {
        out.reason = hold[i];
      }
    }
    MarkChanged(jobs, d);
    return d;
  }

  const PolicyOptions options_;
};

}  // namespace

std::unique_ptr<Policy> NewElasticPolicy(const PolicyOptions& options) {
  return std::make_unique<ElasticPolicy>(options);
}

}  // namespace vf::policy::internal
