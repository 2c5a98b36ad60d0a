#include "operator/controller/kueue.h"

#include <algorithm>
#include <utility>

#include "operator/controller/kueue_contract.h"
#include "operator/controller/worker_pod.h"
#include "operator/policy/policy.h"

namespace vf::controller {

using nlohmann::json;

namespace {

const json& Obj(const json& j, const char* key) {
  static const json kEmpty = json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

bool IsTrue(const json* condition) {
  return condition != nullptr && condition->value("status", "") == "True";
}

// The workers Kueue admitted: the count of the workers' pod set assignment, which partial
// admission may have lowered; the full count when Kueue wrote none.
int AdmittedWorkers(const json& workload, const JobSpec& spec) {
  const json& admission = Obj(Obj(workload, "status"), "admission");
  for (const json& a : admission.value("podSetAssignments", json::array())) {
    if (!a.is_object() || a.value("name", "") != kWorkersPodSet) continue;
    auto count = a.find("count");
    if (count != a.end() && count->is_number_integer()) return count->get<int>();
  }
  for (const json& ps : Obj(workload, "spec").value("podSets", json::array())) {
    if (ps.is_object() && ps.value("name", "") == kWorkersPodSet) {
      return ps.value("count", spec.replicas_max);
    }
  }
  return spec.replicas_max;
}

}  // namespace

std::string QueueNameOf(const json& job) {
  return Obj(Obj(job, "metadata"), "labels").value(kQueueNameLabel, "");
}

std::string WorkloadName(const json& job) {
  const json& meta = Obj(job, "metadata");
  std::string uid = meta.value("uid", "");
  uid.erase(std::remove(uid.begin(), uid.end(), '-'), uid.end());
  // A Workload's name is a DNS subdomain (253 characters); the suffix keeps it unique.
  std::string name = meta.value("name", "").substr(0, 200);
  while (!name.empty() && (name.back() == '-' || name.back() == '.')) name.pop_back();
  return name + "-vf-" + uid.substr(0, 8);
}

int CoreWorkers(const JobSpec& spec) {
  // A fixed-size policy (static) runs a job at replicas.max or not at all.
  const bool fixed = policy::SharingOf(spec.elasticity.policy) == policy::Sharing::kFixed;
  return std::max(1, fixed ? spec.replicas_max : spec.replicas_min);
}

int UnitWorkloads(const JobSpec& spec) {
  return std::max(0, spec.replicas_max - CoreWorkers(spec));
}

std::string UnitWorkloadName(const json& job, int index) {
  return WorkloadName(job) + "-" + std::to_string(index);
}

namespace {

json WorkloadOf(const json& job, const std::string& name, const std::string& role, int count,
                const json& worker_pod) {
  const json& meta = Obj(job, "metadata");
  // Only labels and annotations may be in a pod set template's metadata.
  json template_meta = json::object();
  if (const json& labels = Obj(Obj(worker_pod, "metadata"), "labels"); !labels.empty()) {
    template_meta["labels"] = labels;
  }
  json pod_set = {{"name", kWorkersPodSet},
                  {"count", count},
                  {"template", {{"metadata", template_meta}, {"spec", Obj(worker_pod, "spec")}}}};
  return {{"apiVersion", kWorkloadApiVersion},
          {"kind", "Workload"},
          {"metadata",
           {{"name", name},
            {"namespace", meta.value("namespace", "")},
            {"labels",
             {{kJobLabel, meta.value("name", "")},
              {kManagedByLabel, kManagedBy},
              {kWorkloadRoleLabel, role},
              {kQueueNameLabel, QueueNameOf(job)}}},
            {"ownerReferences", {OwnerReference(job)}}}},
          {"spec", {{"queueName", QueueNameOf(job)}, {"podSets", {pod_set}}}}};
}

bool Evicted(const json& workload) { return IsTrue(WorkloadCondition(workload, "Evicted")); }

bool HoldsReservation(const json& workload) {
  return IsTrue(WorkloadCondition(workload, "QuotaReserved")) ||
         Obj(workload, "status").contains("admission");
}

}  // namespace

json BuildWorkload(const json& job, const JobSpec& spec, const json& worker_pod) {
  return WorkloadOf(job, WorkloadName(job), kCoreRole, CoreWorkers(spec), worker_pod);
}

json BuildUnitWorkload(const json& job, const JobSpec& /*spec*/, const json& worker_pod,
                       int index) {
  return WorkloadOf(job, UnitWorkloadName(job, index), kUnitRole, 1, worker_pod);
}

KueueAdmission AdmissionOf(const json& workload, const JobSpec& spec) {
  KueueAdmission out;
  out.finished = IsTrue(WorkloadCondition(workload, "Finished"));
  const json* admitted = WorkloadCondition(workload, "Admitted");
  const json* evicted = WorkloadCondition(workload, "Evicted");
  const json* reserved = WorkloadCondition(workload, "QuotaReserved");
  if (IsTrue(admitted) && !IsTrue(evicted)) {
    out.admitted = true;
    out.workers = AdmittedWorkers(workload, spec);
    out.cluster_queue = Obj(Obj(workload, "status"), "admission").value("clusterQueue", "");
    return out;
  }
  // The most telling of Kueue's conditions: an eviction, then why no quota is reserved, then
  // why a reservation is not yet an admission (admission checks).
  for (const json* c : {IsTrue(evicted) ? evicted : nullptr, reserved, admitted}) {
    if (c == nullptr || c->value("message", "").empty()) continue;
    out.reason = c->value("reason", "");
    out.message = c->value("message", "");
    return out;
  }
  out.reason = kNotSeenByKueue;
  out.message = "Kueue has not looked at the Workload yet";
  return out;
}

JobAdmission JobAdmissionOf(const json& core, const std::vector<json>& units, const JobSpec& spec) {
  JobAdmission out;
  if (core.is_null()) {
    out.admission.reason = kNotSeenByKueue;
    out.admission.message = "the Workload was just created";
    return out;
  }
  out.admission = AdmissionOf(core, spec);
  for (size_t i = 0; i < units.size(); ++i) {
    const json& unit = units[i];
    if (unit.is_null()) continue;
    if (Evicted(unit)) {
      if (HoldsReservation(unit)) out.units_evicted.push_back(static_cast<int>(i) + 1);
      continue;
    }
    if (out.admission.admitted && AdmissionOf(unit, spec).admitted) ++out.units_admitted;
  }
  if (out.admission.admitted) out.admission.workers += out.units_admitted;
  return out;
}

int KueueWorkerLimit(const json& job, const json& core, const std::vector<json>& units,
                     const JobSpec& spec) {
  if (QueueNameOf(job).empty()) return spec.replicas_max;
  const KueueAdmission admission = JobAdmissionOf(core, units, spec).admission;
  return admission.admitted && !admission.finished ? std::min(admission.workers, spec.replicas_max)
                                                   : 0;
}

json FinishedWorkload(json workload, bool succeeded, const std::string& message,
                      const std::string& now) {
  if (IsTrue(WorkloadCondition(workload, "Finished"))) return workload;
  json& status = workload["status"];
  if (!status.is_object()) status = json::object();
  json conditions = json::array();
  for (const json& c : status.value("conditions", json::array())) {
    if (c.is_object() && c.value("type", "") != "Finished") conditions.push_back(c);
  }
  conditions.push_back({{"type", "Finished"},
                        {"status", "True"},
                        {"reason", succeeded ? "Succeeded" : "Failed"},
                        {"message", message.substr(0, 32768)},
                        {"lastTransitionTime", now},
                        {"observedGeneration", Obj(workload, "metadata").value("generation", 0)}});
  status["conditions"] = std::move(conditions);
  return workload;
}

}  // namespace vf::controller
