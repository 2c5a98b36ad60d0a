#include "operator/policy/membership.h"

#include <gtest/gtest.h>

namespace vf::policy {
namespace {

WorkerState Ready(const std::string& name, double age = 100) {
  WorkerState w;
  w.name = name;
  w.life = WorkerLife::kRunning;
  w.registered = true;
  w.ready = true;
  w.age_seconds = age;
  return w;
}

std::vector<std::string> Names(const MembershipDecision& d) {
  std::vector<std::string> out;
  for (const PlannedMember& m : d.members) out.push_back(m.worker);
  return out;
}

TEST(MembershipTest, FirstPlanWaitsForMinimumThenStarts) {
  MembershipInput in;
  in.desired = 3;
  in.min_workers = 2;
  in.virtual_nodes = 8;
  in.workers = {Ready("a")};
  MembershipDecision d = DecideMembership(in);
  EXPECT_FALSE(d.publish);
  EXPECT_NE(d.reason.find("waiting"), std::string::npos);
  in.workers.push_back(Ready("b"));
  d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "start");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(d.members[0].virtual_nodes, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(d.members[1].virtual_nodes, (std::vector<int>{4, 5, 6, 7}));
}

TEST(MembershipTest, JoinersWarmingUpAreWaitedForThenAddedTogether) {
  MembershipInput in;
  in.members = {"a"};
  in.desired = 3;
  in.virtual_nodes = 6;
  WorkerState warming = Ready("c", 1);
  warming.ready = false;
  in.workers = {Ready("a"), Ready("b", 2), warming};
  EXPECT_FALSE(DecideMembership(in).publish);
  in.workers[2].ready = true;
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "grow");
  EXPECT_EQ(Names(d)[0], "a");  // the survivor keeps rank 0
  EXPECT_EQ(d.members.size(), 3u);
  // A joiner that takes too long is not waited for.
  in.workers[2].ready = false;
  in.workers[2].age_seconds = 60;
  d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "b"}));
}

TEST(MembershipTest, NothingChangesWhenAllIsWell) {
  MembershipInput in;
  in.members = {"a", "b"};
  in.desired = 2;
  in.virtual_nodes = 8;
  in.workers = {Ready("a"), Ready("b"), Ready("spare")};
  EXPECT_FALSE(DecideMembership(in).publish);
}

TEST(MembershipTest, LostMemberForcesAPlanAtOnce) {
  MembershipInput in;
  in.members = {"a", "b", "c"};
  in.desired = 3;
  in.virtual_nodes = 12;
  WorkerState dead = Ready("b");
  dead.life = WorkerLife::kFailed;
  WorkerState warming = Ready("d", 1);
  warming.ready = false;
  in.workers = {Ready("a"), dead, Ready("c"), warming};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "failure");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "c"}));
  // A vanished pod counts as lost too.
  in.workers = {Ready("a"), Ready("c")};
  d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "failure");
}

TEST(MembershipTest, UnresponsiveMemberIsLeftOutAtOnce) {
  MembershipInput in;
  in.members = {"a", "b", "c"};
  in.desired = 3;
  in.virtual_nodes = 12;
  in.failure_reported = true;  // the survivors' collective timed out waiting for it
  WorkerState stopped = Ready("b");
  stopped.responsive = false;
  in.workers = {Ready("a"), stopped, Ready("c")};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "failure");
  EXPECT_EQ(d.reason, "b stopped answering; 3 -> 2 workers");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "c"}));
  // Even before anyone reports a failed collective.
  in.failure_reported = false;
  EXPECT_EQ(Names(DecideMembership(in)), (std::vector<std::string>{"a", "c"}));
}

TEST(MembershipTest, UnresponsiveWorkerIsNoJoinerUntilHeardAgain) {
  MembershipInput in;
  in.members = {"a"};
  in.desired = 2;
  in.virtual_nodes = 4;
  WorkerState silent = Ready("b");
  silent.responsive = false;
  in.workers = {Ready("a"), silent};
  MembershipDecision d = DecideMembership(in);
  EXPECT_FALSE(d.publish);
  in.workers[1].responsive = true;  // it woke up (SIGCONT) or the network healed
  d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "grow");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "b"}));
}

TEST(MembershipTest, ReportedFailureRedoesWithSameMembers) {
  MembershipInput in;
  in.members = {"a", "b"};
  in.desired = 2;
  in.virtual_nodes = 4;
  in.failure_reported = true;
  in.workers = {Ready("a"), Ready("b")};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "failure");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "b"}));
}

TEST(MembershipTest, LeaverIsLeftOutAndReplacedByReadyJoiner) {
  MembershipInput in;
  in.members = {"a", "b"};
  in.desired = 2;
  in.virtual_nodes = 4;
  WorkerState leaving = Ready("a");
  leaving.life = WorkerLife::kLeaving;
  in.workers = {leaving, Ready("b"), Ready("c")};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "leave");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"b", "c"}));
}

TEST(MembershipTest, ShrinkDropsMembersOnCordonedNodesFirst) {
  MembershipInput in;
  in.members = {"a", "b", "c"};
  in.desired = 2;
  in.virtual_nodes = 6;
  WorkerState a = Ready("a");
  a.on_schedulable_node = false;
  in.workers = {a, Ready("b"), Ready("c")};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "shrink");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"b", "c"}));
  in.workers[0].on_schedulable_node = true;
  d = DecideMembership(in);
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "b"}));
}

TEST(MembershipTest, MembersNotYetReRegisteredAreKept) {
  // After an operator restart the coordinator knows no worker until they report again.
  MembershipInput in;
  in.members = {"a", "b"};
  in.desired = 2;
  in.virtual_nodes = 4;
  WorkerState a = Ready("a");
  a.registered = a.ready = false;
  WorkerState b = Ready("b");
  b.registered = b.ready = false;
  in.workers = {a, b};
  EXPECT_FALSE(DecideMembership(in).publish);
}

TEST(MembershipTest, MeasuredSpeedsSplitProportionally) {
  MembershipInput in;
  in.desired = 2;
  in.virtual_nodes = 8;
  in.workers = {Ready("fast"), Ready("slow")};
  in.workers[0].seconds_per_virtual_node = 0.01;
  in.workers[1].seconds_per_virtual_node = 0.03;
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.members[0].virtual_nodes.size(), 6u);
  EXPECT_EQ(d.members[1].virtual_nodes.size(), 2u);
}

TEST(MembershipTest, NeverMoreWorkersThanVirtualNodes) {
  MembershipInput in;
  in.desired = 5;
  in.virtual_nodes = 2;
  in.workers = {Ready("a"), Ready("b"), Ready("c")};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.members.size(), 2u);
}

TEST(MembershipTest, PlanStandsUnheldWhileOnlySparesWarmUp) {
  MembershipInput in;
  in.members = {"a", "b"};
  in.desired = 3;
  in.virtual_nodes = 6;
  WorkerState warming = Ready("c", 1);
  warming.ready = false;
  in.workers = {Ready("a"), Ready("b"), warming};
  MembershipDecision d = DecideMembership(in);
  EXPECT_FALSE(d.publish);
  EXPECT_FALSE(d.held);  // nothing is due yet: the plan stands
  EXPECT_NE(d.reason.find("warm up"), std::string::npos);
}

TEST(MembershipTest, GrowthIsHeldWhileAnotherJoinerWarmsUp) {
  MembershipInput in;
  in.members = {"a"};
  in.desired = 3;
  in.virtual_nodes = 6;
  WorkerState warming = Ready("c", 1);
  warming.ready = false;
  in.workers = {Ready("a"), Ready("b", 2), warming};
  MembershipDecision d = DecideMembership(in);
  EXPECT_FALSE(d.publish);
  EXPECT_TRUE(d.held);
}

TEST(MembershipTest, FirstPlanBelowMinimumIsHeld) {
  MembershipInput in;
  in.desired = 2;
  in.min_workers = 2;
  in.virtual_nodes = 4;
  in.workers = {Ready("a")};
  MembershipDecision d = DecideMembership(in);
  EXPECT_FALSE(d.publish);
  EXPECT_TRUE(d.held);
}

TEST(MembershipTest, MemberThatExitedIsLost) {
  MembershipInput in;
  in.members = {"a", "b"};
  in.desired = 2;
  in.virtual_nodes = 4;
  WorkerState exited = Ready("b");
  exited.life = WorkerLife::kExited;
  in.workers = {Ready("a"), exited};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "failure");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a"}));
  EXPECT_EQ(d.members[0].virtual_nodes, (std::vector<int>{0, 1, 2, 3}));
}

TEST(MembershipTest, RunningMemberThatAskedToLeaveIsLeftOut) {
  MembershipInput in;
  in.members = {"a", "b", "c"};
  in.desired = 3;
  in.virtual_nodes = 6;
  in.workers = {Ready("a"), Ready("b"), Ready("c")};
  in.workers[1].leave_requested = true;
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "leave");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "c"}));
}

TEST(MembershipTest, SurvivorsKeepTheCallersRankOrder) {
  MembershipInput in;
  in.members = {"c", "a", "b"};
  in.desired = 3;
  in.virtual_nodes = 6;
  WorkerState dead = Ready("b");
  dead.life = WorkerLife::kFailed;
  in.workers = {Ready("a"), dead, Ready("c")};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(Names(d), (std::vector<std::string>{"c", "a"}));
}

TEST(MembershipTest, OldestReadyJoinersJoinFirst) {
  MembershipInput in;
  in.members = {"a"};
  in.desired = 2;
  in.virtual_nodes = 4;
  in.workers = {Ready("a"), Ready("young", 5), Ready("old", 50)};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "grow");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "old"}));
}

TEST(MembershipTest, EvenSplitGivesTheRemainderToTheLowestRanks) {
  MembershipInput in;
  in.desired = 3;
  in.virtual_nodes = 8;
  in.workers = {Ready("a"), Ready("b"), Ready("c")};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  ASSERT_EQ(d.members.size(), 3u);
  EXPECT_EQ(d.members[0].virtual_nodes, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(d.members[1].virtual_nodes, (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(d.members[2].virtual_nodes, (std::vector<int>{6, 7}));
}

TEST(MembershipTest, AfterALostMemberSurvivorsKeepTheirNodes) {
  MembershipInput in;
  in.members = {"a", "b", "c"};
  in.desired = 3;
  in.virtual_nodes = 8;
  in.held = {{"a", {0, 1, 2}}, {"b", {3, 4, 5}}, {"c", {6, 7}}};
  WorkerState dead = Ready("a");
  dead.life = WorkerLife::kFailed;
  in.workers = {dead, Ready("b"), Ready("c")};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "failure");
  ASSERT_EQ(Names(d), (std::vector<std::string>{"b", "c"}));
  // The contiguous split would give b 0-3 and c 4-7, taking 4 and 5 from b, which computed them.
  EXPECT_EQ(d.members[0].virtual_nodes, (std::vector<int>{0, 3, 4, 5}));
  EXPECT_EQ(d.members[1].virtual_nodes, (std::vector<int>{1, 2, 6, 7}));
  // A growth (nothing failed) splits contiguously again.
  in.members = {"b", "c"};
  in.held = {{"b", {0, 3, 4, 5}}, {"c", {1, 2, 6, 7}}};
  in.workers = {Ready("b"), Ready("c"), Ready("d")};
  d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "grow");
  EXPECT_EQ(d.members[0].virtual_nodes, (std::vector<int>{0, 1, 2}));
}

}  // namespace
}  // namespace vf::policy
