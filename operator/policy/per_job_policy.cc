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

// A fixed-size job (Sharing::kFixed) as the other passes see it: exactly its request, or it
// waits; once running, exactly what it holds (with its workers not placed yet), which for the
// static policy is its request.
PolicyJob AsFixed(const PolicyJob& job) {
  PolicyJob out = job;
  const int held = TotalWorkers(job.current);
  const int want =
      held > 0 ? std::max(job.min_workers, std::min(held + job.unbound_workers, job.max_workers))
      : job.requested_workers > 0 ? job.requested_workers
                                  : job.max_workers;
  out.min_workers = want;
  out.max_workers = want;
  out.requested_workers = want;
  return out;
}

// One registered policy inside a PerJobPolicy: its decider and how its jobs are held beside
// other policies' jobs. Immutable.
struct Member {
  std::unique_ptr<Policy> policy;
  Sharing sharing = Sharing::kByWeight;
};

// Wraps the policy a caller named (its default for jobs that name none). When every job's
// policy is that one, it decides alone, exactly as before per-job policies existed. Otherwise
// each job is sized as its policy's Sharing says, over one inventory, in two passes:
//   1. by throughput (autoscale): every other job is held at its minimum (fixed jobs at their
//      request), in the common service order, and these jobs take their one-step moves from
//      what is left, as the autoscale policy decides them;
//   2. by weight (elastic): the jobs of pass 1 are held at what it gave them, fixed jobs at
//      their request, and the rest share what is left by weight (idle GPUs lent), as the
//      elastic policy decides them.
// Lent workers of jobs shared by weight are the first to go back: pass 1 does not count them as
// held. Fixed jobs never change size once running. Immutable; safe to share between threads.
class PerJobPolicy final : public Policy {
 public:
  PerJobPolicy(std::string fallback, std::map<std::string, Member> members,
               const PolicyOptions& options)
      : fallback_(std::move(fallback)),
        members_(std::move(members)),
        by_throughput_(NewAutoscalePolicy(options)),
        by_weight_(NewElasticPolicy(options)) {}

  const std::string& name() const override { return fallback_; }

  Result<Decision> Decide(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                          double now) const override {
    VF_RETURN_IF_ERROR(ValidateInput(jobs, inventory, now));
    std::vector<std::string> names;
    std::vector<Sharing> sharing;
    bool mixed = false;
    for (const PolicyJob& j : jobs) {
      // An unknown name makes the job invalid (InvalidReason), whichever policy decides it.
      names.push_back(members_.count(j.policy) != 0 ? j.policy : fallback_);
      sharing.push_back(members_.at(names.back()).sharing);
      mixed = mixed || names.back() != names.front();
    }
    if (!mixed) {
      return members_.at(names.empty() ? fallback_ : names.front())
          .policy->Decide(jobs, inventory, now);
    }
    VF_ASSIGN_OR_RETURN(const Decision scaled, ThroughputPass(jobs, sharing, inventory, now));
    return WeightPass(jobs, sharing, scaled, inventory, now);
  }

 private:
  Result<Decision> ThroughputPass(const std::vector<PolicyJob>& jobs,
                                  const std::vector<Sharing>& sharing,
                                  const GpuInventory& inventory, double now) const {
    std::vector<PolicyJob> view;
    for (size_t i = 0; i < jobs.size(); ++i) {
      const PolicyJob& j = jobs[i];
      if (sharing[i] == Sharing::kByThroughput) {
        view.push_back(j);
        continue;
      }
      const PolicyJob held = sharing[i] == Sharing::kFixed ? AsFixed(j) : j;
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
    return by_throughput_->Decide(view, inventory, now);
  }

  Result<Decision> WeightPass(const std::vector<PolicyJob>& jobs,
                              const std::vector<Sharing>& sharing, const Decision& scaled,
                              const GpuInventory& inventory, double now) const {
    std::vector<PolicyJob> view;
    std::vector<size_t> index;  // view position -> job
    for (size_t i = 0; i < jobs.size(); ++i) {
      const PolicyJob& j = jobs[i];
      if (sharing[i] == Sharing::kByThroughput) {
        const Allocation& got = scaled.jobs[i].workers;
        // One that waits still stands in the service order, so that nobody behind it starts.
        view.push_back(got.empty() ? Fixed(j, {}, j.min_workers)
                                   : Fixed(j, got, TotalWorkers(got)));
      } else {
        view.push_back(sharing[i] == Sharing::kFixed ? AsFixed(j) : j);
      }
      index.push_back(i);
    }
    VF_ASSIGN_OR_RETURN(const Decision shared, by_weight_->Decide(view, inventory, now));
    Decision out;
    out.jobs.resize(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) out.jobs[i] = scaled.jobs[i];
    for (size_t k = 0; k < index.size(); ++k) {
      const size_t i = index[k];
      JobDecision& d = out.jobs[i];
      if (sharing[i] == Sharing::kByThroughput &&
          shared.jobs[k].workers == scaled.jobs[i].workers) {
        continue;
      }
      d = shared.jobs[k];
    }
    MarkChanged(jobs, out);
    return out;
  }

  const std::string fallback_;
  const std::map<std::string, Member> members_;
  const std::unique_ptr<Policy> by_throughput_;
  const std::unique_ptr<Policy> by_weight_;
};

}  // namespace

std::unique_ptr<Policy> NewPerJobPolicy(const std::string& fallback,
                                        const std::vector<PolicyInfo>& policies,
                                        const PolicyOptions& options) {
  std::map<std::string, Member> members;
  for (const PolicyInfo& p : policies) members[p.name] = Member{p.create(options), p.sharing};
  return std::make_unique<PerJobPolicy>(fallback, std::move(members), options);
}

}  // namespace vf::policy::internal
