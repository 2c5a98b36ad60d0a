// Names of the Kubernetes resources the operator uses, and the REST paths they live at.
#pragma once

#include <string>
#include <string_view>

namespace vf::kube {

// One kind of object in the API: which group/version serves it, its plural name in URLs, its
// Kind in objects, and whether it lives in namespaces. The fields are views so that the
// constants below are constexpr; a Resource built at run time must keep its strings alive for
// as long as it is used. Value type; thread-compatible.
struct Resource {
  std::string_view group;     // "" for the core group ("v1" objects)
  std::string_view version;   // "v1", "v1alpha1"
  std::string_view resource;  // plural, lower case: "pods", "leases"
  std::string_view kind;      // "Pod", "Lease"
  bool namespaced = true;

  // "v1" for the core group, "group/version" otherwise: what objects carry as apiVersion.
  std::string ApiVersion() const;
  // "pods" for the core group, "leases.coordination.k8s.io" otherwise (as kubectl names them).
  std::string Name() const;

  friend bool operator==(const Resource&, const Resource&) = default;
};

inline constexpr Resource kPods{"", "v1", "pods", "Pod", true};
inline constexpr Resource kNodes{"", "v1", "nodes", "Node", false};
inline constexpr Resource kNamespaces{"", "v1", "namespaces", "Namespace", false};
inline constexpr Resource kSecrets{"", "v1", "secrets", "Secret", true};
inline constexpr Resource kConfigMaps{"", "v1", "configmaps", "ConfigMap", true};
inline constexpr Resource kServiceAccounts{"", "v1", "serviceaccounts", "ServiceAccount", true};
inline constexpr Resource kEvents{"", "v1", "events", "Event", true};
// Each job's NetworkPolicy (operator/controller/worker_pod.h).
inline constexpr Resource kNetworkPolicies{"networking.k8s.io", "v1", "networkpolicies",
                                           "NetworkPolicy", true};
inline constexpr Resource kLeases{"coordination.k8s.io", "v1", "leases", "Lease", true};
inline constexpr Resource kVirtualFlowJobs{"virtualflow.io", "v1alpha1", "virtualflowjobs",
                                           "VirtualFlowJob", true};
// Kueue's admission unit (operator/controller/kueue.h); served only where Kueue is installed.
inline constexpr Resource kWorkloads{"kueue.x-k8s.io", "v1beta2", "workloads", "Workload", true};
// The priority classes a job's Workloads take their priority from (kueue_contract.h).
inline constexpr Resource kWorkloadPriorityClasses{
    "kueue.x-k8s.io", "v1beta2", "workloadpriorityclasses", "WorkloadPriorityClass", false};
// The flavors a Kueue admission names, whose node labels and tolerations its pods get.
inline constexpr Resource kResourceFlavors{"kueue.x-k8s.io", "v1beta2", "resourceflavors",
                                           "ResourceFlavor", false};
inline constexpr Resource kPriorityClasses{"scheduling.k8s.io", "v1", "priorityclasses",
                                           "PriorityClass", false};

// The path of a collection or of one object, relative to the server's URL:
//   /api/v1/namespaces/{ns}/pods[/{name}[/{subresource}]]
//   /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/...
// `ns` is ignored for cluster-scoped resources; an empty `ns` for a namespaced resource is the
// collection across all namespaces (for list and watch). Names are percent-encoded.
std::string ResourcePath(const Resource& resource, std::string_view ns, std::string_view name = "",
                         std::string_view subresource = "");

// "pods team/worker-0", "nodes gpu-1", "pods in team", "pods in all namespaces": how errors name
// what a call was about.
std::string Describe(const Resource& resource, std::string_view ns, std::string_view name = "");

// Percent-encodes a path segment or query value (everything but unreserved characters).
std::string UrlEncode(std::string_view text);

}  // namespace vf::kube
