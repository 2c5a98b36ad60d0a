// The staged communicator over real Gloo ranks (threads of this process) on the CPU device:
// every collective gives what Gloo gives on host memory, bit for bit. On a GPU the same class
// joins workers that share one (runtime/executor_cuda_test.cc).
#include "runtime/comm/staged/communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/store.h"

namespace vf {
namespace {

// Runs fn(rank) on one thread per rank and waits for all of them.
template <typename Fn>
void RunRanks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) threads.emplace_back([&fn, rank] { fn(rank); });
  for (std::thread& t : threads) t.join();
}

TEST(StagedCommunicator, CollectivesGiveWhatTheHostBackendGives) {
  constexpr int kRanks = 3;
  MemoryStore store;
  std::vector<std::vector<float>> sums(kRanks);
  std::vector<std::vector<int64_t>> shards(kRanks);
  std::vector<std::vector<int64_t>> gathered(kRanks), broadcast(kRanks);
  std::vector<std::string> names(kRanks);
  RunRanks(kRanks, [&](int rank) {
    auto device = CreateCpuDevice(1);
    CommOptions options;
    auto gloo = CreateGlooCommunicator(store, rank, kRanks, options);
    ASSERT_TRUE(gloo.ok()) << gloo.status().ToString();
    StagedCommunicator comm(*device, std::move(*gloo));
    names[rank] = comm.backend();
    EXPECT_EQ(comm.rank(), rank);
    EXPECT_EQ(comm.size(), kRanks);
    // Float sums: 0.1 * (rank + 1) per element, summed over ranks as Gloo sums them.
    auto f = DeviceBuffer<float>::Create(*device, 5);
    ASSERT_TRUE(f.ok());
    for (size_t i = 0; i < 5; ++i) f->data()[i] = 0.1f * static_cast<float>(rank + 1) + i;
    ASSERT_TRUE(comm.AllReduce(f->data(), 5, ReduceOp::kSum).ok());
    sums[rank].assign(f->data(), f->data() + 5);
    // Reduce-scatter of int64 in shards of 2, then an all-gather of the shards.
    auto a = DeviceBuffer<int64_t>::Create(*device, 2 * kRanks);
    ASSERT_TRUE(a.ok());
    for (size_t i = 0; i < a->size(); ++i)
      a->data()[i] = (rank + 1) * 100 + static_cast<int64_t>(i);
    ASSERT_TRUE(comm.ReduceScatter(a->data(), 2, ReduceOp::kSum).ok());
    shards[rank].assign(a->data() + 2 * rank, a->data() + 2 * rank + 2);
    ASSERT_TRUE(comm.AllGather(a->data(), 2 * sizeof(int64_t)).ok());
    gathered[rank].assign(a->data(), a->data() + a->size());
    auto b = DeviceBuffer<int64_t>::Create(*device, 3);
    ASSERT_TRUE(b.ok());
    for (size_t i = 0; i < 3; ++i) b->data()[i] = rank == 1 ? 7 + static_cast<int64_t>(i) : -1;
    ASSERT_TRUE(comm.Broadcast(b->data(), 3 * sizeof(int64_t), 1).ok());
    broadcast[rank].assign(b->data(), b->data() + 3);
    int64_t most = rank;
    ASSERT_TRUE(comm.AllReduce(&most, 1, ReduceOp::kMax).ok());
    EXPECT_EQ(most, kRanks - 1);
    EXPECT_TRUE(comm.Barrier().ok());
  });
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < 5; ++i) {
      const float expected = ((0.1f + i) + (0.2f + i)) + (0.3f + i);
      EXPECT_EQ(sums[r][i], sums[0][i]);
      EXPECT_NEAR(sums[r][i], expected, 1e-5);
    }
    // Element i summed over ranks: 100 + 200 + 300 + 3i.
    EXPECT_EQ(shards[r], (std::vector<int64_t>{600 + 3 * 2 * r, 600 + 3 * (2 * r + 1)}));
    EXPECT_EQ(gathered[r], (std::vector<int64_t>{600, 603, 606, 609, 612, 615}));
    EXPECT_EQ(broadcast[r], (std::vector<int64_t>{7, 8, 9}));
    EXPECT_NE(names[r].find("staged through cpu"), std::string::npos) << names[r];
  }
}

}  // namespace
}  // namespace vf
