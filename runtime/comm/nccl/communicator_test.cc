// Real NCCL. The rendezvous and argument cases run anywhere; the collectives need a GPU and skip,
// saying why, without one. NCCL cannot put two ranks of one communicator on the same GPU, so
// the collectives run in a world of one, and two ranks show how NCCL's refusal is reported.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kUniqueIdKey[] = "nccl-unique-id";

CommOptions Options(milliseconds timeout = milliseconds(30000)) {
  CommOptions options;
  options.timeout = timeout;
  return options;
}

// True if this process can use CUDA device 0; otherwise `why` says what is missing.
bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(error);
    return false;
  }
  if (count == 0) {
    *why = "cudaGetDeviceCount found none";
    return false;
  }
  return true;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// `n` values of T in device memory of the current GPU.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    data_ = static_cast<T*>(p);
  }
  ~DeviceBuffer() { EXPECT_EQ(cudaFree(data_), cudaSuccess); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return data_; }

  void Upload(const std::vector<T>& values) {
    ASSERT_EQ(values.size(), n_);
    ASSERT_EQ(cudaMemcpy(data_, values.data(), n_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> values(n_);
    EXPECT_EQ(cudaMemcpy(values.data(), data_, n_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return values;
  }

 private:
  size_t n_;
  T* data_ = nullptr;
};

// Rank 0 of a world of one on device 0.
std::unique_ptr<Communicator> WorldOfOne(Store& store) {
  Result<std::unique_ptr<Communicator>> comm = CreateNcclCommunicator(store, 0, 1, Options(), 0);
  EXPECT_TRUE(comm.ok()) << comm.status().ToString();
  if (!comm.ok()) return nullptr;
  return std::move(comm).value();
}

// --- Cases that run with or without a GPU. ---

TEST(NcclCommunicator, RankWhosePeersNeverPublishTimesOut) {
  MemoryStore store;
  const Clock::time_point start = Clock::now();
  auto comm = CreateNcclCommunicator(store, 1, 2, Options(milliseconds(200)));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("timed out after 200"), std::string::npos)
      << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("rank 1 of 2"), std::string::npos)
      << comm.status().ToString();
  EXPECT_LT(SecondsSince(start), 5.0);
}

TEST(NcclCommunicator, RejectsInvalidArguments) {
  MemoryStore store;
  struct Case {
    int rank;
    int size;
    milliseconds timeout;
    int device;
  };
  const std::vector<Case> cases = {
      {0, 0, milliseconds(100), 0},  {-1, 2, milliseconds(100), 0}, {2, 2, milliseconds(100), 0},
      {0, -3, milliseconds(100), 0}, {1, 2, milliseconds(0), 0},    {1, 2, milliseconds(100), -1},
  };
  for (const Case& c : cases) {
    auto comm = CreateNcclCommunicator(store, c.rank, c.size, Options(c.timeout), c.device);
    ASSERT_FALSE(comm.ok()) << "rank " << c.rank << " size " << c.size;
    EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument)
        << "rank " << c.rank << " size " << c.size << ": " << comm.status().ToString();
  }
  // Nothing was published or waited for.
  EXPECT_FALSE(store.Get(kUniqueIdKey, milliseconds(0)).ok());
}

TEST(NcclCommunicator, RejectsAUniqueIdOfTheWrongLength) {
  MemoryStore store;
  ASSERT_TRUE(store.Set(kUniqueIdKey, "short").ok());
  auto comm = CreateNcclCommunicator(store, 1, 2, Options(milliseconds(200)));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDataLoss) << comm.status().ToString();
}

TEST(NcclCommunicator, WithoutAGpuRankZeroSaysSoAndPublishesNothing) {
  std::string why;
  if (HaveGpu(&why)) GTEST_SKIP() << "this machine has a CUDA device";
  MemoryStore store;
  auto comm = CreateNcclCommunicator(store, 0, 1, Options(milliseconds(200)));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kFailedPrecondition) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("no CUDA device"), std::string::npos)
      << comm.status().ToString();
  EXPECT_FALSE(store.Get(kUniqueIdKey, milliseconds(0)).ok());
}

TEST(NcclCommunicator, WithoutAGpuOtherRanksSaySoAfterTheRendezvous) {
  std::string why;
  if (HaveGpu(&why)) GTEST_SKIP() << "this machine has a CUDA device";
  MemoryStore store;
  ASSERT_TRUE(store.Set(kUniqueIdKey, std::string(sizeof(ncclUniqueId), '\0')).ok());
  auto comm = CreateNcclCommunicator(store, 1, 2, Options(milliseconds(200)));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kFailedPrecondition) << comm.status().ToString();
  EXPECT_NE(comm.status().message().find("no CUDA device"), std::string::npos)
      << comm.status().ToString();
}

// --- Cases that need a GPU. ---

TEST(NcclCommunicator, WorldOfOneDescribesItself) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::unique_ptr<Communicator> comm = WorldOfOne(store);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), "nccl");
}

// Two ranks on the one GPU (as `vf run`'s workers sharing it would be): NCCL refuses the
// communicator on both, and says so as kInvalidArgument, which no new plan would change, naming
// the cause and the fix; never a hang, and never kUnavailable, on which the workers would be
// planned into the same refusal again. Each rank names the rank it shares the GPU with.
TEST(NcclCommunicator, TwoRanksOnOneGpuAreRefusedForGoodSayingWhy) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::vector<Status> refused(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      auto comm = CreateNcclCommunicator(store, rank, 2, Options(milliseconds(20000)), 0);
      refused[static_cast<size_t>(rank)] =
          comm.ok() ? Internal("NCCL built the communicator") : comm.status();
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    const Status& s = refused[static_cast<size_t>(rank)];
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << "rank " << rank << ": " << s.ToString();
    EXPECT_NE(s.message().find("NCCL refused the communicator"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("one rank per GPU"), std::string::npos) << s.ToString();
    // Found by the ranks themselves, not read from NCCL's last-error text (which, with both
    // ranks in one process, the other rank's later warning may have replaced).
    const std::string other = "with rank " + std::to_string(1 - rank) + ":";
    EXPECT_NE(s.message().find(other), std::string::npos) << s.ToString();
  }
}

TEST(NcclCommunicator, AllReduceInt64) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::unique_ptr<Communicator> comm = WorldOfOne(store);
  ASSERT_NE(comm, nullptr);
  const std::vector<int64_t> values = {1, -2, int64_t{1} << 40, 0, 7};
  DeviceBuffer<int64_t> buffer(values.size());
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    buffer.Upload(values);
    ASSERT_TRUE(comm->AllReduce(buffer.data(), values.size(), op).ok());
    EXPECT_EQ(buffer.Download(), values);  // A world of one reduces to its own values.
  }
}

TEST(NcclCommunicator, AllReduceFloat) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::unique_ptr<Communicator> comm = WorldOfOne(store);
  ASSERT_NE(comm, nullptr);
  std::vector<float> values(1000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.25f * static_cast<float>(i) - 100.0f;
  DeviceBuffer<float> buffer(values.size());
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    buffer.Upload(values);
    ASSERT_TRUE(comm->AllReduce(buffer.data(), values.size(), op).ok());
    EXPECT_EQ(buffer.Download(), values);
  }
}

TEST(NcclCommunicator, ReduceScatterAndAllGatherInAWorldOfOne) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::unique_ptr<Communicator> comm = WorldOfOne(store);
  ASSERT_NE(comm, nullptr);
  const std::vector<int64_t> values = {3, -9, int64_t{1} << 50, 0};
  DeviceBuffer<int64_t> buffer(values.size());
  buffer.Upload(values);
  ASSERT_TRUE(comm->ReduceScatter(buffer.data(), values.size(), ReduceOp::kSum).ok());
  EXPECT_EQ(buffer.Download(), values);
  ASSERT_TRUE(comm->AllGather(buffer.data(), values.size() * sizeof(int64_t)).ok());
  EXPECT_EQ(buffer.Download(), values);
}

TEST(NcclCommunicator, ZeroCountIsANoOp) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::unique_ptr<Communicator> comm = WorldOfOne(store);
  ASSERT_NE(comm, nullptr);
  EXPECT_TRUE(comm->AllReduce(static_cast<float*>(nullptr), 0, ReduceOp::kSum).ok());
  EXPECT_TRUE(comm->Broadcast(nullptr, 0, 0).ok());
}

TEST(NcclCommunicator, BroadcastFromRootZero) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::unique_ptr<Communicator> comm = WorldOfOne(store);
  ASSERT_NE(comm, nullptr);
  std::vector<uint8_t> bytes(333);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  DeviceBuffer<uint8_t> buffer(bytes.size());
  buffer.Upload(bytes);
  ASSERT_TRUE(comm->Broadcast(buffer.data(), bytes.size(), 0).ok());
  EXPECT_EQ(buffer.Download(), bytes);
}

TEST(NcclCommunicator, Barrier) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::unique_ptr<Communicator> comm = WorldOfOne(store);
  ASSERT_NE(comm, nullptr);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(comm->Barrier().ok());
}

TEST(NcclCommunicator, BadArgumentsLeaveTheCommunicatorUsable) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::unique_ptr<Communicator> comm = WorldOfOne(store);
  ASSERT_NE(comm, nullptr);
  DeviceBuffer<int64_t> buffer(4);
  for (int root : {-1, 1, 5}) {
    const Status status = comm->Broadcast(buffer.data(), 4 * sizeof(int64_t), root);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  }
  Status status = comm->AllReduce(static_cast<int64_t*>(nullptr), 4, ReduceOp::kSum);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  status = comm->AllReduce(buffer.data(), 4, static_cast<ReduceOp>(42));
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();

  buffer.Upload({3, 1, 4, 1});
  ASSERT_TRUE(comm->AllReduce(buffer.data(), 4, ReduceOp::kMax).ok());
  EXPECT_EQ(buffer.Download(), (std::vector<int64_t>{3, 1, 4, 1}));
  EXPECT_TRUE(comm->Barrier().ok());
}

TEST(NcclCommunicator, HostBuffersAreStagedThroughTheDevice) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  MemoryStore store;
  std::unique_ptr<Communicator> comm = WorldOfOne(store);
  ASSERT_NE(comm, nullptr);
  std::vector<int64_t> header = {5, -2, 9};
  ASSERT_TRUE(comm->AllReduce(header.data(), header.size(), ReduceOp::kMax).ok());
  EXPECT_EQ(header, (std::vector<int64_t>{5, -2, 9}));
  std::vector<float> values(1000, 0.5f);
  ASSERT_TRUE(comm->AllReduce(values.data(), values.size(), ReduceOp::kSum).ok());
  EXPECT_EQ(values, std::vector<float>(1000, 0.5f));
  std::string meta = "metadata";
  ASSERT_TRUE(comm->Broadcast(meta.data(), meta.size(), 0).ok());
  EXPECT_EQ(meta, "metadata");
}

TEST(NcclCommunicator, CreatingAndDestroyingManyDoesNotLeak) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  constexpr int kCommunicators = 100;
  constexpr size_t kSlack = size_t{64} << 20;
  size_t free_after_first = 0;
  for (int i = 0; i < kCommunicators; ++i) {
    MemoryStore store;
    {
      std::unique_ptr<Communicator> comm = WorldOfOne(store);
      ASSERT_NE(comm, nullptr) << "communicator " << i;
      ASSERT_TRUE(comm->Barrier().ok()) << "communicator " << i;
    }
    if (i == 0) {
      size_t total = 0;
      ASSERT_EQ(cudaMemGetInfo(&free_after_first, &total), cudaSuccess);
    }
  }
  size_t free_after_all = 0;
  size_t total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_after_all, &total), cudaSuccess);
  EXPECT_GE(free_after_all + kSlack, free_after_first)
      << "free GPU memory went from " << free_after_first << " to " << free_after_all
      << " bytes over " << kCommunicators << " communicators";
}

}  // namespace
}  // namespace vf
