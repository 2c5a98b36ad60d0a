// The reconciler against an API server stand-in and a real coordinator (reconciler_test_fixture.h):
// A job whose workers speak another coordinator protocol is drained and starts again.
#include <gtest/gtest.h>

#include "operator/controller/reconciler_test_fixture.h"

namespace vf::controller::reconciler_fixture {
namespace {

// An operator that restarts (an upgrade: another build of its own) expects the recorded build
// from its first pass, so that a pod of that build registering before the members do again is
// taken.
TEST_F(ReconcilerTest, ARestartedOperatorExpectsTheBuildTheStatusRecorded) {
  Start({RunningJobOf(
            {{"workerImage", "virtualflow/agent:1"}, {"workerBuild", "virtualflow 0.0.9"}})},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const JobView view = coordinator_.GetJob(kKey).value();
  EXPECT_EQ(view.build, "virtualflow 0.0.9");
  EXPECT_TRUE(
      coordinator_
          .RegisterWorker(kKey, "mnist-worker-j", view.fingerprint, "virtualflow 0.0.9", false)
          .ok());
}

// An operator upgrade that changed the coordinator protocol under a running job: this
// coordinator cannot talk to its workers, so the job is drained on purpose, never failed. Its
// pods are deleted (rank 0 checkpoints its last step as it leaves, since the coordinator no
// longer knows the job), the status says why naming both protocols, and once no pod is left the
// job starts again from its checkpoint on the image a job started now gets, speaking this
// protocol.
TEST_F(ReconcilerTest, AJobOfWorkersOfAnotherProtocolIsDrainedThenStartsAgainFromItsCheckpoint) {
  default_image_ = "virtualflow/agent:2";
  const int64_t theirs = kProtocolVersion + 1;
  json job = RunningJobOf({{"workerImage", "virtualflow/agent:1"},
                           {"workerBuild", "virtualflow 0.0.9"},
                           {"workerProtocol", theirs},
                           {"step", 12}});
  job["spec"]["checkpoint"] = {{"path", "/ckpt/mnist.state"}, {"everySteps", 5}};
  Start({job}, {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->deletions().size(), 1u);
  EXPECT_EQ(api_->deletions()[0].first, "/api/v1/namespaces/team/pods/mnist-worker-a");
  EXPECT_TRUE(api_->created_pods().empty());
  EXPECT_FALSE(coordinator_.GetJob(kKey).ok());  // forgotten: its workers leave untold
  const json draining = api_->status_patches().back();
  EXPECT_EQ(draining["phase"], "Pending") << draining;
  const json* c = Condition(draining, "Draining");
  ASSERT_NE(c, nullptr) << draining;
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_EQ((*c)["reason"], "CoordinatorProtocolChanged");
  const std::string message = (*c)["message"];
  EXPECT_NE(message.find("the job's workers speak coordinator protocol " + std::to_string(theirs) +
                         " and this operator speaks protocol " + std::to_string(kProtocolVersion)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("1 worker pod(s) stopping"), std::string::npos) << message;
  EXPECT_NE(message.find("on image virtualflow/agent:2 from its last checkpoint "
                         "(/ckpt/mnist.state)"),
            std::string::npos)
      << message;
  EXPECT_EQ(draining["workerProtocol"], theirs);
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Draining"}));

  // Its pod gone: drained. The job makes way for pods of now, and says so once.
  job["status"] = Applied(draining);
  Start({job}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_pods().empty());
  const json drained = api_->status_patches().back();
  c = Condition(drained, "Draining");
  ASSERT_NE(c, nullptr) << drained;
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], "RestartedFromCheckpoint");
  EXPECT_EQ(drained["workerProtocol"], kProtocolVersion);
  EXPECT_TRUE(drained["workerImage"].is_null()) << drained;
  EXPECT_TRUE(drained["workerBuild"].is_null()) << drained;
  EXPECT_EQ(drained["step"], 12);  // the checkpoint keeps it
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Restarted"}));
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());  // the cache has not seen the write yet
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Restarted"}));

  // Started again: pods of the image a job started now gets, under this protocol.
  job["status"] = Applied(drained);
  Start({job}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_FALSE(api_->created_pods().empty());
  EXPECT_EQ(api_->created_pods()[0]["spec"]["containers"][0]["image"], "virtualflow/agent:2");
  EXPECT_TRUE(api_->deletions().empty());
  const json started = api_->status_patches().back();
  EXPECT_EQ(started["workerImage"], "virtualflow/agent:2");
  EXPECT_EQ(started["workerProtocol"], kProtocolVersion);
  c = Condition(started, "Draining");
  ASSERT_NE(c, nullptr) << started;
  EXPECT_EQ((*c)["reason"], "RestartedFromCheckpoint");
  EXPECT_TRUE(coordinator_.GetJob(kKey).ok());
}

// Without spec.checkpoint.path there is nothing to resume from: the job starts again from step
// 0, and says so (a Warning, since its progress is lost).
TEST_F(ReconcilerTest, ADrainedJobWithoutACheckpointStartsAgainFromStepZeroSayingSo) {
  json job = RunningJobOf({{"workerProtocol", kProtocolVersion + 1}, {"step", 12}, {"loss", 0.5}});
  Start({job}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json drained = api_->status_patches().back();
  EXPECT_EQ(drained["phase"], "Pending");
  EXPECT_EQ(drained["step"], 0);
  EXPECT_TRUE(drained["loss"].is_null()) << drained;
  const json* c = Condition(drained, "Draining");
  ASSERT_NE(c, nullptr) << drained;
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], "RestartedFromStepZero");
  EXPECT_NE((*c)["message"].get<std::string>().find("from step 0: it has no spec.checkpoint.path"),
            std::string::npos)
      << (*c)["message"];
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Draining", "Restarted"}));
}

// A job an operator from before status.workerProtocol started: its workers speak protocol 1,
// the only one there was, so under an operator of protocol 1 they keep running, and the
// protocol is recorded.
TEST_F(ReconcilerTest, AJobStartedBeforeTheProtocolWasRecordedSpeaksOneAndIsKept) {
  static_assert(kProtocolVersion == 1, "a job without status.workerProtocol speaks 1");
  Start({RunningJobOf({{"workerImage", "virtualflow/agent:1"}})},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->deletions().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["workerProtocol"], 1);
  EXPECT_EQ(Condition(status, "Draining"), nullptr);
  EXPECT_TRUE(coordinator_.GetJob(kKey).ok());
}

}  // namespace
}  // namespace vf::controller::reconciler_fixture
