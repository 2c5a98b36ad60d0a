// The pods the operator runs for a VirtualFlowJob: how one is built from the job, and what the
// operator reads back from one. Pure functions of JSON objects.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/policy/membership.h"
#include "runtime/job/spec.h"
#include "runtime/status.h"

namespace vf::controller {

inline constexpr char kJobLabel[] = "virtualflow.io/job";
inline constexpr char kManagedByLabel[] = "app.kubernetes.io/managed-by";
inline constexpr char kManagedBy[] = "virtualflow-operator";
inline constexpr char kTokenKey[] = "token";
// The key of the coordinator's CA certificate in a worker's credential Secret.
inline constexpr char kCaKey[] = "ca.crt";

// What the operator puts into every worker pod besides the job itself. Value type.
struct PodSettings {
  std::string coordinator_url;  // where agents reach the coordinator
  // PEM of the CA the coordinator's certificate chains to, when it serves TLS; empty for plain
  // HTTP. Goes into each worker's credential Secret (never the CA's key).
  std::string coordinator_ca;
  std::string default_image;  // when the job's worker container names no image
  int metrics_port = 9090;    // the agent's /metrics port; < 0: no metrics endpoint
  // Seconds a leaving worker gets to finish its step and acknowledge the plan.
  int termination_grace_seconds = 60;
  // Test-only: the coordinator protocol the workers speak when it is not their build's (an
  // operator posing as one of another protocol, VF_TEST_OPERATOR_PROTOCOL): every pod gets it in
  // kTestAgentProtocolEnv. 0: none, the production setting.
  int64_t test_agent_protocol = 0;
};

// Where the operator mounts what it owns in every worker container.
inline constexpr char kTokenDir[] = "/var/run/virtualflow";
inline constexpr char kTokenFile[] = "/var/run/virtualflow/token";
inline constexpr char kCaFile[] = "/var/run/virtualflow/ca.crt";
// Where a worker that finished the job leaves its final report (the container's
// terminationMessagePath, the kubelet's default; the worker finds it in
// VF_TERMINATION_MESSAGE_PATH): the kubelet copies it into the pod's status, where a restarted
// operator that had not recorded the outcome yet reads it (FinalReportOfPod).
inline constexpr char kTerminationMessagePath[] = "/dev/termination-log";
// Volume names the operator owns; a template may not use them.
inline constexpr char kTokenVolume[] = "vf-token";
inline constexpr char kShmVolume[] = "vf-shm";
// The pod annotation that names the container kubectl logs and exec pick without -c.
inline constexpr char kDefaultContainerAnnotation[] = "kubectl.kubernetes.io/default-container";
// The CPU a worker of a CPU-only job requests when its template says nothing.
inline constexpr char kDefaultWorkerCpu[] = "1";

// How the operator names a job's worker pods: "<job>-worker-" and kWorkerPodSuffixLength
// characters drawn at random from kWorkerPodSuffixAlphabet (no vowels, so that no word is
// spelled by chance).
inline constexpr char kWorkerPodSuffixAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
inline constexpr size_t kWorkerPodSuffixLength = 5;
// Whether `pod_name` is a name the operator gives a worker pod of job `job_name`.
bool IsWorkerPodName(const std::string& job_name, const std::string& pod_name);
// Whether `object` has an owner reference with controller true to the object of `uid`: what the
// operator sets on every object it makes for a job (OwnerReference), and what it takes for a
// sign that an object is its own.
bool ControlledBy(const nlohmann::json& object, const std::string& uid);

// The name of the Secret that holds the credential of the worker in pod `pod_name`: one Secret
// per pod, so that a node's kubelet (which may read only the Secrets of its own pods) never
// holds another worker's credential, and so that the Secret goes with its pod.
std::string CredentialSecretName(const std::string& pod_name);

// The Secret holding `credential`, the credential of the worker in `pod` (as the API server
// returned it, uid included), under key kTokenKey, and the coordinator's CA certificate
// `coordinator_ca` under kCaKey when it is not empty. Owned by the pod, so that the garbage
// collector deletes it with the pod.
nlohmann::json BuildCredentialSecret(const nlohmann::json& job, const nlohmann::json& pod,
                                     const std::string& credential,
                                     const std::string& coordinator_ca = "");

// The job's NetworkPolicy (BuildNetworkPolicy): "<job>-vf-workers". "-vf-workers" ends no pod's
// or Secret's name the operator makes.
std::string NetworkPolicyName(const std::string& job_name);

// Who may reach a job's worker pods besides the job's own pods. Value type.
struct NetworkPolicySettings {
  // NetworkPolicy peers (networking.k8s.io/v1 NetworkPolicyPeer objects) admitted to the
  // workers' metrics port, e.g. the Prometheus pods; an empty array admits none.
  nlohmann::json metrics_from = nlohmann::json::array();
};

// The NetworkPolicy that isolates `job`'s worker pods: it selects them (kJobLabel and
// kManagedByLabel, as BuildWorkerPod sets them) and admits, on every port, only pods with the
// same two labels in the job's namespace (Gloo, NCCL and state transfer pick their ports at run
// time), and on the metrics port `metrics_port` (when > 0) the peers of `settings`. Owned by the
// job (a controller reference), so that it goes with the job. Ingress only: workers still dial
// the coordinator and their data.
nlohmann::json BuildNetworkPolicy(const nlohmann::json& job, int metrics_port,
                                  const NetworkPolicySettings& settings);

// An owner reference to `job` (controller, blocks owner deletion), so that deleting the job
// deletes what it owns.
nlohmann::json OwnerReference(const nlohmann::json& job);

// The manifest an agent trains from: apiVersion, kind, metadata (name, namespace) and spec.
nlohmann::json AgentManifest(const nlohmann::json& job);

// What the CRD's schema cannot say about spec.template: volume names the operator owns (vf-*),
// and in the worker container mounts of volumes that do not exist, a mount at /dev/shm or the
// token directory, environment variables the operator sets (VF_*). InvalidArgument naming the
// field.
Status ValidateTemplate(const nlohmann::json& job);

// The worker pod `pod_name` of `job` (whose parsed spec is `spec`): the job's spec.template (a
// core/v1 PodTemplateSpec) as written, with what the operator owns (docs/crd-reference.md, "The
// worker pods"): name, labels, owner reference, restartPolicy Never (the operator replaces
// failed workers itself), and in the worker container (the one named kWorkerContainer, else the
// first, moved to the front) the command (virtualflow-agent, or the user's program with the job
// in VF_* variables), the worker's own credential as a mounted file (from its Secret,
// BuildCredentialSecret, created once the pod exists), the pod's address for the communicator,
// the accelerator (AcceleratorResource; a CPU request for CPU-only jobs when the template has
// none), a memory-backed /dev/shm, the termination message path, probes on the agent's /healthz
// and /readyz, and a security context that passes the restricted Pod Security Standard (the
// template's fields win; the pod's likewise). The grace period and the service account token
// setting are defaults the template may set. `gpu_product` non-empty pins a pod of
// nvidia.com/gpu to nodes of that nvidia.com/gpu.product.
nlohmann::json BuildWorkerPod(const nlohmann::json& job, const JobSpec& spec,
                              const std::string& pod_name, const PodSettings& settings,
                              const std::string& gpu_product = "");

// The image a job would start its workers on now: the worker container's, else `default_image`
// (the operator's --agent-image, the chart's default agent image).
std::string StartingImage(const nlohmann::json& job, const std::string& default_image);

// The image of the job's workers, which every new pod of the job runs. A job that trains keeps
// the build it started with, since its workers must all run one build (the coordinator refuses
// a worker of another one), whatever the operator's default image has become since (an
// upgrade) and whatever its template's image says now: it is status.workerImage, recorded
// with the job's first pods; for a job whose pods an operator without that field made, the
// image of its pods (a pod of a plan member first, else the oldest live pod). A job without
// members in its plan (`members` empty: none trains yet, or none is left, as after a resume)
// has no build to keep, and starts on StartingImage: a corrected image is taken, and a job
// suspended and resumed moves to the image of then.
std::string WorkerImage(const nlohmann::json& job, const std::vector<nlohmann::json>& pods,
                        const std::set<std::string>& members, const std::string& default_image);

// The image of a pod's first container (the worker's); empty if it names none.
std::string PodImage(const nlohmann::json& pod);

// The CPU one worker of a CPU-only job requests, in millicores (the worker container's request,
// else its limit, else kDefaultWorkerCpu).
int64_t WorkerCpuMillis(const nlohmann::json& job);

// Where the final checkpoint (the trained weights) of `job` is, for status.finalCheckpoint:
// {path, and when a volume the worker container mounts holds it: volume, claimName (a PVC),
// subPath}; null when
// the job writes no checkpoint.
nlohmann::json FinalCheckpointLocation(const nlohmann::json& job, const JobSpec& spec);

// What the operator's cache of pods keeps of a pod: the fields the operator reads (the GPU
// inventory, the reconciler, the change handler), and nothing else. The cache mirrors every pod
// of the cluster, and most of a pod (managedFields, annotations, env, volumes, probes,
// conditions) is never read: dropping it bounds the operator's memory by the number of pods
// rather than their size, and spares a reconcile for a change of a field nobody reads. Kept:
//   metadata: name, namespace, uid, creationTimestamp, deletionTimestamp, labels,
//             ownerReferences (not resourceVersion: a pod whose kept fields are unchanged is
//             the same pod to the cache, and queues no reconcile);
//   spec:     nodeName, nodeSelector, and of each container name, image and resources;
//   status:   phase, reason, message, and of each container status name and state; of a failed
//             pod also each init container's and each condition's type and status (what
//             spec.runPolicy.podFailurePolicy reads).
// A field read from a pod must be added here (worker_pod_test checks the list).
void TrimPodForCache(nlohmann::json& pod);

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
