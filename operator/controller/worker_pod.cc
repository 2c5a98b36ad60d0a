#include "operator/controller/worker_pod.h"

#include "operator/controller/inventory.h"

namespace vf::controller {

using nlohmann::json;

std::string TokenSecretName(const std::string& job_name) { return job_name + "-vf-token"; }

json OwnerReference(const json& job) {
  const json& meta = job.at("metadata");
  return {{"apiVersion", job.value("apiVersion", kJobApiVersion)},
          {"kind", job.value("kind", kJobKind)},
          {"name", meta.value("name", "")},
          {"uid", meta.value("uid", "")},
          {"controller", true},
          {"blockOwnerDeletion", true}};
}

json AgentManifest(const json& job) {
  const json& meta = job.at("metadata");
  return {
      {"apiVersion", job.value("apiVersion", kJobApiVersion)},
      {"kind", job.value("kind", kJobKind)},
      {"metadata", {{"name", meta.value("name", "")}, {"namespace", meta.value("namespace", "")}}},
      {"spec", job.value("spec", json::object())}};
}

json BuildWorkerPod(const json& job, const JobSpec& spec, const std::string& pod_name,
                    const PodSettings& settings) {
  const json& meta = job.at("metadata");
  const std::string name = meta.value("name", "");
  const std::string ns = meta.value("namespace", "");
  // The pod template is the operator's alone (JobSpec has no part of it).
  const json& tmpl = job.value("spec", json::object()).value("template", json::object());
  const int gpus = spec.gpus_per_worker;

  json args = {"--coordinator", settings.coordinator_url, "--job-id", ns + "/" + name, "--worker",
               pod_name};
  json container = {{"name", "agent"}, {"command", {"virtualflow-agent"}}};
  if (settings.metrics_port >= 0) {
    args.push_back("--metrics-port");
    args.push_back(std::to_string(settings.metrics_port));
    if (settings.metrics_port > 0) {
      container["ports"] = {{{"name", "metrics"}, {"containerPort", settings.metrics_port}}};
    }
  }
  container["args"] = args;
  container["image"] = tmpl.value("image", settings.default_image);
  json env = json::array();
  env.push_back({{"name", "VF_JOB_SPEC"}, {"value", AgentManifest(job).dump()}});
  env.push_back(
      {{"name", "VF_JOB_TOKEN"},
       {"valueFrom", {{"secretKeyRef", {{"name", TokenSecretName(name)}, {"key", kTokenKey}}}}}});
  for (const json& e : tmpl.value("env", json::array())) env.push_back(e);
  container["env"] = env;
  json resources = tmpl.value("resources", json::object());
  resources["limits"][kGpuResource] = std::to_string(gpus);
  if (resources.contains("requests") && resources["requests"].contains(kGpuResource)) {
    resources["requests"][kGpuResource] = std::to_string(gpus);
  }
  container["resources"] = resources;
  container["terminationMessagePolicy"] = "FallbackToLogsOnError";

  json pod_spec = {{"restartPolicy", "Never"},
                   {"automountServiceAccountToken", false},
                   {"enableServiceLinks", false},
                   {"terminationGracePeriodSeconds", settings.termination_grace_seconds},
                   {"containers", {container}}};
  if (tmpl.contains("nodeSelector")) pod_spec["nodeSelector"] = tmpl["nodeSelector"];
  if (tmpl.contains("tolerations")) pod_spec["tolerations"] = tmpl["tolerations"];

  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"name", pod_name},
            {"namespace", ns},
            {"labels",
             {{kJobLabel, name},
              {kManagedByLabel, kManagedBy},
              {"app.kubernetes.io/name", "virtualflow-agent"}}},
            {"ownerReferences", {OwnerReference(job)}}}},
          {"spec", pod_spec}};
}

PodLife PodLifeOf(const json& pod) {
  const std::string phase = pod.value("status", json::object()).value("phase", "");
  if (phase == "Succeeded") return PodLife::kSucceeded;
  if (phase == "Failed") return PodLife::kFailed;
  if (pod.value("metadata", json::object()).contains("deletionTimestamp")) {
    return PodLife::kTerminating;
  }
  if (phase == "Running") return PodLife::kRunning;
  return PodLife::kStarting;
}

policy::WorkerLife WorkerLifeOf(PodLife life) {
  switch (life) {
    case PodLife::kStarting:
      return policy::WorkerLife::kStarting;
    case PodLife::kRunning:
      return policy::WorkerLife::kRunning;
    case PodLife::kTerminating:
      return policy::WorkerLife::kLeaving;
    case PodLife::kSucceeded:
      return policy::WorkerLife::kExited;
    case PodLife::kFailed:
      return policy::WorkerLife::kFailed;
  }
  return policy::WorkerLife::kFailed;
}

namespace {
// Points into `pod` itself (json::value() returns copies, which would dangle).
const json* Terminated(const json& pod) {
  auto status = pod.find("status");
  if (status == pod.end() || !status->is_object()) return nullptr;
  auto statuses = status->find("containerStatuses");
  if (statuses == status->end() || !statuses->is_array() || statuses->empty()) return nullptr;
  const json& first = (*statuses)[0];
  if (!first.is_object()) return nullptr;
  auto state = first.find("state");
  if (state == first.end() || !state->is_object()) return nullptr;
  auto t = state->find("terminated");
  if (t == state->end() || !t->is_object()) return nullptr;
  return &*t;
}
}  // namespace

int PodExitCode(const json& pod) {
  const json* t = Terminated(pod);
  return t == nullptr ? -1 : t->value("exitCode", -1);
}

std::string PodTerminationMessage(const json& pod) {
  const json* t = Terminated(pod);
  std::string message;
  if (t != nullptr) message = t->value("message", t->value("reason", ""));
  if (message.empty()) message = pod.value("status", json::object()).value("message", "");
  // The last line says most; keep status small.
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.pop_back();
  }
  const size_t nl = message.rfind('\n');
  if (nl != std::string::npos) message = message.substr(nl + 1);
  if (message.size() > 512) message = message.substr(message.size() - 512);
  return message;
}

}  // namespace vf::controller
