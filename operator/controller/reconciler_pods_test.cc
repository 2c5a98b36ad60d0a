// The reconciler against an API server stand-in and a real coordinator (reconciler_test_fixture.h):
// Worker credentials: revoked with their pod or plan, a missing credential Secret replaced, and
// pods and Secrets the operator did not make left alone.
#include <gtest/gtest.h>

#include "operator/controller/reconciler_test_fixture.h"

namespace vf::controller::reconciler_fixture {
namespace {

// Rank 0 finished the job before the upgrade and left its final report in its pod: the job
// succeeds with it; nothing is drained.
TEST_F(ReconcilerTest, AJobThatFinishedUnderItsOldWorkersSucceedsRatherThanDrains) {
  Report final;
  final.epoch = 1;
  final.step = 25;
  final.finished = true;
  final.weights_sha256 = std::string(64, 'a');
  const json assignment = {{{"worker", kRank0}, {"rank", 0}, {"virtualNodes", {0, 1, 2, 3}}}};
  Start({RunningJobOf({{"workerProtocol", kProtocolVersion + 1}, {"assignment", assignment}})},
        {SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, final))}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->deletions().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Succeeded") << status;
  EXPECT_EQ(Condition(status, "Draining"), nullptr);
}

// A credential is a function of its worker's name: it is revoked by the coordinator refusing
// it once its worker has nothing left to say (its pod ended, or it acknowledged a plan without
// it).
TEST_F(ReconcilerTest, AWorkerWhosePodEndedOrThatLeftItsPlanLosesItsCredential) {
  json job = EpochJob();
  job["status"] = {{"phase", "Running"},
                   {"epoch", 1},
                   {"assignment",
                    {{{"worker", "mnist-worker-a"}, {"rank", 0}, {"virtualNodes", {0, 1}}},
                     {{"worker", "mnist-worker-b"}, {"rank", 1}, {"virtualNodes", {2, 3}}}}}};
  Start(
      {job},
      {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b"), FailedPod("mnist-worker-c", 1)},
      {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const auto check = [this](const std::string& worker) {
    return coordinator_.CheckCredential(kKey, worker, CredentialOf(worker)).code();
  };
  EXPECT_EQ(check("mnist-worker-a"), StatusCode::kOk);
  EXPECT_EQ(check("mnist-worker-b"), StatusCode::kOk);
  EXPECT_EQ(check("mnist-worker-c"), StatusCode::kUnauthenticated);  // its pod failed
  EXPECT_EQ(check("mnist-worker-x"), StatusCode::kUnauthenticated);  // no pod at all

  // b leaves: a plan without it, which it acknowledges on its way out.
  Ready({"mnist-worker-a", "mnist-worker-b"});
  ASSERT_TRUE(
      coordinator_.PublishPlanWithEpoch(kKey, 7, {{"mnist-worker-a", 0, {0, 1, 2, 3}}}).ok());
  ASSERT_TRUE(coordinator_.AckPlan(kKey, "mnist-worker-b", 7).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(check("mnist-worker-a"), StatusCode::kOk);
  EXPECT_EQ(check("mnist-worker-b"), StatusCode::kUnauthenticated);
}

TEST_F(ReconcilerTest, AWorkerWhosePodIsDeletedLosesItsCredential) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> created = api_->created_pods();
  ASSERT_EQ(created.size(), 2u);
  const std::string kept = created[0]["metadata"]["name"];
  const std::string deleted = created[1]["metadata"]["name"];
  EXPECT_TRUE(coordinator_.CheckCredential(kKey, deleted, CredentialOf(deleted)).ok());
  // A later moment, seen by the operator after a restart (same coordinator): one pod runs, the
  // other is gone.
  json running = created[0];
  running["metadata"]["uid"] = "pod-" + kept;
  running["status"] = {{"phase", "Running"}};
  Reset();
  Start({EpochJob()}, {running}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(coordinator_.CheckCredential(kKey, kept, CredentialOf(kept)).ok());
  EXPECT_EQ(coordinator_.CheckCredential(kKey, deleted, CredentialOf(deleted)).code(),
            StatusCode::kUnauthenticated);
}

// The operator died between creating a pod and its Secret, or someone deleted the Secret: the
// pod, which would wait for it forever, is replaced, and the replacement gets its credential.
TEST_F(ReconcilerTest, APodWhoseCredentialSecretIsMissingIsReplaced) {
  const std::string stuck = "mnist-worker-bbbbb";
  Start({EpochJob()}, {PendingPod(stuck)}, {GpuNode("gpu-a", 2)});
  api_->LoseSecret(stuck);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  // Asked for with a Secret that holds no credential, which was made: the Secret was missing.
  const std::vector<json> secrets = api_->created_secrets();
  ASSERT_FALSE(secrets.empty());
  EXPECT_EQ(secrets[0]["metadata"]["name"], stuck + "-vf-credential");
  EXPECT_FALSE(secrets[0].contains("stringData")) << secrets[0];
  EXPECT_FALSE(secrets[0].contains("data")) << secrets[0];
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 1u);
  EXPECT_EQ(deletions[0].first, "/api/v1/namespaces/team/pods/" + stuck);
  EXPECT_EQ(deletions[0].second["preconditions"]["uid"], "pod-" + stuck);
  const std::vector<std::string> reasons = api_->event_reasons();
  EXPECT_EQ(Count(reasons, "CredentialSecretMissing"), 1u);
  // It counts for nothing: both workers the policy wants are created, each with its credential.
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 2u);
  ASSERT_EQ(secrets.size(), 3u);
  for (size_t i = 0; i < pods.size(); ++i) {
    const std::string name = pods[i]["metadata"]["name"];
    EXPECT_EQ(secrets[i + 1]["stringData"]["token"], CredentialOf(name));
  }
  EXPECT_EQ(coordinator_.CheckCredential(kKey, stuck, CredentialOf(stuck)).code(),
            StatusCode::kUnauthenticated);
}

TEST_F(ReconcilerTest, APendingPodWhoseCredentialSecretExistsIsLeftToStart) {
  const std::string pending = "mnist-worker-bbbbb";
  Start({EpochJob()}, {PendingPod(pending)}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->deletions().empty());
  EXPECT_EQ(api_->created_pods().size(), 1u);  // the pending one counts
  EXPECT_TRUE(coordinator_.CheckCredential(kKey, pending, CredentialOf(pending)).ok());
  // Asked once: the next passes within kCredentialRecheck do not ask again.
  const size_t writes = api_->writes().size();
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (size_t i = writes; i < api_->writes().size(); ++i) {
    EXPECT_EQ(api_->writes()[i].find("/secrets"), std::string::npos) << api_->writes()[i];
  }
}

// A Secret of the name the operator gives a new pod's credential exists already: someone else
// made it (the pod's name was drawn a moment ago), and the pod would mount whatever it holds.
TEST_F(ReconcilerTest, ACredentialSecretTheOperatorDidNotMakeIsNotUsed) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  api_->SecretNamesTaken(true);
  Result<ReconcileResult> refused = reconciler_->Reconcile(kKey);
  ASSERT_FALSE(refused.ok());
  ASSERT_EQ(api_->created_pods().size(), 1u);
  const std::string pod = api_->created_pods()[0]["metadata"]["name"];
  EXPECT_TRUE(api_->created_secrets().empty());
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 1u);  // the pod that would have mounted it
  EXPECT_EQ(deletions[0].first, "/api/v1/namespaces/team/pods/" + pod);
  const json status = api_->status_patches().back();
  const json* blocked = Condition(status, "ReconcileError");
  ASSERT_NE(blocked, nullptr) << status;
  EXPECT_EQ((*blocked)["reason"], "CredentialSecretNotOwned");
  EXPECT_NE((*blocked)["message"].get<std::string>().find(
                "Secret team/mnist-worker-*-vf-credential exists and was not made by the operator"),
            std::string::npos)
      << (*blocked)["message"];
  EXPECT_EQ(api_->event_reasons(), std::vector<std::string>{"CredentialSecretNotOwned"});

  api_->SecretNamesTaken(false);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_secrets().size(), 2u);
}

TEST_F(ReconcilerTest, APodOfTheDrawnNameThatExistsIsNotAdopted) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  api_->PodNamesTaken(true);
  ASSERT_FALSE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_secrets().empty());  // no credential for a pod it did not make
  const json status = api_->status_patches().back();
  const json* blocked = Condition(status, "ReconcileError");
  ASSERT_NE(blocked, nullptr) << status;
  EXPECT_EQ((*blocked)["reason"], "WorkerPodNotOwned");
  EXPECT_EQ(api_->event_reasons(), std::vector<std::string>{"WorkerPodNotOwned"});
}

}  // namespace
}  // namespace vf::controller::reconciler_fixture
