#include "operator/controller/job_spec.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>

namespace vf::controller {
namespace {

using nlohmann::json;

// A job as the API server returns it: its own metadata and status around the spec.
json Job(const json& spec) {
  return {{"apiVersion", "virtualflow.io/v1alpha1"},
          {"kind", "VirtualFlowJob"},
          {"metadata",
           {{"name", "mnist"},
            {"namespace", "team"},
            {"uid", "u-1"},
            {"generation", 3},
            {"creationTimestamp", "2026-01-02T03:04:05Z"}}},
          {"spec", spec},
          {"status", {{"phase", "Running"}, {"step", 12}}}};
}

TEST(JobSpecOf, ReadsEveryFieldAsTheAgentsParserDoes) {
  const json spec = json::parse(R"({
    "virtualNodes": 8, "globalBatchSize": 256, "replicas": {"min": 2, "max": 6},
    "gpusPerWorker": 2, "model": {"name": "mlp", "hiddenSizes": [64, 32]},
    "dataset": {"name": "synthetic", "trainSamples": 4096, "testSamples": 512},
    "optimizer": {"name": "adamw", "learningRate": 0.002, "weightDecay": 0.01,
                  "beta1": 0.85, "beta2": 0.995, "epsilon": 1e-7},
    "epochs": 3, "reduction": "fast", "seed": 9,
    "elasticity": {"policy": "autoscale", "cooldownSeconds": 45},
    "checkpoint": {"path": "/ckpt/mnist", "everySteps": 50},
    "template": {"spec": {"containers": [{"name": "worker", "image": "example/agent:1"}]}}})");
  Result<JobSpec> job = JobSpecOf(Job(spec));
  ASSERT_TRUE(job.ok()) << job.status().message();
  // The agents read the same manifest as JSON text (VF_JOB_SPEC): the two must agree exactly.
  const json manifest = {{"apiVersion", "virtualflow.io/v1alpha1"},
                         {"kind", "VirtualFlowJob"},
                         {"metadata", {{"name", "mnist"}, {"namespace", "team"}}},
                         {"spec", spec}};
  EXPECT_TRUE(job.value() == ParseJobYaml(manifest.dump(), "agent").value());
  EXPECT_EQ(job->name, "mnist");
  EXPECT_EQ(job->namespace_name, "team");
  EXPECT_EQ(job->replicas_max, 6);
  EXPECT_EQ(job->gpus_per_worker, 2);
  EXPECT_EQ(job->optimizer.epsilon, 1e-7);
  EXPECT_EQ(job->reduction, Reduction::kFast);
  EXPECT_EQ(job->elasticity.cooldown_seconds, 45);
  EXPECT_EQ(job->checkpoint.every_steps, 50);
}

TEST(JobSpecOf, FieldsLeftOutTakeSpecHsDefaults) {
  Result<JobSpec> job =
      JobSpecOf(Job({{"virtualNodes", 8}, {"globalBatchSize", 256}, {"steps", 10}}));
  ASSERT_TRUE(job.ok()) << job.status().message();
  JobSpec expected;
  expected.name = "mnist";
  expected.namespace_name = "team";
  expected.virtual_nodes = 8;
  expected.global_batch_size = 256;
  expected.steps = 10;
  EXPECT_TRUE(job.value() == expected);
}

TEST(JobSpecOf, ErrorsNameTheJobAndTheField) {
  Result<JobSpec> job =
      JobSpecOf(Job({{"virtualNodes", 8}, {"globalBatchSize", 250}, {"steps", 10}}));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "team/mnist: spec.globalBatchSize (250) must be divisible by spec.virtualNodes (8): "
            "every virtual node takes an equal micro-batch");
}

TEST(JobSpecOf, APolicyNotInTheRegistryIsRefusedNamingTheKnownOnes) {
  Result<JobSpec> job = JobSpecOf(Job({{"virtualNodes", 8},
                                       {"globalBatchSize", 256},
                                       {"steps", 10},
                                       {"elasticity", {{"policy", "greedy"}}}}));
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().message(),
            "team/mnist: spec.elasticity.policy: unknown policy 'greedy' (known: static, elastic, "
            "autoscale)");
}

TEST(JobSpecOf, NumbersInStringsAreText) {
  Result<JobSpec> job =
      JobSpecOf(Job({{"virtualNodes", "8"}, {"globalBatchSize", 256}, {"steps", 10}}));
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.status().message().find("spec.virtualNodes: expected an integer"),
            std::string::npos)
      << job.status().message();
}

TEST(JsonToYaml, KeepsEveryValuesKind) {
  const YAML::Node node = JsonToYaml(json::parse(
      R"({"n": 3, "big": 9007199254740993, "x": 0.1, "t": true, "s": "yes", "z": null,
          "list": [1, "a"], "map": {}})"));
  ASSERT_TRUE(node.IsMap());
  EXPECT_EQ(node["n"].Scalar(), "3");
  EXPECT_EQ(node["big"].Scalar(), "9007199254740993");
  EXPECT_EQ(node["x"].as<double>(), 0.1);
  EXPECT_EQ(node["t"].Scalar(), "true");
  EXPECT_EQ(node["s"].Scalar(), "yes");
  EXPECT_EQ(node["s"].Tag(), "tag:yaml.org,2002:str");  // "yes" is text, not YAML 1.1's true
  EXPECT_TRUE(node["z"].IsNull());
  ASSERT_TRUE(node["list"].IsSequence());
  EXPECT_EQ(node["list"][1].Tag(), "tag:yaml.org,2002:str");
  EXPECT_TRUE(node["map"].IsMap());
}

}  // namespace
}  // namespace vf::controller
