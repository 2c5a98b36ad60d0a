#include "runtime/executor.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "runtime/device/cpu/device.h"

namespace vf {
namespace {

JobSpec SmallJob(Reduction mode = Reduction::kExact, const std::string& optimizer = "sgd") {
  JobSpec j;
  j.name = "small";
  j.virtual_nodes = 6;
  j.global_batch_size = 48;
  j.replicas_min = 1;
  j.replicas_max = 6;
  j.model.hidden_sizes = {32, 16};
  j.dataset.name = "synthetic";
  j.dataset.train_samples = 960;
  j.dataset.test_samples = 200;
  j.optimizer.name = optimizer;
  j.optimizer.learning_rate = optimizer == "sgd" ? 0.05 : 0.002;
  j.steps = 12;
  j.reduction = mode;
  j.seed = 5;
  return j;
}

// Trains `job` for its steps with the given mapping of virtual nodes to ranks (threads with
// real Gloo communicators), each rank's device offering `lanes` lanes; returns each rank's
// weight digest.
std::vector<std::string> Train(const JobSpec& job, const std::vector<std::vector<int>>& mapping,
                               int lanes = 1) {
  auto data = LoadJobDataset(job).value();
  const int ranks = static_cast<int>(mapping.size());
  MemoryStore store;
  std::vector<std::string> digests(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto dev = CreateCpuDevice(1);
      DeviceTuning tuning;
      tuning.lanes = lanes;
      dev->Tune(tuning);
      auto ex = Executor::Create(job, *dev, data.train);
      ASSERT_TRUE(ex.ok()) << ex.status().message();
      ASSERT_TRUE((*ex)->InitializeFresh().ok());
      std::unique_ptr<Communicator> comm =
          ranks == 1 ? CreateLocalCommunicator()
                     : CreateGlooCommunicator(store, r, ranks, CommOptions{}).value();
      while ((*ex)->step() < (*ex)->total_steps()) {
        auto s = (*ex)->Step(*comm, mapping[static_cast<size_t>(r)]);
        ASSERT_TRUE(s.ok()) << s.status().message();
      }
      digests[static_cast<size_t>(r)] = (*ex)->WeightsSha256();
    });
  }
  for (auto& t : threads) t.join();
  return digests;
}

TEST(Executor, ExactModeWeightsDoNotDependOnMappingOrOrder) {
  const JobSpec job = SmallJob();
  const auto one = Train(job, {{0, 1, 2, 3, 4, 5}});
  const auto reversed = Train(job, {{5, 3, 1, 4, 2, 0}});
  const auto three = Train(job, {{0}, {1, 2, 3}, {4, 5}});
  EXPECT_EQ(reversed[0], one[0]);
  for (const auto& d : three) EXPECT_EQ(d, one[0]);
}

TEST(Executor, AdamWExactModeIsMappingIndependentToo) {
  const JobSpec job = SmallJob(Reduction::kExact, "adamw");
  const auto one = Train(job, {{0, 1, 2, 3, 4, 5}});
  const auto two = Train(job, {{0, 1, 2}, {3, 4, 5}});
  EXPECT_EQ(two[0], one[0]);
  EXPECT_EQ(two[1], one[0]);
}

TEST(Executor, LanesDoNotChangeTheWeights) {
  // A device's lanes get a node each in turn (their own model, gradient and staging; fast mode
  // on the CPU keeps one sum, so one lane); on the CPU they run in turn, which checks that every
  // node still computes from its own buffers and lands in its own statistics.
  for (Reduction mode : {Reduction::kExact, Reduction::kFast}) {
    const JobSpec job = SmallJob(mode);
    const auto one_lane = Train(job, {{0, 1, 2, 3, 4, 5}});
    EXPECT_EQ(Train(job, {{0, 1, 2, 3, 4, 5}}, 2)[0], one_lane[0]) << ReductionName(mode);
    EXPECT_EQ(Train(job, {{0, 1, 2, 3, 4, 5}}, 3)[0], one_lane[0]) << ReductionName(mode);
    EXPECT_EQ(Train(job, {{0, 1, 2, 3, 4, 5}}, 4)[0], one_lane[0]) << ReductionName(mode);
    if (mode == Reduction::kExact) {
      for (const auto& d : Train(job, {{4, 0, 2}, {1, 5, 3}}, 3)) EXPECT_EQ(d, one_lane[0]);
    }
  }
}

// The CPU with a GPU's grouping of fast mode's sums (Device::FastPartialSums), so that the
// executor's partial sums run here too.
class GroupedCpuDevice : public CpuDevice {
 public:
  GroupedCpuDevice() : CpuDevice(1) {}
  int FastPartialSums() const override { return kDefaultCudaLanes; }
};

TEST(Executor, FastModesPartialSumsDoNotDependOnTheLanes) {
  // Node k adds into partial sum k mod 4, which one lane owns; the partials are added in order.
  // Six nodes: two partials of two nodes, two of one, on 1, 2, 3 (unevenly) and 4 lanes.
  const JobSpec job = SmallJob(Reduction::kFast);
  auto data = LoadJobDataset(job).value();
  std::vector<std::string> digests;
  for (int lanes : {1, 2, 3, 4}) {
    GroupedCpuDevice dev;
    DeviceTuning tuning;
    tuning.lanes = lanes;
    dev.Tune(tuning);
    auto ex = Executor::Create(job, dev, data.train).value();
    ASSERT_TRUE(ex->InitializeFresh().ok());
    auto comm = CreateLocalCommunicator();
    while (ex->step() < ex->total_steps()) {
      auto s = ex->Step(*comm, std::vector<int>{0, 1, 2, 3, 4, 5});
      ASSERT_TRUE(s.ok()) << s.status().message();
    }
    digests.push_back(ex->WeightsSha256());
  }
  for (const auto& d : digests) EXPECT_EQ(d, digests[0]);
  // The grouping is arithmetic: the CPU's one sum adds in another order (here, another result).
  EXPECT_NE(Train(job, {{0, 1, 2, 3, 4, 5}})[0], digests[0]);
}

TEST(Executor, LanesReportEveryNodesLossAndSurviveEvaluation) {
  // The step's loss sums every node's statistics: a node's statistics landing in another's slot
  // changes it. Evaluation between steps regrows lane 0's staging for its larger chunks.
  const JobSpec job = SmallJob();
  auto data = LoadJobDataset(job).value();
  std::vector<std::vector<double>> losses;
  std::vector<double> accuracies;
  for (int lanes : {1, 4}) {
    auto dev = CreateCpuDevice(1);
    DeviceTuning tuning;
    tuning.lanes = lanes;
    dev->Tune(tuning);
    auto ex = Executor::Create(job, *dev, data.train).value();
    ASSERT_TRUE(ex->InitializeFresh().ok());
    auto comm = CreateLocalCommunicator();
    const std::vector<int> all = {0, 1, 2, 3, 4, 5};
    losses.emplace_back();
    for (int i = 0; i < 4; ++i) {
      auto s = ex->Step(*comm, all);
      ASSERT_TRUE(s.ok()) << s.status().message();
      losses.back().push_back(s->loss);
      auto eval = ex->Evaluate(data.test, 64);
      ASSERT_TRUE(eval.ok()) << eval.status().message();
      if (i == 3) accuracies.push_back(static_cast<double>(eval->correct));
    }
  }
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(accuracies[0], accuracies[1]);
  EXPECT_GT(losses[0][0], 0.0);
}

TEST(Executor, SnapshotAndRestoreContinueBitForBit) {
  const JobSpec job = SmallJob(Reduction::kExact, "adamw");
  auto data = LoadJobDataset(job).value();
  auto dev = CreateCpuDevice(1);
  auto comm = CreateLocalCommunicator();
  const std::vector<int> all = {0, 1, 2, 3, 4, 5};
  auto a = Executor::Create(job, *dev, data.train).value();
  ASSERT_TRUE(a->InitializeFresh().ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(a->Step(*comm, all).ok());
  const TrainingState mid = a->Snapshot();
  EXPECT_EQ(mid.step, 5);
  EXPECT_EQ(mid.optimizer_slots.size(), 2u);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a->Step(*comm, all).ok());

  auto b = Executor::Create(job, *dev, data.train).value();
  auto decoded = DeserializeState(SerializeState(mid), "test");
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  ASSERT_TRUE(b->Restore(*decoded).ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(b->Step(*comm, all).ok());
  EXPECT_EQ(b->WeightsSha256(), a->WeightsSha256());
  EXPECT_EQ(b->Snapshot(), a->Snapshot());
}

TEST(Executor, RestoreRejectsAnotherJobsState) {
  JobSpec job = SmallJob();
  auto data = LoadJobDataset(job).value();
  auto dev = CreateCpuDevice(1);
  auto a = Executor::Create(job, *dev, data.train).value();
  ASSERT_TRUE(a->InitializeFresh().ok());
  TrainingState s = a->Snapshot();
  job.seed = 6;
  auto b = Executor::Create(job, *dev, data.train).value();
  Status st = b->Restore(s);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("different job"), std::string::npos);
}

TEST(Executor, TrainingLowersTheLoss) {
  JobSpec job = SmallJob();
  job.steps = 60;
  auto data = LoadJobDataset(job).value();
  auto dev = CreateCpuDevice(1);
  auto comm = CreateLocalCommunicator();
  auto ex = Executor::Create(job, *dev, data.train).value();
  ASSERT_TRUE(ex->InitializeFresh().ok());
  auto before = ex->Evaluate(data.test).value();
  const std::vector<int> all = {0, 1, 2, 3, 4, 5};
  while (ex->step() < ex->total_steps()) ASSERT_TRUE(ex->Step(*comm, all).ok());
  auto after = ex->Evaluate(data.test).value();
  EXPECT_LT(after.loss_sum, 0.5 * before.loss_sum);
  EXPECT_GT(after.correct, before.correct);
}

TEST(Executor, DivergenceIsANumericalErrorNamingTheStep) {
  JobSpec job = SmallJob();
  job.optimizer.learning_rate = 1e30;
  job.optimizer.momentum = 0.0;
  auto data = LoadJobDataset(job).value();
  auto dev = CreateCpuDevice(1);
  auto comm = CreateLocalCommunicator();
  auto ex = Executor::Create(job, *dev, data.train).value();
  ASSERT_TRUE(ex->InitializeFresh().ok());
  const std::vector<int> all = {0, 1, 2, 3, 4, 5};
  Status failure;
  for (int i = 0; i < 10 && failure.ok(); ++i) failure = ex->Step(*comm, all).status();
  EXPECT_EQ(failure.code(), StatusCode::kNumerical);
  EXPECT_NE(failure.message().find("step "), std::string::npos);
  EXPECT_NE(failure.message().find("learning rate"), std::string::npos);
}

TEST(Executor, OutOfRangeVirtualNodeIsRejected) {
  JobSpec job = SmallJob();
  auto data = LoadJobDataset(job).value();
  auto dev = CreateCpuDevice(1);
  auto comm = CreateLocalCommunicator();
  auto ex = Executor::Create(job, *dev, data.train).value();
  ASSERT_TRUE(ex->InitializeFresh().ok());
  const std::vector<int> bad = {0, 6};
  EXPECT_EQ(ex->Step(*comm, bad).status().code(), StatusCode::kInvalidArgument);
  // More nodes than the job has (a node twice) would overrun the per-node statistics.
  std::vector<int> too_many(static_cast<size_t>(job.virtual_nodes) + 1, 0);
  const auto r = ex->Step(*comm, too_many);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("more than the job's"), std::string::npos)
      << r.status().message();
  EXPECT_EQ(ex->step(), 0);
}

}  // namespace
}  // namespace vf
