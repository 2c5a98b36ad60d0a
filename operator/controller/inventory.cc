#include "operator/controller/inventory.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

namespace vf::controller {

using nlohmann::json;

const json& ObjectAt(const json& j, const char* key) {
  static const json kEmpty = json::object();
  if (!j.is_object()) return kEmpty;
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

const json& ArrayAt(const json& j, const char* key) {
  static const json kEmpty = json::array();
  if (!j.is_object()) return kEmpty;
  auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : kEmpty;
}

bool NodeSchedulable(const json& node) {
  if (ObjectAt(node, "spec").value("unschedulable", false)) return false;
  const json& status = ObjectAt(node, "status");
  for (const json& c : ArrayAt(status, "conditions")) {
    if (c.value("type", "") == "Ready" && c.value("status", "") == "False") return false;
  }
  return true;
}

int ParseGpuQuantity(const json& quantity) {
  if (quantity.is_number_integer()) return static_cast<int>(quantity.get<int64_t>());
  if (!quantity.is_string()) return 0;
  const std::string s = quantity.get<std::string>();
  if (s.empty()) return 0;
  try {
    size_t used = 0;
    if (s.back() == 'm') {
      const long long milli = std::stoll(s.substr(0, s.size() - 1), &used);
      if (used != s.size() - 1 || milli < 0) return 0;
      return static_cast<int>(milli / 1000);
    }
    const long long whole = std::stoll(s, &used);
    if (used != s.size() || whole < 0) return 0;
    return static_cast<int>(whole);
  } catch (const std::exception&) {
    return 0;
  }
}

int64_t ParseCpuMillis(const json& quantity) {
  if (quantity.is_number_integer()) return quantity.get<int64_t>() * 1000;
  if (!quantity.is_string()) return -1;
  const std::string s = quantity.get<std::string>();
  // Hand-parsed: Kubernetes' CPU quantities are a decimal or a millicore count; nothing in
  // the packaged libraries reads them, and doubles would round "0.1" differently.
  std::string digits = s;
  int64_t scale = 1000;
  if (!digits.empty() && digits.back() == 'm') {
    digits.pop_back();
    scale = 1;
  }
  const size_t dot = digits.find('.');
  std::string whole = digits.substr(0, dot);
  std::string frac = dot == std::string::npos ? "" : digits.substr(dot + 1);
  if (whole.empty() && frac.empty()) return -1;
  if (scale == 1 && !frac.empty()) return -1;
  for (char c : whole + frac) {
    if (c < '0' || c > '9') return -1;
  }
  if (whole.size() > 12 || frac.size() > 3) return -1;
  while (frac.size() < 3) frac += '0';
  const int64_t w = whole.empty() ? 0 : std::stoll(whole);
  return scale == 1 ? w : w * 1000 + std::stoll(frac);
}

bool IsExtendedResource(const std::string& name) {
  const size_t slash = name.find('/');
  if (slash == std::string::npos || name.rfind("requests.", 0) == 0) return false;
  const std::string domain = name.substr(0, slash);
  return domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io");
}

namespace {

// What one container asks for of each extended resource (its limit, else its request).
std::map<std::string, int> ContainerAccelerators(const json& container) {
  std::map<std::string, int> out;
  const json& res = ObjectAt(container, "resources");
  for (const char* part : {"requests", "limits"}) {  // limits last: they win
    for (const auto& [name, quantity] : ObjectAt(res, part).items()) {
      if (IsExtendedResource(name)) out[name] = ParseGpuQuantity(quantity);
    }
  }
  return out;
}

}  // namespace

int PodGpus(const json& pod, const std::string& resource) {
  int total = 0;
  for (const json& c : ArrayAt(ObjectAt(pod, "spec"), "containers")) {
    for (const auto& [name, n] : ContainerAccelerators(c)) {
      if (resource.empty() || name == resource) total += n;
    }
  }
  return total;
}

const json& TemplateWorkerContainer(const json& pod_template) {
  static const json kNone = json::object();
  const json& containers = ArrayAt(ObjectAt(pod_template, "spec"), "containers");
  for (const json& c : containers) {
    if (c.is_object() && c.value("name", "") == kWorkerContainer) return c;
  }
  return !containers.empty() && containers[0].is_object() ? containers[0] : kNone;
}

std::string TemplateAccelerator(const json& pod_template) {
  const std::map<std::string, int> named =
      ContainerAccelerators(TemplateWorkerContainer(pod_template));
  for (const auto& [name, n] : named) {
    if (n > 0) return name;
  }
  return kGpuResource;
}

std::string TypeOnNode(const ClusterGpus& cluster, const std::string& node,
                       const std::string& resource) {
  auto types = cluster.node_types.find(node);
  if (types == cluster.node_types.end()) return "";
  auto type = types->second.find(resource);
  return type == types->second.end() ? "" : type->second;
}

bool PodHoldsResources(const json& pod) {
  const std::string phase = ObjectAt(pod, "status").value("phase", "");
  if (phase == "Succeeded" || phase == "Failed") return false;
  return !ObjectAt(pod, "spec").value("nodeName", "").empty();
}

bool IsWorkerPod(const json& pod) {
  return ObjectAt(ObjectAt(pod, "metadata"), "labels").contains("virtualflow.io/job");
}

namespace {

int64_t PodCpuMillis(const json& pod) {
  int64_t total = 0;
  for (const json& c : ArrayAt(ObjectAt(pod, "spec"), "containers")) {
    const json& res = ObjectAt(c, "resources");
    for (const char* part : {"requests", "limits"}) {
      const json& r = ObjectAt(res, part);
      if (r.contains("cpu")) {
        total += std::max<int64_t>(0, ParseCpuMillis(r.at("cpu")));
        break;
      }
    }
  }
  return total;
}

bool Matches(const json& requirement, const std::string& value, bool present) {
  const std::string op = requirement.value("operator", "");
  std::vector<std::string> values;
  for (const json& v : ArrayAt(requirement, "values")) {
    if (v.is_string()) values.push_back(v.get<std::string>());
  }
  const bool in = std::find(values.begin(), values.end(), value) != values.end();
  if (op == "In") return present && in;
  if (op == "NotIn") return !present || !in;
  if (op == "Exists") return present;
  if (op == "DoesNotExist") return !present;
  if ((op == "Gt" || op == "Lt") && present && values.size() == 1) {
    try {
      const long long have = std::stoll(value);
      const long long want = std::stoll(values[0]);
      return op == "Gt" ? have > want : have < want;
    } catch (const std::exception&) {
      return false;
    }
  }
  return false;
}

bool TermMatches(const json& term, const json& node) {
  const json& meta = ObjectAt(node, "metadata");
  const json& labels = ObjectAt(meta, "labels");
  for (const json& req : ArrayAt(term, "matchExpressions")) {
    const std::string key = req.value("key", "");
    const bool present = labels.contains(key) && labels[key].is_string();
    if (!Matches(req, present ? labels[key].get<std::string>() : "", present)) return false;
  }
  for (const json& req : ArrayAt(term, "matchFields")) {
    if (req.value("key", "") != "metadata.name") return false;
    if (!Matches(req, meta.value("name", ""), true)) return false;
  }
  return true;
}

bool Tolerates(const json& tolerations, const json& taint) {
  for (const json& t : tolerations) {
    const std::string effect = t.value("effect", "");
    if (!effect.empty() && effect != taint.value("effect", "")) continue;
    const std::string key = t.value("key", "");
    const std::string op = t.value("operator", "Equal");
    if (key.empty()) {
      if (op == "Exists") return true;
      continue;
    }
    if (key != taint.value("key", "")) continue;
    if (op == "Exists" || t.value("value", "") == taint.value("value", "")) return true;
  }
  return false;
}

}  // namespace

bool NodeEligible(const json& node, const json& pod_template) {
  if (!NodeSchedulable(node)) return false;
  const json& pod_spec = ObjectAt(pod_template, "spec");
  const json& labels = ObjectAt(ObjectAt(node, "metadata"), "labels");
  const json& selector = ObjectAt(pod_spec, "nodeSelector");
  for (const auto& [k, v] : selector.items()) {
    if (!labels.contains(k) || labels[k] != v) return false;
  }
  const json& required = ObjectAt(ObjectAt(ObjectAt(pod_spec, "affinity"), "nodeAffinity"),
                                  "requiredDuringSchedulingIgnoredDuringExecution");
  const json& terms = ArrayAt(required, "nodeSelectorTerms");
  if (!terms.empty()) {
    bool any = false;
    for (const json& term : terms) any = any || TermMatches(term, node);
    if (!any) return false;
  }
  const json& tolerations = ArrayAt(pod_spec, "tolerations");
  for (const json& taint : ArrayAt(ObjectAt(node, "spec"), "taints")) {
    const std::string effect = taint.value("effect", "");
    if (effect != "NoSchedule" && effect != "NoExecute") continue;
    if (!Tolerates(tolerations, taint)) return false;
  }
  return true;
}

int EligibleWorkers(const ClusterGpus& cluster, const json& pod_template, int gpus_per_worker,
                    int64_t cpu_millis) {
  int workers = 0;
  const std::string resource = gpus_per_worker > 0 ? TemplateAccelerator(pod_template) : "";
  for (const auto& [name, shared] : cluster.nodes) {
    const json& node = *shared;
    if (!NodeEligible(node, pod_template)) continue;
    if (gpus_per_worker > 0) {
      const json& alloc = ObjectAt(ObjectAt(node, "status"), "allocatable");
      if (!alloc.contains(resource)) continue;
      int held = 0;
      if (auto on_node = cluster.node_held_by_others.find(name);
          on_node != cluster.node_held_by_others.end()) {
        auto of = on_node->second.find(resource);
        if (of != on_node->second.end()) held = of->second;
      }
      const int gpus = ParseGpuQuantity(alloc.at(resource)) - held;
      workers += std::max(0, gpus) / gpus_per_worker;
    } else if (cpu_millis > 0) {
      auto alloc = cluster.cpu_allocatable.find(name);
      if (alloc == cluster.cpu_allocatable.end()) continue;
      auto held = cluster.cpu_held_by_others.find(name);
      const int64_t free =
          alloc->second - (held == cluster.cpu_held_by_others.end() ? 0 : held->second);
      workers += static_cast<int>(std::max<int64_t>(0, free) / cpu_millis);
    }
  }
  return workers;
}

std::vector<std::string> EligibleProducts(const ClusterGpus& cluster, const json& pod_template) {
  std::set<std::string> products;
  const std::string resource = TemplateAccelerator(pod_template);
  for (const auto& [name, types] : cluster.node_types) {
    auto type = types.find(resource);
    if (type == types.end()) continue;
    auto node = cluster.nodes.find(name);
    if (node != cluster.nodes.end() && NodeEligible(*node->second, pod_template)) {
      products.insert(type->second);
    }
  }
  return {products.begin(), products.end()};
}

bool WaitsForScheduler(const json& pod) {
  const json& spec = ObjectAt(pod, "spec");
  const json& meta = ObjectAt(pod, "metadata");
  const std::string phase = ObjectAt(pod, "status").value("phase", std::string("Pending"));
  return !IsWorkerPod(pod) && spec.value("nodeName", "").empty() && phase == "Pending" &&
         !meta.contains("deletionTimestamp") && ArrayAt(spec, "schedulingGates").empty();
}

namespace {

// What pods of other workloads that wait for the scheduler ask for, by type, into
// `out.pending_demand`: a request for nvidia.com/gpu counts in the product its nodeSelector
// names, else in the product with the most left; a request no single node of that type could
// hold (it waits for ever, whatever VirtualFlow jobs give back) is not counted.
void CountPendingDemand(const std::vector<std::shared_ptr<const json>>& pods,
                        const std::map<std::string, int>& largest_node, ClusterGpus& out) {
  for (const std::shared_ptr<const json>& shared : pods) {
    const json& pod = *shared;
    if (!WaitsForScheduler(pod)) continue;
    std::map<std::string, int> asks;
    for (const json& c : ArrayAt(ObjectAt(pod, "spec"), "containers")) {
      for (const auto& [resource, n] : ContainerAccelerators(c)) asks[resource] += n;
    }
    for (const auto& [resource, n] : asks) {
      std::string type = resource;
      if (resource == kGpuResource) {
        type = ObjectAt(ObjectAt(pod, "spec"), "nodeSelector").value(kGpuProductLabel, "");
        if (type.empty()) {
          std::set<std::string> gpu_products;
          for (const auto& [node, product] : out.node_product) gpu_products.insert(product);
          int most = -1;
          for (const std::string& product : gpu_products) {
            const int left = out.products[product].total - out.held_by_others[product] -
                             out.pending_demand[product];
            if (left > most) {
              most = left;
              type = product;
            }
          }
        }
      }
      auto largest = largest_node.find(type);
      if (type.empty() || largest == largest_node.end() || n > largest->second) continue;
      out.pending_demand[type] += n;
    }
  }
}

}  // namespace

ClusterGpus CountGpus(const std::vector<std::shared_ptr<const json>>& nodes,
                      const std::vector<std::shared_ptr<const json>>& pods) {
  ClusterGpus out;
  std::map<std::string, int> largest_node;  // type -> the most one node has
  for (const std::shared_ptr<const json>& shared : nodes) {
    const json& node = *shared;
    if (!NodeSchedulable(node)) continue;
    const json& alloc = ObjectAt(ObjectAt(node, "status"), "allocatable");
    const std::string node_name = ObjectAt(node, "metadata").value("name", "");
    out.nodes[node_name] = shared;
    if (alloc.contains("cpu")) {
      out.cpu_allocatable[node_name] = std::max<int64_t>(0, ParseCpuMillis(alloc.at("cpu")));
    }
    for (const auto& [resource, quantity] : alloc.items()) {
      if (!IsExtendedResource(resource)) continue;
      const int gpus = ParseGpuQuantity(quantity);
      if (gpus <= 0) continue;
      // nvidia.com/gpu by product, as the policy's types have always been; any other extended
      // resource by its name (a MIG profile is itself a type).
      std::string type = resource;
      if (resource == kGpuResource) {
        const json& labels = ObjectAt(ObjectAt(node, "metadata"), "labels");
        type = labels.value(kGpuProductLabel, std::string(kUnknownProduct));
        out.node_product[node_name] = type;
      }
      out.node_types[node_name][resource] = type;
      out.products[type].total += gpus;
      largest_node[type] = std::max(largest_node[type], gpus);
    }
  }
  for (const std::shared_ptr<const json>& shared : pods) {
    const json& pod = *shared;
    if (!PodHoldsResources(pod)) continue;
    const std::string node = ObjectAt(pod, "spec").value("nodeName", "");
    if (!IsWorkerPod(pod) && out.cpu_allocatable.count(node) != 0) {
      out.cpu_held_by_others[node] += PodCpuMillis(pod);
    }
    auto types = out.node_types.find(node);
    if (types == out.node_types.end()) continue;
    for (const json& c : ArrayAt(ObjectAt(pod, "spec"), "containers")) {
      for (const auto& [resource, gpus] : ContainerAccelerators(c)) {
        auto type = types->second.find(resource);
        if (type == types->second.end()) continue;
        out.products[type->second].allocated += gpus;
        if (!IsWorkerPod(pod)) {
          out.held_by_others[type->second] += gpus;
          out.node_held_by_others[node][resource] += gpus;
        }
      }
    }
  }
  CountPendingDemand(pods, largest_node, out);
  return out;
}

json NodeSchedulingFacts(const json& node) {
  if (!node.is_object()) return nullptr;
  const json& meta = ObjectAt(node, "metadata");
  const json& spec = ObjectAt(node, "spec");
  return {{"name", meta.value("name", "")},
          {"labels", ObjectAt(meta, "labels")},
          {"unschedulable", spec.value("unschedulable", false)},
          {"taints", ArrayAt(spec, "taints")},
          {"allocatable", ObjectAt(ObjectAt(node, "status"), "allocatable")},
          {"schedulable", NodeSchedulable(node)}};
}

ClusterGpus CountGpus(const std::vector<json>& nodes, const std::vector<json>& pods) {
  auto share = [](const std::vector<json>& objects) {
    std::vector<std::shared_ptr<const json>> out;
    for (const json& o : objects) out.push_back(std::make_shared<const json>(o));
    return out;
  };
  return CountGpus(share(nodes), share(pods));
}

}  // namespace vf::controller
