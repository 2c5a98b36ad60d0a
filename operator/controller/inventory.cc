#include "operator/controller/inventory.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

namespace vf::controller {

using nlohmann::json;

bool NodeSchedulable(const json& node) {
  if (node.value("spec", json::object()).value("unschedulable", false)) return false;
  const json& status = node.value("status", json::object());
  for (const json& c : status.value("conditions", json::array())) {
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

int PodGpus(const json& pod) {
  int total = 0;
  for (const json& c : pod.value("spec", json::object()).value("containers", json::array())) {
    const json& res = c.value("resources", json::object());
    const json& limits = res.value("limits", json::object());
    const json& requests = res.value("requests", json::object());
    if (limits.contains(kGpuResource)) {
      total += ParseGpuQuantity(limits.at(kGpuResource));
    } else if (requests.contains(kGpuResource)) {
      total += ParseGpuQuantity(requests.at(kGpuResource));
    }
  }
  return total;
}

bool PodHoldsResources(const json& pod) {
  const std::string phase = pod.value("status", json::object()).value("phase", "");
  if (phase == "Succeeded" || phase == "Failed") return false;
  return !pod.value("spec", json::object()).value("nodeName", "").empty();
}

bool IsWorkerPod(const json& pod) {
  return pod.value("metadata", json::object())
      .value("labels", json::object())
      .contains("virtualflow.io/job");
}

namespace {

int64_t PodCpuMillis(const json& pod) {
  int64_t total = 0;
  for (const json& c : pod.value("spec", json::object()).value("containers", json::array())) {
    const json& res = c.value("resources", json::object());
    for (const char* part : {"requests", "limits"}) {
      const json& r = res.value(part, json::object());
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
  for (const json& v : requirement.value("values", json::array())) {
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
  const json& meta = node.value("metadata", json::object());
  const json& labels = meta.value("labels", json::object());
  for (const json& req : term.value("matchExpressions", json::array())) {
    const std::string key = req.value("key", "");
    const bool present = labels.contains(key) && labels[key].is_string();
    if (!Matches(req, present ? labels[key].get<std::string>() : "", present)) return false;
  }
  for (const json& req : term.value("matchFields", json::array())) {
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
  const json& labels = node.value("metadata", json::object()).value("labels", json::object());
  const json selector = pod_template.value("nodeSelector", json::object());
  for (const auto& [k, v] : selector.items()) {
    if (!labels.contains(k) || labels[k] != v) return false;
  }
  const json& required =
      pod_template.value("affinity", json::object())
          .value("nodeAffinity", json::object())
          .value("requiredDuringSchedulingIgnoredDuringExecution", json::object());
  const json& terms = required.value("nodeSelectorTerms", json::array());
  if (!terms.empty()) {
    bool any = false;
    for (const json& term : terms) any = any || TermMatches(term, node);
    if (!any) return false;
  }
  const json& tolerations = pod_template.value("tolerations", json::array());
  for (const json& taint : node.value("spec", json::object()).value("taints", json::array())) {
    const std::string effect = taint.value("effect", "");
    if (effect != "NoSchedule" && effect != "NoExecute") continue;
    if (!Tolerates(tolerations, taint)) return false;
  }
  return true;
}

int EligibleWorkers(const ClusterGpus& cluster, const json& pod_template, int gpus_per_worker,
                    int64_t cpu_millis) {
  int workers = 0;
  for (const auto& [name, node] : cluster.nodes) {
    if (!NodeEligible(node, pod_template)) continue;
    if (gpus_per_worker > 0) {
      const json& alloc = node.value("status", json::object()).value("allocatable", json::object());
      if (!alloc.contains(kGpuResource)) continue;
      auto held = cluster.node_gpus_held_by_others.find(name);
      const int gpus = ParseGpuQuantity(alloc.at(kGpuResource)) -
                       (held == cluster.node_gpus_held_by_others.end() ? 0 : held->second);
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
  for (const auto& [name, product] : cluster.node_product) {
    auto node = cluster.nodes.find(name);
    if (node != cluster.nodes.end() && NodeEligible(node->second, pod_template)) {
      products.insert(product);
    }
  }
  return {products.begin(), products.end()};
}

ClusterGpus CountGpus(const std::vector<json>& nodes, const std::vector<json>& pods) {
  ClusterGpus out;
  for (const json& node : nodes) {
    if (!NodeSchedulable(node)) continue;
    const json& alloc = node.value("status", json::object()).value("allocatable", json::object());
    const std::string node_name = node.value("metadata", json::object()).value("name", "");
    out.nodes[node_name] = node;
    if (alloc.contains("cpu")) {
      out.cpu_allocatable[node_name] = std::max<int64_t>(0, ParseCpuMillis(alloc.at("cpu")));
    }
    if (!alloc.contains(kGpuResource)) continue;
    const int gpus = ParseGpuQuantity(alloc.at(kGpuResource));
    if (gpus <= 0) continue;
    const json& labels = node.value("metadata", json::object()).value("labels", json::object());
    const std::string product = labels.value(kGpuProductLabel, std::string(kUnknownProduct));
    const std::string name = node.value("metadata", json::object()).value("name", "");
    out.node_product[name] = product;
    out.products[product].total += gpus;
  }
  for (const json& pod : pods) {
    if (!PodHoldsResources(pod)) continue;
    const std::string node = pod.value("spec", json::object()).value("nodeName", "");
    if (!IsWorkerPod(pod) && out.cpu_allocatable.count(node) != 0) {
      out.cpu_held_by_others[node] += PodCpuMillis(pod);
    }
    auto it = out.node_product.find(node);
    if (it == out.node_product.end()) continue;
    const int gpus = PodGpus(pod);
    out.products[it->second].allocated += gpus;
    if (!IsWorkerPod(pod)) {
      out.held_by_others[it->second] += gpus;
      out.node_gpus_held_by_others[node] += gpus;
    }
  }
  return out;
}

}  // namespace vf::controller
