#include "operator/controller/membership.h"

#include <gtest/gtest.h>

namespace vf::controller {
namespace {

WorkerState Ready(const std::string& name, double age = 100) {
  WorkerState w;
  w.name = name;
  w.life = PodLife::kRunning;
  w.registered = true;
  w.ready = true;
  w.age_seconds = age;
  return w;
}

Plan PlanOf(int64_t epoch, std::vector<std::string> workers, int vnodes) {
  Plan p;
  p.epoch = epoch;
  const int n = static_cast<int>(workers.size());
  int next = 0;
  for (int i = 0; i < n; ++i) {
    Member m{workers[static_cast<size_t>(i)], i, {}};
    const int count = vnodes / n + (i < vnodes % n ? 1 : 0);
    for (int k = 0; k < count; ++k) m.virtual_nodes.push_back(next++);
    p.members.push_back(m);
  }
  return p;
}

std::vector<std::string> Names(const MembershipDecision& d) {
  std::vector<std::string> out;
  for (const Member& m : d.members) out.push_back(m.worker);
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
  in.plan = PlanOf(1, {"a"}, 6);
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
  in.plan = PlanOf(4, {"a", "b"}, 8);
  in.desired = 2;
  in.virtual_nodes = 8;
  in.workers = {Ready("a"), Ready("b"), Ready("spare")};
  EXPECT_FALSE(DecideMembership(in).publish);
}

TEST(MembershipTest, LostMemberForcesAPlanAtOnce) {
  MembershipInput in;
  in.plan = PlanOf(2, {"a", "b", "c"}, 12);
  in.desired = 3;
  in.virtual_nodes = 12;
  WorkerState dead = Ready("b");
  dead.life = PodLife::kFailed;
  WorkerState warming = Ready("d", 1);
  warming.ready = false;
  in.workers = {Ready("a"), dead, Ready("c"), warming};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "failure");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(d.members[1].rank, 1);
  // A vanished pod counts as lost too.
  in.workers = {Ready("a"), Ready("c")};
  d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "failure");
}

TEST(MembershipTest, ReportedFailureRedoesWithSameMembers) {
  MembershipInput in;
  in.plan = PlanOf(3, {"a", "b"}, 4);
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
  in.plan = PlanOf(5, {"a", "b"}, 4);
  in.desired = 2;
  in.virtual_nodes = 4;
  WorkerState leaving = Ready("a");
  leaving.life = PodLife::kTerminating;
  in.workers = {leaving, Ready("b"), Ready("c")};
  MembershipDecision d = DecideMembership(in);
  ASSERT_TRUE(d.publish);
  EXPECT_EQ(d.kind, "leave");
  EXPECT_EQ(Names(d), (std::vector<std::string>{"b", "c"}));
}

TEST(MembershipTest, ShrinkDropsMembersOnCordonedNodesFirst) {
  MembershipInput in;
  in.plan = PlanOf(5, {"a", "b", "c"}, 6);
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
  in.plan = PlanOf(7, {"a", "b"}, 4);
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

}  // namespace
}  // namespace vf::controller
