// The GPU inventory of a cluster as the operator sees it: allocatable `nvidia.com/gpu` of every
// schedulable node, by product (the `nvidia.com/gpu.product` label), minus what pods that are not
// VirtualFlow workers request. Pure functions of Node and Pod objects.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vf::controller {

inline constexpr char kGpuResource[] = "nvidia.com/gpu";
inline constexpr char kGpuProductLabel[] = "nvidia.com/gpu.product";
// The product name of a node that advertises GPUs without the label.
inline constexpr char kUnknownProduct[] = "unknown";

// GPUs of one product. Value type.
struct ProductGpus {
  int total = 0;      // allocatable on schedulable, ready nodes
  int allocated = 0;  // requested by running or pending pods bound to those nodes
  int free() const { return total - allocated; }
};

// Value type; thread-compatible.
struct ClusterGpus {
  std::map<std::string, ProductGpus> products;
  // Node name -> product, for the nodes counted above.
  std::map<std::string, std::string> node_product;
  // GPUs per product that other workloads (not VirtualFlow workers) hold.
  std::map<std::string, int> held_by_others;
  std::map<std::string, int> node_gpus_held_by_others;  // the same, by node
  // Every schedulable node (GPUs or not), by name: CPU-only jobs run on any of them.
  std::map<std::string, std::shared_ptr<const nlohmann::json>> nodes;
  // Millicores per node: allocatable, and requested by pods that are not VirtualFlow workers.
  std::map<std::string, int64_t> cpu_allocatable;
  std::map<std::string, int64_t> cpu_held_by_others;
};

// The member `key` of `j` when it is an object (ObjectAt) or an array (ArrayAt), else an empty
// one. A reference, never a copy: json::value(key, json::object()) copies the whole member,
// which over every node and pod of a large cluster costs more than the reconcile it serves.
const nlohmann::json& ObjectAt(const nlohmann::json& j, const char* key);
const nlohmann::json& ArrayAt(const nlohmann::json& j, const char* key);

// The pool type CPU-only workers are counted in, in millicores (never a GPU product).
inline constexpr char kCpuPool[] = "cpu";

// True when a worker built from `pod_template` (spec.template) may be placed on `node` as the
// scheduler decides it: the node is schedulable, has every nodeSelector label, satisfies the
// required node affinity (matchExpressions and matchFields on metadata.name), and every
// NoSchedule or NoExecute taint is tolerated.
bool NodeEligible(const nlohmann::json& node, const nlohmann::json& pod_template);

// Workers of one job that fit on the nodes eligible for its template, counting only what other
// workloads hold: `gpus_per_worker` GPUs of one node each, or for a CPU-only job (0)
// `cpu_millis` millicores each. An upper bound on the job's size whatever the policy says.
int EligibleWorkers(const ClusterGpus& cluster, const nlohmann::json& pod_template,
                    int gpus_per_worker, int64_t cpu_millis);
// GPU products with at least one eligible node for the template.
std::vector<std::string> EligibleProducts(const ClusterGpus& cluster,
                                          const nlohmann::json& pod_template);

// True for a node that may receive new pods: not cordoned, and not reported NotReady.
bool NodeSchedulable(const nlohmann::json& node);
// Whole GPUs a quantity string stands for ("2", "2000m"); 0 for anything else.
int ParseGpuQuantity(const nlohmann::json& quantity);
// Millicores a CPU quantity stands for ("500m", "2", "1.5"); -1 for anything else.
int64_t ParseCpuMillis(const nlohmann::json& quantity);
// GPUs a pod requests (sum over its containers' limits or requests).
int PodGpus(const nlohmann::json& pod);
// True while a pod holds its node's resources: bound, and not Succeeded or Failed.
bool PodHoldsResources(const nlohmann::json& pod);
// True for pods the operator created (they carry the virtualflow.io/job label).
bool IsWorkerPod(const nlohmann::json& pod);

ClusterGpus CountGpus(const std::vector<nlohmann::json>& nodes,
                      const std::vector<nlohmann::json>& pods);
// What of a node the inventory and NodeEligible read (name, labels, taints, cordon, allocatable,
// readiness), without what changes on every heartbeat: two versions of a node with equal facts
// place workers alike, so a change that keeps them says nothing to any job.
nlohmann::json NodeSchedulingFacts(const nlohmann::json& node);
// The same over objects shared with an informer's cache (Informer::Snapshot), without copies.
ClusterGpus CountGpus(const std::vector<std::shared_ptr<const nlohmann::json>>& nodes,
                      const std::vector<std::shared_ptr<const nlohmann::json>>& pods);

}  // namespace vf::controller
