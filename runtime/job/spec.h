// The VirtualFlowJob manifest (docs/architecture.md): the same YAML file that `vf run` reads
// locally is later `kubectl apply`-ed unchanged. Parsed once into JobSpec, which every part uses
// (the agent, `vf run`, the operator, the simulator): the defaults below are the only statement
// of each default (crds/virtualflowjob.yaml restates them for the API server, and
// crd_test.cc checks that it does so faithfully).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace vf {

inline constexpr char kJobApiVersion[] = "virtualflow.io/v1alpha1";
inline constexpr char kJobKind[] = "VirtualFlowJob";

struct ModelSpec {
  std::string name = "mlp";  // known: mlp
  std::vector<int> hidden_sizes = {512, 256};

  bool operator==(const ModelSpec&) const = default;
};

struct DatasetSpec {
  std::string name = "fashion-mnist";                      // known: fashion-mnist, synthetic
  std::string path = "/usr/share/datasets/fashion-mnist";  // fashion-mnist only
  int64_t train_samples = 8192;                            // synthetic only
  int64_t test_samples = 1024;                             // synthetic only

  bool operator==(const DatasetSpec&) const = default;
};

struct OptimizerSpec {
  std::string name = "sgd";  // known: sgd, adamw
  double learning_rate = 0.05;
  double momentum = 0.9;  // sgd
  bool nesterov = false;  // sgd
  double weight_decay = 0.0;
  double beta1 = 0.9;     // adamw
  double beta2 = 0.999;   // adamw
  double epsilon = 1e-8;  // adamw

  bool operator==(const OptimizerSpec&) const = default;
};

enum class Reduction { kExact, kFast };

struct ElasticitySpec {
  std::string policy = "elastic";
  int cooldown_seconds = 30;

  bool operator==(const ElasticitySpec&) const = default;
};

struct CheckpointSpec {
  std::string path;         // empty: no checkpoints
  int64_t every_steps = 0;  // 0: only at the end

  bool operator==(const CheckpointSpec&) const = default;
};

// batch/v1 Job's default for spec.backoffLimit: the worker failures a job survives.
inline constexpr int kDefaultBackoffLimit = 6;

// spec.runPolicy.cleanPodPolicy, with the meaning of Kubeflow's training operators: which pods
// of a finished job the operator deletes. kNone (keep them all, for their logs) is the default.
enum class CleanPodPolicy { kNone, kRunning, kAll };

// What a rule of spec.runPolicy.podFailurePolicy does with a failed worker pod it matches.
enum class PodFailureAction {
  kFailJob,  // the job fails at once (reason PodFailurePolicy)
  kIgnore,   // not counted against backoffLimit; the pod is replaced
  kCount,    // counted against backoffLimit, as a pod no rule matches
};

// onExitCodes of a pod failure rule (batch/v1's shape): the rule matches when a container (the
// one named, or any) terminated with a non-zero exit code that is In / NotIn `values`.
struct ExitCodeRequirement {
  std::string container_name;  // empty: any container
  bool in = true;              // operator In (true) or NotIn (false)
  std::vector<int> values;

  bool operator==(const ExitCodeRequirement&) const = default;
};

// One of onPodConditions: the rule matches a pod with a condition of this type and status.
struct PodConditionPattern {
  std::string type;  // e.g. DisruptionTarget
  std::string status = "True";

  bool operator==(const PodConditionPattern&) const = default;
};

// A rule of spec.runPolicy.podFailurePolicy.rules: exactly one of the two requirements is set.
struct PodFailureRule {
  PodFailureAction action = PodFailureAction::kCount;
  std::optional<ExitCodeRequirement> on_exit_codes;
  std::vector<PodConditionPattern> on_pod_conditions;

  bool operator==(const PodFailureRule&) const = default;
};

// spec.runPolicy, as batch/v1 Job has it: when the operator gives up on a job, what it does with
// the pods of a finished one, and when it deletes it. The operator acts on it; `vf run` ignores
// it.
// The spec.managedBy of a job the VirtualFlow operator runs (the default, as an empty one).
inline constexpr char kVirtualFlowManager[] = "virtualflow.io/operator";

struct RunPolicySpec {
  int backoff_limit = kDefaultBackoffLimit;        // counted worker failures tolerated (>= 0)
  std::optional<int64_t> active_deadline_seconds;  // from status.startTime (>= 1); unset: none
  // From the moment the job finished (its Complete or Failed condition); unset: kept.
  std::optional<int> ttl_seconds_after_finished;
  CleanPodPolicy clean_pod_policy = CleanPodPolicy::kNone;
  std::vector<PodFailureRule> pod_failure_rules;  // first match wins; none: every failure counts

  bool operator==(const RunPolicySpec&) const = default;
};

// The container of spec.template (a core/v1 PodTemplateSpec) that runs the worker: the one named
// kWorkerContainer, else the first. The operator patches it with what it owns.
inline constexpr char kWorkerContainer[] = "worker";
// What spec.gpusPerWorker asks for when the worker container names no extended resource.
inline constexpr char kNvidiaGpu[] = "nvidia.com/gpu";

// What `vf run` and the operator both read of spec.template (the rest is the operator's alone):
// the worker container's program, empty for the built-in model (the virtualflow-agent binary
// trains it), otherwise the user's own training program (command and args, as in a Pod), which
// joins the job through the virtualflow Python package; and the accelerator it asks for.
struct TemplateSpec {
  std::vector<std::string> command;
  std::vector<std::string> args;
  // The extended resource (nvidia.com/gpu, nvidia.com/mig-1g.10gb, amd.com/gpu, ...) that the
  // worker container's resources name, JobSpec::gpus_per_worker of it a worker; empty when they
  // name none (then gpusPerWorker asks for kNvidiaGpu).
  std::string accelerator;

  bool user_program() const { return !command.empty(); }
  bool operator==(const TemplateSpec&) const = default;
};

// A validated job. Value type; thread-compatible.
struct JobSpec {
  std::string name;
  std::string namespace_name = "default";
  int virtual_nodes = 0;
  int64_t global_batch_size = 0;
  int replicas_min = 1;
  int replicas_max = 1;
  // spec.replicas.desired, the scale subresource's size: when set, the job runs on at most this
  // many workers (min <= desired <= max). Not part of the fingerprint.
  std::optional<int> replicas_desired;
  int gpus_per_worker = 1;
  ModelSpec model;
  DatasetSpec dataset;
  OptimizerSpec optimizer;
  int64_t steps = 0;  // exactly one of steps and epochs is set (> 0)
  int64_t epochs = 0;
  Reduction reduction = Reduction::kExact;
  uint64_t seed = 0;
  ElasticitySpec elasticity;
  CheckpointSpec checkpoint;
  TemplateSpec worker_template;
  RunPolicySpec run_policy;  // not part of the fingerprint: it does not change the training
  // spec.suspend, as batch/v1 Job has it: while true the operator keeps no worker pods; set back
  // to false, the job resumes from its checkpoint. Not part of the fingerprint; `vf run` refuses
  // a suspended job (there is nothing to run).
  bool suspend = false;
  // spec.managedBy, as batch/v1 Job has it: the controller that runs the job on Kubernetes.
  // Empty or kVirtualFlowManager: the VirtualFlow operator; anything else (MultiKueue's
  // "kueue.x-k8s.io/multikueue", which runs it on another cluster) and the operator leaves the
  // job alone. `vf run` ignores it.
  std::string managed_by;

  int64_t micro_batch() const { return global_batch_size / virtual_nodes; }
  // Hex digest of every field that defines the training math (virtual nodes, batch, model,
  // dataset identity, optimizer, reduction, seed, and the user's program if there is one) and
  // nothing else: two workers may train
  // together, and a checkpoint may be resumed, only when the fingerprints match.
  std::string Fingerprint() const;

  bool operator==(const JobSpec&) const = default;
};

// The job's length in steps: spec.steps, or spec.epochs epochs of a training set of
// `train_samples` samples, each epoch floor(train_samples / globalBatchSize) steps (the sharder
// drops the tail that does not fill a step). Only whoever loaded the data knows its size: the
// agents report the result to the coordinator. 0 when the length depends on the training set and
// `train_samples` is 0 (unknown).
int64_t TotalSteps(const JobSpec& job, int64_t train_samples);

// Largest supported virtualNodes: the exact reducer sums up to this many fixed-point values
// per element without overflowing int64 (see runtime/reduce/exact.h).
inline constexpr int kMaxVirtualNodes = 4096;

const char* ReductionName(Reduction r);

// The extended resource each worker of `job` asks for (gpus_per_worker of it): the template's
// accelerator, else kNvidiaGpu; empty for a CPU-only job.
std::string AcceleratorResource(const JobSpec& job);

// Parses and validates a VirtualFlowJob manifest. Errors are one line that names the source
// and the field: "job.yaml: spec.globalBatchSize (250) must be divisible by spec.virtualNodes
// (8)". Unknown fields under spec are errors (as with kubectl's strict validation).
Result<JobSpec> ParseJobYaml(const std::string& text, const std::string& source);
// The same for a manifest already in memory as a YAML tree (the operator's, converted from the
// API server's JSON): scalars are typed as in a file, quoted or tagged !!str ones are text.
Result<JobSpec> ParseJobNode(const YAML::Node& manifest, const std::string& source);
Result<JobSpec> LoadJobFile(const std::string& path);
// Validation alone (used after programmatic overrides).
Status ValidateJob(const JobSpec& job);

}  // namespace vf
