#include "operator/local/decisions.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "operator/policy/membership.h"
#include "operator/policy/policy.h"

namespace vf::local {
namespace {

JobSpec Job(int min, int max, const std::string& policy = "elastic") {
  JobSpec job;
  job.name = "local";
  job.virtual_nodes = 12;
  job.global_batch_size = 192;
  job.replicas_min = min;
  job.replicas_max = max;
  job.steps = 100;
  job.elasticity.policy = policy;
  job.elasticity.cooldown_seconds = 0;
  return job;
}

std::unique_ptr<policy::Policy> PolicyOf(const JobSpec& job) {
  return policy::CreatePolicy(job.elasticity.policy, {}).value();
}

ProcessView Ready(const std::string& name, double age = 100) {
  ProcessView p;
  p.name = name;
  p.age_seconds = age;
  p.registered = true;
  p.ready = true;
  return p;
}

TEST(SlotSchedule, CapacityScheduleIsParsed) {
  auto s = SlotSchedule("0:2,20:4", 0, Job(1, 4), 8);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->ToString(), "0:2,20:4");
}

TEST(SlotSchedule, WorkersFlagGivesThatManySlots) {
  auto s = SlotSchedule("", 3, Job(1, 8), 2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->At(0, 0), 3);
}

TEST(SlotSchedule, DefaultIsReplicasMaxCappedByCores) {
  EXPECT_EQ(SlotSchedule("", 0, Job(1, 8), 2)->At(0, 0), 2);
  EXPECT_EQ(SlotSchedule("", 0, Job(1, 3), 16)->At(0, 0), 3);
  EXPECT_EQ(SlotSchedule("", 0, Job(1, 3), 0)->At(0, 0), 1);
}

TEST(SlotSchedule, BadScheduleIsAnErrorNamingTheEntry) {
  auto s = SlotSchedule("0:2,x", 0, Job(1, 4), 8);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("'x'"), std::string::npos) << s.status().message();
}

TEST(DesiredWorkers, ElasticJobTakesTheFreeSlotsUpToItsMaximum) {
  const JobSpec job = Job(1, 4);
  auto p = PolicyOf(job);
  EXPECT_EQ(DesiredWorkers(*p, job, 0, 2, -1e30, 0)->workers, 2);
  EXPECT_EQ(DesiredWorkers(*p, job, 2, 8, -1e30, 10)->workers, 4);
}

TEST(DesiredWorkers, ElasticJobGivesBackSlotsThatGoAway) {
  const JobSpec job = Job(1, 4);
  auto d = DesiredWorkers(*PolicyOf(job), job, 4, 1, 0, 50);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->workers, 1);
  EXPECT_FALSE(d->reason.empty());
}

TEST(DesiredWorkers, GrowthWaitsForTheCooldown) {
  JobSpec job = Job(1, 4);
  job.elasticity.cooldown_seconds = 30;
  auto p = policy::CreatePolicy("elastic", {}).value();
  EXPECT_EQ(DesiredWorkers(*p, job, 2, 4, 10, 20)->workers, 2);
  EXPECT_EQ(DesiredWorkers(*p, job, 2, 4, 10, 41)->workers, 4);
}

TEST(DesiredWorkers, StaticJobWaitsUntilAllItsWorkersFit) {
  const JobSpec job = Job(4, 4, "static");
  auto p = PolicyOf(job);
  EXPECT_EQ(DesiredWorkers(*p, job, 0, 3, -1e30, 0)->workers, 0);
  EXPECT_EQ(DesiredWorkers(*p, job, 0, 4, -1e30, 0)->workers, 4);
}

TEST(SlotsToFill, TakesTheLowestFreeSlots) {
  EXPECT_EQ(SlotsToFill({0, 2}, 2, 2, 4, 4), (std::vector<int>{1, 3}));
}

TEST(SlotsToFill, LeaversStillHoldTheirSlots) {
  // Three live processes, one of them leaving: two usable, one more slot free.
  EXPECT_EQ(SlotsToFill({0, 1, 2}, 3, 2, 4, 4), (std::vector<int>{3}));
}

TEST(SlotsToFill, NothingWhenEnoughAreUsableOrNoSlotIsFree) {
  EXPECT_TRUE(SlotsToFill({0, 1}, 2, 2, 2, 4).empty());
  EXPECT_TRUE(SlotsToFill({0, 1}, 2, 1, 3, 2).empty());
}

TEST(ProcessView, WorkerAskedToLeaveIsNotUsableAndIsLeaving) {
  ProcessView p = Ready("w");
  EXPECT_TRUE(Usable(p));
  EXPECT_EQ(WorkerStateOf(p).life, policy::WorkerLife::kRunning);
  p.asked_to_leave = true;
  EXPECT_FALSE(Usable(p));
  EXPECT_EQ(WorkerStateOf(p).life, policy::WorkerLife::kLeaving);
}

TEST(ProcessView, WorkerThatAskedToLeaveIsNotUsable) {
  ProcessView p = Ready("w");
  p.leave_requested = true;
  EXPECT_FALSE(Usable(p));
  EXPECT_TRUE(WorkerStateOf(p).leave_requested);
}

TEST(ProcessView, SilentProcessIsAliveButNotUsable) {
  ProcessView p = Ready("w");
  p.responsive = false;  // stopped (SIGSTOP): waitpid still sees it alive
  EXPECT_FALSE(Usable(p));
  EXPECT_EQ(WorkerStateOf(p).life, policy::WorkerLife::kRunning);
  EXPECT_FALSE(WorkerStateOf(p).responsive);
}

TEST(ProcessView, EndedProcessHasExitedOrFailedByItsExitCode) {
  ProcessView p = Ready("w");
  p.alive = false;
  EXPECT_FALSE(Usable(p));
  EXPECT_EQ(WorkerStateOf(p).life, policy::WorkerLife::kFailed);
  p.exited_cleanly = true;
  EXPECT_EQ(WorkerStateOf(p).life, policy::WorkerLife::kExited);
}

TEST(ProcessView, WarmingProcessRunsButIsNotReady) {
  ProcessView p;
  p.name = "w";
  p.age_seconds = 1;
  const policy::WorkerState w = WorkerStateOf(p);
  EXPECT_EQ(w.life, policy::WorkerLife::kRunning);
  EXPECT_FALSE(w.registered);
  EXPECT_FALSE(w.ready);
  EXPECT_EQ(w.age_seconds, 1);
  EXPECT_EQ(w.seconds_per_virtual_node, 0);  // plans split evenly; the runner rebalances
}

TEST(FailureReported, FailureInTheCurrentPlanCounts) {
  EXPECT_TRUE(FailureReported({-1, 3}, 3, 0));
  EXPECT_FALSE(FailureReported({-1, 2}, 3, 0));
  EXPECT_FALSE(FailureReported({}, 3, 0));
}

TEST(FailureReported, NoPlanNoFailure) { EXPECT_FALSE(FailureReported({0}, 0, 0)); }

TEST(FailureReported, PlanThatAnsweredAFailureIsNotRedoneForIt) {
  // The failure in epoch 3 was answered by plan 4; reports of it in plan 4 do not redo it.
  EXPECT_FALSE(FailureReported({4}, 4, 4));
  EXPECT_TRUE(FailureReported({5}, 5, 4));
}

TEST(PlanReason, NamesWhatChanged) {
  EXPECT_EQ(PlanReason("start", "started", 2), "start");
  EXPECT_EQ(PlanReason("failure", "", 2), "a worker failed");
  EXPECT_EQ(PlanReason("failure", "", 2, "a worker failed; 3 -> 2 workers"), "a worker failed");
  EXPECT_EQ(PlanReason("failure", "", 2, "worker-2 stopped answering; 3 -> 2 workers"),
            "worker-2 stopped answering");
  EXPECT_EQ(PlanReason("leave", "", 2), "a worker asked to leave");
  EXPECT_EQ(PlanReason("grow", "grew: idle GPUs lent", 4), "grew: idle GPUs lent, 4 slots");
  EXPECT_EQ(PlanReason("shrink", "", 1), "1 slots");
}

TEST(FoldSpeed, SmoothsReportsOfOnePlanAndStartsOverOnANewOne) {
  SpeedEstimate e;
  FoldSpeed(1, 10, 0.010, e);
  EXPECT_DOUBLE_EQ(e.seconds_per_virtual_node, 0.010);
  FoldSpeed(1, 10, 0.500, e);  // the same report again
  EXPECT_EQ(e.samples, 1);
  FoldSpeed(1, 11, 0.020, e);
  EXPECT_DOUBLE_EQ(e.seconds_per_virtual_node, 0.3 * 0.020 + 0.7 * 0.010);
  FoldSpeed(1, 12, 0.0, e);  // nothing measured
  EXPECT_EQ(e.samples, 2);
  FoldSpeed(2, 13, 0.040, e);
  EXPECT_EQ(e.samples, 1);
  EXPECT_DOUBLE_EQ(e.seconds_per_virtual_node, 0.040);
}

TEST(FoldSpeed, SettledAfterFourSamplesOfTheCurrentPlan) {
  SpeedEstimate e;
  for (int step = 1; step <= 3; ++step) FoldSpeed(7, step, 0.01, e);
  EXPECT_FALSE(Settled(e, 7));
  FoldSpeed(7, 4, 0.01, e);
  EXPECT_TRUE(Settled(e, 7));
  EXPECT_FALSE(Settled(e, 8));
}

TEST(ProposeRebalance, MovesNodesToFasterWorkersWhenItPays) {
  auto r = ProposeRebalance(12, {6, 6}, {0.01, 0.03});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->counts, (std::vector<int>{9, 3}));
  EXPECT_DOUBLE_EQ(r->step_seconds_before, 0.18);
  EXPECT_DOUBLE_EQ(r->step_seconds_after, 0.09);
}

TEST(ProposeRebalance, NotForAGainOf15PercentOrLess) {
  // 7:5 would take 0.07 instead of 0.072 (3% less): not worth a pause.
  EXPECT_FALSE(ProposeRebalance(12, {6, 6}, {0.01, 0.012}).has_value());
}

TEST(ProposeRebalance, NotWhenTheSplitIsAlreadyBest) {
  EXPECT_FALSE(ProposeRebalance(12, {9, 3}, {0.01, 0.03}).has_value());
}

// The local runner's workers through the membership decision, as Reconcile puts them together.
TEST(LocalMembership, FirstPlanWaitsForWorkersStartedTogether) {
  policy::MembershipInput in;
  in.desired = 2;
  in.virtual_nodes = 12;
  ProcessView warming;
  warming.name = "worker-1";
  warming.age_seconds = 1;
  in.workers = {WorkerStateOf(Ready("worker-0", 1.5)), WorkerStateOf(warming)};
  policy::MembershipDecision d = policy::DecideMembership(in);
  EXPECT_FALSE(d.publish);
  EXPECT_TRUE(d.held);
  in.workers[1] = WorkerStateOf(Ready("worker-1", 1.2));
  d = policy::DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(PlanReason(d.kind, "", 2), "start");
  ASSERT_EQ(d.members.size(), 2u);
  EXPECT_EQ(d.members[0].worker, "worker-0");
  EXPECT_EQ(d.members[0].virtual_nodes, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

TEST(LocalMembership, KilledMemberIsReplacedByAPlanWithoutIt) {
  policy::MembershipInput in;
  in.members = {"worker-0", "worker-1", "worker-2"};
  in.desired = 3;
  in.virtual_nodes = 12;
  ProcessView killed = Ready("worker-1");
  killed.alive = false;
  ProcessView replacement;
  replacement.name = "worker-3";
  in.workers = {WorkerStateOf(Ready("worker-0")), WorkerStateOf(killed),
                WorkerStateOf(Ready("worker-2")), WorkerStateOf(replacement)};
  const policy::MembershipDecision d = policy::DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(PlanReason(d.kind, "", 3), "a worker failed");
  ASSERT_EQ(d.members.size(), 2u);
  EXPECT_EQ(d.members[0].worker, "worker-0");
  EXPECT_EQ(d.members[1].worker, "worker-2");
}

TEST(LocalMembership, WorkerSentSigtermLeavesThroughAPlan) {
  policy::MembershipInput in;
  in.members = {"worker-0", "worker-1", "worker-2"};
  in.desired = 3;
  in.virtual_nodes = 12;
  ProcessView leaving = Ready("worker-2");
  leaving.leave_requested = true;
  in.workers = {WorkerStateOf(Ready("worker-0")), WorkerStateOf(Ready("worker-1")),
                WorkerStateOf(leaving)};
  const policy::MembershipDecision d = policy::DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(PlanReason(d.kind, "", 3), "a worker asked to leave");
  EXPECT_EQ(d.members.size(), 2u);
}

}  // namespace
}  // namespace vf::local
