// Kueue admission for VirtualFlowJobs, through Kueue's Workload API (the way Kueue documents for
// a job kind it has no integration for): a job labelled kueue.x-k8s.io/queue-name gets a
// Workload that it owns, describing its workers; Kueue reserves quota for it in the LocalQueue's
// ClusterQueue and marks it admitted, with how many workers it may have; the operator runs the
// job within that count and marks the Workload finished when the job ends, which releases the
// quota. Pure functions of JSON objects.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/job/spec.h"

namespace vf::controller {

// The label that puts a job into a Kueue LocalQueue (the same one Kueue reads on batch/v1 Jobs).
inline constexpr char kQueueNameLabel[] = "kueue.x-k8s.io/queue-name";
inline constexpr char kWorkloadApiVersion[] = "kueue.x-k8s.io/v1beta2";
// The reason of the Admitted condition while Kueue has said nothing about the Workload yet (a
// Workload just created, or Kueue not running).
inline constexpr char kNotSeenByKueue[] = "WaitingForKueue";
// The reason of the Admitted condition of a job without a queue label under an operator that
// runs every job through Kueue (ReconcilerOptions::require_queue).
inline constexpr char kNoQueueName[] = "QueueNameMissing";
// The one pod set of a job's Workload: its workers, all alike.
inline constexpr char kWorkersPodSet[] = "workers";

// The LocalQueue `job` asks for; "" when it asks for none (then Kueue plays no part).
std::string QueueNameOf(const nlohmann::json& job);

// The name of the Workload of this incarnation of `job`: the job's name and the start of its
// uid, so that a job deleted and created again never finds its predecessor's Workload.
std::string WorkloadName(const nlohmann::json& job);

// A job's quota is Workloads Kueue can take back one by one (docs/architecture.md, "Sharing a
// GPU quota with Kueue"): a core Workload for the workers the job cannot run without
// (CoreWorkers: replicas.min, or replicas.max under the static policy) and, once the core is
// admitted, a unit Workload of one worker for each worker above it (UnitWorkloads), one
// priority below the core's, so that Kueue preempts units first and a preemption shrinks the
// job rather than stopping it. kWorkloadRoleLabel tells them apart.
inline constexpr char kWorkloadRoleLabel[] = "virtualflow.io/workload-role";
inline constexpr char kCoreRole[] = "core";
inline constexpr char kUnitRole[] = "unit";
int CoreWorkers(const JobSpec& spec);
int UnitWorkloads(const JobSpec& spec);

// The name of unit Workload `index` (1 ... UnitWorkloads) of this incarnation of `job`.
std::string UnitWorkloadName(const nlohmann::json& job, int index);

// The core Workload for `job` (parsed spec `spec`), owned by it: one pod set of CoreWorkers,
// whose template is `worker_pod`'s labels and spec (requests included: nvidia.com/gpu, CPU,
// memory), in the LocalQueue of the job's label.
nlohmann::json BuildWorkload(const nlohmann::json& job, const JobSpec& spec,
                             const nlohmann::json& worker_pod);

// Unit Workload `index` of `job`: as the core, with a pod set of one worker.
nlohmann::json BuildUnitWorkload(const nlohmann::json& job, const JobSpec& spec,
                                 const nlohmann::json& worker_pod, int index);

// What a job's Workload allows. Value type.
struct KueueAdmission {
  bool admitted = false;      // Kueue admitted the Workload and it is not evicted
  bool finished = false;      // the operator marked it finished
  int workers = 0;            // the workers admitted (0 unless admitted)
  std::string cluster_queue;  // where quota was reserved (once admitted)
  // Why it waits, as Kueue says it (QuotaReserved, Evicted or Admitted condition), for the
  // job's condition; empty once admitted.
  std::string reason;
  std::string message;
};

// Reads Kueue's decision from a Workload as the API server returned it.
KueueAdmission AdmissionOf(const nlohmann::json& workload, const JobSpec& spec);

// Kueue's decision on all of a job's Workloads: the core's admission, with `workers` the
// core's plus one for each unit admitted and not evicted (none while the core is not admitted),
// and the units Kueue evicted that still hold their reservation. Value type.
struct JobAdmission {
  KueueAdmission admission;
  int units_admitted = 0;
  // Indexes of units evicted (Kueue's preemption of part of the job) whose quota is still
  // reserved: the operator releases each once a worker fewer holds it (RequeuedAfterEviction).
  std::vector<int> units_evicted;
};

// `core` is the core Workload (null when it does not exist); `units[i - 1]` unit i (null when
// it does not exist).
JobAdmission JobAdmissionOf(const nlohmann::json& core, const std::vector<nlohmann::json>& units,
                            const JobSpec& spec);

// The most workers `job` may have: replicas.max without a queue label; with one, what Kueue
// admitted (JobAdmissionOf), or 0 while the core Workload is not admitted.
int KueueWorkerLimit(const nlohmann::json& job, const nlohmann::json& core,
                     const std::vector<nlohmann::json>& units, const JobSpec& spec);

// `workload` with the condition Finished=True (reason Succeeded or Failed, `message`) added,
// Kueue's conditions kept: the object to write back through the status subresource. Kueue then
// releases its quota.
nlohmann::json FinishedWorkload(nlohmann::json workload, bool succeeded, const std::string& message,
                                const std::string& now);

}  // namespace vf::controller
