// The JSON shapes the coordinator's server and client exchange, and the field readers that turn
// a malformed body into a one-line error naming the field. Internal to operator/coordinator/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "operator/coordinator/coordinator.h"
#include "runtime/status.h"

namespace vf::coordinator_wire {

// Deeper nesting than any request needs is refused before it can cost stack or memory.
inline constexpr int kMaxJsonDepth = 16;

// Parses a request or response body that must be a JSON object.
Result<nlohmann::json> ParseObject(std::string_view body);

// Serializes without ever throwing: bytes that are not UTF-8 (a key or name a client sent) are
// replaced rather than aborting the reply.
std::string Dump(const nlohmann::json& value);

// kInvalidArgument naming the field when it is missing or has the wrong type.
Result<std::string> StringField(const nlohmann::json& object, const char* name);
Result<int64_t> IntField(const nlohmann::json& object, const char* name);
Result<bool> BoolField(const nlohmann::json& object, const char* name);
// A number, or null for NaN (JSON has no NaN; the client sends null for a non-finite value).
Result<double> NumberField(const nlohmann::json& object, const char* name);

// A report's job length (Report::total_steps). Optional on read: agents from before it send
// none, and the length stays 0 (unknown).
inline constexpr char kReportTotalSteps[] = "total_steps";
Status ReadReportTotalSteps(const nlohmann::json& object, Report& report);

nlohmann::json PlanToJson(const Plan& plan);
Result<Plan> PlanFromJson(const nlohmann::json& json);

}  // namespace vf::coordinator_wire
