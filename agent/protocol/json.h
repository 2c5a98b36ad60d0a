// The JSON shapes the coordinator's server (operator/coordinator/) and the agent's client
// exchange, and the field readers that turn a malformed body into a one-line error naming the
// field. Both sides use these functions, so the wire format is written down once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "agent/protocol/messages.h"
#include "runtime/status.h"

namespace vf::protocol {

// Deeper nesting than any request needs is refused before it can cost stack or memory.
inline constexpr int kMaxJsonDepth = 16;
// A report's checkpointError is one error message, not a log.
inline constexpr size_t kMaxCheckpointError = 1024;

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

nlohmann::json PlanToJson(const Plan& plan);
Result<Plan> PlanFromJson(const nlohmann::json& json);

// A report's fields (the sender adds "worker"). Non-finite numbers go as null and come back as
// NaN. The final report's fields and "pauseSeconds" are optional on read, so older agents keep
// working.
nlohmann::json ReportToJson(const Report& report);
Result<Report> ReportFromJson(const nlohmann::json& json);

// The final report as a worker leaves it in its container's termination message (the kubelet
// keeps at most 4096 bytes of it in the pod's status: this is a few hundred), so that the
// outcome of a job outlives the coordinator that received it: {"kind":
// "VirtualFlowFinalReport", "worker": ..., "report": {ReportToJson, finished true}}.
inline constexpr std::string_view kFinalReportKind = "VirtualFlowFinalReport";
std::string FinalReportMessage(const std::string& worker, const Report& report);
// The worker and report of a termination message FinalReportMessage wrote. kNotFound for any
// other message (a log tail, another program's words); kInvalidArgument naming the field for a
// final report that is malformed or not finished.
Result<std::pair<std::string, Report>> FinalReportFromMessage(std::string_view message);

}  // namespace vf::protocol
