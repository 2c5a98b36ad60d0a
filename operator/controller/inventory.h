// The accelerator inventory of a cluster as the operator sees it: allocatable `nvidia.com/gpu` of
// every schedulable node, by product (the `nvidia.com/gpu.product` label), and of every other
// extended resource (nvidia.com/mig-1g.10gb, amd.com/gpu, ...) by its name, minus what pods that
// are not VirtualFlow workers request. Pure functions of Node and Pod objects.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/job/spec.h"

namespace vf::controller {

inline constexpr char kGpuResource[] = "nvidia.com/gpu";  // kNvidiaGpu
inline constexpr char kGpuProductLabel[] = "nvidia.com/gpu.product";
// The product name of a node that advertises GPUs without the label.
inline constexpr char kUnknownProduct[] = "unknown";

// Accelerators of one type (an nvidia.com/gpu product, or another extended resource). Value type.
struct ProductGpus {
  int total = 0;      // allocatable on schedulable, ready nodes
  int allocated = 0;  // requested by running or pending pods bound to those nodes
  int free() const { return total - allocated; }
};

// Value type; thread-compatible.
struct ClusterGpus {
  // By type: the product of nvidia.com/gpu, the resource's name for any other extended resource.
  std::map<std::string, ProductGpus> products;
  // Node name -> product, for the nodes with nvidia.com/gpu.
  std::map<std::string, std::string> node_product;
  // Node name -> extended resource -> type, for every accelerator the node advertises.
  std::map<std::string, std::map<std::string, std::string>> node_types;
  // Accelerators per type that other workloads (not VirtualFlow workers) hold.
  std::map<std::string, int> held_by_others;
  // Accelerators per type that other workloads' pods wait for (PendingDemand): the policy
  // leaves them free, so that elastic jobs above replicas.min give way to them.
  std::map<std::string, int> pending_demand;
  // The same by node and extended resource.
  std::map<std::string, std::map<std::string, int>> node_held_by_others;
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

// An extended resource: a name with a domain outside kubernetes.io (nvidia.com/gpu, amd.com/gpu);
// cpu, memory, ephemeral-storage and hugepages-* have none. Each counts as an accelerator.
bool IsExtendedResource(const std::string& name);

// The worker container of a pod template (core/v1 PodTemplateSpec, spec.template): the one named
// kWorkerContainer, else the first; an empty object when there is none.
const nlohmann::json& TemplateWorkerContainer(const nlohmann::json& pod_template);
// The accelerator a worker of that template asks for: the extended resource its worker container
// names (runtime/job/spec.cc allows one), else nvidia.com/gpu (spec.gpusPerWorker's).
std::string TemplateAccelerator(const nlohmann::json& pod_template);
// The type `resource` counts in on node `node` (see ClusterGpus::products); empty when the node
// has none of it.
std::string TypeOnNode(const ClusterGpus& cluster, const std::string& node,
                       const std::string& resource);

// True when a worker built from `pod_template` (spec.template, a PodTemplateSpec) may be placed
// on `node` as the scheduler decides it: the node is schedulable, has every nodeSelector label,
// satisfies the required node affinity (matchExpressions and matchFields on metadata.name), and
// every NoSchedule or NoExecute taint is tolerated.
bool NodeEligible(const nlohmann::json& node, const nlohmann::json& pod_template);

// Workers of one job that fit on the nodes eligible for its template, counting only what other
// workloads hold: `gpus_per_worker` of the template's accelerator (TemplateAccelerator) of one
// node each, or for a CPU-only job (0) `cpu_millis` millicores each. An upper bound on the job's
// size whatever the policy says.
int EligibleWorkers(const ClusterGpus& cluster, const nlohmann::json& pod_template,
                    int gpus_per_worker, int64_t cpu_millis);
// Types of the template's accelerator with at least one eligible node for the template.
std::vector<std::string> EligibleProducts(const ClusterGpus& cluster,
                                          const nlohmann::json& pod_template);

// True for a node that may receive new pods: not cordoned, and not reported NotReady.
bool NodeSchedulable(const nlohmann::json& node);
// Whole GPUs a quantity string stands for ("2", "2000m"); 0 for anything else.
int ParseGpuQuantity(const nlohmann::json& quantity);
// Millicores a CPU quantity stands for ("500m", "2", "1.5"); -1 for anything else.
int64_t ParseCpuMillis(const nlohmann::json& quantity);
// Accelerators a pod requests: of `resource` (sum over its containers' limits or requests), or
// with none named, of every extended resource.
int PodGpus(const nlohmann::json& pod, const std::string& resource = "");
// True while a pod holds its node's resources: bound, and not Succeeded or Failed.
bool PodHoldsResources(const nlohmann::json& pod);
// True for pods the operator created (they carry the virtualflow.io/job label).
bool IsWorkerPod(const nlohmann::json& pod);
// True for a pod of another workload that waits for the scheduler: not a VirtualFlow worker,
// not bound to a node, Pending, not being deleted, and not held back by a scheduling gate (a
// gated pod, Kueue's among them, waits for its gate, not for GPUs). CountGpus counts what such
// a pod asks for as demand (ClusterGpus::pending_demand) when one node could hold it.
bool WaitsForScheduler(const nlohmann::json& pod);

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
