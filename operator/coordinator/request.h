// How the coordinator's server reads a request before it calls the coordinator: the route of
// its path, the methods a route answers, its query, its bearer token and the fields of each
// action's body. No HTTP objects, so that the server's unit tests and its fuzz target
// (request_fuzz.cc) run it without a listener. Internal to operator/coordinator/.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "agent/protocol/messages.h"
#include "runtime/status.h"

namespace vf::coordinator {

enum class Action { kRegister, kPlan, kStore, kReport, kLeave, kAck, kFailure };

// Where a request goes: POST /v1/jobs/<namespace>/<name>/<action>, or .../store/<key>.
struct Route {
  std::string job;  // "namespace/name"
  Action action = Action::kRegister;
  std::string key;  // kStore only
};

// kNotFound for a path the API does not have; kInvalidArgument for malformed percent-encoding.
// `raw_path` is still percent-encoded, so that a key may hold '/' written either plainly or as
// %2F.
Result<Route> ParseRoute(std::string_view raw_path);

// The methods a route answers, as an Allow header lists them.
std::string AllowedMethods(Action action);
bool MethodAllowed(Action action, std::string_view method);

// name -> value of a raw (percent-encoded) query string; a repeated name keeps its last value.
Result<std::map<std::string, std::string>> ParseQuery(std::string_view raw);
// The integer `name`, or `fallback` if absent; kInvalidArgument for anything but an integer.
Result<int64_t> QueryInt(const std::map<std::string, std::string>& query, const std::string& name,
                         int64_t fallback);
// A long poll's `timeout_ms` (default 30 s), capped at `cap`.
Result<int64_t> PollTimeout(const std::map<std::string, std::string>& query, int64_t cap);

// The token of an Authorization header's value "Bearer <token>" (scheme case-insensitive), or
// empty.
std::string BearerToken(std::string_view authorization);

// The fields of a POST body, read for its action. Fields of other actions stay default.
struct Body {
  std::string worker;
  // kRegister
  std::string fingerprint;
  std::string build;
  bool ready = false;
  int64_t protocol = kProtocolVersion;  // absent: 1, the version before there were versions
  // kAck, kFailure
  int64_t epoch = 0;
  // kFailure
  int64_t step = 0;
  std::string message;
  // kReport
  Report report;
};

// Reads the JSON body of a POST to `action` (not kPlan or kStore). `caller` is the worker the
// request's credential was checked for: a body that speaks for another worker is
// kPermissionDenied. kInvalidArgument naming the field for a malformed body.
Result<Body> ParseBody(Action action, std::string_view body, const std::string& caller);

}  // namespace vf::coordinator
