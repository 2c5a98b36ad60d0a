#include "agent/state_sync.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "agent/executor_state.h"

namespace vf {
namespace {

JobSpec SmallJob() {
  JobSpec j;
  j.name = "sync";
  j.virtual_nodes = 4;
  j.global_batch_size = 32;
  j.replicas_max = 4;
  j.model.hidden_sizes = {16};
  j.dataset.name = "synthetic";
  j.dataset.train_samples = 640;
  j.dataset.test_samples = 64;
  j.optimizer.name = "adamw";
  j.optimizer.learning_rate = 0.001;
  j.steps = 20;
  j.seed = 3;
  return j;
}

struct RankResult {
  SyncOutcome outcome;
  int64_t step = -1;
  std::string sha;
  bool ok = false;
};

// `steps[r]` < 0: rank r joins without state; otherwise it trained that many steps alone.
std::vector<RankResult> Sync(const std::vector<int>& steps) {
  const JobSpec job = SmallJob();
  const auto data = LoadJobDataset(job).value();
  const int n = static_cast<int>(steps.size());
  MemoryStore store;
  std::vector<RankResult> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto dev = CreateCpuDevice(1);
      auto ex = Executor::Create(job, *dev, data.train).value();
      if (steps[static_cast<size_t>(r)] >= 0) {
        ASSERT_TRUE(ex->InitializeFresh().ok());
        auto local = CreateLocalCommunicator();
        const std::vector<int> all = {0, 1, 2, 3};
        for (int s = 0; s < steps[static_cast<size_t>(r)]; ++s) {
          ASSERT_TRUE(ex->Step(*local, all).ok());
        }
      }
      auto comm = CreateGlooCommunicator(store, r, n, CommOptions{}).value();
      ExecutorState state(*ex, "");
      auto res = SyncState(*comm, state);
      ASSERT_TRUE(res.ok()) << res.status().message();
      auto& o = out[static_cast<size_t>(r)];
      o.outcome = *res;
      o.step = ex->step();
      o.sha = ex->WeightsSha256();
      o.ok = true;
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::string ShaAfter(int steps) {
  const JobSpec job = SmallJob();
  const auto data = LoadJobDataset(job).value();
  auto dev = CreateCpuDevice(1);
  auto ex = Executor::Create(job, *dev, data.train).value();
  EXPECT_TRUE(ex->InitializeFresh().ok());
  auto local = CreateLocalCommunicator();
  const std::vector<int> all = {0, 1, 2, 3};
  for (int s = 0; s < steps; ++s) EXPECT_TRUE(ex->Step(*local, all).ok());
  return ex->WeightsSha256();
}

TEST(StateSync, NobodyHasStateSoRankZeroInitializesAndShares) {
  auto out = Sync({-1, -1, -1});
  for (const auto& r : out) {
    ASSERT_TRUE(r.ok);
    EXPECT_TRUE(r.outcome.transferred);
    EXPECT_EQ(r.outcome.source_rank, 0);
    EXPECT_EQ(r.step, 0);
    EXPECT_EQ(r.sha, out[0].sha);
  }
  EXPECT_TRUE(out[0].outcome.initialized);
  EXPECT_FALSE(out[1].outcome.initialized);
  EXPECT_EQ(out[0].sha, ShaAfter(0));
}

TEST(StateSync, JoinersAndLaggardsAdoptTheNewestState) {
  // Rank 2 completed one step more than rank 1 (it finished a step whose collective failed
  // for the others); rank 0 is a joiner.
  auto out = Sync({-1, 4, 5});
  const std::string expected = ShaAfter(5);
  for (const auto& r : out) {
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.outcome.source_rank, 2);
    EXPECT_GT(r.outcome.bytes, 0);
    EXPECT_EQ(r.step, 5);
    EXPECT_EQ(r.sha, expected);
  }
}

TEST(StateSync, LowestRankAtTheNewestStepIsTheSource) {
  auto out = Sync({3, 3, -1, 2});
  for (const auto& r : out) {
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.outcome.source_rank, 0);
    EXPECT_EQ(r.step, 3);
  }
}

TEST(StateSync, MembersThatAgreeAlreadySendNothing) {
  auto out = Sync({6, 6});
  for (const auto& r : out) {
    ASSERT_TRUE(r.ok);
    EXPECT_FALSE(r.outcome.transferred);
    EXPECT_EQ(r.outcome.bytes, 0);
    EXPECT_EQ(r.step, 6);
  }
}

}  // namespace
}  // namespace vf
