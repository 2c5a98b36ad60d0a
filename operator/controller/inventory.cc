#include "operator/controller/inventory.h"

#include <cmath>
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

ClusterGpus CountGpus(const std::vector<json>& nodes, const std::vector<json>& pods) {
  ClusterGpus out;
  for (const json& node : nodes) {
    if (!NodeSchedulable(node)) continue;
    const json& alloc = node.value("status", json::object()).value("allocatable", json::object());
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
    auto it = out.node_product.find(node);
    if (it == out.node_product.end()) continue;
    const int gpus = PodGpus(pod);
    out.products[it->second].allocated += gpus;
    if (!IsWorkerPod(pod)) out.held_by_others[it->second] += gpus;
  }
  return out;
}

}  // namespace vf::controller
