// Each job under its own policy (PolicyJob::policy), one inventory for all of them.
#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "operator/policy/policy_internal.h"

namespace vf::policy::internal {
namespace {

// A job fixed at `workers`: it keeps them (on the types it holds) and never grows or shrinks.
PolicyJob Fixed(const PolicyJob& job, const Allocation& current, int workers) {
  PolicyJob out = job;
  out.current = current;
  out.min_workers = workers;
  out.max_workers = workers;
  out.requested_workers = workers;
  out.unbound_workers = 0;
  return out;
}

// A static job as the elastic family sees it: exactly its request, or it waits.
PolicyJob AsStatic(const PolicyJob& job) {
  PolicyJob out = job;
  const int want = job.requested_workers > 0 ? job.requested_workers : job.max_workers;
  out.min_workers = want;
  out.max_workers = want;
  out.requested_workers = want;
  return out;
}

// Wraps the policy a caller named (its default for jobs that name none). When every job's
// policy is that one, it decides alone, exactly as before per-job policies existed. Otherwise
// each job is sized by its own policy over one inventory, in two passes:
//   1. autoscale: every other job is held at its minimum (static jobs at their request), in the
//      common service order, and the autoscale jobs take their one-step moves from what is left;
//   2. elastic: the autoscale jobs are held at what pass 1 gave them, static jobs at their
//      request, and the elastic jobs share the rest by weight (idle GPUs lent, as always).
// Elastic jobs' lent workers are the first to go back: pass 1 does not count them as held.
// Static jobs never change size once running. Immutable; safe to share between threads.
class PerJobPolicy final : public Policy {
 public:
  PerJobPolicy(std::string fallback, std::map<std::string, std::unique_ptr<Policy>> policies)
      : fallback_(std::move(fallback)), policies_(std::move(policies)) {}

  const std::string& name() const override { return fallback_; }

  Result<Decision> Decide(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                          double now) const override {
    VF_RETURN_IF_ERROR(ValidateInput(jobs, inventory, now));
    std::vector<std::string> names;
    bool mixed = false;
    for (const PolicyJob& j : jobs) {
      // An unknown name makes the job invalid (InvalidReason), whichever policy decides it.
      names.push_back(policies_.count(j.policy) != 0 ? j.policy : fallback_);
      mixed = mixed || names.back() != names.front();
    }
    if (!mixed) {
      return policies_.at(names.empty() ? fallback_ : names.front())->Decide(jobs, inventory, now);
    }
    VF_ASSIGN_OR_RETURN(const Decision scaled, AutoscalePass(jobs, names, inventory, now));
    return ElasticPass(jobs, names, scaled, inventory, now);
  }

 private:
  Result<Decision> AutoscalePass(const std::vector<PolicyJob>& jobs,
                                 const std::vector<std::string>& names,
                                 const GpuInventory& inventory, double now) const {
    std::vector<PolicyJob> view;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const PolicyJob& j = jobs[i];
      if (names[i] == "autoscale") {
        view.push_back(j);
        continue;
      }
      const PolicyJob held = names[i] == "static" ? AsStatic(j) : j;
      // What it holds up to its minimum counts; the rest is lent.
      Allocation kept;
      int left = held.min_workers;
      for (const auto& [type, n] : j.current) {
        const int k = std::min(n, left);
        if (k > 0) kept[type] = k;
        left -= k;
      }
      view.push_back(Fixed(held, kept, held.min_workers));
    }
    return policies_.at("autoscale")->Decide(view, inventory, now);
  }

  Result<Decision> ElasticPass(const std::vector<PolicyJob>& jobs,
                               const std::vector<std::string>& names, const Decision& scaled,
                               const GpuInventory& inventory, double now) const {
    std::vector<PolicyJob> view;
    std::vector<size_t> index;  // view position -> job
    for (size_t i = 0; i < jobs.size(); ++i) {
      const PolicyJob& j = jobs[i];
      if (names[i] == "autoscale") {
        const Allocation& got = scaled.jobs[i].workers;
        // One that waits still stands in the service order, so that nobody behind it starts.
        view.push_back(got.empty() ? Fixed(j, {}, j.min_workers)
                                   : Fixed(j, got, TotalWorkers(got)));
      } else {
        view.push_back(names[i] == "static" ? AsStatic(j) : j);
      }
      index.push_back(i);
    }
    VF_ASSIGN_OR_RETURN(const Decision shared,
                        policies_.at("elastic")->Decide(view, inventory, now));
    Decision out;
    out.jobs.resize(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) out.jobs[i] = scaled.jobs[i];
    for (size_t k = 0; k < index.size(); ++k) {
      const size_t i = index[k];
      JobDecision& d = out.jobs[i];
      if (names[i] == "autoscale" && shared.jobs[k].workers == scaled.jobs[i].workers) continue;
      d = shared.jobs[k];
    }
    MarkChanged(jobs, out);
    return out;
  }

  const std::string fallback_;
  const std::map<std::string, std::unique_ptr<Policy>> policies_;
};

}  // namespace

std::unique_ptr<Policy> NewPerJobPolicy(const std::string& fallback, const PolicyOptions& options) {
  std::map<std::string, std::unique_ptr<Policy>> policies;
  policies["static"] = NewStaticPolicy(options);
  policies["elastic"] = NewElasticPolicy(options);
  policies["autoscale"] = NewAutoscalePolicy(options);
  return std::make_unique<PerJobPolicy>(fallback, std::move(policies));
}

}  // namespace vf::policy::internal
