#include "runtime/job/spec.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace vf {
namespace {

// Builds a manifest from a minimal valid spec plus per-test edits. Each edit replaces the
// spec field of that name (kRemove deletes it) or, for a new name, appends it. Values are YAML
// text, flow style for maps and lists.
constexpr const char* kRemove = "<remove>";
using Edits = std::vector<std::pair<std::string, std::string>>;

std::string Manifest(const Edits& edits, const std::string& metadata = "{name: test}") {
  Edits spec = {{"virtualNodes", "8"}, {"globalBatchSize", "256"}, {"steps", "10"}};
  for (const auto& [key, value] : edits) {
    bool replaced = false;
    for (auto& field : spec) {
      if (field.first == key) {
        field.second = value;
        replaced = true;
      }
    }
    if (!replaced) spec.emplace_back(key, value);
  }
  std::string text =
      "apiVersion: virtualflow.io/v1alpha1\nkind: VirtualFlowJob\nmetadata: " + metadata +
      "\nspec:\n";
  for (const auto& [key, value] : spec) {
    if (value != kRemove) text += "  " + key + ": " + value + "\n";
  }
  return text;
}

JobSpec MustParse(const std::string& text) {
  Result<JobSpec> job = ParseJobYaml(text, "job.yaml");
  EXPECT_TRUE(job.ok()) << job.status().message() << "\n" << text;
  return job.ok() ? job.value() : JobSpec{};
}

TEST(JobSpecTest, ExampleFileParsesToItsValues) {
  Result<JobSpec> job = LoadJobFile(std::string(VF_SOURCE_DIR) + "/examples/fashion-mnist.yaml");
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->name, "fashion-mnist");
  EXPECT_EQ(job->namespace_name, "default");
  EXPECT_EQ(job->virtual_nodes, 8);
  EXPECT_EQ(job->global_batch_size, 256);
  EXPECT_EQ(job->micro_batch(), 32);
  EXPECT_EQ(job->replicas_min, 1);
  EXPECT_EQ(job->replicas_max, 4);
  EXPECT_EQ(job->gpus_per_worker, 1);
  EXPECT_EQ(job->model.name, "mlp");
  EXPECT_EQ(job->model.hidden_sizes, (std::vector<int>{512, 256}));
  EXPECT_EQ(job->dataset.name, "fashion-mnist");
  EXPECT_EQ(job->dataset.path, "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(job->optimizer.name, "sgd");
  EXPECT_DOUBLE_EQ(job->optimizer.learning_rate, 0.05);
  EXPECT_DOUBLE_EQ(job->optimizer.momentum, 0.9);
  EXPECT_DOUBLE_EQ(job->optimizer.weight_decay, 0.0001);
  EXPECT_FALSE(job->optimizer.nesterov);
  EXPECT_EQ(job->steps, 0);
  EXPECT_EQ(job->epochs, 8);
  EXPECT_EQ(TotalSteps(*job, 2560), 8 * 10);
  EXPECT_EQ(job->reduction, Reduction::kExact);
  EXPECT_EQ(job->seed, 42u);
  EXPECT_EQ(job->elasticity.policy, "elastic");
  EXPECT_EQ(job->elasticity.cooldown_seconds, 30);
  EXPECT_EQ(job->checkpoint.path, "");
  EXPECT_EQ(job->checkpoint.every_steps, 0);
}

TEST(JobSpecTest, OmittedFieldsTakeTheHeaderDefaults) {
  const JobSpec job = MustParse(Manifest({}));
  const JobSpec defaults;
  EXPECT_EQ(job.name, "test");
  EXPECT_EQ(job.namespace_name, "default");
  EXPECT_EQ(job.replicas_min, 1);
  EXPECT_EQ(job.replicas_max, 1);
  EXPECT_EQ(job.gpus_per_worker, 1);
  EXPECT_EQ(job.model.name, "mlp");
  EXPECT_EQ(job.model.hidden_sizes, defaults.model.hidden_sizes);
  EXPECT_EQ(job.dataset.name, "fashion-mnist");
  EXPECT_EQ(job.dataset.path, defaults.dataset.path);
  EXPECT_EQ(job.optimizer.name, "sgd");
  EXPECT_EQ(job.optimizer.learning_rate, defaults.optimizer.learning_rate);
  EXPECT_EQ(job.optimizer.momentum, defaults.optimizer.momentum);
  EXPECT_EQ(job.optimizer.beta1, defaults.optimizer.beta1);
  EXPECT_EQ(job.optimizer.beta2, defaults.optimizer.beta2);
  EXPECT_EQ(job.optimizer.epsilon, defaults.optimizer.epsilon);
  EXPECT_EQ(job.steps, 10);
  EXPECT_EQ(job.epochs, 0);
  EXPECT_EQ(job.reduction, Reduction::kExact);
  EXPECT_EQ(job.seed, 0u);
  EXPECT_EQ(job.elasticity.policy, "elastic");
  EXPECT_EQ(job.elasticity.cooldown_seconds, 30);
  // No run policy: batch/v1's backoffLimit, no limit on time, and a finished job and its pods
  // stay.
  EXPECT_EQ(job.run_policy.backoff_limit, kDefaultBackoffLimit);
  EXPECT_EQ(kDefaultBackoffLimit, 6);
  EXPECT_EQ(job.run_policy.clean_pod_policy, CleanPodPolicy::kNone);
  EXPECT_TRUE(job.run_policy.pod_failure_rules.empty());
  EXPECT_FALSE(job.replicas_desired.has_value());
  EXPECT_FALSE(job.run_policy.active_deadline_seconds.has_value());
  EXPECT_FALSE(job.run_policy.ttl_seconds_after_finished.has_value());
  EXPECT_FALSE(job.suspend);
}

TEST(JobSpecTest, ReplicasDefaultFromWhicheverBoundIsGiven) {
  JobSpec job = MustParse(Manifest({{"replicas", "{min: 3}"}}));
  EXPECT_EQ(job.replicas_min, 3);
  EXPECT_EQ(job.replicas_max, 3);
  job = MustParse(Manifest({{"replicas", "{max: 6}"}}));
  EXPECT_EQ(job.replicas_min, 1);
  EXPECT_EQ(job.replicas_max, 6);
  job = MustParse(Manifest({{"replicas", "{min: 2, max: 8}"}}));
  EXPECT_EQ(job.replicas_min, 2);
  EXPECT_EQ(job.replicas_max, 8);
  job = MustParse(Manifest({{"replicas", "{min: 2, max: 8, desired: 5}"}}));
  EXPECT_EQ(job.replicas_desired, 5);
}

TEST(JobSpecTest, ReadsThePodFailurePolicyAndCleanPodPolicy) {
  const JobSpec job = MustParse(
      Manifest({{"runPolicy",
                 "{cleanPodPolicy: Running, podFailurePolicy: {rules: ["
                 "{action: FailJob, onExitCodes: {containerName: worker, operator: In, "
                 "values: [42, 43]}}, "
                 "{action: Ignore, onPodConditions: [{type: DisruptionTarget}]}, "
                 "{action: Count, onExitCodes: {operator: NotIn, values: [0, 1]}}, "
                 "{action: Ignore, onPodConditions: [{type: Ready, status: 'False'}]}]}}"}}));
  const RunPolicySpec& run = job.run_policy;
  EXPECT_EQ(run.clean_pod_policy, CleanPodPolicy::kRunning);
  ASSERT_EQ(run.pod_failure_rules.size(), 4u);
  const PodFailureRule& fail = run.pod_failure_rules[0];
  EXPECT_EQ(fail.action, PodFailureAction::kFailJob);
  ASSERT_TRUE(fail.on_exit_codes.has_value());
  EXPECT_EQ(fail.on_exit_codes->container_name, "worker");
  EXPECT_TRUE(fail.on_exit_codes->in);
  EXPECT_EQ(fail.on_exit_codes->values, (std::vector<int>{42, 43}));
  const PodFailureRule& ignore = run.pod_failure_rules[1];
  EXPECT_EQ(ignore.action, PodFailureAction::kIgnore);
  EXPECT_FALSE(ignore.on_exit_codes.has_value());
  EXPECT_EQ(ignore.on_pod_conditions,
            (std::vector<PodConditionPattern>{{"DisruptionTarget", "True"}}));
  EXPECT_EQ(run.pod_failure_rules[2].action, PodFailureAction::kCount);
  EXPECT_FALSE(run.pod_failure_rules[2].on_exit_codes->in);
  EXPECT_EQ(run.pod_failure_rules[3].on_pod_conditions[0].status, "False");
  EXPECT_EQ(
      MustParse(Manifest({{"runPolicy", "{cleanPodPolicy: All}"}})).run_policy.clean_pod_policy,
      CleanPodPolicy::kAll);
}

TEST(JobSpecTest, ReadsEveryField) {
  const JobSpec job = MustParse(Manifest(
      {{"virtualNodes", "16"},
       {"globalBatchSize", "512"},
       {"replicas", "{min: 2, max: 16}"},
       {"gpusPerWorker", "0"},
       {"model", "{name: mlp, hiddenSizes: [1024, 64, 32]}"},
       {"dataset", "{name: synthetic, trainSamples: 4096, testSamples: 128}"},
       {"optimizer",
        "{name: adamw, learningRate: 1e-3, momentum: 0.5, nesterov: true, weightDecay: 0.01, "
        "beta1: 0.8, beta2: 0.99, epsilon: 1.0e-6}"},
       {"steps", kRemove},
       {"epochs", "3"},
       {"reduction", "fast"},
       {"seed", "9223372036854775807"},
       {"elasticity", "{policy: autoscale, cooldownSeconds: 0}"},
       {"checkpoint", "{path: /tmp/ckpt, everySteps: 50}"},
       {"runPolicy", "{backoffLimit: 0, activeDeadlineSeconds: 3600, ttlSecondsAfterFinished: 0}"},
       {"suspend", "true"}},
      "{name: a-1, namespace: team-x, labels: {app: x}, annotations: {note: 'hi'}}"));
  EXPECT_EQ(job.name, "a-1");
  EXPECT_EQ(job.namespace_name, "team-x");
  EXPECT_EQ(job.virtual_nodes, 16);
  EXPECT_EQ(job.global_batch_size, 512);
  EXPECT_EQ(job.replicas_min, 2);
  EXPECT_EQ(job.replicas_max, 16);
  EXPECT_EQ(job.gpus_per_worker, 0);
  EXPECT_EQ(job.model.hidden_sizes, (std::vector<int>{1024, 64, 32}));
  EXPECT_EQ(job.dataset.name, "synthetic");
  EXPECT_EQ(job.dataset.train_samples, 4096);
  EXPECT_EQ(job.dataset.test_samples, 128);
  EXPECT_EQ(job.optimizer.name, "adamw");
  EXPECT_DOUBLE_EQ(job.optimizer.learning_rate, 1e-3);
  EXPECT_DOUBLE_EQ(job.optimizer.momentum, 0.5);
  EXPECT_TRUE(job.optimizer.nesterov);
  EXPECT_DOUBLE_EQ(job.optimizer.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(job.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(job.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(job.optimizer.epsilon, 1e-6);
  EXPECT_EQ(job.steps, 0);
  EXPECT_EQ(job.epochs, 3);
  EXPECT_EQ(job.reduction, Reduction::kFast);
  EXPECT_EQ(job.seed, 9223372036854775807u);
  EXPECT_EQ(job.elasticity.policy, "autoscale");
  EXPECT_EQ(job.elasticity.cooldown_seconds, 0);
  EXPECT_EQ(job.checkpoint.path, "/tmp/ckpt");
  EXPECT_EQ(job.checkpoint.every_steps, 50);
  EXPECT_EQ(job.run_policy.backoff_limit, 0);
  EXPECT_EQ(job.run_policy.active_deadline_seconds, 3600);
  EXPECT_EQ(job.run_policy.ttl_seconds_after_finished, 0);
  EXPECT_TRUE(job.suspend);
}

TEST(JobSpecTest, ManagedByNamesTheControllerAndIsNotTheTrainingMath) {
  EXPECT_EQ(MustParse(Manifest({})).managed_by, "");
  const JobSpec elsewhere = MustParse(Manifest({{"managedBy", "kueue.x-k8s.io/multikueue"}}));
  EXPECT_EQ(elsewhere.managed_by, "kueue.x-k8s.io/multikueue");
  // Where a job runs changes nothing of what it computes.
  EXPECT_EQ(elsewhere.Fingerprint(), MustParse(Manifest({})).Fingerprint());
  EXPECT_FALSE(ParseJobYaml(Manifest({{"managedBy", "[a]"}}), "job.yaml").ok());
}

// spec.template as a pod template whose only container is `container` (flow YAML).
std::string PodTemplate(const std::string& container, const std::string& pod_fields = "") {
  return "{metadata: {labels: {a: b}}, spec: {" + pod_fields + "containers: [" + container + "]}}";
}

TEST(JobSpecTest, TemplateIsAPodTemplateWhoseRestIsTheOperators) {
  const JobSpec job = MustParse(Manifest(
      {{"template", PodTemplate("{name: worker, image: 'x:1', env: [{name: A, value: '1'}], "
                                "anythingElse: {deep: [1, 2, {x: y}]}}",
                                "nodeSelector: {a: b}, tolerations: [{key: k, operator: Exists}], "
                                "initContainers: [{name: init, image: busybox}], ")}}));
  EXPECT_EQ(job.virtual_nodes, 8);
  EXPECT_FALSE(job.worker_template.user_program());
  EXPECT_EQ(job.gpus_per_worker, 1);
  EXPECT_EQ(AcceleratorResource(job), "nvidia.com/gpu");
}

TEST(JobSpecTest, TemplateCommandAndArgsNameTheUsersProgram) {
  const JobSpec builtin = MustParse(Manifest({}));
  EXPECT_FALSE(builtin.worker_template.user_program());
  const JobSpec job = MustParse(Manifest(
      {{"template", PodTemplate("{name: worker, image: 'x:1', command: [python3, train.py], "
                                "args: ['--lr', '3']}")}}));
  EXPECT_TRUE(job.worker_template.user_program());
  EXPECT_EQ(job.worker_template.command, (std::vector<std::string>{"python3", "train.py"}));
  EXPECT_EQ(job.worker_template.args, (std::vector<std::string>{"--lr", "3"}));
}

TEST(JobSpecTest, TheProgramIsTheWorkerContainersElseTheFirsts) {
  const std::string sidecar = "{name: sidecar, image: s, command: [sleep, inf]}";
  const JobSpec named = MustParse(Manifest(
      {{"template", PodTemplate(sidecar + ", {name: worker, image: w, command: [train]}")}}));
  EXPECT_EQ(named.worker_template.command, (std::vector<std::string>{"train"}));
  const JobSpec first = MustParse(Manifest(
      {{"template", PodTemplate(sidecar + ", {name: other, image: w, command: [train]}")}}));
  EXPECT_EQ(first.worker_template.command, (std::vector<std::string>{"sleep", "inf"}));
}

TEST(JobSpecTest, TheUsersProgramIsPartOfTheFingerprintAndTheBuiltInsIsUnchanged) {
  const auto print = [](const std::string& container) {
    return MustParse(Manifest({{"template", PodTemplate(container)}})).Fingerprint();
  };
  const std::string builtin = MustParse(Manifest({})).Fingerprint();
  EXPECT_EQ(print("{name: worker, image: 'x:2'}"), builtin);
  const std::string a = print("{name: worker, command: [python3, a.py]}");
  const std::string b = print("{name: worker, command: [python3, b.py]}");
  const std::string a_args = print("{name: worker, command: [python3, a.py], args: [x]}");
  EXPECT_NE(a, builtin);
  EXPECT_NE(a, b);
  EXPECT_NE(a, a_args);
}

// The first error of a job whose template is `tmpl`.
std::string TemplateError(const std::string& tmpl, const std::string& more = "") {
  Result<JobSpec> job = ParseJobYaml(Manifest({{"template", tmpl}}) + more, "job.yaml");
  EXPECT_FALSE(job.ok()) << tmpl;
  return job.ok() ? std::string() : job.status().message();
}

TEST(JobSpecTest, ABadTemplateCommandIsAOneLineErrorNamingTheField) {
  const auto error = [](const std::string& container) {
    return TemplateError(PodTemplate(container));
  };
  const std::string c = "spec.template.spec.containers[0].";
  EXPECT_NE(error("{name: worker, command: python3}").find(c + "command"), std::string::npos);
  EXPECT_NE(error("{name: worker, command: [python3, {a: b}]}").find(c + "command[1]"),
            std::string::npos);
  EXPECT_NE(error("{name: worker, args: [x]}").find("needs " + c + "command"), std::string::npos);
  EXPECT_NE(error("{name: worker, command: ['']}").find("must not be empty"), std::string::npos);
  EXPECT_NE(TemplateError("[a]").find("spec.template"), std::string::npos);
  EXPECT_NE(TemplateError("{spec: {containers: {name: a}}}").find("spec.template.spec.containers"),
            std::string::npos);
  EXPECT_NE(TemplateError("{metadata: {}, specs: {}}").find("spec.template.specs: unknown field"),
            std::string::npos);
}

TEST(JobSpecTest, TheFlattenedTemplateIsRefusedWithTheNewForm) {
  for (const char* old : {"{image: 'x:1'}", "{command: [python3, a.py]}",
                          "{metadata: {}, podSecurityContext: {fsGroup: 1}}",
                          "{spec: {containers: [{name: worker}]}, volumes: []}"}) {
    const std::string error = TemplateError(old);
    EXPECT_NE(error.find("spec.template is a pod template now"), std::string::npos) << error;
    EXPECT_NE(error.find("spec.template.spec.containers"), std::string::npos) << error;
  }
}

TEST(JobSpecTest, TheWorkerContainersExtendedResourceIsTheAccelerator) {
  const auto job = [](const std::string& resources, const std::string& more = "") {
    return MustParse(
        Manifest({{"template", PodTemplate("{name: worker, resources: " + resources + "}")}}) +
        more);
  };
  const JobSpec mig = job("{limits: {nvidia.com/mig-1g.10gb: 2, cpu: '4', memory: 8Gi}}");
  EXPECT_EQ(mig.gpus_per_worker, 2);
  EXPECT_EQ(AcceleratorResource(mig), "nvidia.com/mig-1g.10gb");
  const JobSpec amd = job("{requests: {amd.com/gpu: '1'}, limits: {amd.com/gpu: '1'}}");
  EXPECT_EQ(amd.gpus_per_worker, 1);
  EXPECT_EQ(AcceleratorResource(amd), "amd.com/gpu");
  // hugepages, cpu and kubernetes.io resources are no accelerator: gpusPerWorker decides.
  const JobSpec none = job("{limits: {hugepages-2Mi: 1Gi, cpu: 1}}");
  EXPECT_EQ(none.gpus_per_worker, 1);
  EXPECT_EQ(AcceleratorResource(none), "nvidia.com/gpu");
  // The same count in gpusPerWorker agrees; none at all is a CPU-only job.
  EXPECT_EQ(job("{limits: {nvidia.com/gpu: 4}}", "  gpusPerWorker: 4\n").gpus_per_worker, 4);
  const JobSpec cpu = MustParse(Manifest({{"gpusPerWorker", "0"}}));
  EXPECT_EQ(AcceleratorResource(cpu), "");
}

TEST(JobSpecTest, AnAcceleratorThatDisagreesWithGpusPerWorkerIsRefused) {
  const auto error = [](const std::string& resources, const std::string& more = "") {
    return TemplateError(PodTemplate("{name: worker, resources: " + resources + "}"), more);
  };
  EXPECT_NE(error("{limits: {nvidia.com/mig-1g.10gb: 1}}", "  gpusPerWorker: 2\n")
                .find("spec.gpusPerWorker (2) disagrees with "
                      "spec.template.spec.containers[0].resources.limits.nvidia.com/"
                      "mig-1g.10gb (1)"),
            std::string::npos);
  EXPECT_NE(error("{limits: {nvidia.com/gpu: 1, amd.com/gpu: 1}}")
                .find("names several extended resources (amd.com/gpu, nvidia.com/gpu)"),
            std::string::npos);
  EXPECT_NE(error("{requests: {nvidia.com/gpu: 1}, limits: {nvidia.com/gpu: 2}}")
                .find("request must equal its limit"),
            std::string::npos);
  EXPECT_NE(error("{limits: {nvidia.com/gpu: 500m}}").find("whole units"), std::string::npos);
}

TEST(JobSpecTest, AcceptsWhatTheApiServerAccepts) {
  // Quoted text for string fields, YAML 1.1 booleans, integers for numbers, nulls as absent.
  JobSpec job = MustParse(Manifest({{"optimizer", "{name: 'sgd', nesterov: yes, learningRate: 1}"},
                                    {"seed", "~"},
                                    {"dataset", "{name: \"fashion-mnist\", path: '/d'}"}}));
  EXPECT_TRUE(job.optimizer.nesterov);
  EXPECT_EQ(job.optimizer.learning_rate, 1.0);
  EXPECT_EQ(job.seed, 0u);
  EXPECT_EQ(job.dataset.path, "/d");

  // The JSON the API server returns, with a status and server-set metadata, and an empty
  // leading document.
  job = MustParse(R"(---
{"apiVersion": "virtualflow.io/v1alpha1", "kind": "VirtualFlowJob",
 "metadata": {"name": "j", "namespace": "ns", "uid": "1234", "generation": 2},
 "spec": {"virtualNodes": 4, "globalBatchSize": 64, "epochs": 1,
          "optimizer": {"learningRate": 0.1}},
 "status": {"phase": "Running", "step": 10}})");
  EXPECT_EQ(job.name, "j");
  EXPECT_EQ(job.namespace_name, "ns");
  EXPECT_EQ(job.virtual_nodes, 4);
  EXPECT_EQ(job.epochs, 1);
  EXPECT_DOUBLE_EQ(job.optimizer.learning_rate, 0.1);
}

struct ErrorCase {
  std::string name;
  std::string text;
  StatusCode code;
  std::vector<std::string> expected;  // substrings of the message
};

// Names the case in test output instead of dumping its bytes.
void PrintTo(const ErrorCase& c, std::ostream* os) { *os << c.name; }

std::vector<ErrorCase> ErrorCases() {
  const StatusCode kBad = StatusCode::kInvalidArgument;
  const std::string kHead = "apiVersion: virtualflow.io/v1alpha1\nkind: VirtualFlowJob\n";
  return {
      // Document structure.
      {"MalformedYamlHasLineAndColumn",
       "a: b: c\n",
       kBad,
       {"job.yaml: malformed YAML at line 1, column 5: "}},
      {"MalformedYamlLaterLine",
       Manifest({{"model", "{name: mlp, hiddenSizes: [1, 2}"}}),
       kBad,
       {"malformed YAML at line ", ", column "}},
      // yaml-cpp 0.7's LoadAll never returned on these (found by spec_fuzz).
      {"LoneFlowEntry", ",", kBad, {"malformed YAML at line 1, column 1: unexpected ','"}},
      {"TagBeforeFlowEntry",
       "# a job\n!tag ,\n",
       kBad,
       {"malformed YAML at line 2, column 6: unexpected ','"}},
      {"EmptyFile", "", kBad, {"job.yaml: ", "empty"}},
      {"OnlyComments", "# nothing here\n", kBad, {"empty"}},
      {"TopLevelList", "- a\n- b\n", kBad, {"VirtualFlowJob manifest", "got a list"}},
      {"TopLevelScalar", "hello\n", kBad, {"VirtualFlowJob manifest", "got 'hello'"}},
      {"TwoDocuments",
       Manifest({}) + "---\n" + Manifest({}),
       kBad,
       {"one YAML document", "found 2"}},
      {"WrongApiVersion",
       "apiVersion: v1\nkind: VirtualFlowJob\n",
       kBad,
       {"apiVersion: expected 'virtualflow.io/v1alpha1', got 'v1'"}},
      {"MissingApiVersion",
       "kind: VirtualFlowJob\n",
       kBad,
       {"apiVersion: required", "virtualflow.io/v1alpha1"}},
      {"WrongKind",
       "apiVersion: virtualflow.io/v1alpha1\nkind: Deployment\n",
       kBad,
       {"kind: expected 'VirtualFlowJob', got 'Deployment'"}},
      {"UnknownTopLevelField",
       Manifest({}) + "specs: {}\n",
       kBad,
       {"job.yaml: specs: unknown field (did you mean 'spec'?)"}},
      {"MissingMetadata", kHead + "spec: {virtualNodes: 1}\n", kBad, {"metadata.name: required"}},
      {"MissingName", Manifest({}, "{labels: {a: b}}"), kBad, {"metadata.name: required"}},
      {"NameNotDns",
       Manifest({}, "{name: Fashion_MNIST}"),
       kBad,
       {"metadata.name: 'Fashion_MNIST' is not a valid name", "uppercase", "DNS-1123"}},
      {"NameBadCharacter",
       Manifest({}, "{name: fashion_mnist}"),
       kBad,
       {"metadata.name", "'_'", "lowercase letters, digits and '-'"}},
      {"NameEndsWithDash",
       Manifest({}, "{name: job-}"),
       kBad,
       {"metadata.name", "starts or ends with '-'"}},
      {"NameTooLong",
       Manifest({}, "{name: " + std::string(64, 'a') + "}"),
       kBad,
       {"metadata.name", "64 characters", "at most 63"}},
      {"NameNotText",
       Manifest({}, "{name: 123}"),
       kBad,
       {"metadata.name: expected a string, got '123'", "quotes"}},
      {"NamespaceNotDns",
       Manifest({}, "{name: a, namespace: My_NS}"),
       kBad,
       {"metadata.namespace", "not a valid name"}},
      {"MissingSpec", kHead + "metadata: {name: a}\n", kBad, {"spec: required field is missing"}},
      {"SpecNotMap",
       kHead + "metadata: {name: a}\nspec: [1]\n",
       kBad,
       {"spec: expected a map, got a list"}},

      // Unknown and duplicate fields.
      {"UnknownFieldNearMiss",
       Manifest({{"optimzer", "{}"}}),
       kBad,
       {"job.yaml: spec.optimzer: unknown field (did you mean 'optimizer'?)"}},
      {"UnknownFieldTransposition",
       Manifest({{"globalBatchSzie", "256"}}),
       kBad,
       {"spec.globalBatchSzie: unknown field (did you mean 'globalBatchSize'?)"}},
      {"UnknownFieldFarOff",
       Manifest({{"frobnicate", "1"}}),
       kBad,
       {"job.yaml: spec.frobnicate: unknown field"}},
      {"UnknownNestedField",
       Manifest({{"replicas", "{min: 1, mx: 2}"}}),
       kBad,
       {"spec.replicas.mx: unknown field (did you mean 'max'?)"}},
      {"UnknownOptimizerField",
       Manifest({{"optimizer", "{learningrate: 0.1}"}}),
       kBad,
       {"spec.optimizer.learningrate: unknown field (did you mean 'learningRate'?)"}},
      {"EmptyFieldName", Manifest({{"''", "1"}}), kBad, {"spec.'': unknown field"}},
      {"DuplicateField",
       Manifest({}) + "  seed: 1\n  seed: 2\n",
       kBad,
       {"spec.seed: duplicate field"}},

      // Types.
      {"IntegerGotWord",
       Manifest({{"virtualNodes", "eight"}}),
       kBad,
       {"job.yaml: spec.virtualNodes: expected an integer, got 'eight'"}},
      {"IntegerGotFloat",
       Manifest({{"virtualNodes", "8.5"}}),
       kBad,
       {"spec.virtualNodes: expected an integer, got '8.5'"}},
      {"IntegerGotQuotedNumber",
       Manifest({{"globalBatchSize", "'256'"}}),
       kBad,
       {"spec.globalBatchSize: expected an integer, got '256'", "quoted"}},
      {"IntegerGotList",
       Manifest({{"steps", "[1]"}}),
       kBad,
       {"spec.steps: expected an integer, got a list"}},
      {"IntegerOutOfRange",
       Manifest({{"virtualNodes", "99999999999"}}),
       kBad,
       {"spec.virtualNodes: 99999999999 is out of range", "2147483647"}},
      {"Int64OutOfRange",
       Manifest({{"steps", "99999999999999999999"}}),
       kBad,
       {"spec.steps", "out of range"}},
      {"BooleanGotWord",
       Manifest({{"optimizer", "{nesterov: maybe}"}}),
       kBad,
       {"spec.optimizer.nesterov: expected a boolean (true or false), got 'maybe'"}},
      {"NumberGotWord",
       Manifest({{"optimizer", "{learningRate: fast}"}}),
       kBad,
       {"spec.optimizer.learningRate: expected a number, got 'fast'"}},
      {"NumberGotMap",
       Manifest({{"optimizer", "{momentum: {a: 1}}"}}),
       kBad,
       {"spec.optimizer.momentum: expected a number, got a map"}},
      {"NumberOverflows",
       Manifest({{"optimizer", "{learningRate: 1e999}"}}),
       kBad,
       {"spec.optimizer.learningRate", "out of range"}},
      {"ListGotScalar",
       Manifest({{"model", "{hiddenSizes: 512}"}}),
       kBad,
       {"spec.model.hiddenSizes: expected a list of integers, got '512'"}},
      {"ListItemWrongType",
       Manifest({{"model", "{hiddenSizes: [512, big]}"}}),
       kBad,
       {"spec.model.hiddenSizes[1]: expected an integer, got 'big'"}},
      {"MapGotScalar",
       Manifest({{"replicas", "4"}}),
       kBad,
       {"spec.replicas: expected a map with min and max, got '4'"}},
      {"SubMapGotList",
       Manifest({{"optimizer", "[sgd]"}}),
       kBad,
       {"spec.optimizer: expected a map, got a list"}},
      {"StringGotList",
       Manifest({{"model", "{name: [mlp]}"}}),
       kBad,
       {"spec.model.name: expected a string, got a list"}},
      {"StringGotNumber",
       Manifest({{"dataset", "{path: 123}"}}),
       kBad,
       {"spec.dataset.path: expected a string, got '123'"}},
      {"TemplateNotMap",
       Manifest({{"template", "nginx"}}),
       kBad,
       {"spec.template: expected a map, got 'nginx'"}},

      // Shape of the job.
      {"VirtualNodesMissing",
       Manifest({{"virtualNodes", kRemove}}),
       kBad,
       {"spec.virtualNodes: required field is missing"}},
      {"GlobalBatchMissing",
       Manifest({{"globalBatchSize", kRemove}}),
       kBad,
       {"spec.globalBatchSize: required field is missing"}},
      {"VirtualNodesZero",
       Manifest({{"virtualNodes", "0"}}),
       kBad,
       {"spec.virtualNodes: must be between 1 and 4096 (got 0)"}},
      {"VirtualNodesTooMany",
       Manifest({{"virtualNodes", "4097"}, {"globalBatchSize", "4097"}}),
       kBad,
       {"spec.virtualNodes: must be between 1 and 4096 (got 4097)"}},
      {"GlobalBatchZero",
       Manifest({{"globalBatchSize", "0"}}),
       kBad,
       {"spec.globalBatchSize: must be at least 1 (got 0)"}},
      {"GlobalBatchNotDivisible",
       Manifest({{"globalBatchSize", "250"}}),
       kBad,
       {"job.yaml: spec.globalBatchSize (250) must be divisible by spec.virtualNodes (8)"}},
      {"ReplicasMinZero",
       Manifest({{"replicas", "{min: 0, max: 2}"}}),
       kBad,
       {"spec.replicas.min: must be at least 1 (got 0)"}},
      {"ReplicasMinAboveMax",
       Manifest({{"replicas", "{min: 4, max: 2}"}}),
       kBad,
       {"spec.replicas.min (4) must not exceed spec.replicas.max (2)"}},
      {"ReplicasMaxAboveVirtualNodes",
       Manifest({{"replicas", "{min: 1, max: 16}"}}),
       kBad,
       {"spec.replicas.max (16) must not exceed spec.virtualNodes (8): a worker holds at least "
        "one virtual node"}},
      {"ReplicasLoneMinAboveVirtualNodes",
       Manifest({{"replicas", "{min: 9}"}}),
       kBad,
       {"spec.replicas.max (9) must not exceed spec.virtualNodes (8)"}},
      {"GpusNegative",
       Manifest({{"gpusPerWorker", "-1"}}),
       kBad,
       {"spec.gpusPerWorker: must be at least 0", "CPU", "got -1"}},
      {"StepsAndEpochs",
       Manifest({{"epochs", "2"}}),
       kBad,
       {"set exactly one of spec.steps and spec.epochs", "both"}},
      {"NeitherStepsNorEpochs",
       Manifest({{"steps", kRemove}}),
       kBad,
       {"set exactly one of spec.steps and spec.epochs", "neither"}},
      {"StepsZero",
       Manifest({{"steps", "0"}}),
       kBad,
       {"spec.steps: must be a positive integer (got 0)"}},
      {"EpochsNegative",
       Manifest({{"steps", kRemove}, {"epochs", "-2"}}),
       kBad,
       {"spec.epochs: must be a positive integer (got -2)"}},

      // Model and data.
      {"UnknownModel",
       Manifest({{"model", "{name: resnet}"}}),
       kBad,
       {"spec.model.name: unknown model 'resnet'", "known: mlp"}},
      {"NoHiddenLayers",
       Manifest({{"model", "{hiddenSizes: []}"}}),
       kBad,
       {"spec.model.hiddenSizes: must list at least one"}},
      {"HiddenSizeZero",
       Manifest({{"model", "{hiddenSizes: [512, 0]}"}}),
       kBad,
       {"spec.model.hiddenSizes[1]: must be between 1 and 65536 (got 0)"}},
      {"HiddenSizeTooLarge",
       Manifest({{"model", "{hiddenSizes: [65537]}"}}),
       kBad,
       {"spec.model.hiddenSizes[0]: must be between 1 and 65536 (got 65537)"}},
      {"UnknownDataset",
       Manifest({{"dataset", "{name: cifar10}"}}),
       kBad,
       {"spec.dataset.name: unknown dataset 'cifar10'", "known: fashion-mnist, synthetic"}},
      {"DatasetPathEmpty",
       Manifest({{"dataset", "{path: ''}"}}),
       kBad,
       {"spec.dataset.path: required for dataset 'fashion-mnist'"}},
      {"SyntheticNoTrainSamples",
       Manifest({{"dataset", "{name: synthetic, trainSamples: 0}"}}),
       kBad,
       {"spec.dataset.trainSamples: must be at least 1 (got 0)"}},
      {"SyntheticNoTestSamples",
       Manifest({{"dataset", "{name: synthetic, testSamples: -1}"}}),
       kBad,
       {"spec.dataset.testSamples: must be at least 1 (got -1)"}},
      {"SyntheticSmallerThanBatch",
       Manifest({{"dataset", "{name: synthetic, trainSamples: 100}"}}),
       kBad,
       {"spec.dataset.trainSamples (100) must be at least spec.globalBatchSize (256)"}},

      // Optimizer.
      {"UnknownOptimizer",
       Manifest({{"optimizer", "{name: adam}"}}),
       kBad,
       {"spec.optimizer.name: unknown optimizer 'adam' (did you mean 'adamw'?)",
        "known: sgd, adamw"}},
      {"LearningRateZero",
       Manifest({{"optimizer", "{learningRate: 0}"}}),
       kBad,
       {"spec.optimizer.learningRate: must be a finite number greater than 0 (got 0)"}},
      {"LearningRateNegative",
       Manifest({{"optimizer", "{learningRate: -0.1}"}}),
       kBad,
       {"spec.optimizer.learningRate", "greater than 0", "-0.1"}},
      {"LearningRateNan",
       Manifest({{"optimizer", "{learningRate: .nan}"}}),
       kBad,
       {"spec.optimizer.learningRate", "finite", "nan"}},
      {"LearningRateInf",
       Manifest({{"optimizer", "{learningRate: .inf}"}}),
       kBad,
       {"spec.optimizer.learningRate", "finite", "inf"}},
      {"MomentumOne",
       Manifest({{"optimizer", "{momentum: 1.0}"}}),
       kBad,
       {"spec.optimizer.momentum: must be in [0, 1) (got 1)"}},
      {"MomentumNegative",
       Manifest({{"optimizer", "{momentum: -0.5}"}}),
       kBad,
       {"spec.optimizer.momentum: must be in [0, 1) (got -0.5)"}},
      {"Beta1One",
       Manifest({{"optimizer", "{name: adamw, beta1: 1}"}}),
       kBad,
       {"spec.optimizer.beta1: must be in [0, 1)"}},
      {"Beta2AboveOne",
       Manifest({{"optimizer", "{name: adamw, beta2: 1.5}"}}),
       kBad,
       {"spec.optimizer.beta2: must be in [0, 1) (got 1.5)"}},
      {"EpsilonZero",
       Manifest({{"optimizer", "{name: adamw, epsilon: 0}"}}),
       kBad,
       {"spec.optimizer.epsilon: must be a finite number greater than 0"}},
      {"WeightDecayNegative",
       Manifest({{"optimizer", "{weightDecay: -1e-4}"}}),
       kBad,
       {"spec.optimizer.weightDecay: must be a finite number of at least 0 (got -0.0001)"}},
      {"WeightDecayInfinite",
       Manifest({{"optimizer", "{weightDecay: .inf}"}}),
       kBad,
       {"spec.optimizer.weightDecay", "finite"}},

      // Run settings.
      {"UnknownReduction",
       Manifest({{"reduction", "fats"}}),
       kBad,
       {"spec.reduction: unknown reduction 'fats' (did you mean 'fast'?)", "known: exact, fast"}},
      {"SeedNegative",
       Manifest({{"seed", "-1"}}),
       kBad,
       {"spec.seed: -1 is out of range (must be between 0 and 9223372036854775807)"}},
      {"SeedAboveInt64",
       Manifest({{"seed", "9223372036854775808"}}),
       kBad,
       {"spec.seed", "out of range", "9223372036854775807"}},
      {"EmptyPolicy",  // which names are known is operator/policy's registry's to check
       Manifest({{"elasticity", "{policy: ''}"}}),
       kBad,
       {"spec.elasticity.policy: must name a scheduling policy"}},
      {"CooldownNegative",
       Manifest({{"elasticity", "{cooldownSeconds: -5}"}}),
       kBad,
       {"spec.elasticity.cooldownSeconds: must be at least 0 (got -5)"}},
      {"CheckpointEveryNegative",
       Manifest({{"checkpoint", "{path: /c, everySteps: -1}"}}),
       kBad,
       {"spec.checkpoint.everySteps: must be at least 0 (got -1)"}},
      {"CheckpointEveryWithoutPath",
       Manifest({{"checkpoint", "{everySteps: 100}"}}),
       kBad,
       {"spec.checkpoint.everySteps (100) requires spec.checkpoint.path"}},
      {"BackoffLimitNegative",
       Manifest({{"runPolicy", "{backoffLimit: -1}"}}),
       kBad,
       {"spec.runPolicy.backoffLimit: must be at least 0 (got -1)"}},
      {"BackoffLimitNotAnInteger",
       Manifest({{"runPolicy", "{backoffLimit: many}"}}),
       kBad,
       {"spec.runPolicy.backoffLimit: expected an integer"}},
      {"BackoffLimitBeyondInt32",
       Manifest({{"runPolicy", "{backoffLimit: 2147483648}"}}),
       kBad,
       {"spec.runPolicy.backoffLimit", "out of range"}},
      {"ActiveDeadlineZero",
       Manifest({{"runPolicy", "{activeDeadlineSeconds: 0}"}}),
       kBad,
       {"spec.runPolicy.activeDeadlineSeconds: must be at least 1 (got 0)"}},
      {"TtlNegative",
       Manifest({{"runPolicy", "{ttlSecondsAfterFinished: -3}"}}),
       kBad,
       {"spec.runPolicy.ttlSecondsAfterFinished: must be at least 0 (got -3)"}},
      {"RunPolicyUnknownField",
       Manifest({{"runPolicy", "{backoffLimits: 3}"}}),
       kBad,
       {"spec.runPolicy.backoffLimits: unknown field", "backoffLimit"}},
      {"SuspendNotABool",
       Manifest({{"suspend", "yes please"}}),
       kBad,
       {"spec.suspend: expected a boolean"}},
      {"DesiredBelowMin",
       Manifest({{"replicas", "{min: 2, max: 4, desired: 1}"}}),
       kBad,
       {"spec.replicas.desired (1) must be between spec.replicas.min (2) and "
        "spec.replicas.max (4)"}},
      {"DesiredAboveMax",
       Manifest({{"replicas", "{min: 2, max: 4, desired: 5}"}}),
       kBad,
       {"spec.replicas.desired (5) must be between"}},
      {"UnknownCleanPodPolicy",
       Manifest({{"runPolicy", "{cleanPodPolicy: Finished}"}}),
       kBad,
       {"spec.runPolicy.cleanPodPolicy: unknown cleanPodPolicy 'Finished'",
        "known: None, Running, All"}},
      {"PodFailurePolicyWithoutRules",
       Manifest({{"runPolicy", "{podFailurePolicy: {}}"}}),
       kBad,
       {"spec.runPolicy.podFailurePolicy.rules: required field is missing"}},
      {"PodFailureRuleUnknownAction",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [{action: FailIndex, onExitCodes: "
                  "{operator: In, values: [1]}}]}}"}}),
       kBad,
       {"spec.runPolicy.podFailurePolicy.rules[0].action: unknown action 'FailIndex'",
        "known: FailJob, Ignore, Count"}},
      {"PodFailureRuleWithoutAction",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [{onExitCodes: {operator: In, values: [1]}}]}}"}}),
       kBad,
       {"spec.runPolicy.podFailurePolicy.rules[0].action: required field is missing"}},
      {"PodFailureRuleWithBothRequirements",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [{action: Ignore, onExitCodes: {operator: In, "
                  "values: [1]}, onPodConditions: [{type: DisruptionTarget}]}]}}"}}),
       kBad,
       {"spec.runPolicy.podFailurePolicy.rules[0]: set exactly one of onExitCodes and "
        "onPodConditions"}},
      {"PodFailureRuleWithNeither",
       Manifest({{"runPolicy", "{podFailurePolicy: {rules: [{action: Ignore}]}}"}}),
       kBad,
       {"rules[0]: set exactly one of onExitCodes and onPodConditions"}},
      {"ExitCodeOperatorUnknown",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [{action: Ignore, onExitCodes: "
                  "{operator: Exists, values: [1]}}]}}"}}),
       kBad,
       {"rules[0].onExitCodes.operator: unknown operator 'Exists'", "known: In, NotIn"}},
      {"ExitCodeZeroWithIn",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [{action: Ignore, onExitCodes: "
                  "{operator: In, values: [1, 0]}}]}}"}}),
       kBad,
       {"rules[0].onExitCodes.values[1]: 0 cannot be used with operator In"}},
      {"ExitCodeDuplicate",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [{action: Ignore, onExitCodes: "
                  "{operator: NotIn, values: [3, 3]}}]}}"}}),
       kBad,
       {"rules[0].onExitCodes.values[1]: duplicate exit code 3"}},
      {"ExitCodesEmpty",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [{action: Ignore, onExitCodes: "
                  "{operator: NotIn, values: []}}]}}"}}),
       kBad,
       {"rules[0].onExitCodes.values: must list at least one code"}},
      {"PodConditionWithoutType",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [{action: Ignore, onPodConditions: "
                  "[{status: 'True'}]}]}}"}}),
       kBad,
       {"rules[0].onPodConditions[0].type: required field is missing"}},
      {"PodConditionStatusUnknown",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [{action: Ignore, onPodConditions: "
                  "[{type: DisruptionTarget, status: Maybe}]}]}}"}}),
       kBad,
       {"rules[0].onPodConditions[0].status: unknown condition status 'Maybe'"}},
      {"TooManyPodFailureRules",
       Manifest({{"runPolicy",
                  "{podFailurePolicy: {rules: [" +
                      [] {
                        std::string rules;
                        for (int i = 0; i < 21; ++i) {
                          rules += std::string(i ? ", " : "") +
                                   "{action: Ignore, onPodConditions: [{type: DisruptionTarget}]}";
                        }
                        return rules;
                      }() +
                      "]}}"}}),
       kBad,
       {"spec.runPolicy.podFailurePolicy.rules: at most 20 items (got 21)"}},
      {"RunPolicyNotAMap",
       Manifest({{"runPolicy", "3"}}),
       kBad,
       {"spec.runPolicy: expected a map"}},
  };
}

class JobSpecErrorTest : public testing::TestWithParam<ErrorCase> {};

TEST_P(JobSpecErrorTest, IsRejectedWithAOneLineMessageNamingTheField) {
  const ErrorCase& c = GetParam();
  Result<JobSpec> job = ParseJobYaml(c.text, "job.yaml");
  ASSERT_FALSE(job.ok()) << c.text;
  EXPECT_EQ(job.status().code(), c.code) << job.status().message();
  const std::string& message = job.status().message();
  EXPECT_EQ(message.rfind("job.yaml: ", 0), 0u) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  for (const std::string& expected : c.expected) {
    EXPECT_NE(message.find(expected), std::string::npos)
        << "message: " << message << "\nexpected to contain: " << expected;
  }
}

INSTANTIATE_TEST_SUITE_P(AllErrors, JobSpecErrorTest, testing::ValuesIn(ErrorCases()),
                         [](const testing::TestParamInfo<ErrorCase>& param_info) {
                           return param_info.param.name;
                         });

TEST(JobSpecTest, FarOffUnknownFieldSuggestsNothing) {
  Result<JobSpec> job = ParseJobYaml(Manifest({{"frobnicate", "1"}}), "job.yaml");
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(), "job.yaml: spec.frobnicate: unknown field");
}

TEST(JobSpecTest, MultiLineValuesStayOnOneLineInErrors) {
  Result<JobSpec> job =
      ParseJobYaml(Manifest({{"model", "{name: \"two\\nlines\"}"}}), "dir/\nodd.yaml");
  ASSERT_FALSE(job.ok());
  const std::string& message = job.status().message();
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find("'two\\nlines'"), std::string::npos) << message;
  EXPECT_EQ(message.rfind("dir/\\nodd.yaml: ", 0), 0u) << message;
}

TEST(JobSpecTest, LongValuesAreShortenedInErrors) {
  const std::string long_name(5000, 'x');
  Result<JobSpec> job = ParseJobYaml(Manifest({{"model", "{name: " + long_name + "}"}}), "j");
  ASSERT_FALSE(job.ok());
  EXPECT_LT(job.status().message().size(), 300u);
  EXPECT_NE(job.status().message().find("..."), std::string::npos);
}

TEST(JobSpecTest, ValidateJobChecksProgrammaticOverrides) {
  JobSpec job = MustParse(Manifest({}));
  ASSERT_TRUE(ValidateJob(job).ok());

  JobSpec both = job;
  both.epochs = 3;
  Status status = ValidateJob(both);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("set exactly one of spec.steps and spec.epochs"),
            std::string::npos);

  JobSpec batch = job;
  batch.global_batch_size = 250;
  status = ValidateJob(batch);
  EXPECT_EQ(status.message(),
            "spec.globalBatchSize (250) must be divisible by spec.virtualNodes (8): every "
            "virtual node takes an equal micro-batch");

  JobSpec seed = job;
  seed.seed = uint64_t{1} << 63;
  status = ValidateJob(seed);
  EXPECT_NE(status.message().find("spec.seed"), std::string::npos) << status.message();

  JobSpec reduction = job;
  reduction.reduction = static_cast<Reduction>(7);
  EXPECT_NE(ValidateJob(reduction).message().find("spec.reduction"), std::string::npos);

  JobSpec unnamed = job;
  unnamed.name.clear();
  EXPECT_NE(ValidateJob(unnamed).message().find("metadata.name"), std::string::npos);
}

TEST(JobSpecTest, TreeParsesLikeTheSameText) {
  const std::string text =
      Manifest({{"optimizer", "{name: adamw, learningRate: 0.002}"}, {"seed", "7"}});
  EXPECT_EQ(ParseJobNode(YAML::Load(text), "job").value(), MustParse(text));
}

TEST(JobSpecTest, TreeErrorsAreTheOneLineErrorsOfTheText) {
  const std::string text = Manifest({{"globalBatchSize", "250"}});
  Result<JobSpec> from_tree = ParseJobNode(YAML::Load(text), "ns/job");
  ASSERT_FALSE(from_tree.ok());
  EXPECT_EQ(from_tree.status().message(),
            "ns/job: spec.globalBatchSize (250) must be divisible by spec.virtualNodes (8): every "
            "virtual node takes an equal micro-batch");
}

TEST(JobSpecTest, TreeScalarsTaggedAsTextAreText) {
  // The operator builds trees from JSON, where "8" is a string: it must not pass as a number.
  YAML::Node manifest = YAML::Load(Manifest({}));
  manifest["spec"]["virtualNodes"] = YAML::Node("8");
  manifest["spec"]["virtualNodes"].SetTag("tag:yaml.org,2002:str");
  Result<JobSpec> job = ParseJobNode(manifest, "job");
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("spec.virtualNodes: expected an integer"),
            std::string::npos)
      << job.status().message();
}

TEST(TotalStepsTest, StepsAreTheLengthWhateverTheData) {
  JobSpec job = MustParse(Manifest({{"steps", "25"}}));
  EXPECT_EQ(TotalSteps(job, 5000), 25);
  EXPECT_EQ(TotalSteps(job, 0), 25);
}

TEST(TotalStepsTest, EpochsCountWholeStepsOfTheRealTrainingSet) {
  JobSpec job = MustParse(Manifest({{"steps", kRemove}, {"epochs", "3"}}));
  EXPECT_EQ(TotalSteps(job, 5000), 3 * 19);  // the tail of 136 samples is dropped
  EXPECT_EQ(TotalSteps(job, 1000), 3 * 3);   // another set, its own length
  EXPECT_EQ(TotalSteps(job, 256), 3);
}

TEST(TotalStepsTest, EpochsOfAnUnknownTrainingSetAreUnknown) {
  JobSpec job = MustParse(Manifest({{"steps", kRemove}, {"epochs", "3"}}));
  EXPECT_EQ(TotalSteps(job, 0), 0);
}

TEST(JobSpecTest, ReductionNames) {
  EXPECT_STREQ(ReductionName(Reduction::kExact), "exact");
  EXPECT_STREQ(ReductionName(Reduction::kFast), "fast");
}

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/vf_spec_test.XXXXXX";
    const char* dir = mkdtemp(pattern);
    EXPECT_NE(dir, nullptr);
    path_ = dir != nullptr ? dir : "/tmp";
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(JobSpecTest, LoadJobFileReadsAFile) {
  TempDir dir;
  const std::string path = dir.path() + "/job.yaml";
  std::ofstream(path) << Manifest({{"seed", "7"}});
  Result<JobSpec> job = LoadJobFile(path);
  ASSERT_TRUE(job.ok()) << job.status().message();
  EXPECT_EQ(job->seed, 7u);
}

TEST(JobSpecTest, LoadJobFileErrorsNameThePath) {
  TempDir dir;
  const std::string path = dir.path() + "/bad.yaml";
  std::ofstream(path) << Manifest({{"globalBatchSize", "250"}});
  Result<JobSpec> job = LoadJobFile(path);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message().rfind(path + ": spec.globalBatchSize (250)", 0), 0u)
      << job.status().message();
}

TEST(JobSpecTest, LoadJobFileMissingIsNotFound) {
  TempDir dir;
  const std::string path = dir.path() + "/missing.yaml";
  Result<JobSpec> job = LoadJobFile(path);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(job.status().message(), path + ": cannot read file: No such file or directory");
}

TEST(JobSpecTest, LoadJobFileDirectoryIsInvalidArgument) {
  TempDir dir;
  Result<JobSpec> job = LoadJobFile(dir.path());
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(), dir.path() + ": cannot read file: Is a directory");
}

TEST(JobSpecTest, LoadJobFileUnreadableIsInvalidArgument) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads any file";
  TempDir dir;
  const std::string path = dir.path() + "/secret.yaml";
  std::ofstream(path) << Manifest({});
  ASSERT_EQ(chmod(path.c_str(), 0), 0);
  Result<JobSpec> job = LoadJobFile(path);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(), path + ": cannot read file: Permission denied");
}

// --- Fingerprint ---------------------------------------------------------------------------

TEST(JobFingerprintTest, IsAStableSha256Hex) {
  const JobSpec job = MustParse(Manifest({}));
  const std::string fp = job.Fingerprint();
  EXPECT_EQ(fp.size(), 64u);
  EXPECT_EQ(fp.find_first_not_of("0123456789abcdef"), std::string::npos) << fp;
  EXPECT_EQ(fp, job.Fingerprint());
  EXPECT_EQ(fp, MustParse(Manifest({})).Fingerprint());
  // Pinned: workers of different builds must agree on it, and checkpoints outlive builds. This
  // is the SHA-256 of the canonical text documented in spec.cc.
  EXPECT_EQ(fp, "08e423f61f0be01fa887370de689a83031a6d1b211d8688f208865f488eead60");
}

TEST(JobFingerprintTest, IgnoresFieldOrderAndSpelling) {
  const JobSpec a = MustParse(Manifest({{"optimizer", "{learningRate: 0.05, momentum: 0.9}"}}));
  const JobSpec b = MustParse(Manifest({{"optimizer", "{momentum: 9e-1, learningRate: 5.0e-2}"}}));
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
}

struct Mutation {
  std::string name;
  std::function<void(JobSpec*)> apply;
};

std::vector<Mutation> MathMutations() {
  return {
      {"virtualNodes", [](JobSpec* j) { j->virtual_nodes = 16; }},
      {"globalBatchSize", [](JobSpec* j) { j->global_batch_size = 512; }},
      {"modelName", [](JobSpec* j) { j->model.name = "other"; }},
      {"hiddenSizesValue",
       [](JobSpec* j) {
         j->model.hidden_sizes = {512, 128};
       }},
      {"hiddenSizesDepth", [](JobSpec* j) { j->model.hidden_sizes = {512}; }},
      {"datasetName", [](JobSpec* j) { j->dataset.name = "synthetic"; }},
      {"optimizerName", [](JobSpec* j) { j->optimizer.name = "adamw"; }},
      {"learningRate", [](JobSpec* j) { j->optimizer.learning_rate = 0.05000000000000001; }},
      {"momentum", [](JobSpec* j) { j->optimizer.momentum = 0.8; }},
      {"nesterov", [](JobSpec* j) { j->optimizer.nesterov = true; }},
      {"weightDecay", [](JobSpec* j) { j->optimizer.weight_decay = 1e-4; }},
      {"beta1", [](JobSpec* j) { j->optimizer.beta1 = 0.85; }},
      {"beta2", [](JobSpec* j) { j->optimizer.beta2 = 0.99; }},
      {"epsilon", [](JobSpec* j) { j->optimizer.epsilon = 1e-7; }},
      {"reduction", [](JobSpec* j) { j->reduction = Reduction::kFast; }},
      {"seed", [](JobSpec* j) { j->seed = 1; }},
  };
}

std::vector<Mutation> NonMathMutations() {
  return {
      {"name", [](JobSpec* j) { j->name = "other"; }},
      {"namespace", [](JobSpec* j) { j->namespace_name = "other"; }},
      {"replicas",
       [](JobSpec* j) {
         j->replicas_min = 2;
         j->replicas_max = 8;
       }},
      {"gpusPerWorker", [](JobSpec* j) { j->gpus_per_worker = 0; }},
      {"steps", [](JobSpec* j) { j->steps = 1000; }},
      {"stepsToEpochs",
       [](JobSpec* j) {
         j->steps = 0;
         j->epochs = 5;
       }},
      {"elasticity",
       [](JobSpec* j) {
         j->elasticity.policy = "static";
         j->elasticity.cooldown_seconds = 1;
       }},
      {"checkpoint",
       [](JobSpec* j) {
         j->checkpoint.path = "/c";
         j->checkpoint.every_steps = 10;
       }},
      {"datasetPath", [](JobSpec* j) { j->dataset.path = "/elsewhere"; }},
      {"runPolicy",
       [](JobSpec* j) {
         j->run_policy.backoff_limit = 3;
         j->run_policy.active_deadline_seconds = 60;
         j->run_policy.ttl_seconds_after_finished = 0;
         j->run_policy.clean_pod_policy = CleanPodPolicy::kAll;
         j->run_policy.pod_failure_rules.push_back({PodFailureAction::kIgnore, std::nullopt, {}});
       }},
      {"replicasDesired", [](JobSpec* j) { j->replicas_desired = 1; }},
      {"suspend", [](JobSpec* j) { j->suspend = true; }},
      // Sample counts only define a synthetic dataset; Fashion-MNIST is what it is.
      {"fashionMnistSampleCounts",
       [](JobSpec* j) {
         j->dataset.train_samples = 1;
         j->dataset.test_samples = 1;
       }},
      {"negativeZeroWeightDecay", [](JobSpec* j) { j->optimizer.weight_decay = -0.0; }},
  };
}

TEST(JobFingerprintTest, ChangesWithEveryMathField) {
  const JobSpec base = MustParse(Manifest({}));
  for (const Mutation& m : MathMutations()) {
    JobSpec changed = base;
    m.apply(&changed);
    EXPECT_NE(changed.Fingerprint(), base.Fingerprint()) << m.name;
  }
}

TEST(JobFingerprintTest, IgnoresEveryOtherField) {
  const JobSpec base = MustParse(Manifest({}));
  for (const Mutation& m : NonMathMutations()) {
    JobSpec changed = base;
    m.apply(&changed);
    EXPECT_EQ(changed.Fingerprint(), base.Fingerprint()) << m.name;
  }
}

TEST(JobFingerprintTest, SyntheticSampleCountsDefineTheDataset) {
  const JobSpec base = MustParse(Manifest({{"dataset", "{name: synthetic}"}}));
  JobSpec train = base;
  train.dataset.train_samples += 1;
  JobSpec test = base;
  test.dataset.test_samples += 1;
  JobSpec path = base;
  path.dataset.path = "/ignored";
  EXPECT_NE(train.Fingerprint(), base.Fingerprint());
  EXPECT_NE(test.Fingerprint(), base.Fingerprint());
  EXPECT_NE(train.Fingerprint(), test.Fingerprint());
  EXPECT_EQ(path.Fingerprint(), base.Fingerprint());
}

TEST(JobFingerprintTest, TextValuesCannotForgeOtherFields) {
  // Unescaped, both would print the same three dataset lines.
  JobSpec a;
  a.dataset.name = "synthetic\ndataset.trainSamples=5\ndataset.testSamples=6";
  JobSpec b;
  b.dataset.name = "synthetic";
  b.dataset.train_samples = 5;
  b.dataset.test_samples = 6;
  EXPECT_NE(a.Fingerprint(), b.Fingerprint());
}

}  // namespace
}  // namespace vf
