#include "agent/state_sync.h"

#include <gtest/gtest.h>

#include <limits>
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

// Rank 0 plays a source that claims the newest state and then declares `forged` bytes of
// metadata; rank 1, which trained `steps` steps, must refuse before allocating, its state intact.
void ExpectForgedSizeRefused(int64_t forged, int steps) {
  const JobSpec job = SmallJob();
  const auto data = LoadJobDataset(job).value();
  MemoryStore store;
  std::thread forger([&] {
    auto comm = CreateGlooCommunicator(store, 0, 2, CommOptions{}).value();
    int64_t agg[4] = {1, 50, -50, 0};
    ASSERT_TRUE(comm->AllReduce(agg, 4, ReduceOp::kMax).ok());
    int64_t claim = 2;
    ASSERT_TRUE(comm->AllReduce(&claim, 1, ReduceOp::kMax).ok());
    int64_t size = forged;
    ASSERT_TRUE(comm->Broadcast(&size, sizeof(size), 0).ok());
  });
  auto dev = CreateCpuDevice(1);
  auto ex = Executor::Create(job, *dev, data.train).value();
  std::string before;
  if (steps >= 0) {
    ASSERT_TRUE(ex->InitializeFresh().ok());
    auto local = CreateLocalCommunicator();
    const std::vector<int> all = {0, 1, 2, 3};
    for (int s = 0; s < steps; ++s) ASSERT_TRUE(ex->Step(*local, all).ok());
    before = ex->WeightsSha256();
  }
  auto comm = CreateGlooCommunicator(store, 1, 2, CommOptions{}).value();
  ExecutorState state(*ex, "");
  Result<SyncOutcome> res = SyncState(*comm, state);
  forger.join();
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(res.status().message().find("declares " + std::to_string(forged) + " bytes"),
            std::string::npos)
      << res.status().message();
  if (steps >= 0) {
    EXPECT_EQ(ex->step(), steps);
    EXPECT_EQ(ex->WeightsSha256(), before);
  }
}

TEST(StateSync, AForgedMetadataSizeIsRefusedBeforeAllocating) {
  ExpectForgedSizeRefused(-1, -1);
  ExpectForgedSizeRefused(int64_t{1} << 50, -1);
  ExpectForgedSizeRefused(std::numeric_limits<int64_t>::max(), 2);
}

}  // namespace
}  // namespace vf
