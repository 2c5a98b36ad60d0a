#include "operator/controller/job_status.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vf::controller {
namespace {

using nlohmann::json;

TEST(PhaseTest, EveryPhaseReadsBackAsItselfAndOnlyTheEndedOnesEnd) {
  for (Phase p : {Phase::kPending, Phase::kRunning, Phase::kResizing, Phase::kSuspended,
                  Phase::kSucceeded, Phase::kFailed}) {
    EXPECT_EQ(ParsePhase(PhaseName(p)), p);
    json status = json::object();
    WritePhase(status, p);
    EXPECT_EQ(PhaseOf(status), p);
    EXPECT_EQ(Ended(p), p == Phase::kSucceeded || p == Phase::kFailed);
  }
  EXPECT_EQ(PhaseName(Phase::kResizing), "Resizing");
  EXPECT_EQ(ParsePhase("running"), std::nullopt);
  EXPECT_EQ(PhaseOf(json::object()), Phase::kPending);
  EXPECT_EQ(PhaseOf(json{{"phase", "Exploded"}}), Phase::kPending);
}

Condition Cond(const std::string& type, bool status, const std::string& reason) {
  Condition c;
  c.type = type;
  c.status = status;
  c.reason = reason;
  c.message = reason + " message";
  c.observed_generation = 2;
  return c;
}

TEST(SetConditionTest, KeepsTheTransitionTimeWhileTheStatusStaysTheSame) {
  std::vector<Condition> conditions;
  SetCondition(conditions, Cond(condition::kRunning, true, reason::kTraining), "T1");
  ASSERT_EQ(conditions.size(), 1u);
  EXPECT_EQ(conditions[0].last_transition_time, "T1");
  // Same status, another reason and message: updated, still dated T1.
  SetCondition(conditions, Cond(condition::kRunning, true, reason::kWaitingForWorkers), "T2");
  ASSERT_EQ(conditions.size(), 1u);
  EXPECT_EQ(conditions[0].reason, reason::kWaitingForWorkers);
  EXPECT_EQ(conditions[0].last_transition_time, "T1");
  // Another status: a transition, dated now.
  SetCondition(conditions, Cond(condition::kRunning, false, reason::kFinished), "T3");
  ASSERT_EQ(conditions.size(), 1u);
  EXPECT_FALSE(conditions[0].status);
  EXPECT_EQ(conditions[0].last_transition_time, "T3");
}

TEST(SetConditionTest, AppendsANewTypeAndFindsEachByType) {
  std::vector<Condition> conditions;
  SetCondition(conditions, Cond(condition::kCreated, true, reason::kPodsCreated), "T1");
  SetCondition(conditions, Cond(condition::kDegraded, false, reason::kAtLeastMinimum), "T2");
  ASSERT_EQ(conditions.size(), 2u);
  EXPECT_EQ(conditions[1].type, condition::kDegraded);
  EXPECT_EQ(conditions[1].last_transition_time, "T2");
  ASSERT_NE(FindCondition(conditions, condition::kCreated), nullptr);
  EXPECT_EQ(FindCondition(conditions, condition::kCreated)->reason, reason::kPodsCreated);
  EXPECT_EQ(FindCondition(conditions, condition::kFailed), nullptr);
}

TEST(ConditionTest, RoundTripsAndRefusesAStatusThatIsNotTrueOrFalse) {
  Condition c = Cond(condition::kSuspended, true, reason::kJobSuspended);
  c.last_transition_time = "2026-01-02T03:04:05Z";
  const json j = c.ToJson();
  EXPECT_EQ(j["status"], "True");
  EXPECT_EQ(j["observedGeneration"], 2);
  Result<Condition> back = Condition::FromJson(j);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, c);
  json unknown = j;
  unknown["status"] = "Unknown";
  EXPECT_FALSE(Condition::FromJson(unknown).ok());
}

json SampleStatus() {
  return {{"phase", "Running"},
          {"message", "training on 2 workers"},
          {"conditions",
           {{{"type", "Running"},
             {"status", "True"},
             {"reason", "Training"},
             {"message", "training on 2 workers"},
             {"lastTransitionTime", "2026-01-02T03:04:05Z"},
             {"observedGeneration", 1}}}},
          {"observedGeneration", 1},
          {"startTime", "2026-01-02T03:00:00Z"},
          {"workers", 2},
          {"readyWorkers", 2},
          {"desiredWorkers", 2},
          {"workerCounts",
           {{"pending", 0}, {"joining", 0}, {"training", 2}, {"leaving", 0}, {"failed", 0}}},
          {"epoch", 3},
          {"assignment",
           {{{"worker", "mnist-worker-a"}, {"rank", 0}, {"virtualNodes", {0, 1}}},
            {{"worker", "mnist-worker-b"}, {"rank", 1}, {"virtualNodes", {2, 3}}}}},
          {"workerImage", "virtualflow/agent:1"},
          {"workerBuild", "virtualflow 0.1.0"},
          {"workerProtocol", 2},
          {"step", 40},
          {"totalSteps", 100},
          {"loss", 0.5},
          {"samplesPerSecond", 120.5},
          {"lastResize",
           {{"time", "2026-01-02T03:02:00Z"},
            {"from", 1},
            {"to", 2},
            {"reason", "GPUs available"},
            {"pauseSeconds", 1.5}}},
          {"restarts", {{"failure", 1}}},
          // Not modelled: kept as it is.
          {"finalCheckpoint", {{"path", "/ckpt"}}},
          {"selector", "virtualflow.io/job=mnist"}};
}

TEST(JobStatusTest, RoundTripsEveryFieldItWritesAndKeepsTheOthers) {
  const json status = SampleStatus();
  Result<JobStatus> parsed = JobStatus::FromJson(status);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->phase, Phase::kRunning);
  EXPECT_EQ(parsed->step, 40);
  ASSERT_TRUE(parsed->assignment.has_value());
  EXPECT_EQ((*parsed->assignment)[1].virtual_nodes, (std::vector<int>{2, 3}));
  ASSERT_TRUE(parsed->last_resize.has_value());
  EXPECT_EQ(parsed->last_resize->pause_seconds, 1.5);
  EXPECT_EQ(parsed->other["selector"], "virtualflow.io/job=mnist");
  EXPECT_EQ(parsed->ToJson(), status);
  EXPECT_EQ(JobStatus{}.ToJson(), json::object());
}

TEST(JobStatusTest, AFieldOfTheWrongTypeIsNamed) {
  json status = SampleStatus();
  status["step"] = "forty";
  Result<JobStatus> parsed = JobStatus::FromJson(status);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("status.step"), std::string::npos);
  status = SampleStatus();
  status["phase"] = "Exploded";
  EXPECT_FALSE(JobStatus::FromJson(status).ok());
}

TEST(StatusPatchTest, HoldsWhatChangedAndNullsWhatWentAway) {
  JobStatus from = JobStatus::FromJson(SampleStatus()).value();
  JobStatus to = from;
  EXPECT_EQ(StatusPatch(from, to), json::object());
  to.phase = Phase::kResizing;
  to.step = 41;
  to.loss.reset();
  to.assignment->pop_back();
  const json patch = StatusPatch(from, to);
  EXPECT_EQ(patch, (json{{"phase", "Resizing"},
                         {"step", 41},
                         {"loss", nullptr},
                         {"assignment", to.ToJson()["assignment"]}}));
  // Applied as the API server applies a merge patch, it gives `to`.
  json applied = from.ToJson();
  applied.merge_patch(patch);
  EXPECT_EQ(applied, to.ToJson());
}

}  // namespace
}  // namespace vf::controller
