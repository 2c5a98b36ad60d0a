#include "operator/controller/job_status.h"

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vf::controller {

using nlohmann::json;

namespace {

constexpr std::array<std::pair<Phase, std::string_view>, 6> kPhases = {{
    {Phase::kPending, "Pending"},
    {Phase::kRunning, "Running"},
    {Phase::kResizing, "Resizing"},
    {Phase::kSuspended, "Suspended"},
    {Phase::kSucceeded, "Succeeded"},
    {Phase::kFailed, "Failed"},
}};

Status WrongType(const std::string& field, const char* want) {
  return InvalidArgument("status." + field + ": not " + want);
}

// Reads the optional field `key` of `j` into `out` with `read`, which says whether the value
// has the right type.
template <typename T, typename Read>
Status ReadField(const json& j, const std::string& key, const char* want, std::optional<T>& out,
                 Read read) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::Ok();
  T value{};
  if (!read(*it, value)) return WrongType(key, want);
  out = std::move(value);
  return Status::Ok();
}

bool ReadInt(const json& v, int64_t& out) {
  if (!v.is_number_integer()) return false;
  out = v.get<int64_t>();
  return true;
}
bool ReadNumber(const json& v, double& out) {
  if (!v.is_number()) return false;
  out = v.get<double>();
  return true;
}
bool ReadString(const json& v, std::string& out) {
  if (!v.is_string()) return false;
  out = v.get<std::string>();
  return true;
}
bool ReadWorkerCounts(const json& v, WorkerCounts& out) {
  if (!v.is_object()) return false;
  for (const auto& [name, field] :
       std::array<std::pair<const char*, int64_t*>, 5>{{{"pending", &out.pending},
                                                        {"joining", &out.joining},
                                                        {"training", &out.training},
                                                        {"leaving", &out.leaving},
                                                        {"failed", &out.failed}}}) {
    auto it = v.find(name);
    if (it != v.end() && !ReadInt(*it, *field)) return false;
  }
  return true;
}
bool ReadAssignment(const json& v, std::vector<AssignedWorker>& out) {
  if (!v.is_array()) return false;
  for (const json& a : v) {
    if (!a.is_object()) return false;
    AssignedWorker w;
    w.worker = a.value("worker", "");
    w.rank = a.value("rank", int64_t{0});
    auto nodes = a.find("virtualNodes");
    if (nodes != a.end()) {
      if (!nodes->is_array()) return false;
      for (const json& n : *nodes) {
        if (!n.is_number_integer()) return false;
        w.virtual_nodes.push_back(n.get<int>());
      }
    }
    out.push_back(std::move(w));
  }
  return true;
}
bool ReadLastResize(const json& v, LastResize& out) {
  if (!v.is_object()) return false;
  out.time = v.value("time", "");
  out.from = v.value("from", int64_t{0});
  out.to = v.value("to", int64_t{0});
  out.reason = v.value("reason", "");
  out.pause_seconds = v.value("pauseSeconds", 0.0);
  return true;
}
bool ReadRestarts(const json& v, std::map<std::string, int64_t>& out) {
  if (!v.is_object()) return false;
  for (const auto& [k, n] : v.items()) {
    if (!n.is_number_integer()) return false;
    out[k] = n.get<int64_t>();
  }
  return true;
}

}  // namespace

std::string_view PhaseName(Phase phase) {
  for (const auto& [p, name] : kPhases) {
    if (p == phase) return name;
  }
  return "Pending";
}

std::optional<Phase> ParsePhase(std::string_view name) {
  for (const auto& [p, n] : kPhases) {
    if (n == name) return p;
  }
  return std::nullopt;
}

bool Ended(Phase phase) { return phase == Phase::kSucceeded || phase == Phase::kFailed; }

Phase PhaseOf(const json& status) {
  if (!status.is_object()) return Phase::kPending;
  auto it = status.find("phase");
  if (it == status.end() || !it->is_string()) return Phase::kPending;
  return ParsePhase(it->get<std::string>()).value_or(Phase::kPending);
}

void WritePhase(json& status, Phase phase) { status["phase"] = std::string(PhaseName(phase)); }

json Condition::ToJson() const {
  return {{"type", type},
          {"status", status ? "True" : "False"},
          {"reason", reason},
          {"message", message},
          {"lastTransitionTime", last_transition_time},
          {"observedGeneration", observed_generation}};
}

Result<Condition> Condition::FromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("status.conditions: an entry is not an object");
  Condition c;
  c.type = j.value("type", "");
  const std::string status = j.value("status", "");
  if (status != "True" && status != "False") {
    return InvalidArgument("status.conditions[" + c.type + "].status: neither True nor False");
  }
  c.status = status == "True";
  c.reason = j.value("reason", "");
  c.message = j.value("message", "");
  c.last_transition_time = j.value("lastTransitionTime", "");
  c.observed_generation = j.value("observedGeneration", int64_t{0});
  return c;
}

void SetCondition(std::vector<Condition>& conditions, Condition c, std::string_view now) {
  for (Condition& existing : conditions) {
    if (existing.type != c.type) continue;
    if (existing.status == c.status) {
      c.last_transition_time = existing.last_transition_time;
    } else if (c.last_transition_time.empty()) {
      c.last_transition_time = std::string(now);
    }
    existing = std::move(c);
    return;
  }
  if (c.last_transition_time.empty()) c.last_transition_time = std::string(now);
  conditions.push_back(std::move(c));
}

const Condition* FindCondition(const std::vector<Condition>& conditions, std::string_view type) {
  for (const Condition& c : conditions) {
    if (c.type == type) return &c;
  }
  return nullptr;
}

json JobStatus::ToJson() const {
  json out = other.is_object() ? other : json::object();
  if (phase) out["phase"] = std::string(PhaseName(*phase));
  if (message) out["message"] = *message;
  if (!conditions.empty()) {
    json list = json::array();
    for (const Condition& c : conditions) list.push_back(c.ToJson());
    out["conditions"] = std::move(list);
  }
  if (observed_generation) out["observedGeneration"] = *observed_generation;
  if (start_time) out["startTime"] = *start_time;
  if (completion_time) out["completionTime"] = *completion_time;
  if (workers) out["workers"] = *workers;
  if (ready_workers) out["readyWorkers"] = *ready_workers;
  if (desired_workers) out["desiredWorkers"] = *desired_workers;
  if (worker_counts) {
    const WorkerCounts& w = *worker_counts;
    out["workerCounts"] = {{"pending", w.pending},
                           {"joining", w.joining},
                           {"training", w.training},
                           {"leaving", w.leaving},
                           {"failed", w.failed}};
  }
  if (epoch) out["epoch"] = *epoch;
  if (assignment) {
    json list = json::array();
    for (const AssignedWorker& a : *assignment) {
      list.push_back({{"worker", a.worker}, {"rank", a.rank}, {"virtualNodes", a.virtual_nodes}});
    }
    out["assignment"] = std::move(list);
  }
  if (worker_image) out["workerImage"] = *worker_image;
  if (worker_build) out["workerBuild"] = *worker_build;
  if (worker_protocol) out["workerProtocol"] = *worker_protocol;
  if (step) out["step"] = *step;
  if (total_steps) out["totalSteps"] = *total_steps;
  if (loss) out["loss"] = *loss;
  if (samples_per_second) out["samplesPerSecond"] = *samples_per_second;
  if (weights_sha256) out["weightsSha256"] = *weights_sha256;
  if (test_accuracy) out["testAccuracy"] = *test_accuracy;
  if (last_resize) {
    const LastResize& r = *last_resize;
    out["lastResize"] = {{"time", r.time},
                         {"from", r.from},
                         {"to", r.to},
                         {"reason", r.reason},
                         {"pauseSeconds", r.pause_seconds}};
  }
  if (restarts) out["restarts"] = *restarts;
  return out;
}

Result<JobStatus> JobStatus::FromJson(const json& status) {
  JobStatus s;
  if (status.is_null()) return s;
  if (!status.is_object()) return InvalidArgument("status: not an object");
  std::optional<std::string> phase;
  VF_RETURN_IF_ERROR(ReadField(status, "phase", "a string", phase, ReadString));
  if (phase) {
    s.phase = ParsePhase(*phase);
    if (!s.phase) return InvalidArgument("status.phase: unknown phase " + *phase);
  }
  VF_RETURN_IF_ERROR(ReadField(status, "message", "a string", s.message, ReadString));
  if (auto it = status.find("conditions"); it != status.end() && !it->is_null()) {
    if (!it->is_array()) return WrongType("conditions", "a list");
    for (const json& c : *it) {
      VF_ASSIGN_OR_RETURN(Condition parsed, Condition::FromJson(c));
      s.conditions.push_back(std::move(parsed));
    }
  }
  VF_RETURN_IF_ERROR(
      ReadField(status, "observedGeneration", "an integer", s.observed_generation, ReadInt));
  VF_RETURN_IF_ERROR(ReadField(status, "startTime", "a string", s.start_time, ReadString));
  VF_RETURN_IF_ERROR(
      ReadField(status, "completionTime", "a string", s.completion_time, ReadString));
  VF_RETURN_IF_ERROR(ReadField(status, "workers", "an integer", s.workers, ReadInt));
  VF_RETURN_IF_ERROR(ReadField(status, "readyWorkers", "an integer", s.ready_workers, ReadInt));
  VF_RETURN_IF_ERROR(ReadField(status, "desiredWorkers", "an integer", s.desired_workers, ReadInt));
  VF_RETURN_IF_ERROR(
      ReadField(status, "workerCounts", "worker counts", s.worker_counts, ReadWorkerCounts));
  VF_RETURN_IF_ERROR(ReadField(status, "epoch", "an integer", s.epoch, ReadInt));
  VF_RETURN_IF_ERROR(
      ReadField(status, "assignment", "a list of members", s.assignment, ReadAssignment));
  VF_RETURN_IF_ERROR(ReadField(status, "workerImage", "a string", s.worker_image, ReadString));
  VF_RETURN_IF_ERROR(ReadField(status, "workerBuild", "a string", s.worker_build, ReadString));
  VF_RETURN_IF_ERROR(ReadField(status, "workerProtocol", "an integer", s.worker_protocol, ReadInt));
  VF_RETURN_IF_ERROR(ReadField(status, "step", "an integer", s.step, ReadInt));
  VF_RETURN_IF_ERROR(ReadField(status, "totalSteps", "an integer", s.total_steps, ReadInt));
  VF_RETURN_IF_ERROR(ReadField(status, "loss", "a number", s.loss, ReadNumber));
  VF_RETURN_IF_ERROR(
      ReadField(status, "samplesPerSecond", "a number", s.samples_per_second, ReadNumber));
  VF_RETURN_IF_ERROR(ReadField(status, "weightsSha256", "a string", s.weights_sha256, ReadString));
  VF_RETURN_IF_ERROR(ReadField(status, "testAccuracy", "a number", s.test_accuracy, ReadNumber));
  VF_RETURN_IF_ERROR(ReadField(status, "lastResize", "an object", s.last_resize, ReadLastResize));
  VF_RETURN_IF_ERROR(ReadField(status, "restarts", "counts", s.restarts, ReadRestarts));
  static constexpr std::array<std::string_view, 23> kModelled = {
      "phase",          "message",    "conditions",   "observedGeneration", "startTime",
      "completionTime", "workers",    "readyWorkers", "desiredWorkers",     "workerCounts",
      "epoch",          "assignment", "workerImage",  "workerBuild",        "workerProtocol",
      "step",           "totalSteps", "loss",         "samplesPerSecond",   "weightsSha256",
      "testAccuracy",   "lastResize", "restarts"};
  for (const auto& [k, v] : status.items()) {
    bool modelled = false;
    for (std::string_view m : kModelled) modelled = modelled || m == k;
    if (!modelled) s.other[k] = v;
  }
  return s;
}

json StatusPatch(const json& from, const json& to) {
  json patch = json::object();
  for (const auto& [k, v] : to.items()) {
    auto it = from.find(k);
    if (it == from.end() || *it != v) patch[k] = v;
  }
  for (const auto& [k, v] : from.items()) {
    if (!to.contains(k)) patch[k] = nullptr;
  }
  return patch;
}

json StatusPatch(const JobStatus& from, const JobStatus& to) {
  return StatusPatch(from.ToJson(), to.ToJson());
}

}  // namespace vf::controller
