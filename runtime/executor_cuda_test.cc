// The executor on a GPU: exact mode gives the same weights for any order in which one device
// runs its virtual nodes, and fast mode on the GPU follows the CPU to a stated tolerance. Skips,
// saying why, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <thread>

#include "runtime/comm/communicator.h"
#include "runtime/comm/staged/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/device.h"
#include "runtime/executor.h"

namespace vf {
namespace {

JobSpec Job(Reduction mode) {
  JobSpec j;
  j.name = "gpu";
  j.virtual_nodes = 8;
  j.global_batch_size = 256;
  j.replicas_min = 1;
  j.replicas_max = 8;
  j.model.hidden_sizes = {512, 256};
  j.dataset.name = "synthetic";
  j.dataset.train_samples = 4096;
  j.dataset.test_samples = 256;
  j.optimizer.name = "sgd";
  j.optimizer.learning_rate = 0.05;
  j.optimizer.momentum = 0.9;
  j.steps = 30;
  j.reduction = mode;
  j.seed = 11;
  return j;
}

// Trains `job` on `device` with all virtual nodes on one rank, run in `order`.
TrainingState Train(const JobSpec& job, Device& device, const std::vector<int>& order) {
  auto data = LoadJobDataset(job);
  EXPECT_TRUE(data.ok()) << data.status().ToString();
  auto ex = Executor::Create(job, device, data->train);
  EXPECT_TRUE(ex.ok()) << ex.status().ToString();
  EXPECT_TRUE((*ex)->InitializeFresh().ok());
  auto comm = CreateLocalCommunicator();
  while ((*ex)->step() < (*ex)->total_steps()) {
    auto s = (*ex)->Step(*comm, order);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) break;
  }
  return (*ex)->Snapshot();
}

// Trains `job` on `ranks` workers sharing GPU 0: threads, each with a CUDA device object of its
// own (its own stream and cuBLAS handle), joined by Gloo through host copies (NCCL refuses two
// ranks on one GPU), rank r running the virtual nodes v with v % ranks == r. Returns each
// rank's final state.
std::vector<TrainingState> TrainOnRanks(const JobSpec& job, int ranks) {
  MemoryStore store;
  std::vector<TrainingState> states(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      auto gpu = CreateCudaDevice(0);
      ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
      auto gloo = CreateGlooCommunicator(store, rank, ranks, CommOptions{});
      ASSERT_TRUE(gloo.ok()) << gloo.status().ToString();
      StagedCommunicator comm(**gpu, std::move(*gloo));
      auto data = LoadJobDataset(job);
      ASSERT_TRUE(data.ok()) << data.status().ToString();
      auto ex = Executor::Create(job, **gpu, data->train);
      ASSERT_TRUE(ex.ok()) << ex.status().ToString();
      ASSERT_TRUE((*ex)->InitializeFresh().ok());
      std::vector<int> mine;
      for (int v = rank; v < job.virtual_nodes; v += ranks) mine.push_back(v);
      while ((*ex)->step() < (*ex)->total_steps()) {
        auto s = (*ex)->Step(comm, mine);
        ASSERT_TRUE(s.ok()) << "rank " << rank << ": " << s.status().ToString();
      }
      states[static_cast<size_t>(rank)] = (*ex)->Snapshot();
    });
  }
  for (auto& t : threads) t.join();
  return states;
}

class CudaExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    auto gpu = CreateCudaDevice(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    gpu_ = std::move(*gpu);
  }
  std::unique_ptr<Device> gpu_;
};

TEST_F(CudaExecutorTest, ExactModeWeightsDoNotDependOnTheVirtualNodeOrder) {
  const JobSpec job = Job(Reduction::kExact);
  const TrainingState forward = Train(job, *gpu_, {0, 1, 2, 3, 4, 5, 6, 7});
  const TrainingState backward = Train(job, *gpu_, {7, 6, 5, 4, 3, 2, 1, 0});
  const TrainingState shuffled = Train(job, *gpu_, {5, 2, 7, 0, 3, 6, 1, 4});
  EXPECT_EQ(forward.step, 30);
  EXPECT_TRUE(forward.parameters == backward.parameters);
  EXPECT_TRUE(forward.parameters == shuffled.parameters);
  EXPECT_TRUE(forward.optimizer_slots == shuffled.optimizer_slots);
}

TEST_F(CudaExecutorTest, DeviceTuningNeverChangesTheWeights) {
  // CUDA graphs, the fused fold, pinned staging and lanes change how the work is issued: every
  // combination trains to the same bits, in both reduction modes. With graphs, the first node
  // runs unrecorded, the second is captured and every later one replays the recording.
  for (Reduction mode : {Reduction::kExact, Reduction::kFast}) {
    const JobSpec job = Job(mode);
    const std::vector<int> order = {0, 1, 2, 3, 4, 5, 6, 7};
    gpu_->Tune(DeviceTuning{});
    const TrainingState all_on = Train(job, *gpu_, order);  // the defaults
    DeviceTuning no_graphs;
    no_graphs.record_nodes = false;
    gpu_->Tune(no_graphs);
    const TrainingState without_graphs = Train(job, *gpu_, order);
    gpu_->Tune(DeviceTuning{true, true, false});
    const TrainingState unpinned = Train(job, *gpu_, order);
    gpu_->Tune(DeviceTuning{false, false, false});
    const TrainingState all_off = Train(job, *gpu_, order);
    // Lanes: one (every node in turn), three (unevenly: 3, 3 and 2 nodes), four without graphs.
    DeviceTuning lanes;
    lanes.lanes = 1;
    gpu_->Tune(lanes);
    const TrainingState one_lane = Train(job, *gpu_, order);
    lanes.lanes = 3;
    gpu_->Tune(lanes);
    const TrainingState three_lanes = Train(job, *gpu_, order);
    lanes.lanes = 4;
    lanes.record_nodes = false;
    gpu_->Tune(lanes);
    const TrainingState lanes_without_graphs = Train(job, *gpu_, order);
    gpu_->Tune(DeviceTuning{});
    EXPECT_TRUE(all_on.parameters == one_lane.parameters) << ReductionName(mode);
    EXPECT_TRUE(all_on.parameters == three_lanes.parameters) << ReductionName(mode);
    EXPECT_TRUE(all_on.parameters == lanes_without_graphs.parameters) << ReductionName(mode);
    EXPECT_EQ(all_on.step, 30);
    EXPECT_TRUE(all_on.parameters == without_graphs.parameters) << ReductionName(mode);
    EXPECT_TRUE(all_on.parameters == unpinned.parameters) << ReductionName(mode);
    EXPECT_TRUE(all_on.parameters == all_off.parameters) << ReductionName(mode);
    EXPECT_TRUE(all_on.optimizer_slots == all_off.optimizer_slots) << ReductionName(mode);
    EXPECT_EQ(all_on.reducer_exponents, all_off.reducer_exponents);
  }
}

TEST_F(CudaExecutorTest, RecordedNodesFollowAChangingMapping) {
  // One recording serves every node; a worker whose share and order change from step to step
  // (as at a resize) still trains to the weights of a static run.
  const JobSpec job = Job(Reduction::kExact);
  const TrainingState static_run = Train(job, *gpu_, {0, 1, 2, 3, 4, 5, 6, 7});
  auto data = LoadJobDataset(job);
  ASSERT_TRUE(data.ok());
  auto ex = Executor::Create(job, *gpu_, data->train);
  ASSERT_TRUE(ex.ok());
  ASSERT_TRUE((*ex)->InitializeFresh().ok());
  auto comm = CreateLocalCommunicator();
  const std::vector<std::vector<int>> orders = {
      {0, 1, 2, 3, 4, 5, 6, 7}, {7, 6, 5, 4, 3, 2, 1, 0}, {3, 1, 4, 0, 5, 2, 7, 6}};
  while ((*ex)->step() < (*ex)->total_steps()) {
    const auto& order = orders[static_cast<size_t>((*ex)->step() / 4) % orders.size()];
    auto s = (*ex)->Step(*comm, order);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
  }
  EXPECT_TRUE((*ex)->Snapshot().parameters == static_run.parameters);
}

TEST_F(CudaExecutorTest, ExactModeWeightsAreTheSameOnOneTwoAndThreeWorkersSharingTheGpu) {
  const JobSpec job = Job(Reduction::kExact);
  const TrainingState alone = Train(job, *gpu_, {0, 1, 2, 3, 4, 5, 6, 7});
  for (int ranks : {2, 3}) {
    const std::vector<TrainingState> states = TrainOnRanks(job, ranks);
    for (const TrainingState& s : states) {
      EXPECT_EQ(s.step, 30) << ranks << " workers";
      EXPECT_TRUE(s.parameters == alone.parameters) << ranks << " workers";
      EXPECT_TRUE(s.optimizer_slots == alone.optimizer_slots) << ranks << " workers";
    }
  }
}

TEST_F(CudaExecutorTest, StagedCollectivesTakeHostBuffersAsTheyAre) {
  // The agent passes host buffers too (the step's header, a state transfer's metadata), as it
  // may to NCCL: those go to Gloo as they are, device buffers through host copies.
  MemoryStore store;
  std::vector<std::vector<int64_t>> host_sums(2), device_sums(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      auto gpu = CreateCudaDevice(0);
      ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
      auto gloo = CreateGlooCommunicator(store, rank, 2, CommOptions{});
      ASSERT_TRUE(gloo.ok()) << gloo.status().ToString();
      StagedCommunicator comm(**gpu, std::move(*gloo));
      std::vector<int64_t> host = {rank + 1, int64_t{10} * (rank + 1), -rank};
      ASSERT_TRUE(comm.AllReduce(host.data(), host.size(), ReduceOp::kSum).ok());
      host_sums[static_cast<size_t>(rank)] = host;
      auto dev = DeviceBuffer<int64_t>::Create(**gpu, 3);
      ASSERT_TRUE(dev.ok());
      (*gpu)->CopyFromHost(dev->data(), host.data(), 3 * sizeof(int64_t));
      ASSERT_TRUE(comm.AllReduce(dev->data(), 3, ReduceOp::kMax).ok());
      std::vector<int64_t> back(3);
      (*gpu)->CopyToHost(back.data(), dev->data(), 3 * sizeof(int64_t));
      device_sums[static_cast<size_t>(rank)] = back;
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(host_sums[static_cast<size_t>(rank)], (std::vector<int64_t>{3, 30, -1}));
    EXPECT_EQ(device_sums[static_cast<size_t>(rank)], (std::vector<int64_t>{3, 30, -1}));
  }
}

TEST_F(CudaExecutorTest, FastModeOnTheGpuFollowsTheCpu) {
  // The matrix products sum in different orders on the two devices, so the weights drift
  // apart by rounding; after 30 steps every parameter is within 1e-4 of the CPU's (measured
  // drift is far below; the bound is what the documentation states).
  const JobSpec job = Job(Reduction::kFast);
  auto cpu = CreateCpuDevice(1);
  std::vector<int> order = {0, 1, 2, 3, 4, 5, 6, 7};
  const TrainingState on_cpu = Train(job, *cpu, order);
  const TrainingState on_gpu = Train(job, *gpu_, order);
  ASSERT_EQ(on_cpu.parameters.size(), on_gpu.parameters.size());
  double worst = 0.0;
  for (size_t i = 0; i < on_cpu.parameters.size(); ++i) {
    worst = std::max(worst,
                     static_cast<double>(std::fabs(on_cpu.parameters[i] - on_gpu.parameters[i])));
  }
  EXPECT_LT(worst, 1e-4) << "largest difference " << worst;
  EXPECT_EQ(gpu_->kind(), DeviceKind::kCuda);
}

}  // namespace
}  // namespace vf
