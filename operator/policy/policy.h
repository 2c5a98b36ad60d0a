// Scheduling policies: how many workers each job gets, and on which GPU types. Pure functions of
// their inputs (no clock, no I/O, no randomness), so the operator, the local launcher and the
// cluster simulator run exactly the same code. Who trains in a job's next plan is
// membership.h's decision; which virtual nodes each worker holds, runtime/split.h's.
//
// Units: times are seconds on one clock chosen by the caller (`now`, `arrival_time` and
// `last_resize_time` must share it); throughput is samples per second; an allocation counts
// workers (a worker uses `gpus_per_worker` GPUs, all of one type).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/job/spec.h"
#include "runtime/status.h"

namespace vf::policy {

// Workers per GPU type, e.g. {"V100": 2, "P100": 8}. Entries are positive; a job with no
// workers has an empty allocation.
using Allocation = std::map<std::string, int>;

// Total workers of an allocation, whatever their types.
int TotalWorkers(const Allocation& allocation);

// One measured throughput: the job ran with `workers` and processed `samples_per_second`.
// Single-type points ({"V100": 4}) are the common case; mixed allocations may be reported too.
struct ThroughputPoint {
  Allocation workers;
  double samples_per_second = 0.0;
};

// What a policy knows about one job. Plain data; thread-compatible.
struct PolicyJob {
  std::string id;                // "namespace/name"; unique within one Decide call
  int priority = 1;              // higher is more important; also the fair-share weight
  double arrival_time = 0.0;     // when the job was submitted
  int64_t submission_order = 0;  // tie-break after arrival_time (then id)
  int min_workers = 1;           // never fewer once running; a job that cannot get these waits
  int max_workers = 1;           // never more; at most virtual_nodes
  int requested_workers = 0;     // what the static policy gives (0: max_workers)
  int virtual_nodes = 1;         // V, fixed for the job's life
  int gpus_per_worker = 1;       // GPUs one worker occupies, all of one type
  // The inventory types this job may use (the GPU products its nodeSelector, affinity and
  // tolerations allow, or the CPU pool of a CPU-only job); empty: every type.
  std::vector<std::string> allowed_types;
  std::string unit = "GPUs";  // what gpus_per_worker counts, in messages ("CPU millicores")
  Allocation current;         // workers it holds now (empty: waiting or not started)
  // Workers it has asked for that the scheduler has not placed on a node yet. A job that keeps
  // what it holds keeps these too, as far as free GPUs go; they are not in `current`, whose
  // types are known.
  int unbound_workers = 0;
  double last_resize_time = -std::numeric_limits<double>::infinity();  // last start or resize
  double resize_pause_seconds = 0.0;        // measured pause of one resize (all workers stall)
  double cooldown_seconds = -1.0;           // < 0: PolicyOptions::cooldown_seconds
  double remaining_samples = -1.0;          // work left (< 0: unknown, treated as long-running)
  std::vector<ThroughputPoint> throughput;  // measurements so far; may be empty
  // The job's own policy (spec.elasticity.policy, a registered name); empty: the one that
  // decides. Every Policy from CreatePolicy sizes each job by its own.
  std::string policy;
};

// The GPUs the policy may hand out to the jobs it is given, per type. Includes what those jobs
// hold now (their GPUs are redistributable); excludes GPUs used by anything else. The local
// launcher passes {"cpu": number of local worker slots}.
struct GpuInventory {
  std::map<std::string, int> gpus;
};

// Knobs shared by the policies. Plain data.
struct PolicyOptions {
  // Minimum seconds between two voluntary resizes of a job that sets none (growing,
  // rebalancing): a job's own default, spec.elasticity.cooldownSeconds. Taking lent GPUs back
  // for a job that is waiting for its minimum ignores it.
  double cooldown_seconds = ElasticitySpec{}.cooldown_seconds;
  // autoscale: keep the newest worker only while it adds at least this fraction of what an
  // average worker contributes ((T(n) - T(n-1)) / (T(n-1) / (n-1))).
  double scaling_efficiency_threshold = 0.1;
  // Let a job that fits start while a higher-priority job ahead of it waits for more GPUs.
  // Off by default: priority order is strict, so large high-priority jobs are not starved.
  bool backfill = false;
  // Let one job's workers span GPU types (virtual nodes are then split by measured speed).
  bool allow_mixed_types = true;
  // Relative speed per GPU type used when a job has no measurement on a type yet (higher is
  // faster). Types missing here rank after listed ones, then by name.
  std::map<std::string, double> gpu_type_speed;
};

// What a policy decided for one job.
struct JobDecision {
  std::string id;
  Allocation workers;    // workers by GPU type from now on (empty: waits)
  bool changed = false;  // differs from the job's current allocation
  // One line for people: why it waits, started, grew, shrank or was held back, e.g.
  // "waiting: needs 2 GPUs (min), 1 free", "grew: idle GPUs lent",
  // "shrank: GPUs returned to job team/b (priority 10)". Empty when nothing happened.
  std::string reason;
};

// A decision for every job of the input, in input order.
struct Decision {
  std::vector<JobDecision> jobs;
  // The job's decision, or nullptr if the id is not there.
  const JobDecision* Find(const std::string& id) const;
};

// A scheduling policy. Implementations are immutable after creation: Decide is const and pure,
// so one object may be shared by threads (thread-compatible, no internal state).
class Policy {
 public:
  virtual ~Policy() = default;
  virtual const std::string& name() const = 0;

  // Decides every job's workers given the inventory at time `now`. Same input, same output.
  // Invariants: a running job (non-empty result) gets between min and max workers; the
  // result's GPUs per type never exceed the inventory; jobs are served in priority order
  // (higher priority, then earlier arrival, then submission order, then id). A job with an
  // inconsistent spec (min > max, max > virtual nodes, ...) waits with an "invalid: ..." reason.
  // kInvalidArgument only for input that is wrong as a whole (duplicate ids, negative counts).
  virtual Result<Decision> Decide(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                                  double now) const = 0;
};

// Every policy is in one registry (operator/policy/registry.cc): its name, a line for --help,
// how its jobs are held beside other policies' jobs, and its factory. Validation of --policy and
// of spec.elasticity.policy, the help text and the CRD's enum (a test compares them) all come
// from it, so a policy is added by its own file and one entry there (or one RegisterPolicy call).

// How a policy's jobs are sized while jobs naming other policies share the inventory (per-job
// policies, operator/policy/per_job_policy.cc); alone, each policy decides for itself.
enum class Sharing {
  kFixed,         // exactly its request, or it waits; never resized once running (static)
  kByWeight,      // within min..max, a share of what is left by priority weight (elastic)
  kByThroughput,  // its own one-step moves first, on what the others' minimums leave (autoscale)
};

// One scheduling policy as the registry holds it. Plain data.
struct PolicyInfo {
  std::string name;         // as --policy and spec.elasticity.policy spell it
  std::string description;  // one line for people, in --help
  Sharing sharing = Sharing::kByWeight;
  std::function<std::unique_ptr<Policy>(const PolicyOptions&)> create;
};

// Adds a policy to the registry, after the built-in ones. kInvalidArgument for a name that is not
// a lower-case word (letters, digits, '-') or a missing factory or description;
// kFailedPrecondition for a name taken. Thread-safe; may run during static initialisation (a policy
// registering itself).
Status RegisterPolicy(PolicyInfo info);
// Every registered policy, in registration order: static, elastic, autoscale, then any added.
std::vector<PolicyInfo> RegisteredPolicies();
std::vector<std::string> KnownPolicyNames();
bool IsKnownPolicy(const std::string& name);
// How the jobs of policy `name` are held beside other policies' (e.g. fixed: they always need
// their request); nothing for an unknown name.
std::optional<Sharing> SharingOf(const std::string& name);
// Ok for a registered name; else kInvalidArgument "<field>: unknown policy 'x' (known: static,
// elastic, ...)", e.g. field "spec.elasticity.policy" or "--policy".
Status CheckPolicyName(const std::string& field, const std::string& name);
// One line per policy, "<indent>static     <description>", for --help texts (no final newline).
std::string PolicyHelp(const std::string& indent);

// The policy `name` (a registered one) for the jobs that name none: a job that names its own
// policy (PolicyJob::policy) is sized by that one, over the same inventory (per_job_policy.cc
// says how); `name` decides all of them when all name the same. Unknown names are
// kInvalidArgument listing the known ones.
Result<std::unique_ptr<Policy>> CreatePolicy(const std::string& name, const PolicyOptions& options);

// Estimated throughput of `job` on `workers` from its measurements: the exact point if
// measured; otherwise per-type per-worker rates from the nearest measured worker count, scaled
// linearly. Returns a negative value when nothing is known about a type it uses.
double EstimateThroughput(const PolicyJob& job, const Allocation& workers);

}  // namespace vf::policy
