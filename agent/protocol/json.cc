#include "agent/protocol/json.h"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

namespace vf::protocol {
namespace {

using nlohmann::json;

struct TooDeep {};

Status Missing(const char* name) {
  return InvalidArgument(std::string("field '") + name + "' is missing");
}

Status WrongType(const char* name, const char* expected) {
  return InvalidArgument(std::string("field '") + name + "' must be " + expected);
}

Result<const json*> Find(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end()) return Missing(name);
  return &*it;
}

// JSON has no NaN or infinity.
json Number(double value) { return std::isfinite(value) ? json(value) : json(nullptr); }

// Reads field `name` into `out` with `read`, keeping `out` when the field is absent and
// `optional` is set.
template <typename T, typename Reader>
Status Read(const json& object, const char* name, bool optional, Reader read, T& out) {
  if (optional && !object.contains(name)) return Status::Ok();
  Result<T> value = read(object, name);
  if (!value.ok()) return value.status();
  out = *std::move(value);
  return Status::Ok();
}

}  // namespace

Result<json> ParseObject(std::string_view body) {
  json parsed;
  try {
    parsed = json::parse(body.begin(), body.end(), [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxJsonDepth) throw TooDeep{};
      return true;
    });
  } catch (const TooDeep&) {
    return InvalidArgument("request body nests deeper than " + std::to_string(kMaxJsonDepth) +
                           " levels");
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("body is not valid JSON: ") + e.what());
  }
  if (!parsed.is_object()) return InvalidArgument("body must be a JSON object");
  return parsed;
}

std::string Dump(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<std::string> StringField(const json& object, const char* name) {
  VF_ASSIGN_OR_RETURN(const json* value, Find(object, name));
  if (!value->is_string()) return WrongType(name, "a string");
  return value->get<std::string>();
}

Result<int64_t> IntField(const json& object, const char* name) {
  VF_ASSIGN_OR_RETURN(const json* value, Find(object, name));
  if (value->is_number_unsigned()) {
    if (value->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return WrongType(name, "an integer below 2^63");
    }
    return static_cast<int64_t>(value->get<uint64_t>());
  }
  if (!value->is_number_integer()) return WrongType(name, "an integer");
  return value->get<int64_t>();
}

Result<bool> BoolField(const json& object, const char* name) {
  VF_ASSIGN_OR_RETURN(const json* value, Find(object, name));
  if (!value->is_boolean()) return WrongType(name, "true or false");
  return value->get<bool>();
}

Result<double> NumberField(const json& object, const char* name) {
  VF_ASSIGN_OR_RETURN(const json* value, Find(object, name));
  if (value->is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!value->is_number()) return WrongType(name, "a number");
  return value->get<double>();
}

json PlanToJson(const Plan& plan) {
  json members = json::array();
  for (const Member& m : plan.members) {
    members.push_back({{"worker", m.worker}, {"rank", m.rank}, {"virtualNodes", m.virtual_nodes}});
  }
  return {{"epoch", plan.epoch}, {"storePrefix", plan.store_prefix}, {"members", members}};
}

Result<Plan> PlanFromJson(const json& object) {
  if (!object.is_object()) return InvalidArgument("plan must be a JSON object");
  Plan plan;
  VF_ASSIGN_OR_RETURN(plan.epoch, IntField(object, "epoch"));
  VF_ASSIGN_OR_RETURN(plan.store_prefix, StringField(object, "storePrefix"));
  VF_ASSIGN_OR_RETURN(const json* members, Find(object, "members"));
  if (!members->is_array()) return WrongType("members", "an array");
  for (const json& entry : *members) {
    if (!entry.is_object()) return WrongType("members", "an array of objects");
    Member m;
    VF_ASSIGN_OR_RETURN(m.worker, StringField(entry, "worker"));
    VF_ASSIGN_OR_RETURN(const int64_t rank, IntField(entry, "rank"));
    if (rank < 0 || rank > std::numeric_limits<int>::max()) return WrongType("rank", "an int");
    m.rank = static_cast<int>(rank);
    VF_ASSIGN_OR_RETURN(const json* nodes, Find(entry, "virtualNodes"));
    if (!nodes->is_array()) return WrongType("virtualNodes", "an array of integers");
    for (const json& node : *nodes) {
      if (!node.is_number_integer() || node.get<int64_t>() < std::numeric_limits<int>::min() ||
          node.get<int64_t>() > std::numeric_limits<int>::max()) {
        return WrongType("virtualNodes", "an array of integers");
      }
      m.virtual_nodes.push_back(node.get<int>());
    }
    plan.members.push_back(std::move(m));
  }
  return plan;
}

json ReportToJson(const Report& report) {
  return {{"epoch", report.epoch},
          {"step", report.step},
          {"loss", Number(report.loss)},
          {"samplesPerSecond", Number(report.samples_per_second)},
          {"secondsPerVirtualNode", Number(report.seconds_per_virtual_node)},
          {"pauseSeconds", Number(report.pause_seconds)},
          {"hasState", report.has_state},
          {"finished", report.finished},
          {"weightsSha256", report.weights_sha256},
          {"testAccuracy", Number(report.test_accuracy)},
          {"totalSteps", report.total_steps},
          {"checkpointStep", report.checkpoint_step},
          {"checkpointError", report.checkpoint_error}};
}

Result<Report> ReportFromJson(const json& object) {
  if (!object.is_object()) return InvalidArgument("report must be a JSON object");
  Report r;
  VF_RETURN_IF_ERROR(Read(object, "epoch", false, IntField, r.epoch));
  VF_RETURN_IF_ERROR(Read(object, "step", false, IntField, r.step));
  VF_RETURN_IF_ERROR(Read(object, "loss", false, NumberField, r.loss));
  VF_RETURN_IF_ERROR(Read(object, "samplesPerSecond", false, NumberField, r.samples_per_second));
  VF_RETURN_IF_ERROR(
      Read(object, "secondsPerVirtualNode", false, NumberField, r.seconds_per_virtual_node));
  VF_RETURN_IF_ERROR(Read(object, "pauseSeconds", true, NumberField, r.pause_seconds));
  VF_RETURN_IF_ERROR(Read(object, "hasState", false, BoolField, r.has_state));
  VF_RETURN_IF_ERROR(Read(object, "finished", true, BoolField, r.finished));
  VF_RETURN_IF_ERROR(Read(object, "weightsSha256", true, StringField, r.weights_sha256));
  if (!r.weights_sha256.empty() &&
      (r.weights_sha256.size() != 64 ||
       r.weights_sha256.find_first_not_of("0123456789abcdef") != std::string::npos)) {
    return WrongType("weightsSha256", "64 lowercase hex digits (a SHA-256)");
  }
  VF_RETURN_IF_ERROR(Read(object, "testAccuracy", true, NumberField, r.test_accuracy));
  VF_RETURN_IF_ERROR(Read(object, "totalSteps", true, IntField, r.total_steps));
  if (r.total_steps < 0) return WrongType("totalSteps", "at least 0");
  VF_RETURN_IF_ERROR(Read(object, "checkpointStep", true, IntField, r.checkpoint_step));
  if (r.checkpoint_step < 0) return WrongType("checkpointStep", "at least 0");
  VF_RETURN_IF_ERROR(Read(object, "checkpointError", true, StringField, r.checkpoint_error));
  static_assert(kMaxCheckpointError == 1024, "the message below names the limit");
  if (r.checkpoint_error.size() > kMaxCheckpointError) {
    return WrongType("checkpointError", "at most 1024 characters");
  }
  return r;
}

std::string FinalReportMessage(const std::string& worker, const Report& report) {
  Report r = report;
  r.finished = true;
  r.checkpoint_error.clear();  // the final checkpoint was written, or nothing is reported
  return Dump({{"kind", kFinalReportKind}, {"worker", worker}, {"report", ReportToJson(r)}});
}

Result<std::pair<std::string, Report>> FinalReportFromMessage(std::string_view message) {
  Result<json> parsed = ParseObject(message);
  if (!parsed.ok()) return NotFound("not a final report");
  const json& object = *parsed;
  const auto kind = object.find("kind");
  if (kind == object.end() || !kind->is_string() || kind->get<std::string>() != kFinalReportKind) {
    return NotFound("not a final report");
  }
  VF_ASSIGN_OR_RETURN(std::string worker, StringField(object, "worker"));
  const auto body = object.find("report");
  if (body == object.end()) return InvalidArgument("final report: field 'report' is missing");
  Result<Report> report = ReportFromJson(*body);
  if (!report.ok()) return InvalidArgument("final report: " + report.status().message());
  if (!report->finished) return InvalidArgument("final report: 'finished' is not true");
  return std::make_pair(std::move(worker), std::move(report).value());
}

}  // namespace vf::protocol
