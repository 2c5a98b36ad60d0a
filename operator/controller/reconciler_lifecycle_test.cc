// The reconciler against an API server stand-in and a real coordinator (reconciler_test_fixture.h):
// How a job ends and pauses: spec.runPolicy (backoff, deadline, TTL, cleanPodPolicy), its start
// and completion times, the outcome read from a final report, and spec.suspend.
#include <gtest/gtest.h>

#include "operator/controller/reconciler_test_fixture.h"

namespace vf::controller::reconciler_fixture {
namespace {

TEST_F(ReconcilerTest, NewPodsArePinnedToTheProductThePolicyChose) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& pod : api_->created_pods()) {
    EXPECT_EQ(pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"], "V100");
  }
}

TEST_F(ReconcilerTest, MoreWorkerFailuresThanTheBackoffLimitFailTheJob) {
  Start({StepJob({{"backoffLimit", 1}}, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 1), FailedPod("mnist-worker-b", 137)}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Failed");
  EXPECT_EQ(status["message"],
            "2 worker failures, more than spec.runPolicy.backoffLimit (1) allows");
  EXPECT_EQ(status["restarts"]["failure"], 2);
  const json* failed = Condition(status, "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["reason"], "BackoffLimitExceeded");
  EXPECT_EQ(status["failed"], 2);
  // batch/v1: a failed job has no completionTime; its Failed condition says when.
  EXPECT_FALSE(status.contains("completionTime"));
  const std::vector<std::string> events = api_->event_reasons();
  EXPECT_EQ(events.back(), "BackoffLimitExceeded");
  EXPECT_FALSE(coordinator_.GetJob(kKey).ok());  // its workers stop
  EXPECT_TRUE(api_->created_pods().empty());     // and none replaces them
}

TEST_F(ReconcilerTest, WorkerFailuresUpToTheBackoffLimitAreRetried) {
  Start({StepJob({{"backoffLimit", 2}}, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 1), FailedPod("mnist-worker-b", 1)}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_NE(status["phase"], "Failed");
  EXPECT_EQ(status["restarts"]["failure"], 2);
  EXPECT_FALSE(status.contains("completionTime"));
}

TEST_F(ReconcilerTest, AJobPastItsActiveDeadlineFailsWithDeadlineExceeded) {
  const std::string start = SecondsAgo(120);
  Start({StepJob({{"activeDeadlineSeconds", 60}}, {{"phase", "Running"}, {"startTime", start}})},
        {RunningPod("mnist-worker-a")}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> patches = api_->status_patches();
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0]["phase"], "Failed");
  const json* failed = Condition(patches[0], "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["reason"], "DeadlineExceeded");
  EXPECT_NE(patches[0]["message"].get<std::string>().find(
                "past spec.runPolicy.activeDeadlineSeconds (60)"),
            std::string::npos)
      << patches[0]["message"];
  EXPECT_EQ(patches[0]["startTime"], start);
  EXPECT_FALSE(patches[0].contains("completionTime"));
  EXPECT_EQ(api_->event_reasons().back(), "DeadlineExceeded");
  EXPECT_FALSE(coordinator_.GetJob(kKey).ok());
}

TEST_F(ReconcilerTest, AJobBeforeItsActiveDeadlineRunsOn) {
  Start({StepJob({{"activeDeadlineSeconds", 3600}},
                 {{"phase", "Running"}, {"startTime", SecondsAgo(120)}})},
        {}, {GpuNode("gpu-a", 1)});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_NE(api_->status_patches().back()["phase"], "Failed");
  EXPECT_GT(result->requeue_after.count(), 0);
  EXPECT_FALSE(api_->created_pods().empty());
}

TEST_F(ReconcilerTest, AFinishedJobPastItsTtlIsDeleted) {
  Start({StepJob({{"ttlSecondsAfterFinished", 60}}, {{"phase", "Succeeded"},
                                                     {"startTime", SecondsAgo(600)},
                                                     {"completionTime", SecondsAgo(120)}})},
        {}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 1u);
  EXPECT_EQ(deletions[0].first, kJobPath);
  EXPECT_EQ(deletions[0].second["preconditions"]["uid"], kUid);  // this incarnation only
  EXPECT_TRUE(api_->status_patches().empty());
}

TEST_F(ReconcilerTest, AFinishedJobBeforeItsTtlIsLookedAtAgainWhenItRunsOut) {
  const std::string completed = SecondsAgo(10);
  Start({StepJob(
            {{"ttlSecondsAfterFinished", 3600}},
            {{"phase", "Failed"}, {"startTime", SecondsAgo(600)}, {"completionTime", completed}})},
        {}, {});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(api_->deletions().empty());
  EXPECT_TRUE(api_->status_patches().empty());  // completionTime stays as it was
  EXPECT_GT(result->requeue_after, std::chrono::seconds(3580));
  EXPECT_LE(result->requeue_after, std::chrono::seconds(3591));
}

TEST_F(ReconcilerTest, WorkerFailuresDefaultToBatchV1sBackoffLimitOfSix) {
  std::vector<json> pods;
  for (const char* name : {"a", "b", "c", "d", "e", "f"}) {
    pods.push_back(FailedPod(std::string("mnist-worker-") + name, 1));
  }
  Start({StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})}, pods,
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_NE(api_->status_patches().back()["phase"], "Failed");
  EXPECT_EQ(api_->status_patches().back()["failed"], 6);
}

TEST_F(ReconcilerTest, FailuresTheStatusCountedAreNotCountedAgainByARestartedOperator) {
  // As an operator that restarted finds the job: one failure counted, its pod not yet deleted.
  const json counted = {{"phase", "Running"},
                        {"startTime", SecondsAgo(600)},
                        {"failed", 1},
                        {"lastFailureTime", SecondsAgo(300)},
                        {"countedFailedPods", {"mnist-worker-a"}}};
  Start({StepJob({{"backoffLimit", 1}}, counted)}, {FailedPod("mnist-worker-a", 1)},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_NE(status["phase"], "Failed");
  EXPECT_EQ(status["failed"], 1);
  const std::vector<std::string> events = api_->event_reasons();
  EXPECT_EQ(std::count(events.begin(), events.end(), "WorkerFailed"), 0);
}

TEST_F(ReconcilerTest, ASecondFailureAfterARestartFailsTheJobAtItsBackoffLimit) {
  // The count lives in the status: a new failure adds to it, whatever the operator forgot.
  const json counted = {{"phase", "Running"},
                        {"startTime", SecondsAgo(600)},
                        {"failed", 1},
                        {"lastFailureTime", SecondsAgo(300)}};
  Start({StepJob({{"backoffLimit", 1}}, counted)}, {FailedPod("mnist-worker-b", 1)},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Failed");
  EXPECT_EQ(status["failed"], 2);
  EXPECT_EQ((*Condition(status, "Failed"))["reason"], "BackoffLimitExceeded");
}

TEST_F(ReconcilerTest, AFailureIsRecordedInStatusBeforeItsPodIsDeleted) {
  Start({StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 1)}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json first = api_->status_patches().front();
  EXPECT_EQ(first["failed"], 1);
  EXPECT_EQ(first["countedFailedPods"], json::array({"mnist-worker-a"}));
  EXPECT_TRUE(first.contains("lastFailureTime"));
  bool deleted = false;
  for (const auto& [path, body] : api_->deletions()) {
    deleted = deleted || path.find("/pods/mnist-worker-a") != std::string::npos;
  }
  EXPECT_TRUE(deleted);
}

TEST_F(ReconcilerTest, AReplacementWaitsOutTheBackoffAfterAFailure) {
  const json recent = {{"phase", "Running"},
                       {"startTime", SecondsAgo(600)},
                       {"failed", 2},
                       {"lastFailureTime", SecondsAgo(5)}};
  Start({StepJob(nullptr, recent)}, {}, {GpuNode("gpu-a", 1)});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(api_->created_pods().empty());  // 20 s after the second failure
  EXPECT_GT(result->requeue_after.count(), 0);
}

TEST_F(ReconcilerTest, AReplacementIsCreatedOnceTheBackoffIsOver) {
  const json past = {{"phase", "Running"},
                     {"startTime", SecondsAgo(600)},
                     {"failed", 2},
                     {"lastFailureTime", SecondsAgo(21)}};
  Start({StepJob(nullptr, past)}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
}

TEST_F(ReconcilerTest, APodFailurePolicyRuleFailsTheJobAtOnce) {
  const json rules = json::parse(R"({"backoffLimit": 5, "podFailurePolicy": {"rules": [
      {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}})");
  Start({StepJob(rules, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 42)}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Failed");
  const json* failed = Condition(status, "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["reason"], "PodFailurePolicy");
  EXPECT_NE(
      (*failed)["message"].get<std::string>().find("worker mnist-worker-a failed (exit code 42)"),
      std::string::npos)
      << (*failed)["message"];
  EXPECT_NE((*failed)["message"].get<std::string>().find(
                "matches spec.runPolicy.podFailurePolicy.rules[0], which fails the job"),
            std::string::npos)
      << (*failed)["message"];
  EXPECT_EQ(api_->event_reasons().back(), "PodFailurePolicy");
}

TEST_F(ReconcilerTest, AFailureAPodFailurePolicyIgnoresIsNotCountedNorBackedOff) {
  const json rules = json::parse(R"({"backoffLimit": 0, "podFailurePolicy": {"rules": [
      {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}}]}})");
  Start({StepJob(rules, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 42)}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_NE(status["phase"], "Failed");
  EXPECT_FALSE(status.contains("failed")) << status;
  EXPECT_EQ(status["restarts"]["failure"], 1);
  EXPECT_FALSE(api_->created_pods().empty());  // replaced at once
}

TEST_F(ReconcilerTest, CleanPodPolicyRunningDeletesAFinishedJobsRunningPodsOnly) {
  Start({FinishedJob({{"cleanPodPolicy", "Running"}})},
        {RunningPod("mnist-worker-a"), FailedPod("mnist-worker-b", 1)}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(DeletedPods(api_->deletions()), (std::vector<std::string>{"mnist-worker-a"}));
}

TEST_F(ReconcilerTest, CleanPodPolicyAllDeletesEveryPodOfAFinishedJob) {
  Start({FinishedJob({{"cleanPodPolicy", "All"}})},
        {RunningPod("mnist-worker-a"), FailedPod("mnist-worker-b", 1)}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(DeletedPods(api_->deletions()),
            (std::vector<std::string>{"mnist-worker-a", "mnist-worker-b"}));
}

TEST_F(ReconcilerTest, AFinishedJobKeepsItsPodsByDefault) {
  Start({FinishedJob(nullptr)}, {RunningPod("mnist-worker-a"), FailedPod("mnist-worker-b", 1)}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->deletions().empty());
}

TEST_F(ReconcilerTest, AFailedJobsTtlCountsFromItsFailedCondition) {
  json status = {{"phase", "Failed"},
                 {"startTime", SecondsAgo(600)},
                 {"conditions",
                  {{{"type", "Failed"},
                    {"status", "True"},
                    {"reason", "BackoffLimitExceeded"},
                    {"message", "x"},
                    {"lastTransitionTime", SecondsAgo(120)}}}}};
  Start({StepJob({{"ttlSecondsAfterFinished", 60}}, status)}, {}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->deletions().size(), 1u);
  EXPECT_EQ(api_->deletions()[0].first, kJobPath);
  EXPECT_TRUE(api_->status_patches().empty());  // no completionTime is made up for it
}

TEST_F(ReconcilerTest, ReplicasDesiredCapsTheWorkersAndTheStatusNamesTheSelector) {
  json job = Job({{"virtualNodes", 8},
                  {"globalBatchSize", 256},
                  {"steps", 10},
                  {"replicas", {{"min", 1}, {"max", 4}, {"desired", 2}}}});
  Start({job}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 2u);
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["desiredWorkers"], 2);
  EXPECT_EQ(status["selector"], "virtualflow.io/job=mnist");
}

TEST_F(ReconcilerTest, AFinishedJobWithoutTtlStays) {
  Start({StepJob(nullptr, {{"phase", "Succeeded"}, {"completionTime", SecondsAgo(99999)}})}, {},
        {});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(api_->deletions().empty());
  EXPECT_EQ(result->requeue_after.count(), 0);
}

TEST_F(ReconcilerTest, StartTimeIsSetOnTheFirstPassAndNeverMoves) {
  Start({StepJob(nullptr, nullptr)}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json first = api_->status_patches().back();
  ASSERT_TRUE(first.contains("startTime"));
  EXPECT_FALSE(first.contains("completionTime"));
  // The cache here never sees the write; a later pass still keeps the time it wrote.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["startTime"], first["startTime"]);
}

TEST_F(ReconcilerTest, StartTimeTheServerHoldsIsKept) {
  const std::string start = "2026-01-02T03:04:06Z";
  Start({StepJob(nullptr, {{"phase", "Pending"}, {"startTime", start}})}, {},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["startTime"], start);
}

TEST_F(ReconcilerTest, CompletionTimeIsSetOnceWhenTheJobSucceeds) {
  json a = RunningPod("mnist-worker-a");
  Start({StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})}, {a},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Report report;
  report.epoch = 1;
  report.step = 25;
  report.finished = true;
  report.weights_sha256 = std::string(64, 'a');
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json done = api_->status_patches().back();
  ASSERT_EQ(done["phase"], "Succeeded");
  ASSERT_TRUE(done.contains("completionTime"));
  EXPECT_EQ(done["startTime"], api_->status_patches().front()["startTime"]);
  for (const json& patch : api_->status_patches()) {
    if (patch != done) {
      EXPECT_FALSE(patch.contains("completionTime")) << patch;
    }
  }
}

// An operator killed after rank 0's final report reached its coordinator and before it wrote
// the status: the new one (a new, empty coordinator) reads the outcome rank 0 left in its pod.
TEST_F(ReconcilerTest, AFinalReportLeftInASucceededPodEndsTheJobAfterARestart) {
  Start({StepJob(nullptr, TwoWorkerJobStatus())},
        {SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, FinalReport('b'))),
         SucceededPod(kRank1, "")},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json done = api_->status_patches().back();
  ASSERT_EQ(done["phase"], "Succeeded") << done;
  EXPECT_EQ(done["weightsSha256"], std::string(64, 'b'));
  EXPECT_EQ(done["step"], 25);
  EXPECT_EQ(done["testAccuracy"], 0.75);
  EXPECT_TRUE(api_->created_pods().empty());  // no worker is started again
  EXPECT_TRUE(api_->deletions().empty());
  EXPECT_EQ(api_->event_reasons().back(), "Succeeded");
  EXPECT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 0u);
}

// The report is left after the final weights were saved: a crash on the way out changes
// nothing of the outcome.
TEST_F(ReconcilerTest, AFinalReportLeftByAWorkerThatCrashedOnItsWayOutEndsTheJob) {
  json crashed = SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, FinalReport('c')));
  crashed["status"]["phase"] = "Failed";
  crashed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = 139;
  Start({StepJob(nullptr, TwoWorkerJobStatus())}, {crashed}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json done = api_->status_patches().back();
  ASSERT_EQ(done["phase"], "Succeeded") << done;
  EXPECT_EQ(done["weightsSha256"], std::string(64, 'c'));
  EXPECT_TRUE(api_->created_pods().empty());
}

TEST_F(ReconcilerTest, ATerminationMessageThatIsNoFinalReportOfItsPodIsNotTaken) {
  Start({StepJob(nullptr, TwoWorkerJobStatus())},
        {SucceededPod(kRank0, "{\"kind\": \"something else\"}"),
         SucceededPod(kRank1, protocol::FinalReportMessage(kRank0, FinalReport('b')))},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& patch : api_->status_patches()) EXPECT_NE(patch.value("phase", ""), "Succeeded");
  const std::vector<std::string> messages = api_->event_messages();
  ASSERT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 1u);
  EXPECT_NE(std::find_if(messages.begin(), messages.end(),
                         [](const std::string& m) {
                           return m.find(
                                      "pod mnist-worker-ccccc is ignored: its report names "
                                      "another worker (mnist-worker-bbbbb)") != std::string::npos;
                         }),
            messages.end());
}

// A member that was not rank 0 has no outcome to report: its final report, however well formed,
// is ignored, and the job goes on.
TEST_F(ReconcilerTest, AFinalReportFromAWorkerThatWasNotRankZeroIsIgnoredWithAnEvent) {
  Start({StepJob(nullptr, TwoWorkerJobStatus())},
        {RunningPod(kRank0),
         SucceededPod(kRank1, protocol::FinalReportMessage(kRank1, FinalReport('f')))},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& patch : api_->status_patches()) {
    EXPECT_NE(patch.value("phase", ""), "Succeeded") << patch;
    EXPECT_FALSE(patch.contains("weightsSha256")) << patch;
  }
  ASSERT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 1u);
  const std::vector<std::string> reasons = api_->event_reasons();
  const std::string message = api_->event_messages().at(static_cast<size_t>(
      std::find(reasons.begin(), reasons.end(), "ForgedOutcomeIgnored") - reasons.begin()));
  EXPECT_EQ(message,
            "the final report in the termination message of pod mnist-worker-ccccc is ignored: "
            "it was not rank 0 of the job's last plan (mnist-worker-bbbbb was)");
  // Recorded once, not on every pass.
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 1u);
  EXPECT_TRUE(api_->event_patches().empty());
}

// Anyone who may create pods in the namespace can give one the job's label and a termination
// message naming itself, even rank 0's name: without the job's controller reference, or with a
// name the operator never gives, it ends nothing.
TEST_F(ReconcilerTest, AFinalReportFromAPodTheJobDoesNotControlIsIgnoredWithAnEvent) {
  json stranger = SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, FinalReport('e')));
  stranger["metadata"]["ownerReferences"] = json::array();
  json misnamed =
      SucceededPod("mnist-rank0", protocol::FinalReportMessage("mnist-rank0", FinalReport('e')));
  Start({StepJob(nullptr, TwoWorkerJobStatus())}, {stranger, misnamed}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& patch : api_->status_patches()) {
    EXPECT_NE(patch.value("phase", ""), "Succeeded") << patch;
  }
  EXPECT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 2u);
  const std::vector<std::string> messages = api_->event_messages();
  const auto said = [&messages](const std::string& text) {
    return std::any_of(messages.begin(), messages.end(),
                       [&text](const std::string& m) { return m.find(text) != std::string::npos; });
  };
  EXPECT_TRUE(
      said("pod mnist-worker-bbbbb is ignored: the job does not control it (no owner "
           "reference with controller true to uid u-1)"));
  EXPECT_TRUE(
      said("pod mnist-rank0 is ignored: its name is not one the operator gives the "
           "job's worker pods"));
  // Neither counts as a worker of the job: no credential is accepted for them.
  const std::string secret = DeriveJobSecret(kJobKey, kUid).value();
  EXPECT_EQ(
      coordinator_.CheckCredential(kKey, kRank0, WorkerCredential(secret, kRank0).value()).code(),
      StatusCode::kUnauthenticated);
}

TEST_F(ReconcilerTest, ACheckpointWrittenAgainClearsCheckpointFailing) {
  json status = {{"phase", "Running"},
                 {"startTime", SecondsAgo(60)},
                 {"conditions",
                  {{{"type", "CheckpointFailing"},
                    {"status", "True"},
                    {"reason", "CheckpointWriteFailed"},
                    {"message", "checkpoint at step 10 not written"}}}}};
  Start({StepJob(nullptr, status)}, {RunningPod("mnist-worker-a")}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a"});
  // Before any worker reported a checkpoint (a restarted operator), the condition stays.
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json before = api_->status_patches().back();
  const json* kept = Condition(before, "CheckpointFailing");
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ((*kept)["status"], "True");

  Report report;
  report.epoch = 1;
  report.step = report.checkpoint_step = 20;
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json after = api_->status_patches().back();
  const json* cleared = Condition(after, "CheckpointFailing");
  ASSERT_NE(cleared, nullptr);
  EXPECT_EQ((*cleared)["status"], "False");
  EXPECT_EQ((*cleared)["reason"], "CheckpointWritten");
  EXPECT_EQ(api_->event_reasons().back(), "CheckpointWritten");
}

TEST_F(ReconcilerTest, SuspendingARunningJobDeletesItsPodsAndSaysSo) {
  Start({Suspended(StepJob({{"activeDeadlineSeconds", 60}},
                           {{"phase", "Running"},
                            {"startTime", SecondsAgo(600)},  // past the deadline: not failed
                            {"epoch", 3},
                            {"assignment", {{{"worker", "mnist-worker-a"}, {"rank", 0}}}},
                            {"workerImage", "virtualflow/agent:1"},
                            {"workerBuild", "virtualflow 0.1.0"}}),
                   true)},
        {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(coordinator_.AddJob(kKey, "secret", "fp", "build").ok());
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_GT(result->requeue_after.count(), 0);  // counts the stopping pods down
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 2u);
  EXPECT_EQ(deletions[0].first, "/api/v1/namespaces/team/pods/mnist-worker-a");
  EXPECT_FALSE(deletions[0].second.contains("gracePeriodSeconds"));  // the pod's own
  EXPECT_EQ(deletions[1].first, "/api/v1/namespaces/team/pods/mnist-worker-b");
  EXPECT_TRUE(api_->created_pods().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Suspended");
  EXPECT_EQ(status["workers"], 0);
  EXPECT_EQ(status["assignment"], json::array());
  EXPECT_EQ(status["epoch"], 3);
  EXPECT_TRUE(status["startTime"].is_null());    // the deadline counts again from the resume
  EXPECT_TRUE(status["workerImage"].is_null());  // resumed, it starts on the image of then
  EXPECT_TRUE(status["workerBuild"].is_null());
  const json* suspended = Condition(status, "Suspended");
  ASSERT_NE(suspended, nullptr);
  EXPECT_EQ((*suspended)["status"], "True");
  EXPECT_EQ((*suspended)["reason"], "JobSuspended");
  EXPECT_EQ((*Condition(status, "Running"))["status"], "False");
  EXPECT_EQ(Condition(status, "Failed"), nullptr);
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Suspended"}));
  EXPECT_FALSE(coordinator_.GetJob(kKey).ok());  // its workers have no plan to follow
}

TEST_F(ReconcilerTest, AJobCreatedSuspendedGetsNoPodsAndNoStartTime) {
  Start({Suspended(StepJob(nullptr, nullptr), true)}, {}, {GpuNode("gpu-a", 1)});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->requeue_after.count(), 0);
  EXPECT_TRUE(api_->created_pods().empty());
  EXPECT_TRUE(api_->deletions().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Suspended");
  EXPECT_FALSE(status.contains("startTime") && !status["startTime"].is_null());
}

TEST_F(ReconcilerTest, ResumingAJobCreatesPodsAndRestartsItsStartTime) {
  const std::string old_start = SecondsAgo(600);
  json job = StepJob({{"activeDeadlineSeconds", 60}}, {{"phase", "Suspended"},
                                                       {"epoch", 3},
                                                       {"assignment", json::array()},
                                                       {"conditions",
                                                        {{{"type", "Suspended"},
                                                          {"status", "True"},
                                                          {"reason", "JobSuspended"},
                                                          {"message", "job suspended"},
                                                          {"lastTransitionTime", old_start}}}}});
  Start({Suspended(job, false)}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Pending");
  ASSERT_TRUE(status.contains("startTime"));
  EXPECT_GT(status["startTime"].get<std::string>(), old_start);
  const json* suspended = Condition(status, "Suspended");
  ASSERT_NE(suspended, nullptr);
  EXPECT_EQ((*suspended)["status"], "False");
  EXPECT_EQ((*suspended)["reason"], "JobResumed");
  const std::vector<std::string> events = api_->event_reasons();
  EXPECT_EQ(events.front(), "Resumed");
  // The coordinator continues the epochs the status counted.
  EXPECT_EQ(coordinator_.GetPlan(kKey)->epoch, 3);
}

}  // namespace
}  // namespace vf::controller::reconciler_fixture
