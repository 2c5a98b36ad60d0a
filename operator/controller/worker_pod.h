// The pods the operator runs for a VirtualFlowJob: how one is built from the job, and what the
// operator reads back from one. Pure functions of JSON objects.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "operator/policy/membership.h"
#include "runtime/job/spec.h"

namespace vf::controller {

inline constexpr char kJobLabel[] = "virtualflow.io/job";
inline constexpr char kManagedByLabel[] = "app.kubernetes.io/managed-by";
inline constexpr char kManagedBy[] = "virtualflow-operator";
inline constexpr char kTokenKey[] = "token";

// What the operator puts into every worker pod besides the job itself. Value type.
struct PodSettings {
  std::string coordinator_url;  // where agents reach the coordinator
  std::string default_image;    // when the job's spec.template.image is empty
  int metrics_port = 9090;      // the agent's /metrics port; < 0: no metrics endpoint
  // Seconds a leaving worker gets to finish its step and acknowledge the plan.
  int termination_grace_seconds = 60;
};

// The name of the Secret that holds a job's coordinator token.
std::string TokenSecretName(const std::string& job_name);

// An owner reference to `job` (controller, blocks owner deletion), so that deleting the job
// deletes what it owns.
nlohmann::json OwnerReference(const nlohmann::json& job);

// The manifest an agent trains from: apiVersion, kind, metadata (name, namespace) and spec.
nlohmann::json AgentManifest(const nlohmann::json& job);

// The worker pod `pod_name` of `job` (whose parsed spec is `spec`): restartPolicy Never (the
// operator replaces failed workers itself), the job's GPUs per worker as a limit, its template's
// image, resources, node selector, tolerations and env, the token from the job's Secret, no
// service-account token.
nlohmann::json BuildWorkerPod(const nlohmann::json& job, const JobSpec& spec,
                              const std::string& pod_name, const PodSettings& settings);

// Where a worker pod is in its life, as the operator needs to know it.
enum class PodLife {
  kStarting,     // not yet running (pending, or bound and starting)
  kRunning,      // its container runs
  kTerminating,  // deletion requested; its agent is leaving or being killed
  kSucceeded,    // exited 0: finished, or left after acknowledging a plan
  kFailed,       // exited non-zero, or could not run
};
PodLife PodLifeOf(const nlohmann::json& pod);
// The same as the membership decision sees a worker: a terminating pod is leaving, a succeeded
// one has exited cleanly.
policy::WorkerLife WorkerLifeOf(PodLife life);
// The container's exit code once terminated; -1 otherwise.
int PodExitCode(const nlohmann::json& pod);
// The container's termination message (or reason), for status and Events.
std::string PodTerminationMessage(const nlohmann::json& pod);

}  // namespace vf::controller
