// The reconciler against an API server stand-in and a real coordinator (reconciler_test_fixture.h):
// What the status and the Events say: blocked reconciles, checkpoints, worker counts, what a
// new job costs in writes, the policy a job names, and the image its workers run.
#include <gtest/gtest.h>

#include "operator/controller/reconciler_test_fixture.h"

namespace vf::controller::reconciler_fixture {
namespace {

// The operator's own plan, newer than what the cache shows of the status (a plan published a
// moment ago), says who rank 0 is.
TEST_F(ReconcilerTest, RankZeroIsOfTheNewestPlanTheOperatorKnows) {
  Start({StepJob(nullptr, TwoWorkerJobStatus())}, {RunningPod(kRank0), RunningPod(kRank1)},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());  // restores the plan of epoch 1
  ASSERT_TRUE(
      coordinator_.PublishPlanWithEpoch(kKey, 5, {{kRank1, 0, {0, 1}}, {kRank0, 1, {2, 3}}}).ok());
  Reset();
  Start({StepJob(nullptr, TwoWorkerJobStatus())},
        {SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, FinalReport('d'))),
         RunningPod(kRank1)},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& patch : api_->status_patches()) {
    EXPECT_NE(patch.value("phase", ""), "Succeeded") << patch;
  }
  const std::vector<std::string> messages = api_->event_messages();
  EXPECT_TRUE(std::any_of(messages.begin(), messages.end(), [](const std::string& m) {
    return m.find("not rank 0 of the job's last plan (mnist-worker-ccccc was)") !=
           std::string::npos;
  }));
}

TEST_F(ReconcilerTest, APodTheQuotaRefusesIsAConditionAndOneWarningEventCounted) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  api_->RefusePods(true);
  Result<ReconcileResult> first = reconciler_->Reconcile(kKey);
  ASSERT_FALSE(first.ok());  // the work queue retries it, with backoff
  EXPECT_NE(first.status().message().find("exceeded quota"), std::string::npos);
  const json status = api_->status_patches().back();
  const json* blocked = Condition(status, "ReconcileError");
  ASSERT_NE(blocked, nullptr) << status;
  EXPECT_EQ((*blocked)["status"], "True");
  EXPECT_EQ((*blocked)["reason"], "FailedCreatePod");
  const std::string message = (*blocked)["message"];
  EXPECT_NE(message.find("Forbidden"), std::string::npos) << message;
  EXPECT_NE(message.find("exceeded quota: gpus"), std::string::npos) << message;
  // The random pod name is left out, so that every retry reads the same.
  EXPECT_NE(message.find("pods \"mnist-worker-*\" is forbidden"), std::string::npos) << message;
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"FailedCreatePod"}));
  EXPECT_TRUE(api_->event_patches().empty());

  // The retries: the same Event, its count going up, not a new one each time.
  ASSERT_FALSE(reconciler_->Reconcile(kKey).ok());
  ASSERT_FALSE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"FailedCreatePod"}));
  const auto patches = api_->event_patches();
  ASSERT_EQ(patches.size(), 2u);
  EXPECT_EQ(patches[0].first, patches[1].first);
  EXPECT_EQ(patches[0].second["count"], 2);
  EXPECT_EQ(patches[1].second["count"], 3);
  EXPECT_TRUE(patches[1].second.contains("lastTimestamp"));

  api_->RefusePods(false);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 2u);
}

TEST_F(ReconcilerTest, APassThatSucceedsClearsReconcileError) {
  json status = {{"phase", "Pending"},
                 {"conditions",
                  {{{"type", "ReconcileError"},
                    {"status", "True"},
                    {"reason", "FailedCreatePod"},
                    {"message", "exceeded quota"}}}}};
  Start({StepJob(nullptr, status)}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json after = api_->status_patches().back();
  const json* cleared = Condition(after, "ReconcileError");
  ASSERT_NE(cleared, nullptr);
  EXPECT_EQ((*cleared)["status"], "False");
  EXPECT_EQ((*cleared)["reason"], "Reconciled");
}

TEST_F(ReconcilerTest, AFailedCheckpointIsAConditionAndAWarningEventPerFailure) {
  int failures_counted = 0;  // the operator's vf_operator_job_checkpoint_failures_total
  hooks_.on_checkpoint_failure = [&](const std::string& job) {
    EXPECT_EQ(job, kKey);
    ++failures_counted;
  };
  Start({StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {RunningPod("mnist-worker-a")}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(Condition(api_->status_patches().back(), "CheckpointFailing"), nullptr);
  const size_t events_before = api_->event_reasons().size();

  Report report;
  report.epoch = 1;
  report.step = 10;
  report.checkpoint_step = 10;
  report.checkpoint_error = "checkpoint /ckpt/job.state: No space left on device";
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json failing = api_->status_patches().back();
  EXPECT_EQ(failing["phase"], "Running");  // training goes on
  const json* c = Condition(failing, "CheckpointFailing");
  ASSERT_NE(c, nullptr) << failing;
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_EQ((*c)["reason"], "CheckpointWriteFailed");
  EXPECT_NE((*c)["message"].get<std::string>().find("step 10"), std::string::npos);
  EXPECT_NE((*c)["message"].get<std::string>().find("No space left on device"), std::string::npos);
  ASSERT_EQ(api_->event_reasons().size(), events_before + 1);
  EXPECT_EQ(api_->event_reasons().back(), "CheckpointFailed");
  EXPECT_EQ(failures_counted, 1);

  // The same failure seen again is not another Event; the next checkpoint's failure counts.
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->event_patches().empty());
  EXPECT_EQ(failures_counted, 1);
  report.step = report.checkpoint_step = 20;
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->event_reasons().size(), events_before + 1);
  ASSERT_EQ(api_->event_patches().size(), 1u);
  EXPECT_EQ(api_->event_patches()[0].second["count"], 2);
  EXPECT_EQ(failures_counted, 2);
}

// A plan made because a member reported a failure names, in its Recovered event, what was
// reported: a failure that recurs plan after plan (a communicator that cannot be built) shows
// its cause among the job's events, not only "a worker failed".
TEST_F(ReconcilerTest, ARecoveryEventNamesWhatTheMembersReported) {
  json job = StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}});
  job["spec"]["replicas"] = {{"min", 1}, {"max", 2}};
  std::vector<ResizeKind> resizes;  // Reconcile runs on this thread
  hooks_.on_resize = [&resizes](const std::string&, ResizeKind kind, int, int) {
    resizes.push_back(kind);
  };
  Start({job}, {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a", "mnist-worker-b"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(coordinator_.GetPlan(kKey)->members.size(), 2u);
  const int64_t epoch = coordinator_.GetPlan(kKey)->epoch;
  ASSERT_TRUE(coordinator_
                  .RecordFailure(kKey, "mnist-worker-b", epoch, 0,
                                 "gloo rendezvous (rank 1 of 2): connection refused")
                  .ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(coordinator_.GetPlan(kKey)->epoch, epoch + 1);
  ASSERT_FALSE(api_->event_reasons().empty());
  EXPECT_EQ(api_->event_reasons().back(), "Recovered");
  // The first plan is no resize; the recovery is one, of its kind.
  EXPECT_EQ(resizes, std::vector<ResizeKind>{ResizeKind::kFailure});
  const std::string message = api_->event_messages().back();
  EXPECT_NE(message.find("a worker failed"), std::string::npos) << message;
  EXPECT_NE(message.find("mnist-worker-b reported: gloo rendezvous (rank 1 of 2): connection "
                         "refused"),
            std::string::npos)
      << message;
}

TEST_F(ReconcilerTest, ASuspendedJobTakesNoGpusFromAnother) {
  json other = StepJob(nullptr, nullptr);
  other["metadata"]["name"] = "other";
  other["metadata"]["uid"] = "u-2";
  other["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z";  // first in line, but suspended
  other["spec"]["replicas"] = {{"min", 1}, {"max", 1}};
  json mine = StepJob(nullptr, nullptr);
  mine["spec"]["replicas"] = {{"min", 1}, {"max", 1}};
  Start({Suspended(other, true), mine}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
}

TEST_F(ReconcilerTest, WorkerCountsSayWhereEachPodIs) {
  json job = EpochJob();
  job["spec"]["replicas"]["max"] = 4;
  Start({job},
        {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b"), RunningPod("mnist-worker-c"),
         PendingPod("mnist-worker-e"), TerminatingPod("mnist-worker-f"),
         FailedPod("mnist-worker-g", 1)},
        {GpuNode("gpu-a", 6)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());  // registers the job with the coordinator
  ASSERT_TRUE(coordinator_.GetJob(kKey).ok()) << api_->status_patches().back().dump();
  // a and b train; c is warming up outside the plan.
  Ready({"mnist-worker-a", "mnist-worker-b"});
  const Result<Plan> plan = coordinator_.PublishPlanWithEpoch(
      kKey, 1, {{"mnist-worker-a", 0, {0, 1}}, {"mnist-worker-b", 1, {2, 3}}});
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const size_t created_before = api_->created_pods().size();
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json counts = api_->status_patches().back()["workerCounts"];
  EXPECT_EQ(counts["training"], 2) << counts;
  EXPECT_EQ(counts["joining"], 1) << counts;
  EXPECT_EQ(counts["leaving"], 1) << counts;  // f, being deleted
  EXPECT_EQ(counts["failed"], 1) << counts;
  // e, and whatever the policy had created on top this pass.
  EXPECT_EQ(counts["pending"], 1 + static_cast<int>(api_->created_pods().size() - created_before))
      << counts;
}

TEST_F(ReconcilerTest, ANewJobsFirstPodsAreInItsCreatedConditionWithoutAnEvent) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->created_pods().size(), 2u);
  // The status says it, with the moment: no Event (a request for every job) says it again.
  EXPECT_EQ(api_->event_reasons(), std::vector<std::string>{});
  const json status = api_->status_patches().back();
  const json* created = Condition(status, "Created");
  ASSERT_NE(created, nullptr) << status;
  EXPECT_EQ((*created)["status"], "True");
  EXPECT_EQ((*created)["reason"], "PodsCreated");
  EXPECT_TRUE((*created)["lastTransitionTime"].is_string());
  EXPECT_EQ(status["workerCounts"]["pending"], 2);
  EXPECT_EQ(status["desiredWorkers"], 2);
}

TEST_F(ReconcilerTest, PodsCreatedForAJobThatHadSomeAreAnEvent) {
  json job = EpochJob();
  job["status"] = {{"phase", "Pending"},
                   {"conditions",
                    {{{"type", "Created"},
                      {"status", "True"},
                      {"reason", "PodsCreated"},
                      {"message", "worker pods were created"},
                      {"lastTransitionTime", SecondsAgo(60)}}}}};
  Start({job}, {PendingPod("mnist-worker-a")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
  EXPECT_EQ(api_->event_reasons(), std::vector<std::string>{"WorkersCreated"});
}

TEST_F(ReconcilerTest, ANewJobsStatusStaysAsWrittenOnceItsPodsAreSeen) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->status_patches().size(), 1u);
  json job = EpochJob();
  job["status"] = api_->status_patches().back();
  std::vector<json> pods;
  for (const json& body : api_->created_pods()) pods.push_back(AsCreated(body));
  ASSERT_EQ(pods.size(), 2u);
  // A moment later: the cache shows the status written and the pods, pending and warming up.
  Reset();
  Start({job}, pods, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 0u);
  EXPECT_EQ(api_->status_patches().size(), 0u) << api_->status_patches().back() << "\nover\n"
                                               << job["status"];
}

TEST_F(ReconcilerTest, AJobThatNamesItsPolicyIsSizedByIt) {
  // The operator runs the elastic policy (its --policy); autoscale starts at the minimum.
  json job = EpochJob();
  job["spec"]["replicas"]["max"] = 4;
  job["spec"]["elasticity"] = {{"policy", "autoscale"}};
  Start({job}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
}

TEST_F(ReconcilerTest, AJobThatNamesNoPolicyGetsTheOperators) {
  json job = EpochJob();
  job["spec"]["replicas"]["max"] = 4;
  Start({job}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 4u);  // elastic: the idle GPUs, lent
}

TEST_F(ReconcilerTest, ANewJobRecordsTheImageItsFirstPodsRun) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 2u);
  for (const json& pod : pods) {
    EXPECT_EQ(pod["spec"]["containers"][0]["image"], "virtualflow/agent:1");
  }
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["workerImage"], "virtualflow/agent:1");
  EXPECT_EQ(Condition(status, "ImageKept"), nullptr);
}

TEST_F(ReconcilerTest, AJobWithATemplateImageRunsItWhateverTheDefault) {
  json job = EpochJob();
  job["spec"]["template"]["spec"]["containers"] = {
      {{"name", "worker"}, {"image", "example/train:3"}}};
  default_image_ = "virtualflow/agent:2";
  Start({job}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->created_pods().size(), 1u);
  EXPECT_EQ(api_->created_pods()[0]["spec"]["containers"][0]["image"], "example/train:3");
  EXPECT_EQ(api_->status_patches().back()["workerImage"], "example/train:3");
}

// An operator upgraded with a new default image: a running job's new pods (a joiner here) run
// the image its workers run, and the job says why it is not the default.
TEST_F(ReconcilerTest, ARunningJobsNewPodsRunItsImageAfterTheDefaultChanged) {
  default_image_ = "virtualflow/agent:2";
  Start({RunningJobOf({{"workerImage", "virtualflow/agent:1"}})},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0]["spec"]["containers"][0]["image"], "virtualflow/agent:1");
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["workerImage"], "virtualflow/agent:1");
  const json* kept = Condition(status, "ImageKept");
  ASSERT_NE(kept, nullptr) << status;
  EXPECT_EQ((*kept)["status"], "True");
  EXPECT_EQ((*kept)["reason"], "JobStartedOnIt");
  const std::string message = (*kept)["message"];
  EXPECT_NE(message.find("virtualflow/agent:1"), std::string::npos) << message;
  EXPECT_NE(message.find("virtualflow/agent:2"), std::string::npos) << message;
}

// The same job started by an operator that did not record the image: it is read from the
// member's pod.
TEST_F(ReconcilerTest, ARunningJobWithoutARecordedImageKeepsItsPodsImage) {
  default_image_ = "virtualflow/agent:2";
  Start({RunningJobOf(json::object())},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->created_pods().size(), 1u);
  EXPECT_EQ(api_->created_pods()[0]["spec"]["containers"][0]["image"], "virtualflow/agent:1");
  EXPECT_EQ(api_->status_patches().back()["workerImage"], "virtualflow/agent:1");
}

// A worker the coordinator refused for running another build (exit code kExitAnotherBuild)
// fails neither the job (even with backoffLimit 0) nor counts as a worker failure: its pod is
// replaced by one of the job's image, and an Event says so.
TEST_F(ReconcilerTest, AWorkerRefusedForAnotherBuildIsReplacedWithoutFailingTheJob) {
  default_image_ = "virtualflow/agent:2";
  json job = RunningJobOf({{"workerImage", "virtualflow/agent:1"}});
  job["spec"]["runPolicy"] = {{"backoffLimit", 0}};
  Start({job},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1"),
         PodOfImage(FailedPod("mnist-worker-r", kExitAnotherBuild), "virtualflow/agent:2")},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_NE(status["phase"], "Failed") << status;
  EXPECT_FALSE(status["restarts"].contains("failure")) << status;
  const std::vector<std::string> events = api_->event_reasons();
  EXPECT_NE(std::find(events.begin(), events.end(), "WorkerRefused"), events.end());
  EXPECT_EQ(std::find(events.begin(), events.end(), "WorkerFailed"), events.end());
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 1u);
  EXPECT_EQ(deletions[0].first, "/api/v1/namespaces/team/pods/mnist-worker-r");
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0]["spec"]["containers"][0]["image"], "virtualflow/agent:1");
}

// The build a member brings is the job's, recorded once one has registered.
TEST_F(ReconcilerTest, TheBuildOfTheMembersIsRecordedOnceOneRegistered) {
  Start({RunningJobOf({{"workerImage", "virtualflow/agent:1"}})},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_FALSE(api_->status_patches().back().contains("workerBuild"));
  const JobView view = coordinator_.GetJob(kKey).value();
  ASSERT_TRUE(
      coordinator_
          .RegisterWorker(kKey, "mnist-worker-a", view.fingerprint, "virtualflow 0.0.9", true)
          .ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["workerBuild"], "virtualflow 0.0.9");
}

}  // namespace
}  // namespace vf::controller::reconciler_fixture
