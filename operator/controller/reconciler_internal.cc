// The functions over a job's JSON that the Reconciler's files share (reconciler_internal.h).
#include "operator/controller/reconciler_internal.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "operator/controller/worker_pod.h"
#include "operator/kube/client.h"

namespace vf::controller::reconciler_internal {

using nlohmann::json;

const json& Obj(const json& j, const char* key) {
  static const json kEmpty = json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

std::string Now() { return kube::FormatTime(std::chrono::system_clock::now()); }

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double UnixSeconds(const std::string& text) {
  std::tm tm{};
  std::istringstream in(text);
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
  if (in.fail()) return std::nan("");
  return static_cast<double>(timegm(&tm));
}

void SetCondition(json& conditions, const json& old_conditions, const std::string& type, bool value,
                  const std::string& reason, const std::string& message, int64_t generation) {
  const std::string status = value ? "True" : "False";
  std::string since = Now();
  for (const json& c : old_conditions) {
    if (c.value("type", "") == type && c.value("status", "") == status) {
      since = c.value("lastTransitionTime", since);
    }
  }
  conditions.push_back({{"type", type},
                        {"status", status},
                        {"reason", reason},
                        {"message", message.substr(0, 4096)},
                        {"lastTransitionTime", since},
                        {"observedGeneration", generation}});
}

const json* FindCondition(const json& conditions, const std::string& type) {
  if (!conditions.is_array()) return nullptr;
  for (const json& c : conditions) {
    if (c.is_object() && c.value("type", "") == type) return &c;
  }
  return nullptr;
}

json PlanJson(const std::vector<Member>& members) {
  json out = json::array();
  for (const Member& m : members) {
    out.push_back({{"worker", m.worker}, {"rank", m.rank}, {"virtualNodes", m.virtual_nodes}});
  }
  return out;
}

std::vector<Member> MembersFromJson(const json& assignment) {
  std::vector<Member> out;
  if (!assignment.is_array()) return out;
  for (const json& a : assignment) {
    Member m;
    m.worker = a.value("worker", "");
    m.rank = a.value("rank", 0);
    m.virtual_nodes = a.value("virtualNodes", std::vector<int>{});
    out.push_back(std::move(m));
  }
  return out;
}

bool OwnedBy(const json& pod, const std::string& ns, const std::string& name,
             const std::string& uid) {
  const json& meta = Obj(pod, "metadata");
  if (meta.value("namespace", "") != ns || Obj(meta, "labels").value(kJobLabel, "") != name) {
    return false;
  }
  return ControlledBy(pod, uid);
}

std::string PodName(const json& pod) { return Obj(pod, "metadata").value("name", ""); }

const json& TemplateOf(const json& job) { return Obj(Obj(job, "spec"), "template"); }

void MarkWorkersStopping(json& status, const std::string& phase, const std::string& message,
                         int stopping) {
  status["phase"] = phase;
  status["message"] = message;
  status["workers"] = 0;
  status["readyWorkers"] = 0;
  status["workerCounts"] = {
      {"pending", 0}, {"joining", 0}, {"training", 0}, {"leaving", stopping}, {"failed", 0}};
  status["assignment"] = json::array();
}

json ConditionsWithoutWorkers(const json& old, const std::string& own) {
  json conditions = json::array();
  for (const json& c : old) {
    const std::string type = c.value("type", "");
    if (type != own && type != "Running" && type != "Resizing" && type != "Degraded" &&
        type != "ReconcileError" && type != "ImageKept") {
      conditions.push_back(c);
    }
  }
  return conditions;
}

bool ManagedHere(const json& job) {
  const std::string manager = Obj(job, "spec").value("managedBy", std::string());
  return manager.empty() || manager == kVirtualFlowManager;
}

}  // namespace vf::controller::reconciler_internal
