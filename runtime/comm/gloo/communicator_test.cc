// Real Gloo over TCP loopback; each rank is a thread of this process and the ranks meet through a
// shared MemoryStore or FileStore, as separate processes would through the coordinator.
#include "runtime/comm/gloo/communicator.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <latch>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Comms = std::vector<std::unique_ptr<Communicator>>;

CommOptions Options(milliseconds timeout = milliseconds(30000)) {
  CommOptions options;
  options.hostname = "127.0.0.1";
  options.timeout = timeout;
  return options;
}

// Runs fn(rank) on one thread per rank and waits for all of them.
template <typename Fn>
void RunRanks(int size, Fn fn) {
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int rank = 0; rank < size; ++rank) threads.emplace_back([&fn, rank] { fn(rank); });
  for (std::thread& t : threads) t.join();
}

// Connects `size` ranks through `store`; a rank that fails to connect leaves a null entry.
Comms ConnectAll(Store& store, int size, const CommOptions& options = Options()) {
  Comms comms(size);
  RunRanks(size, [&](int rank) {
    Result<std::unique_ptr<Communicator>> comm = CreateGlooCommunicator(store, rank, size, options);
    ASSERT_TRUE(comm.ok()) << "rank " << rank << ": " << comm.status().ToString();
    comms[rank] = std::move(comm).value();
  });
  return comms;
}

bool AllConnected(const Comms& comms) {
  for (const auto& comm : comms) {
    if (comm == nullptr) return false;
  }
  return true;
}

// Names parameterized tests after the world size (gtest's own lambda parameter is called
// `info`, so a lambda here would shadow it).
std::string SizeName(const testing::TestParamInfo<int>& param) {
  return "Size" + std::to_string(param.param);
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = testing::TempDir() + "vf_gloo_test_XXXXXX";
    EXPECT_NE(mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern;
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------------------
// Collectives, for every world size from 1 to 4.

class GlooWorldTest : public testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    comms_ = ConnectAll(store_, size());
    ASSERT_TRUE(AllConnected(comms_));
  }
  int size() const { return GetParam(); }

  MemoryStore store_;
  Comms comms_;
};

TEST_P(GlooWorldTest, ReportsRankSizeAndBackend) {
  for (int rank = 0; rank < size(); ++rank) {
    EXPECT_EQ(comms_[rank]->rank(), rank);
    EXPECT_EQ(comms_[rank]->size(), size());
    EXPECT_EQ(comms_[rank]->backend(), "gloo");
  }
}

TEST_P(GlooWorldTest, AllReduceInt64SumAndMax) {
  const int n = size();
  RunRanks(n, [&](int rank) {
    // Values past 2^32 and negative ones, so a 32-bit or unsigned reduction would show.
    auto value = [](int r, int i) -> int64_t {
      return (int64_t{1} << 40) * (r + 1) - int64_t{7} * i * (r % 2 == 0 ? 1 : -1);
    };
    std::vector<int64_t> sum(5), max(5);
    for (int i = 0; i < 5; ++i) sum[i] = max[i] = value(rank, i);
    Status s = comms_[rank]->AllReduce(sum.data(), sum.size(), ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = comms_[rank]->AllReduce(max.data(), max.size(), ReduceOp::kMax);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int i = 0; i < 5; ++i) {
      int64_t want_sum = 0;
      int64_t want_max = value(0, i);
      for (int r = 0; r < n; ++r) {
        want_sum += value(r, i);
        want_max = std::max(want_max, value(r, i));
      }
      EXPECT_EQ(sum[i], want_sum) << "rank " << rank << " element " << i;
      EXPECT_EQ(max[i], want_max) << "rank " << rank << " element " << i;
    }
  });
}

TEST_P(GlooWorldTest, AllReduceFloatSumAndMax) {
  const int n = size();
  RunRanks(n, [&](int rank) {
    // Quarters are exact in float, so the sum is exact whatever the reduction order.
    auto value = [](int r, int i) { return 0.25f * static_cast<float>(i) - static_cast<float>(r); };
    std::vector<float> sum(7), max(7);
    for (int i = 0; i < 7; ++i) sum[i] = max[i] = value(rank, i);
    // The largest value sits on the last rank for one element, so MAX cannot just keep rank 0's.
    max[3] = rank == n - 1 ? 100.0f : max[3];
    Status s = comms_[rank]->AllReduce(sum.data(), sum.size(), ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.ToString();
    s = comms_[rank]->AllReduce(max.data(), max.size(), ReduceOp::kMax);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (int i = 0; i < 7; ++i) {
      float want_sum = 0;
      for (int r = 0; r < n; ++r) want_sum += value(r, i);
      EXPECT_EQ(sum[i], want_sum) << "rank " << rank << " element " << i;
      EXPECT_EQ(max[i], i == 3 ? 100.0f : value(0, i)) << "rank " << rank << " element " << i;
    }
  });
}

TEST_P(GlooWorldTest, AllReduceOfNothingSucceeds) {
  RunRanks(size(), [&](int rank) {
    EXPECT_TRUE(comms_[rank]->AllReduce(static_cast<float*>(nullptr), 0, ReduceOp::kSum).ok());
    EXPECT_TRUE(comms_[rank]->AllReduce(static_cast<int64_t*>(nullptr), 0, ReduceOp::kMax).ok());
    // And the communicator still works afterwards.
    int64_t one = 1;
    Status s = comms_[rank]->AllReduce(&one, 1, ReduceOp::kSum);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(one, size());
  });
}

TEST_P(GlooWorldTest, BroadcastFromLastRankReachesEveryRank) {
  const int root = size() - 1;
  RunRanks(size(), [&](int rank) {
    std::vector<uint8_t> data(1001, 0);  // Odd size: nothing assumes whole elements.
    if (rank == root) {
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
    }
    Status s = comms_[rank]->Broadcast(data.data(), data.size(), root);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < data.size(); ++i) {
      ASSERT_EQ(data[i], static_cast<uint8_t>(i * 7 + 3)) << "rank " << rank << " byte " << i;
    }
  });
}

TEST_P(GlooWorldTest, BarrierHoldsEveryRankUntilAllArrive) {
  std::atomic<int> arrived{0};
  RunRanks(size(), [&](int rank) {
    std::this_thread::sleep_for(milliseconds(40 * rank));  // Arrive one after another.
    ++arrived;
    Status s = comms_[rank]->Barrier();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(arrived.load(), size()) << "rank " << rank << " left the barrier early";
  });
}

TEST_P(GlooWorldTest, LargeFloatAllReduce) {
  constexpr size_t kCount = size_t{4} << 20;
  const int n = size();
  RunRanks(n, [&](int rank) {
    std::vector<float> data(kCount);
    for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<float>(rank + 1 + (i % 5));
    Status s = comms_[rank]->AllReduce(data.data(), data.size(), ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < kCount; ++i) {
      const int sum = n * (n + 1) / 2 + n * static_cast<int>(i % 5);  // n * (n + 1) is even
      const float want = static_cast<float>(sum);
      ASSERT_EQ(data[i], want) << "rank " << rank << " element " << i;
    }
  });
}

TEST_P(GlooWorldTest, ManyCollectivesInARowStayMatched) {
  RunRanks(size(), [&](int rank) {
    for (int step = 0; step < 20; ++step) {
      int64_t value = rank + step;
      Status s =
          comms_[rank]->AllReduce(&value, 1, step % 2 == 0 ? ReduceOp::kSum : ReduceOp::kMax);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const int64_t want =
          step % 2 == 0 ? size() * (size() - 1) / 2 + size() * step : size() - 1 + step;
      ASSERT_EQ(value, want) << "rank " << rank << " step " << step;
      uint8_t byte = rank == 0 ? static_cast<uint8_t>(step) : 0;
      s = comms_[rank]->Broadcast(&byte, 1, 0);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(byte, step);
    }
  });
}

TEST_P(GlooWorldTest, ReduceScatterLeavesEachRankItsShardOfTheSum) {
  const int n = size();
  for (size_t shard : {size_t{1}, size_t{7}, size_t{100003}}) {
    RunRanks(n, [&](int rank) {
      std::vector<int64_t> sum(shard * n);
      std::vector<int64_t> max(shard * n);
      for (size_t i = 0; i < sum.size(); ++i) {
        // Values near 2^60 with both signs, so a lost or doubled contribution shows.
        sum[i] =
            (int64_t{1} << 58) * (rank % 2 == 0 ? 1 : -1) + static_cast<int64_t>(i * 31) + rank;
        max[i] = static_cast<int64_t>((i + static_cast<size_t>(rank) * 5) % 11) - 5;
      }
      Status s = comms_[rank]->ReduceScatter(sum.data(), shard, ReduceOp::kSum);
      ASSERT_TRUE(s.ok()) << s.ToString();
      s = comms_[rank]->ReduceScatter(max.data(), shard, ReduceOp::kMax);
      ASSERT_TRUE(s.ok()) << s.ToString();
      const int odd = n / 2;  // ranks contributing -2^58
      for (size_t j = 0; j < shard; ++j) {
        const size_t i = static_cast<size_t>(rank) * shard + j;
        const int64_t want_sum =
            (int64_t{1} << 58) * (n - 2 * odd) + n * static_cast<int64_t>(i * 31) + n * (n - 1) / 2;
        ASSERT_EQ(sum[i], want_sum) << "rank " << rank << " element " << i << " shard " << shard;
        int64_t want_max = INT64_MIN;
        for (int r = 0; r < n; ++r) {
          want_max =
              std::max(want_max, static_cast<int64_t>((i + static_cast<size_t>(r) * 5) % 11) - 5);
        }
        ASSERT_EQ(max[i], want_max) << "rank " << rank << " element " << i;
      }
    });
  }
}

TEST_P(GlooWorldTest, AllGatherGivesEveryRankEveryShard) {
  const int n = size();
  for (size_t shard_bytes : {size_t{1}, size_t{13}, size_t{1} << 20}) {
    RunRanks(n, [&](int rank) {
      std::vector<uint8_t> data(shard_bytes * n, 0xee);
      for (size_t j = 0; j < shard_bytes; ++j) {
        data[static_cast<size_t>(rank) * shard_bytes + j] =
            static_cast<uint8_t>(static_cast<size_t>(rank) * 37 + j);
      }
      Status s = comms_[rank]->AllGather(data.data(), shard_bytes);
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int r = 0; r < n; ++r) {
        for (size_t j = 0; j < shard_bytes; ++j) {
          ASSERT_EQ(data[static_cast<size_t>(r) * shard_bytes + j],
                    static_cast<uint8_t>(static_cast<size_t>(r) * 37 + j))
              << "rank " << rank << " shard " << r << " byte " << j;
        }
      }
    });
  }
}

TEST_P(GlooWorldTest, ReduceScatterThenAllGatherIsAnAllReduce) {
  // The exact reducer's pattern: sum int64 shards, convert each rank's shard, gather the
  // results; interleaved with ordinary collectives so tags stay matched.
  const int n = size();
  constexpr size_t kShard = 4099;
  RunRanks(n, [&](int rank) {
    for (int round = 0; round < 3; ++round) {
      std::vector<int64_t> acc(kShard * n);
      for (size_t i = 0; i < acc.size(); ++i) acc[i] = static_cast<int64_t>(i) * (rank + round);
      Status s = comms_[rank]->ReduceScatter(acc.data(), kShard, ReduceOp::kSum);
      ASSERT_TRUE(s.ok()) << s.ToString();
      std::vector<double> out(kShard * n, -1.0);
      for (size_t j = 0; j < kShard; ++j) {
        out[rank * kShard + j] = static_cast<double>(acc[rank * kShard + j]);
      }
      s = comms_[rank]->AllGather(out.data(), kShard * sizeof(double));
      ASSERT_TRUE(s.ok()) << s.ToString();
      const int64_t factor = n * (n - 1) / 2 + n * round;
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i], static_cast<double>(static_cast<int64_t>(i) * factor))
            << "rank " << rank << " element " << i << " round " << round;
      }
      int64_t one = 1;
      s = comms_[rank]->AllReduce(&one, 1, ReduceOp::kSum);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ASSERT_EQ(one, n);
    }
  });
}

TEST_P(GlooWorldTest, BroadcastRootOutsideTheWorldIsInvalidAndHarmless) {
  RunRanks(size(), [&](int rank) {
    uint8_t byte = 0;
    EXPECT_EQ(comms_[rank]->Broadcast(&byte, 1, size()).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(comms_[rank]->Broadcast(&byte, 1, -1).code(), StatusCode::kInvalidArgument);
    Status s = comms_[rank]->Barrier();
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooWorldTest, testing::Values(1, 2, 3, 4), SizeName);

// ---------------------------------------------------------------------------------------------
// Rendezvous.

TEST(GlooRendezvous, WorksThroughAFileStore) {
  TempDir dir;
  for (int size = 1; size <= 4; ++size) {
    FileStore files(dir.path());
    PrefixStore store("size" + std::to_string(size), files);
    Comms comms = ConnectAll(store, size);
    ASSERT_TRUE(AllConnected(comms)) << "size " << size;
    RunRanks(size, [&](int rank) {
      float value = static_cast<float>(rank);
      Status s = comms[rank]->AllReduce(&value, 1, ReduceOp::kMax);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(value, static_cast<float>(size - 1));
    });
  }
}

TEST(GlooRendezvous, MissingRankTimesOutInsteadOfHanging) {
  MemoryStore store;
  const auto timeout = milliseconds(500);
  std::vector<Status> results(2);
  const auto start = Clock::now();
  // A world of three where rank 2 never shows up.
  RunRanks(2, [&](int rank) {
    results[rank] = CreateGlooCommunicator(store, rank, 3, Options(timeout)).status();
  });
  const double elapsed = SecondsSince(start);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].code(), StatusCode::kDeadlineExceeded) << results[rank].ToString();
    EXPECT_NE(
        results[rank].message().find("gloo rendezvous (rank " + std::to_string(rank) + " of 3)"),
        std::string::npos)
        << results[rank].message();
    EXPECT_NE(results[rank].message().find("'2'"), std::string::npos) << results[rank].message();
  }
  EXPECT_GE(elapsed, 0.5);
  EXPECT_LT(elapsed, 5.0);
}

TEST(GlooRendezvous, EpochsOnOneStoreUseTheirOwnPrefixes) {
  MemoryStore shared;
  // Epoch 1: three members.
  PrefixStore epoch1("job/epoch1", shared);
  Comms first = ConnectAll(epoch1, 3);
  ASSERT_TRUE(AllConnected(first));
  RunRanks(3, [&](int rank) {
    int64_t value = 1;
    Status s = first[rank]->AllReduce(&value, 1, ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(value, 3);
  });
  first.clear();

  // Epoch 2: rank 2 has left; the old epoch's addresses are still in the store.
  PrefixStore epoch2("job/epoch2", shared);
  Comms second = ConnectAll(epoch2, 2);
  ASSERT_TRUE(AllConnected(second));
  RunRanks(2, [&](int rank) {
    int64_t value = 1;
    Status s = second[rank]->AllReduce(&value, 1, ReduceOp::kSum);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(value, 2);
  });
}

TEST(GlooRendezvous, InvalidArgumentsAreRejected) {
  MemoryStore store;
  auto code = [&](int rank, int size, const CommOptions& options) {
    return CreateGlooCommunicator(store, rank, size, options).status().code();
  };
  EXPECT_EQ(code(-1, 2, Options()), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(2, 2, Options()), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(0, 0, Options()), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(0, -3, Options()), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(0, 1, Options(milliseconds(0))), StatusCode::kInvalidArgument);
  CommOptions no_host = Options();
  no_host.hostname = "";
  EXPECT_EQ(code(0, 1, no_host), StatusCode::kInvalidArgument);
  CommOptions nice = Options();
  nice.event_thread_nice = 20;
  EXPECT_EQ(code(0, 1, nice), StatusCode::kInvalidArgument);
  nice.event_thread_nice = -1;
  EXPECT_EQ(code(0, 1, nice), StatusCode::kInvalidArgument);
}

// The nice value of each of this process's threads, from /proc/self/task/*/stat.
std::vector<int> ThreadNiceValues() {
  std::vector<int> values;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(task.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    size_t at = stat.rfind(')');
    if (at == std::string::npos) continue;  // the thread ended while we read
    // After the name: state is field 3, nice field 19; fields are separated by single spaces.
    for (int field = 2; field < 19 && at != std::string::npos; ++field) at = stat.find(' ', at + 1);
    if (at == std::string::npos) continue;
    values.push_back(std::atoi(stat.c_str() + at + 1));
  }
  return values;
}

int ThreadsAt(int nice) {
  const std::vector<int> values = ThreadNiceValues();
  return static_cast<int>(std::count(values.begin(), values.end(), nice));
}

TEST(GlooRendezvous, EventThreadRunsAtTheNiceValueAskedForAndTheCallerKeepsItsOwn) {
  MemoryStore store;
  const int before = ThreadsAt(19);
  const int own = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  ASSERT_LT(own, 19) << "the test must start below the nice value it asks for";
  CommOptions options = Options();
  options.event_thread_nice = 19;
  Comms comms(2);
  std::vector<int> callers(2, -100);
  RunRanks(2, [&](int rank) {
    auto comm = CreateGlooCommunicator(store, rank, 2, options);
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    comms[rank] = std::move(comm).value();
    callers[rank] = getpriority(PRIO_PROCESS, static_cast<id_t>(gettid()));
  });
  ASSERT_TRUE(AllConnected(comms));
  // One event thread per rank's device, and only those.
  EXPECT_EQ(ThreadsAt(19), before + 2);
  EXPECT_EQ(getpriority(PRIO_PROCESS, static_cast<id_t>(gettid())), own);
  EXPECT_EQ(callers, std::vector<int>(2, own));
  // And the communicator works as ever.
  std::vector<float> sums(2);
  RunRanks(2, [&](int rank) {
    float value = static_cast<float>(rank + 1);
    ASSERT_TRUE(comms[rank]->AllReduce(&value, 1, ReduceOp::kSum).ok());
    sums[rank] = value;
  });
  EXPECT_EQ(sums, std::vector<float>(2, 3.0F));
  comms.clear();
  EXPECT_EQ(ThreadsAt(19), before);
}

TEST(GlooRendezvous, HostnameThatCannotBeUsedIsAnError) {
  MemoryStore store;
  CommOptions unresolvable = Options();
  unresolvable.hostname = "no-such-host.invalid";
  Status s = CreateGlooCommunicator(store, 0, 1, unresolvable).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("no-such-host.invalid"), std::string::npos) << s.message();

  // TEST-NET-1: a valid address, but not one of this machine's, so listening on it fails.
  CommOptions foreign = Options();
  foreign.hostname = "192.0.2.1";
  s = CreateGlooCommunicator(store, 0, 1, foreign).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("192.0.2.1"), std::string::npos) << s.message();
}

TEST(GlooRendezvous, WritingToAClosedSocketDoesNotKillTheProcess) {
  MemoryStore store;
  Result<std::unique_ptr<Communicator>> comm = CreateGlooCommunicator(store, 0, 1, Options());
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  // What a write to a dead peer's socket delivers; by default it would end the process here.
  ASSERT_EQ(raise(SIGPIPE), 0);
}

// ---------------------------------------------------------------------------------------------
// Failures.

class GlooFailureTest : public testing::TestWithParam<int> {
 protected:
  int size() const { return GetParam(); }
};

TEST_P(GlooFailureTest, PeerThatLeftFailsTheNextCollectiveAndBreaksTheCommunicator) {
  const int n = size();
  const int leaver = n / 2;
  const auto timeout = milliseconds(5000);
  MemoryStore store;
  Comms comms = ConnectAll(store, n, Options(timeout));
  ASSERT_TRUE(AllConnected(comms));

  std::latch left(1);
  std::vector<Status> first(n), later(n);
  std::vector<double> took(n, 0), destroy_took(n, 0);
  RunRanks(n, [&](int rank) {
    if (rank == leaver) {
      comms[rank].reset();
      left.count_down();
      return;
    }
    left.wait();
    std::vector<float> data(1 << 16, 1.0f);
    const auto start = Clock::now();
    first[rank] = comms[rank]->AllReduce(data.data(), data.size(), ReduceOp::kSum);
    took[rank] = SecondsSince(start);
    later[rank] = comms[rank]->Barrier();
    const auto destroy_start = Clock::now();
    comms[rank].reset();
    destroy_took[rank] = SecondsSince(destroy_start);
  });

  for (int rank = 0; rank < n; ++rank) {
    if (rank == leaver) continue;
    EXPECT_FALSE(first[rank].ok()) << "rank " << rank;
    EXPECT_TRUE(first[rank].code() == StatusCode::kUnavailable ||
                first[rank].code() == StatusCode::kDeadlineExceeded)
        << "rank " << rank << ": " << StatusCodeName(first[rank].code()) << " "
        << first[rank].ToString();
    EXPECT_NE(first[rank].message().find("gloo allreduce (rank " + std::to_string(rank) + " of " +
                                         std::to_string(n) + ")"),
              std::string::npos)
        << first[rank].message();
    // Failures spread through closed connections, so nobody waits out the timeout.
    EXPECT_LT(took[rank], 0.8 * std::chrono::duration<double>(timeout).count()) << "rank " << rank;

    EXPECT_EQ(later[rank].code(), StatusCode::kFailedPrecondition) << later[rank].ToString();
    EXPECT_NE(later[rank].message().find("communicator is broken after an earlier failure"),
              std::string::npos)
        << later[rank].message();
    EXPECT_LT(destroy_took[rank], 2.0) << "rank " << rank;
  }
}

// The last rank leaves 200 ms into `collective`, which the others are blocked in; every other
// rank must fail it with kUnavailable or kDeadlineExceeded, naming `op`, well before the timeout.
// The collectives move small buffers (whole in the socket buffers at once): Gloo (0.5) fails the
// receives a pair has posted when its connection breaks, but not one whose payload is half read,
// so a rank reading from a neighbour that fails mid-send waits out its timeout. With large
// buffers a slow machine can still be mid-send at 200 ms; the others are blocked all the same,
// on the leaver, whatever the size.
template <typename Collective>
void ExpectPeerLeavingDuringItFailsEveryRank(int n, std::string_view op, Collective collective) {
  const int leaver = n - 1;
  const auto timeout = milliseconds(5000);
  MemoryStore store;
  Comms comms = ConnectAll(store, n, Options(timeout));
  ASSERT_TRUE(AllConnected(comms));

  std::vector<Status> results(n);
  std::vector<double> took(n, 0);
  RunRanks(n, [&](int rank) {
    if (rank == leaver) {
      std::this_thread::sleep_for(milliseconds(200));
      comms[rank].reset();
      return;
    }
    const auto start = Clock::now();
    results[rank] = collective(*comms[rank]);
    took[rank] = SecondsSince(start);
  });
  for (int rank = 0; rank < n; ++rank) {
    if (rank == leaver) continue;
    EXPECT_TRUE(results[rank].code() == StatusCode::kUnavailable ||
                results[rank].code() == StatusCode::kDeadlineExceeded)
        << "rank " << rank << ": " << StatusCodeName(results[rank].code()) << " "
        << results[rank].ToString();
    EXPECT_NE(results[rank].message().find(op), std::string::npos) << results[rank].ToString();
    EXPECT_LT(took[rank], 0.8 * std::chrono::duration<double>(timeout).count()) << "rank " << rank;
  }
}

TEST_P(GlooFailureTest, PeerLeavingDuringACollectiveFailsIt) {
  ExpectPeerLeavingDuringItFailsEveryRank(size(), "allreduce", [](Communicator& comm) {
    std::vector<float> data(size_t{1} << 10, 1.0f);
    return comm.AllReduce(data.data(), data.size(), ReduceOp::kSum);
  });
}

TEST_P(GlooFailureTest, PeerLeavingDuringAReduceScatterFailsItOnEveryRank) {
  // Only the leaver's ring neighbours talk to it; the others learn of it because a rank whose
  // collective failed closes its connections.
  const int n = size();
  ExpectPeerLeavingDuringItFailsEveryRank(n, "reduce-scatter", [n](Communicator& comm) {
    constexpr size_t kShard = size_t{1} << 10;
    std::vector<int64_t> data(kShard * n, 1);
    return comm.ReduceScatter(data.data(), kShard, ReduceOp::kSum);
  });
}

TEST_P(GlooFailureTest, PeerThatStopsCallingCollectivesTimesOut) {
  const int n = size();
  const auto timeout = milliseconds(500);
  MemoryStore store;
  Comms comms = ConnectAll(store, n, Options(timeout));
  ASSERT_TRUE(AllConnected(comms));

  // Every rank but the last runs a collective; the last stays connected but silent until the
  // others have given up, as a stalled process would.
  std::latch gave_up(n - 1);
  std::vector<Status> results(n);
  std::vector<double> took(n, 0);
  RunRanks(n, [&](int rank) {
    if (rank == n - 1) {
      gave_up.wait();
      return;
    }
    int64_t value = 1;
    const auto start = Clock::now();
    results[rank] = comms[rank]->AllReduce(&value, 1, ReduceOp::kSum);
    took[rank] = SecondsSince(start);
    gave_up.count_down();
  });
  bool someone_timed_out = false;
  for (int rank = 0; rank < n - 1; ++rank) {
    EXPECT_FALSE(results[rank].ok()) << "rank " << rank;
    someone_timed_out |= results[rank].code() == StatusCode::kDeadlineExceeded;
    EXPECT_LT(took[rank], 5.0) << "rank " << rank;
  }
  EXPECT_TRUE(someone_timed_out);
  comms.clear();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooFailureTest, testing::Values(2, 3, 4), SizeName);

}  // namespace
}  // namespace vf
