// The baseline: a job runs on the workers it asked for, or waits; it is never resized.
#include <string>

#include "operator/policy/policy_internal.h"

namespace vf::policy::internal {
namespace {

// Strict FIFO by priority with gang allocation of the requested workers. Immutable; safe to
// share between threads.
class StaticPolicy final : public Policy {
 public:
  explicit StaticPolicy(const PolicyOptions& options) : options_(options) {}

  const std::string& name() const override {
    static const std::string kName = "static";
    return kName;
  }

  Result<Decision> Decide(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                          double now) const override {
    VF_RETURN_IF_ERROR(ValidateInput(jobs, inventory, now));
    Decision d;
    d.jobs.resize(jobs.size());
    std::vector<bool> valid(jobs.size(), false);
    for (size_t i = 0; i < jobs.size(); ++i) {
      d.jobs[i].id = jobs[i].id;
      const std::string why = InvalidReason(jobs[i]);
      if (why.empty()) {
        valid[i] = true;
      } else {
        d.jobs[i].reason = "invalid: " + why;
      }
    }
    const std::vector<size_t> order = ServiceOrder(jobs);
    GpuPool pool(inventory);
    // Running jobs keep exactly what they hold.
    for (size_t i : order) {
      const PolicyJob& j = jobs[i];
      if (!valid[i] || TotalWorkers(j.current) == 0) continue;
      if (pool.TakeExact(j.current, j.gpus_per_worker)) {
        d.jobs[i].workers = j.current;
      } else {
        d.jobs[i].reason = "stopped: the GPUs it held (" + Describe(j.current) + ") are gone";
      }
    }
    // And the workers they asked for that are not placed yet, up to the request, on what is
    // still free.
    for (size_t i : order) {
      const PolicyJob& j = jobs[i];
      if (d.jobs[i].workers.empty()) continue;
      const int want = j.requested_workers > 0 ? j.requested_workers : j.max_workers;
      KeepUnbound(j, want, TypesFastestFirst(j, inventory, options_), options_.allow_mixed_types,
                  pool, d.jobs[i].workers);
    }
    // Waiting jobs start with all their requested workers, in service order.
    std::string blocker;
    for (size_t i : order) {
      const PolicyJob& j = jobs[i];
      if (!valid[i] || TotalWorkers(j.current) != 0) continue;
      if (!blocker.empty() && !options_.backfill) {
        d.jobs[i].reason = "waiting: behind higher-priority job " + blocker;
        continue;
      }
      const int want = j.requested_workers > 0 ? j.requested_workers : j.max_workers;
      const std::vector<std::string> types = TypesFastestFirst(j, inventory, options_);
      int free = 0;
      for (const std::string& t : types) free += pool.Free(t);
      auto a = pool.Take(want, j.gpus_per_worker, {}, types, options_.allow_mixed_types);
      if (!a) {
        d.jobs[i].reason = "waiting: needs " + std::to_string(want * j.gpus_per_worker) + " " +
                           j.unit + " (requested), " + std::to_string(free) + " free";
        if (blocker.empty()) blocker = j.id;
        continue;
      }
      d.jobs[i].workers = *a;
      d.jobs[i].reason = "started: " + Describe(*a) + " (requested)";
    }
    MarkChanged(jobs, d);
    return d;
  }

 private:
  const PolicyOptions options_;
};

}  // namespace

std::unique_ptr<Policy> NewStaticPolicy(const PolicyOptions& options) {
  return std::make_unique<StaticPolicy>(options);
}

}  // namespace vf::policy::internal
