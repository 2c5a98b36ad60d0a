// The controller's callbacks as the operator binary wires them to its metrics: what a job's
// status sets, and that a job the reconciler reports gone (deleted by a user, or by the operator
// after spec.runPolicy.ttlSecondsAfterFinished) leaves no series behind.
#include "operator/metrics/controller_metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "agent/metrics/test_util.h"

namespace vf {
namespace {

using metrics::Exposition;
using nlohmann::json;

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

class ControllerMetricsTest : public testing::Test {
 protected:
  void SetUp() override {
    ReportControllerMetrics(options_, metrics_);
    spec_.replicas_min = 1;
    spec_.replicas_max = 4;
  }

  void Status(const std::string& key, const json& status) {
    options_.hooks.on_job_status(key, status, spec_);
  }
  std::string Text() const { return Exposition(metrics_.registry()); }

  OperatorMetrics metrics_;
  controller::ControllerOptions options_;
  JobSpec spec_;
};

TEST_F(ControllerMetricsTest, AJobsStatusSetsItsWorkersProgressAndPhase) {
  Status("team/mnist", {{"phase", "Running"},
                        {"workers", 3},
                        {"desiredWorkers", 4},
                        {"readyWorkers", 2},
                        {"step", 120},
                        {"totalSteps", 1872},
                        {"samplesPerSecond", 5120.5}});
  const std::string text = Text();
  const std::string job = "job_name=\"mnist\",job_namespace=\"team\"";
  EXPECT_TRUE(Contains(text, "vf_operator_job_workers{" + job + ",kind=\"current\"} 3")) << text;
  EXPECT_TRUE(Contains(text, "vf_operator_job_workers{" + job + ",kind=\"desired\"} 4"));
  EXPECT_TRUE(Contains(text, "vf_operator_job_workers{" + job + ",kind=\"ready\"} 2"));
  EXPECT_TRUE(Contains(text, "vf_operator_job_workers{" + job + ",kind=\"max\"} 4"));
  EXPECT_TRUE(Contains(text, "vf_operator_job_step{" + job + "} 120"));
  EXPECT_TRUE(Contains(text, "vf_operator_job_total_steps{" + job + "} 1872"));
  EXPECT_TRUE(Contains(text, "vf_operator_job_samples_per_second{" + job + "} 5120.5"));
  EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"Running\"} 1"));
}

TEST_F(ControllerMetricsTest, AnEpochJobsLengthHasNoSeriesBeforeAnAgentReportsIt) {
  Status("team/mnist", {{"phase", "Pending"}, {"step", 0}});
  EXPECT_EQ(Text().find("vf_operator_job_total_steps{"), std::string::npos);
  EXPECT_TRUE(Contains(Text(), "vf_operator_jobs{phase=\"Pending\"} 1"));
}

TEST_F(ControllerMetricsTest, AFinishedJobKeepsItsSeriesUntilItIsGoneThenLeavesNone) {
  Status("team/mnist", {{"phase", "Running"}, {"workers", 2}, {"step", 10}, {"totalSteps", 25}});
  Status("team/other", {{"phase", "Running"}, {"workers", 1}, {"step", 5}, {"totalSteps", 25}});
  options_.hooks.on_resize("team/mnist", controller::ResizeKind::kGrow, 1, 2);
  options_.hooks.on_resize_pause("team/mnist", 0.5);
  // Finished: the reconciler still reports it on every pass until it is deleted (by a user, or
  // by the operator when spec.runPolicy.ttlSecondsAfterFinished runs out).
  Status("team/mnist", {{"phase", "Succeeded"}, {"workers", 0}, {"step", 25}, {"totalSteps", 25}});
  std::string text = Text();
  EXPECT_TRUE(Contains(text, "vf_operator_job_step{job_name=\"mnist\",job_namespace=\"team\"} 25"));
  EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"Succeeded\"} 1"));

  options_.hooks.on_job_gone("team/mnist");
  text = Text();
  EXPECT_EQ(text.find("job_name=\"mnist\""), std::string::npos) << text;
  EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"Succeeded\"} 0"));
  EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"Running\"} 1"));
  EXPECT_TRUE(Contains(text, "vf_operator_job_step{job_name=\"other\",job_namespace=\"team\"} 5"));
}

TEST_F(ControllerMetricsTest, ResizesCountByTheirKind) {
  Status("team/mnist", {{"phase", "Running"}});
  options_.hooks.on_resize("team/mnist", controller::ResizeKind::kShrink, 4, 2);
  options_.hooks.on_resize("team/mnist", controller::ResizeKind::kFailure, 2, 1);
  options_.hooks.on_resize("team/mnist", controller::ResizeKind::kLeave, 2, 1);
  options_.hooks.on_resize("team/mnist", controller::ResizeKind::kGrow, 1, 2);
  options_.hooks.on_resize("team/mnist", controller::ResizeKind::kGrow, 2, 3);
  const std::string text = Text();
  const std::string job = "job_name=\"mnist\",job_namespace=\"team\"";
  EXPECT_TRUE(Contains(text, "vf_operator_resizes_total{" + job + ",reason=\"shrink\"} 1"));
  EXPECT_TRUE(Contains(text, "vf_operator_resizes_total{" + job + ",reason=\"failure\"} 1"));
  EXPECT_TRUE(Contains(text, "vf_operator_resizes_total{" + job + ",reason=\"leave\"} 1"));
  EXPECT_TRUE(Contains(text, "vf_operator_resizes_total{" + job + ",reason=\"grow\"} 2"));
}

TEST_F(ControllerMetricsTest, EachFailedCheckpointTheReconcilerSeesCountsForItsJob) {
  Status("team/mnist", {{"phase", "Running"}});
  options_.hooks.on_checkpoint_failure("team/mnist");
  EXPECT_TRUE(Contains(
      Text(),
      "vf_operator_job_checkpoint_failures_total{job_name=\"mnist\",job_namespace=\"team\"} 1"));
}

TEST_F(ControllerMetricsTest, ReconcilesAndQueueDepth) {
  options_.on_reconcile(0.002, false);
  options_.on_reconcile(0.003, true);
  options_.on_queue_depth(7);
  const std::string text = Text();
  EXPECT_TRUE(Contains(text, "vf_operator_reconcile_duration_seconds_count 2"));
  EXPECT_TRUE(Contains(text, "vf_operator_reconcile_errors_total 1"));
  EXPECT_TRUE(Contains(text, "vf_operator_workqueue_depth 7"));
}

}  // namespace
}  // namespace vf
