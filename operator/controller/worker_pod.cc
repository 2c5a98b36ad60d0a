#include "operator/controller/worker_pod.h"

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <set>
#include <string_view>

#include "agent/protocol/messages.h"
#include "operator/controller/inventory.h"
#include "runtime/job/worker_env.h"

namespace vf::controller {

using nlohmann::json;

bool IsWorkerPodName(const std::string& job_name, const std::string& pod_name) {
  const std::string prefix = job_name + "-worker-";
  if (job_name.empty() || pod_name.size() != prefix.size() + kWorkerPodSuffixLength ||
      pod_name.compare(0, prefix.size(), prefix) != 0) {
    return false;
  }
  const std::string_view alphabet(kWorkerPodSuffixAlphabet);
  return std::all_of(pod_name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), pod_name.end(),
                     [&](char c) { return alphabet.find(c) != std::string_view::npos; });
}

bool ControlledBy(const json& object, const std::string& uid) {
  if (uid.empty() || !object.is_object() || !object.contains("metadata")) return false;
  const json& meta = object.at("metadata");
  if (!meta.is_object() || !meta.contains("ownerReferences")) return false;
  const json& refs = meta.at("ownerReferences");
  if (!refs.is_array()) return false;
  for (const json& ref : refs) {
    if (!ref.is_object()) continue;
    const json controller = ref.value("controller", json());
    if (ref.value("uid", "") == uid && controller.is_boolean() && controller.get<bool>()) {
      return true;
    }
  }
  return false;
}

std::string CredentialSecretName(const std::string& pod_name) {
  return pod_name + "-vf-credential";
}

json BuildCredentialSecret(const json& job, const json& pod, const std::string& credential,
                           const std::string& coordinator_ca) {
  const json meta = pod.is_object() ? pod.value("metadata", json::object()) : json::object();
  // Not a controller reference (the job controls the pod, and a Secret has one controller at
  // most), and not blocking the pod's deletion, which would need rights on the pod's finalizers.
  const json owner = {{"apiVersion", "v1"},
                      {"kind", "Pod"},
                      {"name", meta.value("name", "")},
                      {"uid", meta.value("uid", "")}};
  json data = {{kTokenKey, credential}};
  if (!coordinator_ca.empty()) data[kCaKey] = coordinator_ca;
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata",
           {{"name", CredentialSecretName(meta.value("name", ""))},
            {"namespace", meta.value("namespace", job.at("metadata").value("namespace", ""))},
            {"labels",
             {{kJobLabel, job.at("metadata").value("name", "")}, {kManagedByLabel, kManagedBy}}},
            {"ownerReferences", {owner}}}},
          {"type", "Opaque"},
          {"stringData", data}};
}

std::string NetworkPolicyName(const std::string& job_name) { return job_name + "-vf-workers"; }

json BuildNetworkPolicy(const json& job, int metrics_port, const NetworkPolicySettings& settings) {
  const json& meta = job.at("metadata");
  const std::string name = meta.value("name", "");
  const json workers = {{"matchLabels", {{kJobLabel, name}, {kManagedByLabel, kManagedBy}}}};
  // A peer with a podSelector and no namespaceSelector is a pod of the policy's own namespace.
  json ingress = json::array({{{"from", {{{"podSelector", workers}}}}}});
  if (metrics_port > 0 && settings.metrics_from.is_array() && !settings.metrics_from.empty()) {
    ingress.push_back({{"ports", {{{"port", metrics_port}, {"protocol", "TCP"}}}},
                       {"from", settings.metrics_from}});
  }
  return {{"apiVersion", "networking.k8s.io/v1"},
          {"kind", "NetworkPolicy"},
          {"metadata",
           {{"name", NetworkPolicyName(name)},
            {"namespace", meta.value("namespace", "")},
            {"labels", {{kJobLabel, name}, {kManagedByLabel, kManagedBy}}},
            {"ownerReferences", {OwnerReference(job)}}}},
          {"spec", {{"podSelector", workers}, {"policyTypes", {"Ingress"}}, {"ingress", ingress}}}};
}

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

namespace {

// `over` merged into `base`, key by key, recursively for objects: the template's own security
// context fields win over the operator's defaults.
json MergeObjects(json base, const json& over) {
  if (!over.is_object()) return base;
  for (const auto& [k, v] : over.items()) {
    if (v.is_object() && base.contains(k) && base[k].is_object()) {
      base[k] = MergeObjects(base[k], v);
    } else {
      base[k] = v;
    }
  }
  return base;
}

// The variables that carry the job's facts (worker_env.h's Kind::kFact): the operator sets them,
// a template may not. Other VF_* variables (VF_THREADS, VF_CHECK_EVERY, ...) tune the worker and
// are the template's to set.
bool IsOperatorEnv(const std::string& name) { return worker_env::IsFact(name); }

json EnvValue(const std::string& name, const std::string& value) {
  return {{"name", name}, {"value", value}};
}

json EnvField(const std::string& name, const std::string& field_path) {
  return {{"name", name}, {"valueFrom", {{"fieldRef", {{"fieldPath", field_path}}}}}};
}

// The command and environment: the built-in agent with flags, or the user's program with the
// same facts in VF_* variables (which virtualflow.torch.init() reads).
void SetProgram(json& container, const json& job, const JobSpec& spec, const std::string& pod_name,
                const PodSettings& settings) {
  const json& meta = job.at("metadata");
  const std::string job_id = meta.value("namespace", "") + "/" + meta.value("name", "");
  json env = json::array();
  for (const json& e : ArrayAt(container, "env")) {
    if (!IsOperatorEnv(e.value("name", ""))) env.push_back(e);
  }
  env.push_back(EnvValue(worker_env::kJobSpec.name, AgentManifest(job).dump()));
  env.push_back(EnvField(worker_env::kPodIp.name, "status.podIP"));
  env.push_back(EnvValue(worker_env::kTerminationMessagePath.name, kTerminationMessagePath));
  if (settings.test_agent_protocol > 0) {
    env.push_back(EnvValue(kTestAgentProtocolEnv, std::to_string(settings.test_agent_protocol)));
  }
  if (spec.worker_template.user_program()) {
    container["command"] = spec.worker_template.command;
    if (!spec.worker_template.args.empty()) container["args"] = spec.worker_template.args;
    env.push_back(EnvValue(worker_env::kCoordinator.name, settings.coordinator_url));
    env.push_back(EnvValue(worker_env::kJobId.name, job_id));
    env.push_back(EnvValue(worker_env::kWorker.name, pod_name));
    env.push_back(EnvValue(worker_env::kJobTokenFile.name, kTokenFile));
    env.push_back(EnvValue(worker_env::kMetricsPort.name, std::to_string(settings.metrics_port)));
    if (!settings.coordinator_ca.empty()) {
      env.push_back(EnvValue(worker_env::kCoordinatorCaFile.name, kCaFile));
    }
  } else {
    json args = {"--coordinator", settings.coordinator_url, "--job-id", job_id, "--worker",
                 pod_name,        "--token-file",           kTokenFile};
    if (!settings.coordinator_ca.empty()) {
      args.push_back("--ca-file");
      args.push_back(kCaFile);
    }
    if (settings.metrics_port >= 0) {
      args.push_back("--metrics-port");
      args.push_back(std::to_string(settings.metrics_port));
    }
    container["command"] = {"virtualflow-agent"};
    container["args"] = args;
  }
  container["env"] = env;
}

json Resources(const json& container, const JobSpec& spec) {
  json resources = ObjectAt(container, "resources");
  const std::string accelerator = AcceleratorResource(spec);
  if (!accelerator.empty()) {
    // The container's own count, or gpusPerWorker's nvidia.com/gpu (spec.cc makes them agree).
    resources["limits"][accelerator] = std::to_string(spec.gpus_per_worker);
    if (resources.contains("requests") && resources["requests"].contains(accelerator)) {
      resources["requests"][accelerator] = std::to_string(spec.gpus_per_worker);
    }
  } else {
    // A CPU-only worker asks for what the operator counted it as (see WorkerCpuMillis), so
    // the scheduler and the inventory agree.
    for (const char* part : {"limits", "requests"}) {
      if (resources.contains(part) && resources[part].is_object()) {
        resources[part].erase(kGpuResource);
      }
    }
    const bool has_request = resources.value("requests", json::object()).contains("cpu");
    const bool has_limit = resources.value("limits", json::object()).contains("cpu");
    if (!has_request && !has_limit) resources["requests"]["cpu"] = kDefaultWorkerCpu;
  }
  return resources;
}

// The agent's /healthz (the process answers) and /readyz (joined and warmed up). The startup
// probe gives a program time to import its framework and load its data. The metrics port joins
// the container's own ports (replacing one the template named "metrics").
void SetProbes(json& container, int port) {
  if (port <= 0) return;
  json ports = json::array();
  for (const json& p : ArrayAt(container, "ports")) {
    if (p.value("name", "") != "metrics" && p.value("containerPort", -1) != port) {
      ports.push_back(p);
    }
  }
  ports.push_back({{"name", "metrics"}, {"containerPort", port}});
  container["ports"] = ports;
  auto probe = [&](const char* path, int period, int failures) {
    return json{{"httpGet", {{"path", path}, {"port", "metrics"}}},
                {"periodSeconds", period},
                {"timeoutSeconds", 5},
                {"failureThreshold", failures}};
  };
  container["startupProbe"] = probe("/healthz", 5, 120);
  container["livenessProbe"] = probe("/healthz", 10, 6);
  container["readinessProbe"] = probe("/readyz", 5, 3);
}

const json& TemplateOf(const json& job) { return ObjectAt(ObjectAt(job, "spec"), "template"); }

// The worker container as the template wrote it, patched with what the operator owns.
json Container(const json& job, const JobSpec& spec, const std::string& pod_name,
               const PodSettings& settings) {
  json container = TemplateWorkerContainer(TemplateOf(job));
  if (!container.contains("name")) container["name"] = kWorkerContainer;
  container["image"] = StartingImage(job, settings.default_image);
  SetProgram(container, job, spec, pod_name, settings);
  container["resources"] = Resources(container, spec);
  json mounts = ArrayAt(container, "volumeMounts");
  mounts.push_back({{"name", kTokenVolume}, {"mountPath", kTokenDir}, {"readOnly", true}});
  mounts.push_back({{"name", kShmVolume}, {"mountPath", "/dev/shm"}});
  container["volumeMounts"] = mounts;
  container["securityContext"] = MergeObjects({{"allowPrivilegeEscalation", false},
                                               {"capabilities", {{"drop", {"ALL"}}}},
                                               {"runAsNonRoot", true},
                                               {"seccompProfile", {{"type", "RuntimeDefault"}}}},
                                              ObjectAt(container, "securityContext"));
  container["terminationMessagePath"] = kTerminationMessagePath;
  container["terminationMessagePolicy"] = "FallbackToLogsOnError";
  SetProbes(container, settings.metrics_port);
  return container;
}

// The template's pod spec with the worker container first (so that kubectl logs and exec pick
// it) and the rest in their order, plus what the operator owns.
json PodSpec(const json& job, const JobSpec& spec, const std::string& pod_name, json container,
             const PodSettings& settings, const std::string& gpu_product) {
  const json& tmpl = ObjectAt(TemplateOf(job), "spec");
  json pod_spec = tmpl;
  json containers = json::array({std::move(container)});
  const json& worker = TemplateWorkerContainer(TemplateOf(job));
  for (const json& c : ArrayAt(tmpl, "containers")) {
    if (&c != &worker) containers.push_back(c);
  }
  pod_spec["containers"] = std::move(containers);
  pod_spec["restartPolicy"] = "Never";  // the operator replaces failed workers itself
  // Defaults: the template's own values win.
  if (!tmpl.contains("enableServiceLinks")) pod_spec["enableServiceLinks"] = false;
  if (!tmpl.contains("terminationGracePeriodSeconds")) {
    pod_spec["terminationGracePeriodSeconds"] = settings.termination_grace_seconds;
  }
  // Workers talk to the coordinator with their own token, never to the API server: no token
  // unless the template names a service account (whose own setting then decides).
  if (!tmpl.contains("serviceAccountName") && !tmpl.contains("automountServiceAccountToken")) {
    pod_spec["automountServiceAccountToken"] = false;
  }
  if (!gpu_product.empty() && AcceleratorResource(spec) == kGpuResource) {
    pod_spec["nodeSelector"][kGpuProductLabel] = gpu_product;
  }
  json volumes = ArrayAt(tmpl, "volumes");
  json items = {{{"key", kTokenKey}, {"path", "token"}}};
  if (!settings.coordinator_ca.empty()) items.push_back({{"key", kCaKey}, {"path", kCaKey}});
  volumes.push_back({{"name", kTokenVolume},
                     {"secret",
                      {{"secretName", CredentialSecretName(pod_name)},
                       {"defaultMode", 0444},
                       {"items", items}}}});
  volumes.push_back({{"name", kShmVolume}, {"emptyDir", {{"medium", "Memory"}}}});
  pod_spec["volumes"] = volumes;
  pod_spec["securityContext"] =
      MergeObjects({{"runAsNonRoot", true}, {"seccompProfile", {{"type", "RuntimeDefault"}}}},
                   ObjectAt(tmpl, "securityContext"));
  return pod_spec;
}

}  // namespace

Status ValidateTemplate(const json& job) {
  const json& tmpl = ObjectAt(TemplateOf(job), "spec");
  std::set<std::string> volumes;
  for (const json& v : ArrayAt(tmpl, "volumes")) {
    const std::string name = v.value("name", "");
    if (name.rfind("vf-", 0) == 0) {
      return InvalidArgument("spec.template.spec.volumes: the name " + name +
                             " is the operator's (vf-*); choose another");
    }
    volumes.insert(name);
  }
  const json& worker = TemplateWorkerContainer(TemplateOf(job));
  const std::string where = "spec.template.spec.containers[" + worker.value("name", "") + "]";
  for (const json& m : ArrayAt(worker, "volumeMounts")) {
    const std::string name = m.value("name", "");
    const std::string path = m.value("mountPath", "");
    if (volumes.count(name) == 0) {
      return InvalidArgument(where + ".volumeMounts: " + path + " mounts volume \"" + name +
                             "\", which spec.template.spec.volumes does not have");
    }
    if (path == "/dev/shm" || path.rfind(kTokenDir, 0) == 0) {
      return InvalidArgument(where + ".volumeMounts: " + path +
                             " is the operator's (a memory-backed /dev/shm and the token)");
    }
  }
  for (const json& e : ArrayAt(worker, "env")) {
    if (IsOperatorEnv(e.value("name", ""))) {
      return InvalidArgument(where + ".env: " + e.value("name", "") + " is set by the operator");
    }
  }
  return Status::Ok();
}

json BuildWorkerPod(const json& job, const JobSpec& spec, const std::string& pod_name,
                    const PodSettings& settings, const std::string& gpu_product) {
  const json& meta = job.at("metadata");
  const std::string name = meta.value("name", "");
  const json& tmeta = ObjectAt(TemplateOf(job), "metadata");
  json labels = ObjectAt(tmeta, "labels");
  labels[kJobLabel] = name;
  labels[kManagedByLabel] = kManagedBy;
  labels["app.kubernetes.io/name"] = "virtualflow-agent";
  json metadata = {{"name", pod_name},
                   {"namespace", meta.value("namespace", "")},
                   {"labels", labels},
                   {"ownerReferences", {OwnerReference(job)}}};
  json container = Container(job, spec, pod_name, settings);
  json annotations = ObjectAt(tmeta, "annotations");
  // What kubectl logs and exec pick without -c.
  annotations[kDefaultContainerAnnotation] = container.value("name", "");
  metadata["annotations"] = annotations;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", metadata},
          {"spec", PodSpec(job, spec, pod_name, std::move(container), settings, gpu_product)}};
}

int64_t WorkerCpuMillis(const json& job) {
  const json& res = ObjectAt(TemplateWorkerContainer(TemplateOf(job)), "resources");
  for (const char* part : {"requests", "limits"}) {
    const json& r = res.value(part, json::object());
    if (r.contains("cpu")) {
      const int64_t m = ParseCpuMillis(r.at("cpu"));
      if (m > 0) return m;
    }
  }
  return ParseCpuMillis(json(kDefaultWorkerCpu));
}

json FinalCheckpointLocation(const json& job, const JobSpec& spec) {
  const std::string& path = spec.checkpoint.path;
  if (path.empty()) return nullptr;
  json out = {{"path", path}};
  const json& tmpl = ObjectAt(TemplateOf(job), "spec");
  // The deepest mount of the worker container that holds the path.
  const json* best = nullptr;
  size_t best_len = 0;
  const json& mounts = ArrayAt(TemplateWorkerContainer(TemplateOf(job)), "volumeMounts");
  for (const json& m : mounts) {
    std::string mp = m.value("mountPath", "");
    while (mp.size() > 1 && mp.back() == '/') mp.pop_back();
    const bool under = path == mp || (path.rfind(mp + "/", 0) == 0) || mp == "/";
    if (under && mp.size() >= best_len) {
      best = &m;
      best_len = mp.size();
    }
  }
  if (best == nullptr) return out;
  const std::string volume = best->value("name", "");
  out["volume"] = volume;
  std::string rest = path.substr(std::min(path.size(), best_len));
  while (!rest.empty() && rest.front() == '/') rest.erase(0, 1);
  std::string sub = best->value("subPath", "");
  if (!sub.empty() && !rest.empty()) sub += "/";
  out["subPath"] = sub + rest;
  for (const json& v : ArrayAt(tmpl, "volumes")) {
    if (v.value("name", "") == volume && v.contains("persistentVolumeClaim")) {
      out["claimName"] = v["persistentVolumeClaim"].value("claimName", "");
    }
  }
  return out;
}

PodLife PodLifeOf(const json& pod) {
  // ObjectAt, not value(): this runs for every pod of every job the policy looks at, and a
  // copy of a pod's status and metadata costs more than the rest of it.
  const std::string phase = ObjectAt(pod, "status").value("phase", "");
  if (phase == "Succeeded") return PodLife::kSucceeded;
  if (phase == "Failed") return PodLife::kFailed;
  if (ObjectAt(pod, "metadata").contains("deletionTimestamp")) {
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

std::string StartingImage(const json& job, const std::string& default_image) {
  const json image = TemplateWorkerContainer(TemplateOf(job)).value("image", json());
  return image.is_string() && !image.get<std::string>().empty() ? image.get<std::string>()
                                                                : default_image;
}

std::string PodImage(const json& pod) {
  const json containers = pod.value("spec", json::object()).value("containers", json::array());
  if (!containers.is_array() || containers.empty() || !containers[0].is_object()) return "";
  const json image = containers[0].value("image", json());
  return image.is_string() ? image.get<std::string>() : "";
}

std::string WorkerImage(const json& job, const std::vector<json>& pods,
                        const std::set<std::string>& members, const std::string& default_image) {
  if (members.empty()) return StartingImage(job, default_image);
  const json recorded = job.value("status", json::object()).value("workerImage", json());
  if (recorded.is_string() && !recorded.get<std::string>().empty()) {
    return recorded.get<std::string>();
  }
  // A job an operator without status.workerImage started: its members' pods run its build,
  // whatever their life now; else the oldest pod still live (a pod that ended outside the plan
  // may have been refused for running another image).
  const json* oldest = nullptr;
  for (const json& pod : pods) {
    if (PodImage(pod).empty()) continue;
    const json& meta = pod.value("metadata", json::object());
    if (members.count(meta.value("name", "")) != 0) return PodImage(pod);
    const PodLife life = PodLifeOf(pod);
    if (life != PodLife::kStarting && life != PodLife::kRunning) continue;
    if (oldest == nullptr ||
        meta.value("creationTimestamp", "") <
            oldest->value("metadata", json::object()).value("creationTimestamp", "")) {
      oldest = &pod;
    }
  }
  if (oldest != nullptr) return PodImage(*oldest);
  return StartingImage(job, default_image);
}

namespace {
// The worker container's terminated state, pointing into `pod` itself (json::value() returns
// copies, which would dangle). The worker is the pod's first container (BuildWorkerPod); the
// kubelet lists container statuses by name, so the status is found by its name.
const json* Terminated(const json& pod) {
  auto status = pod.find("status");
  if (status == pod.end() || !status->is_object()) return nullptr;
  auto statuses = status->find("containerStatuses");
  if (statuses == status->end() || !statuses->is_array() || statuses->empty()) return nullptr;
  const json& containers = ArrayAt(ObjectAt(pod, "spec"), "containers");
  const std::string worker =
      containers.empty() || !containers[0].is_object() ? "" : containers[0].value("name", "");
  const json* mine = &(*statuses)[0];
  for (const json& s : *statuses) {
    if (s.is_object() && !worker.empty() && s.value("name", "") == worker) mine = &s;
  }
  const json& first = *mine;
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

namespace {

// `object` less every member not named in `keep`; a value that is not an object is left alone.
void KeepOnly(json& object, std::initializer_list<const char*> keep) {
  if (!object.is_object()) return;
  json kept = json::object();
  for (const char* key : keep) {
    if (object.contains(key)) kept[key] = std::move(object[key]);
  }
  object = std::move(kept);
}

// Each element of the array `object[key]`, if there is one, trimmed to `keep`.
void KeepOnlyInEach(json& object, const char* key, std::initializer_list<const char*> keep) {
  if (!object.is_object() || !object.contains(key)) return;
  json& array = object[key];
  if (!array.is_array()) return;
  for (json& element : array) KeepOnly(element, keep);
}

}  // namespace

void TrimPodForCache(json& pod) {
  if (!pod.is_object()) return;
  KeepOnly(pod, {"apiVersion", "kind", "metadata", "spec", "status"});
  if (pod.contains("metadata")) {
    KeepOnly(pod["metadata"], {"name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                               "labels", "ownerReferences"});
  }
  if (pod.contains("spec")) {
    json& spec = pod["spec"];
    KeepOnly(spec, {"nodeName", "nodeSelector", "containers"});
    KeepOnlyInEach(spec, "containers", {"name", "image", "resources"});
  }
  if (pod.contains("status")) {
    json& status = pod["status"];
    // A failed pod's conditions and init containers are what spec.runPolicy.podFailurePolicy
    // reads; a pod that has not failed changes its conditions often, and they say nothing here.
    if (status.value("phase", json()) == "Failed") {
      KeepOnly(status, {"phase", "reason", "message", "containerStatuses", "initContainerStatuses",
                        "conditions"});
      KeepOnlyInEach(status, "initContainerStatuses", {"name", "state"});
      KeepOnlyInEach(status, "conditions", {"type", "status"});
    } else {
      KeepOnly(status, {"phase", "reason", "message", "containerStatuses"});
    }
    KeepOnlyInEach(status, "containerStatuses", {"name", "state"});
  }
}

}  // namespace vf::controller
