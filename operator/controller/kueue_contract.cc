#include "operator/controller/kueue_contract.h"

#include <limits>
#include <tuple>
#include <utility>

namespace vf::controller {

using nlohmann::json;

namespace {

const json& Obj(const json& j, const char* key) {
  static const json kEmpty = json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

bool IsTrue(const json& workload, const std::string& type) {
  const json* c = WorkloadCondition(workload, type);
  return c != nullptr && c->value("status", "") == "True";
}

int64_t Generation(const json& workload) {
  const json& meta = Obj(workload, "metadata");
  auto it = meta.find("generation");
  return it != meta.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

json MakeCondition(const json& workload, const std::string& type, bool status,
                   const std::string& reason, const std::string& message) {
  return {{"type", type},
          {"status", status ? "True" : "False"},
          {"reason", reason},
          {"message", message},
          {"observedGeneration", Generation(workload)}};
}

// The workload's status.conditions, made an array if it is not one.
json& ConditionsOf(json& workload) {
  json& status = workload["status"];
  if (!status.is_object()) status = json::object();
  json& conditions = status["conditions"];
  if (!conditions.is_array()) conditions = json::array();
  return conditions;
}

// Copies `from` into `into`; a key already there with another value is an error naming the
// field and the key.
Status MergeKeys(const std::map<std::string, std::string>& from, const char* field,
                 std::map<std::string, std::string>& into) {
  for (const auto& [key, value] : from) {
    auto [it, inserted] = into.emplace(key, value);
    if (!inserted && it->second != value) {
      return InvalidArgument(std::string("conflicting ") + field + " " + key + ": \"" + it->second +
                             "\" and \"" + value + "\"");
    }
  }
  return Status::Ok();
}

std::map<std::string, std::string> StringMap(const json& object) {
  std::map<std::string, std::string> out;
  if (!object.is_object()) return out;
  for (const auto& [key, value] : object.items()) {
    if (value.is_string()) out[key] = value.get<std::string>();
  }
  return out;
}

void AppendTolerations(const json& tolerations, json& into) {
  if (!tolerations.is_array()) return;
  for (const json& t : tolerations) {
    bool present = false;
    for (const json& have : into) present = present || have == t;
    if (!present) into.push_back(t);
  }
}

// The admission check podSetUpdates of `workload` for `pod_set`, merged into `placement`.
Status MergePodSetUpdates(const json& workload, const std::string& pod_set,
                          PodSetPlacement& placement) {
  for (const json& check : Obj(workload, "status").value("admissionChecks", json::array())) {
    if (!check.is_object()) continue;
    for (const json& update : check.value("podSetUpdates", json::array())) {
      if (!update.is_object() || update.value("name", "") != pod_set) continue;
      const std::string source = "(admission check " + check.value("name", "") + ")";
      for (auto [field, into] : {std::pair{"labels", &placement.labels},
                                 std::pair{"annotations", &placement.annotations},
                                 std::pair{"nodeSelector", &placement.node_selector}}) {
        Status merged = MergeKeys(StringMap(update.value(field, json::object())), field, *into);
        if (!merged.ok()) return InvalidArgument(merged.message() + " " + source);
      }
      AppendTolerations(update.value("tolerations", json::array()), placement.tolerations);
    }
  }
  return Status::Ok();
}

}  // namespace

const json* WorkloadCondition(const json& workload, const std::string& type) {
  const json& status = Obj(workload, "status");
  auto it = status.find("conditions");
  if (it == status.end() || !it->is_array()) return nullptr;
  for (const json& c : *it) {
    if (c.is_object() && c.value("type", "") == type) return &c;
  }
  return nullptr;
}

bool SetStatusCondition(json& conditions, const json& condition, const std::string& now) {
  if (!conditions.is_array()) conditions = json::array();
  const std::string type = condition.value("type", "");
  for (json& existing : conditions) {
    if (!existing.is_object() || existing.value("type", "") != type) continue;
    bool changed = false;
    if (existing.value("status", "") != condition.value("status", "")) {
      existing["status"] = condition.value("status", "");
      existing["lastTransitionTime"] = now;
      changed = true;
    }
    for (const char* field : {"reason", "message", "observedGeneration"}) {
      auto it = condition.find(field);
      if (it == condition.end() || existing.value(field, json()) == *it) continue;
      existing[field] = *it;
      changed = true;
    }
    return changed;
  }
  json added = condition;
  added["lastTransitionTime"] = now;
  conditions.push_back(std::move(added));
  return true;
}

WorkloadUpdate WithPodsReady(json workload, bool ready, const std::string& why_not,
                             const std::string& now) {
  const json* current = WorkloadCondition(workload, kWorkloadPodsReady);
  const bool admitted = IsTrue(workload, kWorkloadAdmitted) && !IsTrue(workload, kWorkloadEvicted);
  const bool was_ready = current != nullptr && current->value("status", "") == "True";
  const std::string current_reason = current != nullptr ? current->value("reason", "") : "";
  json condition;
  if (admitted && ready) {
    const bool recovering =
        current_reason == kReasonWaitForRecovery || current_reason == kReasonRecovered;
    condition = MakeCondition(workload, kWorkloadPodsReady, true,
                              recovering ? kReasonRecovered : kReasonStarted,
                              "At least the Workload's count of workers train");
  } else if (admitted && (was_ready || current_reason == kReasonWaitForRecovery)) {
    condition = MakeCondition(workload, kWorkloadPodsReady, false, kReasonWaitForRecovery, why_not);
  } else {
    condition = MakeCondition(workload, kWorkloadPodsReady, false, kReasonWaitForStart, why_not);
  }
  WorkloadUpdate out;
  out.changed = SetStatusCondition(ConditionsOf(workload), condition, now);
  out.workload = std::move(workload);
  return out;
}

std::string EvictionReason(const json& workload) {
  const json* evicted = WorkloadCondition(workload, kWorkloadEvicted);
  if (evicted == nullptr || evicted->value("status", "") != "True") return "";
  return evicted->value("reason", "");
}

WorkloadUpdate RequeuedAfterEviction(json workload, const std::string& now) {
  WorkloadUpdate out;
  const std::string reason = EvictionReason(workload);
  const bool reserved =
      IsTrue(workload, kWorkloadQuotaReserved) || Obj(workload, "status").contains("admission");
  if (reason.empty() || !reserved) {
    out.workload = std::move(workload);
    return out;
  }
  const json* evicted = WorkloadCondition(workload, kWorkloadEvicted);
  const std::string message = evicted->value("message", "");
  const bool requeue = reason == kReasonPreempted || reason == kReasonNodeFailures;
  json requeued = MakeCondition(workload, kWorkloadRequeued, requeue, reason, message);
  json unreserved = MakeCondition(workload, kWorkloadQuotaReserved, false, "Pending", message);
  json unadmitted = MakeCondition(workload, kWorkloadAdmitted, false, "NoReservation",
                                  "The workload has no reservation");
  json& conditions = ConditionsOf(workload);
  SetStatusCondition(conditions, requeued, now);
  SetStatusCondition(conditions, unreserved, now);
  if (IsTrue(workload, kWorkloadAdmitted)) SetStatusCondition(conditions, unadmitted, now);
  workload["status"].erase("admission");
  out.changed = true;
  out.workload = std::move(workload);
  return out;
}

std::optional<PriorityClassRef> PriorityClassOf(const json& job, const json& worker_pod) {
  const std::string label =
      Obj(Obj(job, "metadata"), "labels").value(kPriorityClassLabel, std::string());
  if (!label.empty()) return PriorityClassRef{"kueue.x-k8s.io", "WorkloadPriorityClass", label};
  const std::string pod_class = Obj(worker_pod, "spec").value("priorityClassName", std::string());
  if (!pod_class.empty()) return PriorityClassRef{"scheduling.k8s.io", "PriorityClass", pod_class};
  return std::nullopt;
}

Result<int32_t> PriorityValueOf(const json& priority_class) {
  const std::string name = Obj(priority_class, "metadata").value("name", std::string());
  auto it = priority_class.find("value");
  if (it == priority_class.end() || !it->is_number_integer()) {
    return InvalidArgument("priority class " + name + " has no integer value");
  }
  const int64_t value = it->get<int64_t>();
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    return InvalidArgument("priority class " + name +
                           " has a value out of range: " + std::to_string(value));
  }
  return static_cast<int32_t>(value);
}

void SetWorkloadPriority(json& workload, const PriorityClassRef& ref, int32_t value) {
  json& spec = workload["spec"];
  if (!spec.is_object()) spec = json::object();
  spec["priorityClassRef"] = {{"group", ref.group}, {"kind", ref.kind}, {"name", ref.name}};
  spec["priority"] = value;
}

std::vector<std::string> AdmittedFlavors(const json& workload, const std::string& pod_set) {
  std::vector<std::string> out;
  const json& admission = Obj(Obj(workload, "status"), "admission");
  for (const json& a : admission.value("podSetAssignments", json::array())) {
    if (!a.is_object() || a.value("name", "") != pod_set) continue;
    const json& flavors = Obj(a, "flavors");
    for (const auto& [resource, flavor] : flavors.items()) {
      if (!flavor.is_string()) continue;
      const std::string name = flavor.get<std::string>();
      bool seen = false;
      for (const std::string& have : out) seen = seen || have == name;
      if (!seen) out.push_back(name);
    }
  }
  return out;
}

Result<PodSetPlacement> PlacementOf(const json& workload, const std::string& pod_set,
                                    const std::map<std::string, json>& flavors) {
  PodSetPlacement placement;
  for (const std::string& name : AdmittedFlavors(workload, pod_set)) {
    auto it = flavors.find(name);
    if (it == flavors.end()) return NotFound("ResourceFlavor " + name + " not found");
    const json& spec = Obj(it->second, "spec");
    Status merged = MergeKeys(StringMap(spec.value("nodeLabels", json::object())), "nodeSelector",
                              placement.node_selector);
    if (!merged.ok()) return InvalidArgument(merged.message() + " (ResourceFlavor " + name + ")");
    AppendTolerations(spec.value("tolerations", json::array()), placement.tolerations);
  }
  if (Status updates = MergePodSetUpdates(workload, pod_set, placement); !updates.ok()) {
    return updates;
  }
  return placement;
}

Status ApplyPlacement(const PodSetPlacement& placement, json& pod) {
  json& meta = pod["metadata"];
  if (!meta.is_object()) meta = json::object();
  json& spec = pod["spec"];
  if (!spec.is_object()) spec = json::object();
  for (auto [field, from, into] : {std::tuple{"labels", &placement.labels, &meta},
                                   std::tuple{"annotations", &placement.annotations, &meta},
                                   std::tuple{"nodeSelector", &placement.node_selector, &spec}}) {
    std::map<std::string, std::string> merged = StringMap(into->value(field, json::object()));
    if (Status s = MergeKeys(*from, field, merged); !s.ok()) return s;
    if (!merged.empty()) (*into)[field] = merged;
  }
  json tolerations = spec.value("tolerations", json::array());
  AppendTolerations(placement.tolerations, tolerations);
  if (!tolerations.empty()) spec["tolerations"] = std::move(tolerations);
  return Status::Ok();
}

bool NodeMatchesPlacement(const PodSetPlacement& placement, const json& node_labels) {
  for (const auto& [key, value] : placement.node_selector) {
    auto it = node_labels.is_object() ? node_labels.find(key) : node_labels.end();
    if (!node_labels.is_object() || it == node_labels.end() || !it->is_string() ||
        it->get<std::string>() != value) {
      return false;
    }
  }
  return true;
}

}  // namespace vf::controller
