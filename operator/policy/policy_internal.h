// Building blocks shared by the policies: service order, input checks, GPU-type ranking and the
// pool of GPUs a decision hands out. Not part of the public API.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "operator/policy/policy.h"

namespace vf::policy::internal {

// Indices of `jobs` in the order they are served: higher priority, earlier arrival, lower
// submission order, then id.
std::vector<size_t> ServiceOrder(const std::vector<PolicyJob>& jobs);

// Why a job's spec cannot be scheduled ("min_workers 3 > max_workers 2"), or "" if it can.
std::string InvalidReason(const PolicyJob& job);

// kInvalidArgument for input that is wrong as a whole: duplicate or empty ids, negative
// inventory counts, non-finite times.
Status ValidateInput(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory, double now);

// Fair-share weight of a job: its priority, at least 1.
double Weight(const PolicyJob& job);

// GPU types of the inventory, fastest first for this job: by the job's measured per-worker
// rate when it has one on every type, else by the speed hints, then by name.
std::vector<std::string> TypesFastestFirst(const PolicyJob& job, const GpuInventory& inventory,
                                           const PolicyOptions& options);

// The GPUs still free during one decision, per type. Value type; not thread-safe.
class GpuPool {
 public:
  explicit GpuPool(const GpuInventory& inventory);

  int Free(const std::string& type) const;
  int TotalFree() const;
  // Whole workers of `gpus_per_worker` GPUs that fit, over all types.
  int WorkersThatFit(int gpus_per_worker) const;

  // Takes `workers` workers from the pool: first on the types of `prefer` (up to its counts,
  // so a job keeps the GPUs it holds), then on `type_order`. With `allow_mixed` false all
  // workers are of one type (the preferred one if it has room). Returns nothing, and takes
  // nothing, when they do not fit.
  std::optional<Allocation> Take(int workers, int gpus_per_worker, const Allocation& prefer,
                                 const std::vector<std::string>& type_order, bool allow_mixed);
  // Adds workers to `into` one at a time via Take(1, ...), each one preferring the types of
  // `prefer` that `into` has fewer of. Returns false when none fits.
  bool AddOne(Allocation& into, int gpus_per_worker, const Allocation& prefer,
              const std::vector<std::string>& type_order, bool allow_mixed);
  // Takes exactly `allocation`; false (taking nothing) if it does not fit.
  bool TakeExact(const Allocation& allocation, int gpus_per_worker);

 private:
  std::map<std::string, int> free_;
};

// `a` minus `b` per type, dropping non-positive entries.
Allocation Minus(const Allocation& a, const Allocation& b);

// "2 x V100 + 8 x P100" style, or "no workers".
std::string Describe(const Allocation& allocation);

// Fills `changed` of every decision by comparing with the jobs' current allocations.
void MarkChanged(const std::vector<PolicyJob>& jobs, Decision& decision);

// Whether a resize from `from` to `to` pays for its pause: the job finishes sooner with the
// pause and the new throughput than without either. Unknown throughput on `to` is assumed to
// scale linearly from `from`; unknown remaining work counts as long-running.
bool ResizePaysOff(const PolicyJob& job, const Allocation& from, const Allocation& to);

// The first pass of the elastic policies: every running job keeps its minimum (on the GPUs it
// holds where possible), then waiting jobs start at their minimum in service order (strictly,
// unless backfill is on). Jobs that fit nowhere get a one-line reason.
struct MinimumPass {
  explicit MinimumPass(const GpuInventory& inventory) : pool(inventory) {}
  GpuPool pool;                                 // what is left after the minimums
  std::vector<size_t> order;                    // service order
  std::vector<std::vector<std::string>> types;  // per job, fastest first
  std::vector<Allocation> base;                 // per job, its minimum workers
  std::vector<bool> running;                    // held workers and keeps running
  std::vector<bool> started;                    // starts in this decision
  std::vector<std::string> reason;              // why it waits, stopped, or is invalid
  bool admitted(size_t i) const { return running[i] || started[i]; }
};
MinimumPass ReserveMinimums(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                            const PolicyOptions& options);

// A job that keeps what it holds also keeps the workers it asked for that are not placed yet
// (`unbound_workers`): the scheduler will put them on GPUs free now. Adds them to `target`, up
// to `cap` workers in all and as far as `pool` has room, on the types of `type_order`.
void KeepUnbound(const PolicyJob& job, int cap, const std::vector<std::string>& type_order,
                 bool allow_mixed, GpuPool& pool, Allocation& target);

// Seconds left of the job's cooldown at `now` (0 when it may resize).
double CooldownLeft(const PolicyJob& job, const PolicyOptions& options, double now);

// The built-in policies (registry.cc lists them).
std::unique_ptr<Policy> NewStaticPolicy(const PolicyOptions& options);
std::unique_ptr<Policy> NewElasticPolicy(const PolicyOptions& options);
std::unique_ptr<Policy> NewAutoscalePolicy(const PolicyOptions& options);
// Each job by its own policy among `policies` (the registry's); `fallback` for jobs that name
// none.
std::unique_ptr<Policy> NewPerJobPolicy(const std::string& fallback,
                                        const std::vector<PolicyInfo>& policies,
                                        const PolicyOptions& options);

}  // namespace vf::policy::internal
