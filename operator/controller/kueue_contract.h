// What Kueue expects of an integration beyond creating a Workload, as its own job framework
// (sigs.k8s.io/kueue pkg/controller/jobframework) keeps it: the Workload's PodsReady condition,
// the quota reservation cleared and Requeued set once an evicted job has stopped, the
// Workload's priority from a WorkloadPriorityClass or PriorityClass, and the admitted
// ResourceFlavors' node labels and tolerations with the admission checks' podSetUpdates on the
// pods. Pure functions of JSON objects as the API server returns them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace vf::controller {

// The label that names a job's WorkloadPriorityClass (the one Kueue reads on batch/v1 Jobs).
inline constexpr char kPriorityClassLabel[] = "kueue.x-k8s.io/priority-class";

// Kueue's Workload condition types and the reasons this file reads or writes.
inline constexpr char kWorkloadPodsReady[] = "PodsReady";
inline constexpr char kWorkloadRequeued[] = "Requeued";
inline constexpr char kWorkloadQuotaReserved[] = "QuotaReserved";
inline constexpr char kWorkloadAdmitted[] = "Admitted";
inline constexpr char kWorkloadEvicted[] = "Evicted";
inline constexpr char kReasonWaitForStart[] = "WaitForStart";
inline constexpr char kReasonWaitForRecovery[] = "WaitForRecovery";
inline constexpr char kReasonStarted[] = "Started";
inline constexpr char kReasonRecovered[] = "Recovered";
inline constexpr char kReasonPreempted[] = "Preempted";
inline constexpr char kReasonNodeFailures[] = "NodeFailures";

// A Workload as it is to be written back through its status subresource, and whether that
// differs from the one read (nothing to write when not). Value type.
struct WorkloadUpdate {
  nlohmann::json workload;
  bool changed = false;
};

// The condition `type` of a Workload's status.conditions, or null.
const nlohmann::json* WorkloadCondition(const nlohmann::json& workload, const std::string& type);

// Sets `condition` (type, status, reason, message; observedGeneration optional) in the
// condition list `conditions` as apimachinery's meta.SetStatusCondition does: a new type is
// added with lastTransitionTime `now`; an existing one takes the new reason, message and
// observedGeneration, and `now` as its lastTransitionTime only when its status changes.
// Returns whether anything changed. `conditions` that is not an array becomes one.
bool SetStatusCondition(nlohmann::json& conditions, const nlohmann::json& condition,
                        const std::string& now);

// `workload` with its PodsReady condition as Kueue's generatePodsReadyCondition derives it:
// False/WaitForStart while the Workload is not admitted (or evicted) or its pods never were
// ready; True/Started once `ready` (Recovered after a recovery); False/WaitForRecovery when
// it was ready and no longer is. For a VirtualFlowJob `ready` means that at least the
// Workload's count of workers train in the current plan; `why_not` is the message while not.
WorkloadUpdate WithPodsReady(nlohmann::json workload, bool ready, const std::string& why_not,
                             const std::string& now);

// Whether Kueue evicted `workload` (Evicted=True), and the condition's reason ("" when not).
std::string EvictionReason(const nlohmann::json& workload);

// An evicted Workload whose job has stopped using its quota (its workers left), as the job
// framework leaves it: Requeued (True after a preemption or node failures, False otherwise,
// with the eviction's reason and message), QuotaReserved False with reason Pending,
// status.admission removed and Admitted False. Kueue then counts the quota free and queues the
// Workload again. Unchanged when it is not evicted or holds no reservation any more.
WorkloadUpdate RequeuedAfterEviction(nlohmann::json workload, const std::string& now);

// A reference to the priority class of a Workload (spec.priorityClassRef). Value type.
struct PriorityClassRef {
  std::string group;  // "kueue.x-k8s.io" or "scheduling.k8s.io"
  std::string kind;   // "WorkloadPriorityClass" or "PriorityClass"
  std::string name;
  bool operator==(const PriorityClassRef&) const = default;
};

// The priority class a job's Workload takes, as Kueue chooses it for its own integrations: the
// job's kPriorityClassLabel (a WorkloadPriorityClass) first, else the worker pod's
// spec.priorityClassName (a PriorityClass); nullopt when neither names one.
std::optional<PriorityClassRef> PriorityClassOf(const nlohmann::json& job,
                                                const nlohmann::json& worker_pod);

// The `value` of a WorkloadPriorityClass or PriorityClass object, or why it has none.
Result<int32_t> PriorityValueOf(const nlohmann::json& priority_class);

// Sets spec.priorityClassRef and spec.priority of `workload`.
void SetWorkloadPriority(nlohmann::json& workload, const PriorityClassRef& ref, int32_t value);

// What Kueue's admission of a pod set asks of its pods: the node labels and tolerations of the
// ResourceFlavors it was charged to, and the admission checks' podSetUpdates. Value type.
struct PodSetPlacement {
  std::map<std::string, std::string> labels;
  std::map<std::string, std::string> annotations;
  std::map<std::string, std::string> node_selector;
  nlohmann::json tolerations = nlohmann::json::array();
};

// The ResourceFlavors the pod set `pod_set` of `workload` was admitted to, each once, in the
// order of its resources' names.
std::vector<std::string> AdmittedFlavors(const nlohmann::json& workload,
                                         const std::string& pod_set);

// The placement of pod set `pod_set` of an admitted `workload`: the node labels and
// tolerations of each of AdmittedFlavors (`flavors` maps a name to the ResourceFlavor object),
// merged with the podSetUpdates of its admission checks. A flavor missing from `flavors`, or two
// sources giving one key different values, is an error (Kueue's BadPodSetsUpdate), naming it.
Result<PodSetPlacement> PlacementOf(const nlohmann::json& workload, const std::string& pod_set,
                                    const std::map<std::string, nlohmann::json>& flavors);

// `pod` (a Pod or a pod template: metadata and spec) with `placement` merged in: labels,
// annotations and spec.nodeSelector added, tolerations appended unless already there. A key
// the pod already has with another value is an error naming it, as in Kueue's podset.Merge.
Status ApplyPlacement(const PodSetPlacement& placement, nlohmann::json& pod);

// Whether a node with labels `node_labels` satisfies the placement's node selector: the nodes
// the operator may count for a job admitted to these flavors.
bool NodeMatchesPlacement(const PodSetPlacement& placement, const nlohmann::json& node_labels);

}  // namespace vf::controller
