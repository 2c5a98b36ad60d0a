#include "operator/controller/worker_pod.h"

#include <gtest/gtest.h>

#include "operator/controller/job_spec.h"

namespace vf::controller {
namespace {

using nlohmann::json;

json Job() {
  return json::parse(R"({
    "apiVersion": "virtualflow.io/v1alpha1", "kind": "VirtualFlowJob",
    "metadata": {"name": "mnist", "namespace": "team", "uid": "u-1"},
    "spec": {"virtualNodes": 8, "globalBatchSize": 256, "steps": 10, "gpusPerWorker": 2,
             "template": {"image": "example/agent:1", "nodeSelector": {"pool": "gpu"},
                          "env": [{"name": "X", "value": "1"}]}},
    "status": {"phase": "Running"}})");
}

JobSpec SpecOf(const json& job) {
  Result<JobSpec> spec = JobSpecOf(job);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  return spec.ok() ? spec.value() : JobSpec{};
}

TEST(WorkerPodTest, BuildsAPodTheAgentCanRun) {
  PodSettings s;
  s.coordinator_url = "http://op:7070";
  s.default_image = "default/agent:0";
  json pod = BuildWorkerPod(Job(), SpecOf(Job()), "mnist-worker-abc", s);
  EXPECT_EQ(pod["metadata"]["name"], "mnist-worker-abc");
  EXPECT_EQ(pod["metadata"]["namespace"], "team");
  EXPECT_EQ(pod["metadata"]["labels"][kJobLabel], "mnist");
  EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["uid"], "u-1");
  EXPECT_TRUE(pod["metadata"]["ownerReferences"][0]["controller"].get<bool>());
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_FALSE(pod["spec"]["automountServiceAccountToken"].get<bool>());
  EXPECT_EQ(pod["spec"]["nodeSelector"]["pool"], "gpu");
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["image"], "example/agent:1");
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "2");
  const std::vector<std::string> args = c["args"];
  const std::vector<std::string> want = {
      "--coordinator", "http://op:7070",   "--job-id",       "team/mnist",
      "--worker",      "mnist-worker-abc", "--metrics-port", "9090"};
  EXPECT_EQ(args, want);
  ASSERT_EQ(c["env"].size(), 3u);
  EXPECT_EQ(c["env"][0]["name"], "VF_JOB_SPEC");
  json manifest = json::parse(c["env"][0]["value"].get<std::string>());
  EXPECT_EQ(manifest["spec"]["virtualNodes"], 8);
  EXPECT_FALSE(manifest.contains("status"));
  EXPECT_EQ(c["env"][1]["valueFrom"]["secretKeyRef"]["name"], "mnist-vf-token");
  EXPECT_EQ(c["env"][2]["name"], "X");
}

TEST(WorkerPodTest, DefaultImageAndNoMetricsPort) {
  PodSettings s;
  s.default_image = "default/agent:0";
  s.metrics_port = -1;
  json job = Job();
  job["spec"]["template"].erase("image");
  json pod = BuildWorkerPod(job, SpecOf(job), "w", s);
  EXPECT_EQ(pod["spec"]["containers"][0]["image"], "default/agent:0");
  for (const auto& a : pod["spec"]["containers"][0]["args"]) EXPECT_NE(a, "--metrics-port");
}

TEST(WorkerPodTest, LifeFollowsPhaseAndDeletion) {
  json pod = {{"metadata", json::object()}, {"status", {{"phase", "Pending"}}}};
  EXPECT_EQ(PodLifeOf(pod), PodLife::kStarting);
  pod["status"]["phase"] = "Running";
  EXPECT_EQ(PodLifeOf(pod), PodLife::kRunning);
  pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  EXPECT_EQ(PodLifeOf(pod), PodLife::kTerminating);
  pod["status"]["phase"] = "Failed";
  pod["status"]["containerStatuses"] =
      json::parse(R"([{"state": {"terminated": {"exitCode": 3, "message": "a\nlast line\n"}}}])");
  EXPECT_EQ(PodLifeOf(pod), PodLife::kFailed);
  EXPECT_EQ(PodExitCode(pod), 3);
  EXPECT_EQ(PodTerminationMessage(pod), "last line");
  EXPECT_EQ(PodExitCode(json::object()), -1);
  pod["status"]["containerStatuses"] = json::parse("[null]");
  EXPECT_EQ(PodExitCode(pod), -1);
}

TEST(WorkerPodTest, MembershipSeesTerminatingPodsLeavingAndSucceededOnesExited) {
  EXPECT_EQ(WorkerLifeOf(PodLife::kStarting), policy::WorkerLife::kStarting);
  EXPECT_EQ(WorkerLifeOf(PodLife::kRunning), policy::WorkerLife::kRunning);
  EXPECT_EQ(WorkerLifeOf(PodLife::kTerminating), policy::WorkerLife::kLeaving);
  EXPECT_EQ(WorkerLifeOf(PodLife::kSucceeded), policy::WorkerLife::kExited);
  EXPECT_EQ(WorkerLifeOf(PodLife::kFailed), policy::WorkerLife::kFailed);
}

TEST(WorkerPodTest, GpuLimitDefaultsToTheJobSpecsOneGpuPerWorker) {
  json job = Job();
  job["spec"].erase("gpusPerWorker");
  json pod = BuildWorkerPod(job, SpecOf(job), "w", PodSettings{});
  EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            std::to_string(JobSpec{}.gpus_per_worker));
}

}  // namespace
}  // namespace vf::controller
