// Kueue admission for VirtualFlowJobs, through Kueue's Workload API (the way Kueue documents for
// a job kind it has no integration for): a job labelled kueue.x-k8s.io/queue-name gets a
// Workload that it owns, describing its workers; Kueue reserves quota for it in the LocalQueue's
// ClusterQueue and marks it admitted, with how many workers it may have; the operator runs the
// job within that count and marks the Workload finished when the job ends, which releases the
// quota. Pure functions of JSON objects.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/job/spec.h"

namespace vf::controller {

// The label that puts a job into a Kueue LocalQueue (the same one Kueue reads on batch/v1 Jobs).
inline constexpr char kQueueNameLabel[] = "kueue.x-k8s.io/queue-name";
inline constexpr char kWorkloadApiVersion[] = "kueue.x-k8s.io/v1beta2";
// The reason of the Admitted condition while Kueue has said nothing about the Workload yet (a
// Workload just created, or Kueue not running).
inline constexpr char kNotSeenByKueue[] = "WaitingForKueue";
// The one pod set of a job's Workload: its workers, all alike.
inline constexpr char kWorkersPodSet[] = "workers";

// The LocalQueue `job` asks for; "" when it asks for none (then Kueue plays no part).
std::string QueueNameOf(const nlohmann::json& job);

// The name of the Workload of this incarnation of `job`: the job's name and the start of its
// uid, so that a job deleted and created again never finds its predecessor's Workload.
std::string WorkloadName(const nlohmann::json& job);

// The Workload for `job` (parsed spec `spec`), owned by it: one pod set of replicas.max workers
// (minCount replicas.min when the job may run on fewer, Kueue's partial admission), whose
// template is `worker_pod`'s labels and spec (requests included: nvidia.com/gpu, CPU, memory),
// in the LocalQueue of the job's label.
nlohmann::json BuildWorkload(const nlohmann::json& job, const JobSpec& spec,
                             const nlohmann::json& worker_pod);

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

// The most workers `job` may have: replicas.max without a queue label; with one, what Kueue
// admitted, or 0 while the Workload (`workload`, null when it does not exist) is not admitted.
int KueueWorkerLimit(const nlohmann::json& job, const nlohmann::json& workload,
                     const JobSpec& spec);

// `workload` with the condition Finished=True (reason Succeeded or Failed, `message`) added,
// Kueue's conditions kept: the object to write back through the status subresource. Kueue then
// releases its quota.
nlohmann::json FinishedWorkload(nlohmann::json workload, bool succeeded, const std::string& message,
                                const std::string& now);

}  // namespace vf::controller
