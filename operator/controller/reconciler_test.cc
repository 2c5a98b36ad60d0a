// The reconciler against an API server stand-in and a real coordinator (reconciler_test_fixture.h):
// What one Reconcile of a job writes for the spec, the job length, the GPUs its template
// allows and the membership plan; the credentials a reconciler derives.
#include <gtest/gtest.h>

#include "operator/controller/reconciler_test_fixture.h"

namespace vf::controller::reconciler_fixture {
namespace {

TEST_F(ReconcilerTest, SpecTheParserRejectsFailsTheJobWithItsMessage) {
  Start({Job({{"virtualNodes", 8}, {"globalBatchSize", 250}, {"steps", 10}})}, {}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> patches = api_->status_patches();
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0]["phase"], "Failed");
  EXPECT_EQ(patches[0]["message"],
            "team/mnist: spec.globalBatchSize (250) must be divisible by spec.virtualNodes (8): "
            "every virtual node takes an equal micro-batch");
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"InvalidSpec"}));
}

TEST_F(ReconcilerTest, CreatesThePodsThePolicyWantsWithTheSpecsGpus) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 2u);  // replicas.max, with 4 GPUs free
  EXPECT_EQ(pods[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "1");
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Pending");
  EXPECT_EQ(status["desiredWorkers"], 2);
}

TEST_F(ReconcilerTest, UnderRequireQueueAJobWithoutAQueueLabelGetsNoPodsAndSaysWhy) {
  require_queue_ = true;
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_pods().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Pending");
  EXPECT_EQ(status["desiredWorkers"], 0);
  json admitted;
  for (const json& c : status["conditions"]) {
    if (c["type"] == "Admitted") admitted = c;
  }
  ASSERT_FALSE(admitted.is_null()) << status.dump();
  EXPECT_EQ(admitted["status"], "False");
  EXPECT_EQ(admitted["reason"], "QueueNameMissing");
  EXPECT_NE(admitted["message"].get<std::string>().find("kueue.x-k8s.io/queue-name"),
            std::string::npos);
  EXPECT_EQ(status["message"], admitted["message"]);
}

TEST_F(ReconcilerTest, AStatusTheCacheHasNotSeenYetIsNotWrittenTwice) {
  // The fake's cache never sees the reconciler's writes: the job stays at resourceVersion 7,
  // as a job does between a status write and its watch event.
  json job = EpochJob();
  job["metadata"]["resourceVersion"] = "7";
  Start({job}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->status_patches().size(), 1u);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().size(), 1u);
}

TEST_F(ReconcilerTest, EachWorkerPodGetsACredentialOfItsOwnThatTheCoordinatorAccepts) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  const std::vector<json> secrets = api_->created_secrets();
  ASSERT_EQ(pods.size(), 2u);
  ASSERT_EQ(secrets.size(), 2u);
  for (size_t i = 0; i < pods.size(); ++i) {
    const std::string pod = pods[i]["metadata"]["name"];
    EXPECT_EQ(secrets[i]["metadata"]["name"], pod + "-vf-credential");
    EXPECT_EQ(pods[i]["spec"]["volumes"][0]["secret"]["secretName"], pod + "-vf-credential");
    const std::string credential = secrets[i]["stringData"]["token"];
    // Derived from the job's secret, which is derived from the operator's key and the job's UID.
    EXPECT_EQ(credential, WorkerCredential(DeriveJobSecret(kJobKey, kUid).value(), pod).value());
    EXPECT_TRUE(coordinator_.CheckCredential(kKey, pod, credential).ok());
    const std::string other = pods[1 - i]["metadata"]["name"];
    EXPECT_EQ(coordinator_.CheckCredential(kKey, other, credential).code(),
              StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(api_->secret_reads(), std::vector<std::string>{});
  // replicas.max is 2: the coordinator registers at most twice that (live workers and their
  // replacements); one more is told to wait for room (Unavailable), not refused for good.
  const JobView view = coordinator_.GetJob(kKey).value();
  for (int w = 0; w < 4; ++w) {
    ASSERT_TRUE(
        coordinator_
            .RegisterWorker(kKey, "w-" + std::to_string(w), view.fingerprint, view.build, true)
            .ok());
  }
  EXPECT_EQ(coordinator_.RegisterWorker(kKey, "w-4", view.fingerprint, view.build, true).code(),
            StatusCode::kUnavailable);
}

TEST_F(ReconcilerTest, APolicyOfTheJobsNameThatIsNotTheOperatorsBlocksTheJobAndSaysSo) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)}, NetworkPolicySettings{kScrapers});
  api_->PolicyNameTaken(true);
  Result<ReconcileResult> r = reconciler_->Reconcile(kKey);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("team/mnist-vf-workers exists and is not the operator's"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"FailedNetworkPolicy"}));
  EXPECT_TRUE(api_->created_pods().empty());  // no pod that the policy would not isolate
}

TEST_F(ReconcilerTest, AnotherReconcilerWithTheSameKeyDerivesTheSameCredentials) {
  // An operator restarted (or its standby leading) reads the same key: the workers' credentials
  // still hold, without any Secret of the job's being read.
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> secrets = api_->created_secrets();
  ASSERT_EQ(secrets.size(), 2u);
  // The restarted operator's cache shows the pods (a worker whose pod it does not see has no
  // credential it accepts).
  std::vector<json> pods;
  for (json pod : api_->created_pods()) {
    pod["metadata"]["uid"] = "pod-" + pod["metadata"].value("name", "");
    pod["status"] = {{"phase", "Running"}};
    pods.push_back(pod);
  }
  Reset();
  Start({EpochJob()}, pods, {GpuNode("gpu-a", 4)});
  Coordinator restarted;
  ReconcilerOptions options;
  options.job_key = kJobKey;
  auto again = Reconciler::Create(*client_, *jobs_, *pods_, *nodes_, restarted, options).value();
  ASSERT_TRUE(again->Reconcile(kKey).ok());
  for (const json& secret : secrets) {
    const std::string pod = secret["metadata"]["ownerReferences"][0]["name"];
    const std::string credential = secret["stringData"]["token"];
    EXPECT_TRUE(restarted.CheckCredential(kKey, pod, credential).ok()) << pod;
  }
}

TEST_F(ReconcilerTest, AReconcilerWithoutAKeyIsRefused) {
  Start({}, {}, {});
  ReconcilerOptions options;
  options.job_key = "short";
  EXPECT_EQ(
      Reconciler::Create(*client_, *jobs_, *pods_, *nodes_, coordinator_, options).status().code(),
      StatusCode::kInvalidArgument);
}

TEST_F(ReconcilerTest, EpochJobLengthIsUnknownUntilAnAgentReportsIt) {
  Start({EpochJob()}, {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b")},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_FALSE(api_->status_patches().back().contains("totalSteps"));

  Ready({"mnist-worker-a", "mnist-worker-b"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json started = api_->status_patches().back();
  EXPECT_EQ(started["epoch"], 1);
  ASSERT_EQ(started["assignment"].size(), 2u);
  EXPECT_EQ(started["assignment"][0]["virtualNodes"], json({0, 1}));
  EXPECT_EQ(coordinator_.GetPlan(kKey)->members.size(), 2u);
  EXPECT_FALSE(started.contains("totalSteps"));

  // The agents loaded a training set of 1000 samples: 15 steps an epoch, 30 in all.
  Report report;
  report.epoch = 1;
  report.step = 3;
  report.total_steps = 30;
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json known = api_->status_patches().back();
  EXPECT_EQ(known["totalSteps"], 30);
  EXPECT_EQ(known["step"], 3);
}

// The cache here never shows the operator's own status writes (as a lagging informer does for a
// moment): it says step 33 throughout. Neither the pass that publishes a new plan nor the one
// after it, with no report of the new epoch yet, may take the step back to what the cache says.
TEST_F(ReconcilerTest, TheStepNeverGoesBackWhenTheCacheLagsBehind) {
  json job = EpochJob();
  job["spec"]["replicas"]["max"] = 3;
  job["status"] = {{"step", 33}, {"observedGeneration", 1}};
  Start({job},
        {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b"), RunningPod("mnist-worker-c")},
        {GpuNode("gpu-a", 3)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a", "mnist-worker-b"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(coordinator_.GetPlan(kKey)->epoch, 1);
  Report report;
  report.epoch = 1;
  report.step = 62;
  report.total_steps = 300;
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["step"], 62);

  // A third worker is ready: the operator publishes a plan of 3, which no member has reported
  // under yet.
  const size_t before = api_->status_patches().size();
  Ready({"mnist-worker-c"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(coordinator_.GetPlan(kKey)->epoch, 2);
  const std::vector<json> patches = api_->status_patches();
  ASSERT_GT(patches.size(), before);
  for (size_t i = before; i < patches.size(); ++i) {
    EXPECT_EQ(patches[i].value("step", 0), 62) << patches[i];
  }
  // Reports of the new epoch move it on.
  report.epoch = 2;
  report.step = 63;
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-b", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["step"], 63);
}

TEST_F(ReconcilerTest, StepJobLengthIsKnownFromItsSpec) {
  Start({Job({{"virtualNodes", 4}, {"globalBatchSize", 64}, {"steps", 25}})}, {},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["totalSteps"], 25);
}

TEST_F(ReconcilerTest, ACpuOnlyJobGetsTheWorkersItsNodesCpusFit) {
  // 4 CPUs on the node its selector allows fit two workers of 1.5 CPUs, whatever replicas.max
  // and the other node (and the GPU node) would allow.
  Start({CpuOnlyJob()}, {},
        {CpuNode("cpu-a", "4", "cpu"), CpuNode("cpu-b", "64", "other"), GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 2u);
  const json& resources = pods[0]["spec"]["containers"][0]["resources"];
  EXPECT_EQ(resources["requests"]["cpu"], "1500m");
  EXPECT_FALSE(resources.value("limits", json::object()).contains("nvidia.com/gpu"));
  EXPECT_EQ(api_->status_patches().back()["desiredWorkers"], 2);
}

TEST_F(ReconcilerTest, ACpuOnlyJobsWorkersOnACpuNodeStartTraining) {
  json a = RunningPod("mnist-worker-a");
  json b = RunningPod("mnist-worker-b");
  for (json* pod : {&a, &b}) (*pod)["spec"]["nodeName"] = "cpu-a";
  Start({CpuOnlyJob()}, {a, b}, {CpuNode("cpu-a", "4", "cpu")});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a", "mnist-worker-b"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["epoch"], 1);
  EXPECT_EQ(coordinator_.GetPlan(kKey)->members.size(), 2u);
}

TEST_F(ReconcilerTest, AGpuJobWhoseSelectorMatchesNoNodeWaits) {
  json job = EpochJob();
  job["spec"]["template"]["spec"] = {{"nodeSelector", {{"pool", "nowhere"}}},
                                     {"containers", {{{"name", "worker"}}}}};
  Start({job}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_pods().empty());
  EXPECT_EQ(api_->status_patches().back()["desiredWorkers"], 0);
}

TEST(ResizeKindTest, EachKindOfMembershipChangeHasOneAndTheFirstPlanNone) {
  EXPECT_EQ(ResizeKindOf("grow"), ResizeKind::kGrow);
  EXPECT_EQ(ResizeKindOf("shrink"), ResizeKind::kShrink);
  EXPECT_EQ(ResizeKindOf("failure"), ResizeKind::kFailure);
  EXPECT_EQ(ResizeKindOf("leave"), ResizeKind::kLeave);
  EXPECT_EQ(ResizeKindOf("start"), std::nullopt);
  EXPECT_EQ(ResizeKindOf("worker-lost"), std::nullopt);
}

}  // namespace
}  // namespace vf::controller::reconciler_fixture
