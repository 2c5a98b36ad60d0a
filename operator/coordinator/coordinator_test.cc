// The in-memory coordinator on its own: plans, workers, generations, the rendezvous store and
// watches. Concurrency is exercised with real threads (this test also runs under TSan).
#include "operator/coordinator/coordinator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace vf {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr char kJob[] = "team/mnist";
constexpr char kToken[] = "secret-token";
constexpr char kFingerprint[] = "fp-1";
constexpr char kBuild[] = "build-1";

std::vector<Member> Members(int n) {
  std::vector<Member> members;
  for (int i = 0; i < n; ++i) members.push_back({"w-" + std::to_string(i), i, {i}});
  return members;
}

class CoordinatorTest : public testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(c_.AddJob(kJob, kToken, kFingerprint, kBuild).ok()); }

  void RegisterAll(int n) {
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(
          c_.RegisterWorker(kJob, "w-" + std::to_string(i), kFingerprint, kBuild, true).ok());
    }
  }

  uint64_t Generation() {
    Result<JobView> view = c_.GetJob(kJob);
    EXPECT_TRUE(view.ok());
    return view.ok() ? view->generation : 0;
  }

  Coordinator c_;
};

TEST_F(CoordinatorTest, AddJobRejectsMalformedNamesAndEmptyTokens) {
  EXPECT_EQ(c_.AddJob("no-slash", kToken, "", "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.AddJob("a/b/c", kToken, "", "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.AddJob("/name", kToken, "", "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.AddJob("ns/sp ace", kToken, "", "").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.AddJob("ns/ok", "", "", "").code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(c_.AddJob("ns/ok", kToken, "", "").ok());
}

TEST_F(CoordinatorTest, AddJobAgainKeepsStateOnlyWhenEverythingIsEqual) {
  ASSERT_TRUE(c_.PublishPlan(kJob, {}).ok());
  EXPECT_TRUE(c_.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  EXPECT_EQ(c_.GetPlan(kJob)->epoch, 1);
  EXPECT_EQ(c_.AddJob(kJob, "other", kFingerprint, kBuild).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_.AddJob(kJob, kToken, "fp-2", kBuild).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_.AddJob(kJob, kToken, kFingerprint, "b-2").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_.GetPlan(kJob)->epoch, 1);
}

TEST(WorkerCredentialTest, IsHmacSha256OfTheWorkerKeyedWithTheJobSecretInHex) {
  // RFC 4231, test case 2.
  EXPECT_EQ(WorkerCredential("Jefe", "what do ya want for nothing?").value(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_NE(WorkerCredential(kToken, "w-0").value(), WorkerCredential(kToken, "w-1").value());
  EXPECT_NE(WorkerCredential(kToken, "w-0").value(), WorkerCredential("other", "w-0").value());
}

TEST_F(CoordinatorTest, CheckCredentialAcceptsOnlyTheWorkersOwn) {
  const std::string w0 = WorkerCredential(kToken, "w-0").value();
  const std::string w1 = WorkerCredential(kToken, "w-1").value();
  EXPECT_TRUE(c_.CheckCredential(kJob, "w-0", w0).ok());
  EXPECT_TRUE(c_.CheckCredential(kJob, "w-1", w1).ok());
  // Another worker's credential, the job's secret itself, a near miss, nothing at all, and an
  // unknown job: all the same answer.
  std::string near = w0;
  near.back() = near.back() == '0' ? '1' : '0';
  for (const auto& [job, worker, credential] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {kJob, "w-0", w1},
           {kJob, "w-1", w0},
           {kJob, "w-0", kToken},
           {kJob, "w-0", near},
           {kJob, "w-0", w0 + "0"},
           {kJob, "w-0", ""},
           {kJob, "", WorkerCredential(kToken, "").value()},
           {kJob, "bad name", WorkerCredential(kToken, "bad name").value()},
           {"team/other", "w-0", w0}}) {
    const Status s = c_.CheckCredential(job, worker, credential);
    EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << job << " " << worker << " " << credential;
    EXPECT_NE(
        s.message().find("the credential is not valid for worker " + worker + " of job " + job),
        std::string::npos)
        << s.message();
  }
}

TEST_F(CoordinatorTest, OnlyRankZeroReportsForTheWholeJob) {
  RegisterAll(2);
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(2)).ok());
  Report report;
  report.epoch = 1;
  report.step = 5;
  report.finished = true;
  report.weights_sha256 = std::string(64, 'f');
  EXPECT_EQ(c_.RecordReport(kJob, "w-1", report).code(), StatusCode::kPermissionDenied);
  report.finished = false;
  EXPECT_EQ(c_.RecordReport(kJob, "w-1", report).code(), StatusCode::kPermissionDenied);
  EXPECT_TRUE(c_.GetJob(kJob)->workers.at("w-1").last_report.weights_sha256.empty());
  report.finished = true;
  EXPECT_TRUE(c_.RecordReport(kJob, "w-0", report).ok());
  // A plan that makes w-1 rank 0 lets it.
  ASSERT_TRUE(c_.PublishPlan(kJob, {{"w-1", 0, {0, 1}}}).ok());
  report.epoch = 2;
  EXPECT_TRUE(c_.RecordReport(kJob, "w-1", report).ok());
  EXPECT_EQ(c_.RecordReport(kJob, "w-0", report).code(), StatusCode::kPermissionDenied);
}

TEST_F(CoordinatorTest, AWorkerWritesOnlyTheCurrentEpochsKeysAndOnlyAsAMember) {
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(2)).ok());
  EXPECT_TRUE(c_.SetKey(kJob, "epoch-1/rank-0", "a", "w-0").ok());
  EXPECT_TRUE(c_.SetKey(kJob, "epoch-1/rank-1", "b", "w-1").ok());
  EXPECT_EQ(c_.SetKey(kJob, "epoch-1/rank-0", "x", "w-7").code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(c_.SetKey(kJob, "epoch-2/rank-0", "x", "w-0").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(*c_.GetKey(kJob, "epoch-1/rank-0", milliseconds(0)), "a");
  // Keys outside any epoch rendezvous nobody; the control plane writes what it needs.
  EXPECT_TRUE(c_.SetKey(kJob, "scratch", "x", "w-7").ok());
  EXPECT_TRUE(c_.SetKey(kJob, "epoch-2/rank-0", "x").ok());
}

TEST_F(CoordinatorTest, WorkersPerJobStopAtItsLimit) {
  EXPECT_EQ(c_.SetWorkerLimit(kJob, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.SetWorkerLimit(kJob, Coordinator::kMaxWorkersPerJob + 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.SetWorkerLimit("team/other", 3).code(), StatusCode::kNotFound);
  ASSERT_TRUE(c_.SetWorkerLimit(kJob, 3).ok());
  RegisterAll(3);
  // Refused for now, as a full coordinator: the worker waits for room, its job goes on.
  const Status fourth = c_.RegisterWorker(kJob, "w-3", kFingerprint, kBuild, true);
  EXPECT_EQ(fourth.code(), StatusCode::kUnavailable);
  EXPECT_NE(fourth.message().find("already has 3 registered workers"), std::string::npos)
      << fourth.message();
  EXPECT_NE(fourth.message().find(kCoordinatorFull), std::string::npos) << fourth.message();
  EXPECT_TRUE(c_.RegisterWorker(kJob, "w-2", kFingerprint, kBuild, false).ok());
  // A worker forgotten makes room.
  ASSERT_TRUE(c_.ForgetWorker(kJob, "w-0").ok());
  EXPECT_TRUE(c_.RegisterWorker(kJob, "w-3", kFingerprint, kBuild, true).ok());
  EXPECT_EQ(c_.GetJob(kJob)->workers.size(), 3u);
}

// One tenant's job holding the budget all jobs share must not fail another's: a worker that
// finds no room is told to wait (kUnavailable, HTTP 503), and is admitted once room comes back.
TEST(CoordinatorBudgetTest, AWorkerPastTheMemoryBudgetIsToldToWaitAndAdmittedOnceThereIsRoom) {
  constexpr size_t kBudget = 64 << 10;
  Coordinator c(kBudget);
  ASSERT_TRUE(c.AddJob("team/a", kToken, kFingerprint, kBuild).ok());
  ASSERT_TRUE(c.AddJob("team/b", kToken, kFingerprint, kBuild).ok());
  ASSERT_TRUE(c.RegisterWorker("team/a", "w-0", kFingerprint, kBuild, true).ok());
  // Job a fills the budget but for 16 bytes, less than one worker's entry.
  const size_t value_bytes = kBudget - c.MemoryUsed() - Coordinator::kKeyOverheadBytes - 1 - 16;
  ASSERT_TRUE(c.SetKey("team/a", "k", std::string(value_bytes, 'a')).ok());
  ASSERT_LT(kBudget - c.MemoryUsed(), Coordinator::kWorkerOverheadBytes);
  const size_t used = c.MemoryUsed();

  const Status refused = c.RegisterWorker("team/b", "w-0", kFingerprint, kBuild, true);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.message();
  EXPECT_NE(refused.message().find(kCoordinatorFull), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("memory budget"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("will retry"), std::string::npos) << refused.message();
  EXPECT_EQ(c.MemoryUsed(), used);
  EXPECT_TRUE(c.GetJob("team/b")->workers.empty());
  // The refusals of a worker that could never join stay what they were.
  EXPECT_EQ(c.RegisterWorker("team/b", "w-0", "fp-2", kBuild, true).code(),
            StatusCode::kFailedPrecondition);

  // Job a ends: the same registration is admitted.
  ASSERT_TRUE(c.ForgetWorker("team/a", "w-0").ok());
  ASSERT_TRUE(c.RemoveJob("team/a").ok());
  ASSERT_TRUE(c.RegisterWorker("team/b", "w-0", kFingerprint, kBuild, true).ok());
  EXPECT_EQ(c.GetJob("team/b")->workers.size(), 1u);
}

TEST_F(CoordinatorTest, StoreKeysPerJobAreBounded) {
  for (size_t i = 0; i < Coordinator::kMaxKeysPerJob; ++i) {
    ASSERT_TRUE(c_.SetKey(kJob, std::to_string(i), "").ok()) << i;
  }
  const Status full = c_.SetKey(kJob, "one-more", "v");
  EXPECT_EQ(full.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(full.message().find("keys"), std::string::npos) << full.message();
  EXPECT_TRUE(c_.SetKey(kJob, "0", "replacing is fine").ok());
  // Another job has its own.
  ASSERT_TRUE(c_.AddJob("team/other", kToken, kFingerprint, kBuild).ok());
  EXPECT_TRUE(c_.SetKey("team/other", "k", "v").ok());
}

TEST(CoordinatorBudgetTest, AllJobsTogetherStayWithinTheMemoryBudget) {
  constexpr size_t kBudget = 256 << 10;
  Coordinator c(kBudget);
  ASSERT_TRUE(c.AddJob("team/a", kToken, kFingerprint, kBuild).ok());
  ASSERT_TRUE(c.AddJob("team/b", kToken, kFingerprint, kBuild).ok());
  EXPECT_EQ(c.MemoryUsed(), 0u);
  ASSERT_TRUE(c.SetKey("team/a", "epoch-1/big", std::string(200 << 10, 'a')).ok());
  ASSERT_TRUE(c.RegisterWorker("team/b", "w-0", kFingerprint, kBuild, true).ok());
  const size_t used = c.MemoryUsed();
  EXPECT_GT(used, size_t{200} << 10);
  // Job b is refused what would pass the budget, though its own store is nearly empty.
  const Status refused = c.SetKey("team/b", "k", std::string(100 << 10, 'b'));
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("memory budget"), std::string::npos) << refused.message();
  EXPECT_EQ(c.MemoryUsed(), used);
  EXPECT_FALSE(c.GetKey("team/b", "k", milliseconds(0)).ok());
  // A failure message is counted too, and refused past the budget.
  ASSERT_TRUE(c.PublishPlan("team/b", {{"w-0", 0, {0}}}).ok());
  ASSERT_TRUE(c.RecordFailure("team/b", "w-0", 1, 0, std::string(4000, 'm')).ok());
  EXPECT_EQ(c.MemoryUsed(), used + 4000);
  // Keys dropped with old epochs give their bytes back, and so does a removed job.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(c.PublishPlan("team/a", {}).ok());
  EXPECT_LT(c.MemoryUsed(), size_t{100} << 10);
  EXPECT_TRUE(c.SetKey("team/b", "k", std::string(100 << 10, 'b')).ok());
  ASSERT_TRUE(c.ForgetWorker("team/b", "w-0").ok());
  ASSERT_TRUE(c.RemoveJob("team/b").ok());
  ASSERT_TRUE(c.RemoveJob("team/a").ok());
  EXPECT_EQ(c.MemoryUsed(), 0u);
}

TEST_F(CoordinatorTest, WorkerNotHeardFromIsSilentUntilHeardAgain) {
  RegisterAll(2);
  const uint64_t before = c_.GetJob(kJob)->generation;
  c_.SweepSilent(std::chrono::hours(1));  // everyone was heard from just now
  EXPECT_EQ(c_.GetJob(kJob)->generation, before);
  EXPECT_FALSE(c_.GetJob(kJob)->workers.at("w-0").silent);

  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  c_.Heard(kJob, "w-1");
  c_.SweepSilent(std::chrono::milliseconds(10));
  JobView view = *c_.GetJob(kJob);
  EXPECT_TRUE(view.workers.at("w-0").silent);
  EXPECT_FALSE(view.workers.at("w-1").silent);
  EXPECT_GT(view.generation, before);  // controllers are woken by the change

  const uint64_t marked = view.generation;
  c_.SweepSilent(std::chrono::milliseconds(10));  // still silent: nothing changes
  EXPECT_EQ(c_.GetJob(kJob)->generation, marked);
  c_.Heard(kJob, "w-0");  // a plan poll after SIGCONT
  view = *c_.GetJob(kJob);
  EXPECT_FALSE(view.workers.at("w-0").silent);
  EXPECT_GT(view.generation, marked);

  // Requests for unknown jobs or workers are no error and change nothing.
  c_.Heard("ns/other", "w-0");
  c_.Heard(kJob, "w-9");
  EXPECT_EQ(c_.GetJob(kJob)->workers.count("w-9"), 0u);
}

TEST_F(CoordinatorTest, PlansGetIncreasingEpochsAndPrefixes) {
  EXPECT_EQ(c_.GetPlan(kJob)->epoch, 0);
  Result<Plan> first = c_.PublishPlan(kJob, Members(2));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->epoch, 1);
  EXPECT_EQ(first->store_prefix, "epoch-1");
  Result<Plan> second = c_.PublishPlan(kJob, Members(3));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->epoch, 2);
  EXPECT_EQ(second->store_prefix, "epoch-2");
  EXPECT_EQ(c_.GetPlan(kJob)->members.size(), 3u);
}

TEST_F(CoordinatorTest, PlansAreSortedByRank) {
  std::vector<Member> members = {{"b", 1, {2, 3}}, {"a", 0, {0, 1}}};
  Result<Plan> plan = c_.PublishPlan(kJob, members);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->members[0].worker, "a");
  EXPECT_EQ(plan->members[1].worker, "b");
}

TEST_F(CoordinatorTest, InvalidPlansAreRejectedAndChangeNothing) {
  struct Case {
    const char* what;
    std::vector<Member> members;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"rank gap", {{"a", 0, {0}}, {"b", 2, {1}}}, "ranks must be 0..1"},
      {"duplicate rank", {{"a", 0, {0}}, {"b", 0, {1}}}, "rank 0 is given to both a and b"},
      {"duplicate worker", {{"a", 0, {0}}, {"a", 1, {1}}}, "worker a appears twice"},
      {"no virtual nodes", {{"a", 0, {}}}, "worker a has no virtual nodes"},
      {"overlap", {{"a", 0, {0, 1}}, {"b", 1, {1}}}, "virtual node 1 is given to both a and b"},
      {"negative node", {{"a", 0, {-1}}}, "non-negative"},
      {"bad name", {{"a b", 0, {0}}}, "worker name"},
  };
  for (const Case& c : cases) {
    Result<Plan> plan = c_.PublishPlan(kJob, c.members);
    ASSERT_FALSE(plan.ok()) << c.what;
    EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(plan.status().message().find(c.message), std::string::npos)
        << c.what << ": " << plan.status().message();
  }
  EXPECT_EQ(c_.GetPlan(kJob)->epoch, 0);
  EXPECT_EQ(c_.PublishPlan("team/none", Members(1)).status().code(), StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, EmptyPlanIsValid) {
  Result<Plan> plan = c_.PublishPlan(kJob, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->epoch, 1);
  EXPECT_TRUE(plan->members.empty());
}

TEST_F(CoordinatorTest, AWorkerOfAnotherProtocolIsRefusedSayingWhich) {
  Status refused = c_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true, kProtocolVersion + 1);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), "worker w-0 was refused: it speaks coordinator protocol " +
                                   std::to_string(kProtocolVersion + 1) +
                                   ", this coordinator speaks protocol " +
                                   std::to_string(kProtocolVersion) +
                                   "; run workers of an agent build with this protocol");
  EXPECT_TRUE(c_.GetJob(kJob)->workers.empty());
}

// A coordinator of the next protocol (an operator that poses as one in tests): the workers of
// this build's protocol are refused, saying both, and those of its own are taken.
TEST_F(CoordinatorTest, ACoordinatorOfAnotherProtocolTakesOnlyWorkersOfIt) {
  Coordinator next(Coordinator::kDefaultMemoryBudget, kProtocolVersion + 1);
  EXPECT_EQ(next.protocol(), kProtocolVersion + 1);
  EXPECT_EQ(c_.protocol(), kProtocolVersion);
  ASSERT_TRUE(next.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  Status refused = next.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(), "worker w-0 was refused: it speaks coordinator protocol " +
                                   std::to_string(kProtocolVersion) +
                                   ", this coordinator speaks protocol " +
                                   std::to_string(kProtocolVersion + 1) +
                                   "; run workers of an agent build with this protocol");
  EXPECT_TRUE(
      next.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true, kProtocolVersion + 1).ok());
  EXPECT_EQ(next.GetJob(kJob)->workers.size(), 1u);
}

// An operator upgraded under a running job: its coordinator, of build-2, restores the plan of
// workers that run build-1. They keep their places; a joiner must then run their build.
TEST_F(CoordinatorTest, ThePlansMembersKeepTheirBuildUnderANewerCoordinator) {
  Coordinator upgraded;
  ASSERT_TRUE(upgraded.AddJob(kJob, kToken, kFingerprint, "build-2").ok());
  ASSERT_TRUE(upgraded.PublishPlanWithEpoch(kJob, 5, Members(2)).ok());
  // A pod the new operator created, of its build, registered before the members came back.
  ASSERT_TRUE(upgraded.RegisterWorker(kJob, "w-9", kFingerprint, "build-2", false).ok());
  EXPECT_TRUE(upgraded.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true).ok());
  EXPECT_TRUE(upgraded.RegisterWorker(kJob, "w-1", kFingerprint, kBuild, true).ok());
  Result<JobView> view = upgraded.GetJob(kJob);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->build, kBuild);
  EXPECT_EQ(view->workers.size(), 2u);
  EXPECT_EQ(view->workers.count("w-9"), 0u);
  Status joiner = upgraded.RegisterWorker(kJob, "w-9", kFingerprint, "build-2", false);
  EXPECT_EQ(joiner.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(joiner.message(),
            "worker w-9 was refused: it runs build build-2, the job runs build build-1");
  EXPECT_TRUE(upgraded.RegisterWorker(kJob, "w-9", kFingerprint, kBuild, false).ok());
}

TEST_F(CoordinatorTest, OnlyTheFirstMemberToRegisterMaySetAnotherBuild) {
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(2)).ok());
  ASSERT_TRUE(c_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true).ok());
  EXPECT_EQ(c_.RegisterWorker(kJob, "w-1", kFingerprint, "build-2", true).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_.GetJob(kJob)->build, kBuild);
}

TEST_F(CoordinatorTest, PublishPlanWithEpochRestoresButNeverGoesBack) {
  Result<Plan> restored = c_.PublishPlanWithEpoch(kJob, 7, Members(2));
  ASSERT_TRUE(restored.ok());
  EXPECT_EQ(restored->epoch, 7);
  EXPECT_EQ(restored->store_prefix, "epoch-7");
  EXPECT_EQ(c_.PublishPlanWithEpoch(kJob, 7, Members(2)).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_.PublishPlanWithEpoch(kJob, 3, Members(2)).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(c_.PublishPlan(kJob, Members(1))->epoch, 8);
}

// A job without members has no build to keep: its first worker brings one (a job whose image is
// of another build than the operator's), which every later worker must run.
TEST_F(CoordinatorTest, TheFirstWorkerOfAJobWithoutMembersSetsItsBuild) {
  ASSERT_TRUE(c_.RegisterWorker(kJob, "w-0", kFingerprint, "build-0", false).ok());
  EXPECT_EQ(c_.GetJob(kJob)->build, "build-0");
  Status second = c_.RegisterWorker(kJob, "w-1", kFingerprint, kBuild, false);
  EXPECT_EQ(second.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.message(),
            "worker w-1 was refused: it runs build build-1, the job runs build build-0");
  EXPECT_TRUE(c_.RegisterWorker(kJob, "w-1", kFingerprint, "build-0", false).ok());
  // A member, once there is a plan, keeps it.
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(c_.ForgetWorker(kJob, "w-1").ok());
  EXPECT_EQ(c_.RegisterWorker(kJob, "w-1", kFingerprint, kBuild, false).code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, RegistrationChecksFingerprintThenBuild) {
  ASSERT_TRUE(c_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true).ok());
  Status spec = c_.RegisterWorker(kJob, "w-3", "fp-other", "build-other", true);
  EXPECT_EQ(spec.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(spec.message(),
            "worker w-3 was refused: its job spec differs from the job's (virtual nodes, batch, "
            "model, dataset, optimizer, reduction or seed)");
  Status build = c_.RegisterWorker(kJob, "w-3", kFingerprint, "build-2", true);
  EXPECT_EQ(build.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(build.message(),
            "worker w-3 was refused: it runs build build-2, the job runs build "
            "build-1");
  EXPECT_EQ(c_.GetJob(kJob)->workers.count("w-3"), 0u);
  EXPECT_EQ(c_.RegisterWorker(kJob, "", kFingerprint, kBuild, true).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.RegisterWorker("team/none", "w", kFingerprint, kBuild, true).code(),
            StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, RegisteringAgainUpdatesReadiness) {
  ASSERT_TRUE(c_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, false).ok());
  EXPECT_FALSE(c_.GetJob(kJob)->workers.at("w-0").ready);
  ASSERT_TRUE(c_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true).ok());
  Result<JobView> view = c_.GetJob(kJob);
  ASSERT_EQ(view->workers.size(), 1u);
  EXPECT_TRUE(view->workers.at("w-0").ready);
  EXPECT_EQ(view->workers.at("w-0").acked_epoch, -1);
  EXPECT_EQ(view->workers.at("w-0").failure_epoch, -1);
}

TEST_F(CoordinatorTest, ReportsMustComeFromRegisteredWorkersInTheCurrentEpoch) {
  Report report;
  report.epoch = 1;
  report.step = 12;
  report.loss = 0.5;
  report.samples_per_second = 100;
  report.seconds_per_virtual_node = 0.01;
  report.pause_seconds = 1.5;
  report.has_state = true;
  EXPECT_EQ(c_.RecordReport(kJob, "w-0", report).code(), StatusCode::kNotFound);
  RegisterAll(2);
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(2)).ok());
  ASSERT_TRUE(c_.RecordReport(kJob, "w-0", report).ok());
  const WorkerInfo info = c_.GetJob(kJob)->workers.at("w-0");
  EXPECT_EQ(info.last_report.step, 12);
  EXPECT_EQ(info.last_report.loss, 0.5);
  EXPECT_EQ(info.last_report.pause_seconds, 1.5);
  EXPECT_TRUE(info.last_report.has_state);

  ASSERT_TRUE(c_.PublishPlan(kJob, Members(2)).ok());
  Status old = c_.RecordReport(kJob, "w-0", report);
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(old.message(), "epoch 1 is older than the current epoch 2");
  report.epoch = 3;
  Status future = c_.RecordReport(kJob, "w-0", report);
  EXPECT_EQ(future.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(future.message().find("from the future"), std::string::npos);
  report.epoch = 2;
  report.loss = std::nan("");
  EXPECT_TRUE(c_.RecordReport(kJob, "w-0", report).ok());
  EXPECT_TRUE(std::isnan(c_.GetJob(kJob)->workers.at("w-0").last_report.loss));
}

TEST_F(CoordinatorTest, LeaveAckAndFailureAreRecorded) {
  RegisterAll(3);
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(3)).ok());
  EXPECT_TRUE(c_.RequestLeave(kJob, "w-2").ok());
  EXPECT_TRUE(c_.GetJob(kJob)->workers.at("w-2").leave_requested);
  EXPECT_EQ(c_.RequestLeave(kJob, "w-9").code(), StatusCode::kNotFound);

  // w-2 may not acknowledge a plan that still includes it.
  EXPECT_EQ(c_.AckPlan(kJob, "w-2", 1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(2)).ok());
  EXPECT_EQ(c_.AckPlan(kJob, "w-2", 3).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(c_.AckPlan(kJob, "w-2", 2).ok());
  EXPECT_EQ(c_.GetJob(kJob)->workers.at("w-2").acked_epoch, 2);

  EXPECT_TRUE(c_.RecordFailure(kJob, "w-0", 2, 40, "gloo: connection reset").ok());
  EXPECT_EQ(c_.RecordFailure(kJob, "w-0", 3, 40, "x").code(), StatusCode::kFailedPrecondition);
  const WorkerInfo info = c_.GetJob(kJob)->workers.at("w-0");
  EXPECT_EQ(info.failure_epoch, 2);
  EXPECT_EQ(info.failure_step, 40);
  EXPECT_EQ(info.failure_message, "gloo: connection reset");
  EXPECT_EQ(ReportedFailure(*c_.GetJob(kJob), 2), "w-0 reported: gloo: connection reset");
  // Only failures under the plan asked about or a later one; the newest step wins.
  EXPECT_EQ(ReportedFailure(*c_.GetJob(kJob), 3), "");
  EXPECT_TRUE(c_.RecordFailure(kJob, "w-1", 2, 41, "gloo: timed out").ok());
  EXPECT_EQ(ReportedFailure(*c_.GetJob(kJob), 2), "w-1 reported: gloo: timed out");
  // A stale report of an older epoch does not overwrite a newer one.
  EXPECT_TRUE(c_.RecordFailure(kJob, "w-0", 1, 10, "older").ok());
  EXPECT_EQ(c_.GetJob(kJob)->workers.at("w-0").failure_epoch, 2);
}

TEST_F(CoordinatorTest, ForgetWorkerDropsTheRegistration) {
  RegisterAll(2);
  EXPECT_TRUE(c_.ForgetWorker(kJob, "w-1").ok());
  EXPECT_EQ(c_.GetJob(kJob)->workers.count("w-1"), 0u);
  EXPECT_EQ(c_.ForgetWorker(kJob, "w-1").code(), StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, GenerationIncreasesOnEveryChange) {
  uint64_t last = Generation();
  EXPECT_GT(last, 0u);
  auto expect_bump = [&](const char* what) {
    const uint64_t now = Generation();
    EXPECT_GT(now, last) << what;
    last = now;
  };
  ASSERT_TRUE(c_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, false).ok());
  expect_bump("registration");
  ASSERT_TRUE(c_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true).ok());
  expect_bump("readiness");
  ASSERT_TRUE(c_.RegisterWorker(kJob, "w-1", kFingerprint, kBuild, true).ok());
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());
  expect_bump("plan");
  Report report;
  report.epoch = 1;
  ASSERT_TRUE(c_.RecordReport(kJob, "w-0", report).ok());
  expect_bump("report");
  ASSERT_TRUE(c_.RequestLeave(kJob, "w-1").ok());
  expect_bump("leave");
  ASSERT_TRUE(c_.AckPlan(kJob, "w-1", 1).ok());
  expect_bump("ack");
  ASSERT_TRUE(c_.RecordFailure(kJob, "w-0", 1, 0, "boom").ok());
  expect_bump("failure");
  ASSERT_TRUE(c_.ForgetWorker(kJob, "w-1").ok());
  expect_bump("forget");
  // Failed requests and store traffic are not changes of membership.
  EXPECT_FALSE(c_.RecordReport(kJob, "nobody", report).ok());
  ASSERT_TRUE(c_.SetKey(kJob, "k", "v").ok());
  EXPECT_EQ(Generation(), last);
}

TEST_F(CoordinatorTest, WaitForChangeWakesOnChange) {
  const uint64_t seen = Generation();
  auto waiter = std::async(std::launch::async,
                           [&] { return c_.WaitForChange(kJob, seen, std::chrono::seconds(20)); });
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = Clock::now();
  ASSERT_TRUE(c_.RegisterWorker(kJob, "w-0", kFingerprint, kBuild, true).ok());
  EXPECT_TRUE(waiter.get());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST_F(CoordinatorTest, WaitForChangeTimesOutWithoutChange) {
  const uint64_t seen = Generation();
  ASSERT_TRUE(c_.SetKey(kJob, "k", "v").ok());
  const auto start = Clock::now();
  EXPECT_FALSE(c_.WaitForChange(kJob, seen, milliseconds(100)));
  EXPECT_GE(Clock::now() - start, milliseconds(100));
  // An outdated generation returns at once.
  EXPECT_TRUE(c_.WaitForChange(kJob, seen - 1, milliseconds(0)));
}

TEST_F(CoordinatorTest, WaitForChangeWakesOnRemovalAndCreation) {
  const uint64_t seen = Generation();
  auto removed = std::async(std::launch::async,
                            [&] { return c_.WaitForChange(kJob, seen, std::chrono::seconds(20)); });
  std::this_thread::sleep_for(milliseconds(30));
  ASSERT_TRUE(c_.RemoveJob(kJob).ok());
  EXPECT_TRUE(removed.get());
  EXPECT_EQ(c_.GetJob(kJob).status().code(), StatusCode::kNotFound);

  auto created = std::async(std::launch::async,
                            [&] { return c_.WaitForChange(kJob, 0, std::chrono::seconds(20)); });
  std::this_thread::sleep_for(milliseconds(30));
  ASSERT_TRUE(c_.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  EXPECT_TRUE(created.get());
  // The new job's generation is one a controller has never seen.
  EXPECT_GT(Generation(), seen);
}

TEST_F(CoordinatorTest, GetKeyWaitsForASetFromAnotherThread) {
  auto reader = std::async(std::launch::async, [&] {
    return c_.GetKey(kJob, "epoch-1/rank-0", std::chrono::seconds(20));
  });
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_TRUE(c_.SetKey(kJob, "epoch-1/rank-0", std::string("a\0b", 3)).ok());
  Result<std::string> value = reader.get();
  ASSERT_TRUE(value.ok()) << value.status().ToString();
  EXPECT_EQ(*value, std::string("a\0b", 3));
}

TEST_F(CoordinatorTest, GetKeyTimesOutNamingTheKey) {
  const auto start = Clock::now();
  Result<std::string> value = c_.GetKey(kJob, "missing", milliseconds(100));
  EXPECT_GE(Clock::now() - start, milliseconds(100));
  ASSERT_EQ(value.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(value.status().message().find("'missing'"), std::string::npos);
  // The abandoned wait is gone: a later set has nobody to call.
  EXPECT_TRUE(c_.SetKey(kJob, "missing", "late").ok());
  EXPECT_EQ(*c_.GetKey(kJob, "missing", milliseconds(0)), "late");
}

TEST_F(CoordinatorTest, StoreIsPerJob) {
  ASSERT_TRUE(c_.AddJob("team/other", "t2", kFingerprint, kBuild).ok());
  ASSERT_TRUE(c_.SetKey(kJob, "k", "mine").ok());
  EXPECT_EQ(c_.GetKey("team/other", "k", milliseconds(0)).status().code(),
            StatusCode::kDeadlineExceeded);
  EXPECT_EQ(c_.GetKey("team/none", "k", milliseconds(0)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c_.SetKey("team/none", "k", "v").code(), StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, StoreRejectsWritesToPastEpochs) {
  ASSERT_TRUE(c_.PublishPlanWithEpoch(kJob, 3, Members(1)).ok());
  Status old = c_.SetKey(kJob, "epoch-2/rank-0", "x");
  EXPECT_EQ(old.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(old.message(), "epoch 2 is older than the current epoch 3");
  EXPECT_TRUE(c_.SetKey(kJob, "epoch-3/rank-0", "x").ok());
  EXPECT_TRUE(c_.SetKey(kJob, "epoch-4/rank-0", "x").ok());  // the next plan's, in a race
  Status future = c_.SetKey(kJob, "epoch-5/rank-0", "x");
  EXPECT_EQ(future.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(future.message(), "epoch 5 is from the future (the current epoch is 3)");
  EXPECT_TRUE(c_.SetKey(kJob, "epoch-x/rank-0", "x").ok());  // not an epoch key
  // Waiting for a key that can no longer be written fails at once.
  const auto start = Clock::now();
  EXPECT_EQ(c_.GetKey(kJob, "epoch-1/rank-0", std::chrono::seconds(20)).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(c_.SetKey(kJob, "", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c_.SetKey(kJob, std::string(Coordinator::kMaxKeyBytes + 1, 'k'), "x").code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, NewPlanFailsWaitersOfOlderEpochs) {
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(2)).ok());
  auto waiter = std::async(std::launch::async, [&] {
    return c_.GetKey(kJob, "epoch-1/rank-1", std::chrono::seconds(20));
  });
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = Clock::now();
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());
  Result<std::string> value = waiter.get();
  EXPECT_EQ(value.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(value.status().message(), "epoch 1 is older than the current epoch 2");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST_F(CoordinatorTest, PublishPlanCollectsStoreDataOfOldEpochs) {
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(c_.SetKey(kJob, "epoch-1/a", "1").ok());
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(c_.SetKey(kJob, "epoch-2/a", "2").ok());
  ASSERT_TRUE(c_.SetKey(kJob, "plain", "kept").ok());
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());  // epoch 3 keeps epochs 1 and 2
  EXPECT_EQ(*c_.GetKey(kJob, "epoch-1/a", milliseconds(0)), "1");
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());  // epoch 4 drops epoch 1
  EXPECT_FALSE(c_.GetKey(kJob, "epoch-1/a", milliseconds(0)).ok());
  EXPECT_EQ(*c_.GetKey(kJob, "epoch-2/a", milliseconds(0)), "2");
  EXPECT_EQ(*c_.GetKey(kJob, "plain", milliseconds(0)), "kept");
}

TEST_F(CoordinatorTest, StoreSizeIsBounded) {
  const std::string mib(1 << 20, 'x');
  int stored = 0;
  Status status;
  for (int i = 0; i < 80 && status.ok(); ++i) {
    status = c_.SetKey(kJob, "k" + std::to_string(i), mib);
    if (status.ok()) ++stored;
  }
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(stored, 63);
  // Replacing a value frees its old size.
  EXPECT_TRUE(c_.SetKey(kJob, "k0", "small").ok());
  EXPECT_TRUE(c_.SetKey(kJob, "k70", mib).ok());
}

TEST_F(CoordinatorTest, KeyEpochReadsTheFirstSegmentOnly) {
  EXPECT_EQ(KeyEpoch("epoch-12/rank-0"), 12);
  EXPECT_EQ(KeyEpoch("epoch-0"), 0);
  EXPECT_EQ(KeyEpoch("epoch-/x"), -1);
  EXPECT_EQ(KeyEpoch("epoch-1a/x"), -1);
  EXPECT_EQ(KeyEpoch("x/epoch-1"), -1);
  EXPECT_EQ(KeyEpoch("epoch-99999999999999999999"), -1);
}

TEST_F(CoordinatorTest, WatchPlanFiresOnceForTheFirstNewerPlan) {
  std::atomic<int> calls{0};
  std::atomic<int64_t> seen_epoch{0};
  Result<Coordinator::WatchId> id = c_.WatchPlan(kJob, 0, [&](Result<Plan> plan) {
    ASSERT_TRUE(plan.ok());
    seen_epoch = plan->epoch;
    ++calls;
  });
  ASSERT_TRUE(id.ok());
  EXPECT_NE(*id, Coordinator::kNoWatch);
  EXPECT_EQ(calls, 0);
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen_epoch, 1);
  EXPECT_FALSE(c_.CancelWatch(*id));

  // Already satisfied: runs before returning.
  Result<Coordinator::WatchId> now = c_.WatchPlan(kJob, 1, [&](Result<Plan> plan) {
    seen_epoch = plan->epoch;
    ++calls;
  });
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(*now, Coordinator::kNoWatch);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(seen_epoch, 2);
  EXPECT_EQ(c_.WatchPlan("team/none", 0, [](const Result<Plan>&) {}).status().code(),
            StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, CancelledWatchNeverFires) {
  std::atomic<int> calls{0};
  Result<Coordinator::WatchId> plan = c_.WatchPlan(kJob, 0, [&](const Result<Plan>&) { ++calls; });
  Result<Coordinator::WatchId> key =
      c_.WatchKey(kJob, "k", [&](const Result<std::string>&) { ++calls; });
  ASSERT_TRUE(plan.ok() && key.ok());
  EXPECT_TRUE(c_.CancelWatch(*plan));
  EXPECT_TRUE(c_.CancelWatch(*key));
  EXPECT_FALSE(c_.CancelWatch(*key));
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());
  ASSERT_TRUE(c_.SetKey(kJob, "k", "v").ok());
  EXPECT_EQ(calls, 0);
}

TEST_F(CoordinatorTest, RemovingAJobFailsItsWatches) {
  std::atomic<int> not_found{0};
  ASSERT_TRUE(c_.WatchPlan(kJob, 0, [&](const Result<Plan>& r) {
                  if (r.status().code() == StatusCode::kNotFound) ++not_found;
                }).ok());
  ASSERT_TRUE(c_.WatchKey(kJob, "k", [&](const Result<std::string>& r) {
                  if (r.status().code() == StatusCode::kNotFound) ++not_found;
                }).ok());
  ASSERT_TRUE(c_.RemoveJob(kJob).ok());
  EXPECT_EQ(not_found, 2);
  EXPECT_EQ(c_.RemoveJob(kJob).code(), StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, CallbacksMayCallBackIntoTheCoordinator) {
  // Callbacks run without the lock held; one that re-enters must not deadlock.
  std::atomic<bool> done{false};
  ASSERT_TRUE(c_.WatchPlan(kJob, 0, [&](const Result<Plan>&) {
                  EXPECT_TRUE(c_.SetKey(kJob, "from-callback", "v").ok());
                  done = true;
                }).ok());
  ASSERT_TRUE(c_.PublishPlan(kJob, Members(1)).ok());
  EXPECT_TRUE(done);
  EXPECT_EQ(*c_.GetKey(kJob, "from-callback", milliseconds(0)), "v");
}

TEST_F(CoordinatorTest, ConcurrentRanksRendezvousThroughTheStore) {
  constexpr int kRanks = 8;
  constexpr int kRounds = 20;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      for (int round = 0; round < kRounds; ++round) {
        const std::string prefix = "round-" + std::to_string(round) + "/";
        if (!c_.SetKey(kJob, prefix + std::to_string(rank), std::to_string(rank * round)).ok()) {
          ++failures;
        }
        for (int peer = 0; peer < kRanks; ++peer) {
          Result<std::string> v =
              c_.GetKey(kJob, prefix + std::to_string(peer), std::chrono::seconds(30));
          if (!v.ok() || *v != std::to_string(peer * round)) ++failures;
        }
      }
    });
  }
  // Membership churn at the same time.
  threads.emplace_back([&] {
    for (int i = 0; i < 50; ++i) {
      if (!c_.PublishPlan(kJob, Members(1 + i % 3)).ok()) ++failures;
      (void)c_.GetJob(kJob);
    }
  });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(c_.GetPlan(kJob)->epoch, 50);
}

}  // namespace
}  // namespace vf
