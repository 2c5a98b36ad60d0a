// Per-job autoscaling by measured marginal throughput.
#include <algorithm>
#include <cstdio>
#include <string>

#include "operator/policy/policy_internal.h"

namespace vf::policy::internal {
namespace {

std::string Percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100.0 * fraction);
  return buf;
}

// The newest measurement of exactly `workers`, or a negative value.
double Measured(const PolicyJob& job, const Allocation& workers) {
  for (auto it = job.throughput.rbegin(); it != job.throughput.rend(); ++it) {
    if (it->workers == workers && it->samples_per_second > 0.0) return it->samples_per_second;
  }
  return -1.0;
}

// What the n-th worker adds, as a fraction of what an average one of the other n - 1 does:
// (T(n) - T(n-1)) / (T(n-1) / (n-1)). Negative when either side is unmeasured.
double MarginalEfficiency(double t_n, double t_smaller, int n) {
  if (t_n <= 0.0 || t_smaller <= 0.0 || n < 2) return -1.0;
  return (t_n - t_smaller) / (t_smaller / (n - 1));
}

// Jobs start at their request (or minimum) and then move one worker at a time: a worker is
// added while the last addition added at least `scaling_efficiency_threshold` of an average
// worker's throughput (an unmeasured next size is probed), and the newest worker is given back
// when it added less. One step per job per cooldown. Growth only uses GPUs nobody holds; a
// starting job still takes its minimum back from running jobs' extra workers. Immutable; safe
// to share between threads.
class AutoscalePolicy final : public Policy {
 public:
  explicit AutoscalePolicy(const PolicyOptions& options) : options_(options) {}

  const std::string& name() const override {
    static const std::string kName = "autoscale";
    return kName;
  }

  Result<Decision> Decide(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                          double now) const override {
    VF_RETURN_IF_ERROR(ValidateInput(jobs, inventory, now));
    MinimumPass m = ReserveMinimums(jobs, inventory, options_);
    std::vector<Allocation> target = m.base;
    std::vector<std::string> why(jobs.size());
    KeepOrGiveBackOne(jobs, now, m, target, why);
    StartAtRequest(jobs, m, target);
    GrowByOne(jobs, now, m, target, why);
    return Explain(jobs, m, target, why);
  }

 private:
  // 1. Running jobs keep their extra workers, minus the newest one if it does not pay; then
  // their workers not placed yet stay too, on what is still free, unless the job shrinks.
  void KeepOrGiveBackOne(const std::vector<PolicyJob>& jobs, double now, MinimumPass& m,
                         std::vector<Allocation>& target, std::vector<std::string>& why) const {
    const double threshold = options_.scaling_efficiency_threshold;
    GpuPool& pool = m.pool;
    for (size_t i : m.order) {
      if (!m.running[i]) continue;
      const PolicyJob& j = jobs[i];
      const int held = TotalWorkers(j.current);
      int keep = std::min(held, j.max_workers);  // max may have dropped since it grew
      if (held > j.min_workers && CooldownLeft(j, options_, now) <= 0.0) {
        // The slowest of its types is the one to give back.
        std::string drop = j.current.begin()->first;
        for (auto it = m.types[i].rbegin(); it != m.types[i].rend(); ++it) {
          if (j.current.count(*it)) {
            drop = *it;
            break;
          }
        }
        Allocation smaller = j.current;
        if (--smaller[drop] == 0) smaller.erase(drop);
        const double e = MarginalEfficiency(Measured(j, j.current), Measured(j, smaller), held);
        if (e >= 0.0 && e < threshold) {
          keep = held - 1;
          why[i] = "shrank: " + std::to_string(held) + " -> " + std::to_string(keep) +
                   " workers (worker " + std::to_string(held) + " added " + Percent(e) +
                   " of an average worker, below " + Percent(threshold) + ")";
        }
      }
      int extra = keep - TotalWorkers(target[i]);
      const Allocation extras = Minus(j.current, target[i]);
      for (const std::string& type : m.types[i]) {  // fastest first: the slowest goes
        auto have = extras.find(type);
        if (have == extras.end()) continue;
        const int k = std::min({have->second, extra, pool.Free(type) / j.gpus_per_worker});
        if (k > 0 && pool.TakeExact({{type, k}}, j.gpus_per_worker)) {
          target[i][type] += k;
          extra -= k;
        }
      }
    }
    for (size_t i : m.order) {
      if (m.running[i] && why[i].empty()) {
        KeepUnbound(jobs[i], jobs[i].max_workers, m.types[i], options_.allow_mixed_types, pool,
                    target[i]);
      }
    }
  }

  // 2. Starting jobs get up to their request.
  void StartAtRequest(const std::vector<PolicyJob>& jobs, MinimumPass& m,
                      std::vector<Allocation>& target) const {
    for (size_t i : m.order) {
      if (!m.started[i]) continue;
      const PolicyJob& j = jobs[i];
      const int want = j.requested_workers > 0 ? j.requested_workers : j.min_workers;
      while (
          TotalWorkers(target[i]) < want &&
          m.pool.AddOne(target[i], j.gpus_per_worker, {}, m.types[i], options_.allow_mixed_types)) {
      }
    }
  }

  // 3. Running jobs whose newest worker paid off (or is unmeasured) try one more.
  void GrowByOne(const std::vector<PolicyJob>& jobs, double now, MinimumPass& m,
                 std::vector<Allocation>& target, std::vector<std::string>& why) const {
    const double threshold = options_.scaling_efficiency_threshold;
    for (size_t i : m.order) {
      if (!m.running[i] || !why[i].empty()) continue;
      const PolicyJob& j = jobs[i];
      const int held = TotalWorkers(j.current);
      if (target[i] != j.current || held >= j.max_workers) continue;
      if (CooldownLeft(j, options_, now) > 0.0) continue;
      GpuPool probe = m.pool;
      Allocation next = target[i];
      if (!probe.AddOne(next, j.gpus_per_worker, {}, m.types[i], options_.allow_mixed_types)) {
        continue;
      }
      const double e = MarginalEfficiency(Measured(j, next), Measured(j, j.current), held + 1);
      if (e >= 0.0) {
        if (e < threshold) continue;  // measured before: not worth it
        why[i] = "grew: " + std::to_string(held) + " -> " + std::to_string(held + 1) +
                 " workers (worker " + std::to_string(held + 1) + " adds " + Percent(e) +
                 " of an average worker)";
      } else {
        if (!ResizePaysOff(j, j.current, next)) continue;
        why[i] = "grew: " + std::to_string(held) + " -> " + std::to_string(held + 1) +
                 " workers (probing an unmeasured size)";
      }
      m.pool = probe;
      target[i] = next;
    }
  }

  static Decision Explain(const std::vector<PolicyJob>& jobs, const MinimumPass& m,
                          const std::vector<Allocation>& target,
                          const std::vector<std::string>& why) {
    Decision d;
    d.jobs.resize(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      JobDecision& out = d.jobs[i];
      out.id = jobs[i].id;
      if (!m.admitted(i)) {
        out.reason = m.reason[i];
        continue;
      }
      out.workers = target[i];
      const int before = TotalWorkers(jobs[i].current);
      const int after = TotalWorkers(target[i]);
      if (m.started[i]) {
        out.reason = "started: " + Describe(target[i]);
      } else if (after < before && why[i].empty()) {
        out.reason = "shrank: " + std::to_string(before) + " -> " + std::to_string(after) +
                     " workers (GPUs returned to a starting job)";
      } else {
        out.reason = why[i];
      }
    }
    MarkChanged(jobs, d);
    return d;
  }

  const PolicyOptions options_;
};

}  // namespace

std::unique_ptr<Policy> NewAutoscalePolicy(const PolicyOptions& options) {
  return std::make_unique<AutoscalePolicy>(options);
}

}  // namespace vf::policy::internal
