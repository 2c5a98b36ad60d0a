// The parts of spec.runPolicy that the operator decides as batch/v1's Job controller does
// (pkg/controller/job): what a failed worker pod means under podFailurePolicy, and how long its
// replacement waits. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/job/spec.h"

namespace vf::controller {

// What the policy decided for one failed pod. Value type.
struct PodFailureVerdict {
  PodFailureAction action = PodFailureAction::kCount;
  int rule = -1;     // index of the rule that matched; -1: none did
  std::string what;  // what matched, for Events: "container worker exited 42", "DisruptionTarget"
};

// The verdict for `pod`, a failed pod as the API server (or the operator's trimmed cache, which
// keeps the conditions of failed pods) returns it. A rule on exit codes looks at each container
// that terminated with a non-zero code (init containers after the others, as batch/v1 does);
// one on pod conditions at the pod's status.conditions.
// The rules in order, the first that matches decides; a pod no rule matches counts against
// backoffLimit.
PodFailureVerdict MatchPodFailurePolicy(const RunPolicySpec& policy, const nlohmann::json& pod);

// The Job controller's back-off before a failed pod's replacement, after `failures` failures
// counted: 0 for none, then 10 s, doubled with each one, at most 6 minutes.
inline constexpr double kFirstFailureBackoffSeconds = 10;
inline constexpr double kMaxFailureBackoffSeconds = 360;
double FailureBackoffSeconds(int64_t failures);

// Seconds a replacement still has to wait at `now` (Unix seconds) after `failures` failures,
// the last at `last_failure` (Unix seconds; NaN: unknown, no wait); 0 when it may be created.
double FailureBackoffLeft(int64_t failures, double last_failure, double now);

}  // namespace vf::controller
