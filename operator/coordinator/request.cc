#include "operator/coordinator/request.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <utility>
#include <vector>

#include <cpprest/uri.h>
#include <nlohmann/json.hpp>

#include "agent/protocol/json.h"

namespace vf::coordinator {
namespace {

constexpr int64_t kDefaultPollMs = 30000;

std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return parts;
}

Result<std::string> Decode(std::string_view encoded) {
  try {
    return web::uri::decode(std::string(encoded));
  } catch (...) {
    return InvalidArgument("malformed percent-encoding in '" + std::string(encoded) + "'");
  }
}

}  // namespace

Result<Route> ParseRoute(std::string_view raw_path) {
  static constexpr std::string_view kPrefix = "/v1/jobs/";
  const Status unknown = NotFound("no such path: " + std::string(raw_path));
  if (raw_path.substr(0, kPrefix.size()) != kPrefix) return unknown;
  const std::string_view rest = raw_path.substr(kPrefix.size());
  // namespace / name / action [/ key...]
  const size_t a = rest.find('/');
  if (a == std::string_view::npos) return unknown;
  const size_t b = rest.find('/', a + 1);
  if (b == std::string_view::npos) return unknown;
  const size_t c = rest.find('/', b + 1);
  const std::string_view action = rest.substr(b + 1, c == std::string_view::npos ? c : c - b - 1);
  Route route;
  VF_ASSIGN_OR_RETURN(const std::string ns, Decode(rest.substr(0, a)));
  VF_ASSIGN_OR_RETURN(const std::string name, Decode(rest.substr(a + 1, b - a - 1)));
  if (ns.empty() || name.empty()) return unknown;
  route.job = ns + "/" + name;
  if (action == "store") {
    if (c == std::string_view::npos || c + 1 == rest.size()) return unknown;
    route.action = Action::kStore;
    VF_ASSIGN_OR_RETURN(route.key, Decode(rest.substr(c + 1)));
    return route;
  }
  if (c != std::string_view::npos) return unknown;
  static const std::map<std::string_view, Action> kActions = {
      {"register", Action::kRegister}, {"plan", Action::kPlan}, {"report", Action::kReport},
      {"leave", Action::kLeave},       {"ack", Action::kAck},   {"failure", Action::kFailure}};
  auto it = kActions.find(action);
  if (it == kActions.end()) return unknown;
  route.action = it->second;
  return route;
}

std::string AllowedMethods(Action action) {
  switch (action) {
    case Action::kPlan:
      return "GET";
    case Action::kStore:
      return "GET, PUT";
    default:
      return "POST";
  }
}

bool MethodAllowed(Action action, std::string_view method) {
  switch (action) {
    case Action::kPlan:
      return method == "GET";
    case Action::kStore:
      return method == "GET" || method == "PUT";
    default:
      return method == "POST";
  }
}

Result<std::map<std::string, std::string>> ParseQuery(std::string_view raw) {
  std::map<std::string, std::string> query;
  if (raw.empty()) return query;
  for (const std::string_view pair : Split(raw, '&')) {
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    VF_ASSIGN_OR_RETURN(std::string name, Decode(pair.substr(0, eq)));
    std::string value;
    if (eq != std::string_view::npos) {
      VF_ASSIGN_OR_RETURN(value, Decode(pair.substr(eq + 1)));
    }
    query[std::move(name)] = std::move(value);
  }
  return query;
}

Result<int64_t> QueryInt(const std::map<std::string, std::string>& query, const std::string& name,
                         int64_t fallback) {
  auto it = query.find(name);
  if (it == query.end()) return fallback;
  const std::string& text = it->second;
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    return InvalidArgument("query parameter '" + name + "' must be an integer, got '" + text + "'");
  }
  return value;
}

Result<int64_t> PollTimeout(const std::map<std::string, std::string>& query, int64_t cap) {
  VF_ASSIGN_OR_RETURN(const int64_t timeout, QueryInt(query, "timeout_ms", kDefaultPollMs));
  if (timeout < 0) return InvalidArgument("query parameter 'timeout_ms' must be non-negative");
  return std::min(timeout, cap);
}

std::string BearerToken(std::string_view authorization) {
  static constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size()) return {};
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return {};
  }
  const size_t start = authorization.find_first_not_of(' ', kScheme.size());
  if (start == std::string_view::npos) return {};
  return std::string(authorization.substr(start));
}

Result<Body> ParseBody(Action action, std::string_view text, const std::string& caller) {
  namespace wire = protocol;
  VF_ASSIGN_OR_RETURN(const nlohmann::json object, wire::ParseObject(text));
  Body body;
  VF_ASSIGN_OR_RETURN(body.worker, wire::StringField(object, "worker"));
  if (body.worker != caller) {
    return PermissionDenied("the credential is worker " + caller + "'s; it cannot act as worker " +
                            body.worker);
  }
  switch (action) {
    case Action::kRegister: {
      VF_ASSIGN_OR_RETURN(body.fingerprint, wire::StringField(object, "fingerprint"));
      VF_ASSIGN_OR_RETURN(body.build, wire::StringField(object, "build"));
      VF_ASSIGN_OR_RETURN(body.ready, wire::BoolField(object, "ready"));
      // An agent that sends no version speaks 1, the protocol before there were versions.
      body.protocol = 1;
      if (object.contains("protocol")) {
        VF_ASSIGN_OR_RETURN(body.protocol, wire::IntField(object, "protocol"));
      }
      break;
    }
    case Action::kReport: {
      VF_ASSIGN_OR_RETURN(body.report, wire::ReportFromJson(object));
      break;
    }
    case Action::kAck: {
      VF_ASSIGN_OR_RETURN(body.epoch, wire::IntField(object, "epoch"));
      break;
    }
    case Action::kFailure: {
      VF_ASSIGN_OR_RETURN(body.epoch, wire::IntField(object, "epoch"));
      VF_ASSIGN_OR_RETURN(body.step, wire::IntField(object, "step"));
      VF_ASSIGN_OR_RETURN(body.message, wire::StringField(object, "message"));
      break;
    }
    case Action::kLeave:
      break;
    default:
      return InvalidArgument("a request to this path has no JSON body");
  }
  return body;
}

}  // namespace vf::coordinator
