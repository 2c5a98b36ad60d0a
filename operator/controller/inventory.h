// The GPU inventory of a cluster as the operator sees it: allocatable `nvidia.com/gpu` of every
// schedulable node, by product (the `nvidia.com/gpu.product` label), minus what pods that are not
// VirtualFlow workers request. Pure functions of Node and Pod objects.
#pragma once

#include <map>
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
};

// True for a node that may receive new pods: not cordoned, and not reported NotReady.
bool NodeSchedulable(const nlohmann::json& node);
// Whole GPUs a quantity string stands for ("2", "2000m"); 0 for anything else.
int ParseGpuQuantity(const nlohmann::json& quantity);
// GPUs a pod requests (sum over its containers' limits or requests).
int PodGpus(const nlohmann::json& pod);
// True while a pod holds its node's resources: bound, and not Succeeded or Failed.
bool PodHoldsResources(const nlohmann::json& pod);
// True for pods the operator created (they carry the virtualflow.io/job label).
bool IsWorkerPod(const nlohmann::json& pod);

ClusterGpus CountGpus(const std::vector<nlohmann::json>& nodes,
                      const std::vector<nlohmann::json>& pods);

}  // namespace vf::controller
