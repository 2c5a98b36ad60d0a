#include "operator/controller/run_policy.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

namespace vf::controller {
namespace {

using nlohmann::json;

const json& Member(const json& object, const char* key) {
  static const json kNull;
  if (!object.is_object()) return kNull;
  auto it = object.find(key);
  return it == object.end() ? kNull : *it;
}

// The first container of `statuses` that the requirement matches: the right name, terminated
// with a non-zero exit code In (NotIn) the values. "container NAME exited CODE", or nothing.
std::optional<std::string> MatchExitCodes(const json& statuses, const ExitCodeRequirement& req) {
  if (!statuses.is_array()) return std::nullopt;
  for (const json& c : statuses) {
    const std::string name = Member(c, "name").is_string() ? c["name"].get<std::string>() : "";
    if (!req.container_name.empty() && req.container_name != name) continue;
    const json& code = Member(Member(Member(c, "state"), "terminated"), "exitCode");
    if (!code.is_number_integer()) continue;
    const auto exit_code = code.get<int64_t>();
    if (exit_code == 0) continue;  // a container that exited 0 did not fail
    const bool listed =
        std::find(req.values.begin(), req.values.end(), exit_code) != req.values.end();
    if (listed == req.in) return "container " + name + " exited " + std::to_string(exit_code);
  }
  return std::nullopt;
}

std::optional<std::string> MatchConditions(const json& conditions,
                                           const std::vector<PodConditionPattern>& patterns) {
  if (!conditions.is_array()) return std::nullopt;
  for (const PodConditionPattern& pattern : patterns) {
    for (const json& c : conditions) {
      if (Member(c, "type") == pattern.type && Member(c, "status") == pattern.status) {
        return "condition " + pattern.type + "=" + pattern.status;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

PodFailureVerdict MatchPodFailurePolicy(const RunPolicySpec& policy, const json& pod) {
  const json& status = Member(pod, "status");
  for (size_t i = 0; i < policy.pod_failure_rules.size(); ++i) {
    const PodFailureRule& rule = policy.pod_failure_rules[i];
    std::optional<std::string> what;
    if (rule.on_exit_codes) {
      what = MatchExitCodes(Member(status, "containerStatuses"), *rule.on_exit_codes);
      if (!what)
        what = MatchExitCodes(Member(status, "initContainerStatuses"), *rule.on_exit_codes);
    } else {
      what = MatchConditions(Member(status, "conditions"), rule.on_pod_conditions);
    }
    if (what) return {rule.action, static_cast<int>(i), std::move(*what)};
  }
  return {};
}

double FailureBackoffSeconds(int64_t failures) {
  if (failures <= 0) return 0;
  double wait = kFirstFailureBackoffSeconds;
  for (int64_t i = 1; i < failures && wait < kMaxFailureBackoffSeconds; ++i) wait *= 2;
  return std::min(wait, kMaxFailureBackoffSeconds);
}

double FailureBackoffLeft(int64_t failures, double last_failure, double now) {
  if (std::isnan(last_failure)) return 0;
  return std::max(0.0, last_failure + FailureBackoffSeconds(failures) - now);
}

}  // namespace vf::controller
