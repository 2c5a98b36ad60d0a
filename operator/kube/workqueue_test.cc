#include "operator/kube/workqueue.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace vf::kube {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Whether `future` is ready within a short real-time wait.
template <typename T>
bool ReadySoon(std::future<T>& future, milliseconds wait = milliseconds(2000)) {
  return future.wait_for(wait) == std::future_status::ready;
}

// Whether `future` is still not ready after a short real-time wait.
template <typename T>
bool StillBlocked(std::future<T>& future) {
  return future.wait_for(milliseconds(50)) == std::future_status::timeout;
}

struct ManualQueue {
  explicit ManualQueue(WorkQueueOptions options = {})
      : clock(std::make_shared<ManualWorkQueueClock>()), queue([&] {
          options.clock = clock;
          return options;
        }()) {}
  std::shared_ptr<ManualWorkQueueClock> clock;
  WorkQueue queue;
};

TEST(WorkQueueTest, AKeyWaitingIsQueuedOnce) {
  WorkQueue queue;
  queue.Add("ns/a");
  queue.Add("ns/b");
  queue.Add("ns/a");
  EXPECT_EQ(queue.Len(), 2u);
  EXPECT_EQ(queue.Get(), "ns/a");
  EXPECT_EQ(queue.Get(), "ns/b");
  EXPECT_EQ(queue.Len(), 0u);
}

TEST(WorkQueueTest, KeysComeOutInTheOrderTheyWereFirstAdded) {
  WorkQueue queue;
  for (const char* key : {"c", "a", "b", "a", "c", "d"}) queue.Add(key);
  std::vector<std::string> order;
  for (int i = 0; i < 4; ++i) order.push_back(*queue.Get());
  EXPECT_EQ(order, (std::vector<std::string>{"c", "a", "b", "d"}));
}

TEST(WorkQueueTest, AKeyAddedWhileBeingProcessedIsQueuedAgainAfterDone) {
  WorkQueue queue;
  queue.Add("a");
  ASSERT_EQ(queue.Get(), "a");
  queue.Add("a");
  queue.Add("a");
  // Not handed to another worker while the first still has it...
  EXPECT_EQ(queue.Len(), 0u);
  auto second = std::async(std::launch::async, [&] { return queue.Get(); });
  EXPECT_TRUE(StillBlocked(second));
  // ...and not lost either: queued once when the first is done.
  queue.Done("a");
  ASSERT_TRUE(ReadySoon(second));
  EXPECT_EQ(second.get(), "a");
  EXPECT_EQ(queue.Len(), 0u);
  queue.Done("a");
  EXPECT_EQ(queue.Len(), 0u);
}

TEST(WorkQueueTest, DoneWithoutAReAddDoesNotQueueTheKey) {
  WorkQueue queue;
  queue.Add("a");
  ASSERT_EQ(queue.Get(), "a");
  queue.Done("a");
  EXPECT_EQ(queue.Len(), 0u);
}

TEST(WorkQueueTest, TheSameKeyNeverRunsOnTwoWorkersAtOnce) {
  constexpr int kKeys = 5;
  constexpr int kWorkers = 8;
  constexpr int kProducers = 4;
  constexpr int kAddsPerProducer = 2000;
  WorkQueue queue;
  std::array<std::atomic<int>, kKeys> running{};
  std::array<std::atomic<int>, kKeys> processed{};
  std::atomic<int> overlaps{0};
  // Per key, how many adds have happened / had happened when a worker last started on it:
  // after everything settles, every key must have been processed after its last add.
  std::array<std::atomic<int>, kKeys> adds{};
  std::array<std::atomic<int>, kKeys> seen_adds{};

  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&] {
      while (std::optional<std::string> key = queue.Get()) {
        const int k = std::stoi(*key);
        if (running[k].fetch_add(1) != 0) ++overlaps;
        seen_adds[k] = adds[k].load();
        std::this_thread::yield();
        ++processed[k];
        running[k].fetch_sub(1);
        queue.Done(*key);
      }
    });
  }
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kAddsPerProducer; ++i) {
        const int k = (i + p) % kKeys;
        ++adds[k];
        queue.Add(std::to_string(k));
      }
    });
  }
  for (std::thread& producer : producers) producer.join();
  // Let the workers catch up with the last adds.
  const auto deadline = std::chrono::steady_clock::now() + seconds(30);
  auto settled = [&] {
    for (int k = 0; k < kKeys; ++k) {
      if (seen_adds[k].load() != adds[k].load()) return false;
    }
    return queue.Len() == 0;
  };
  while (!settled() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  queue.ShutDown();
  for (std::thread& worker : workers) worker.join();

  EXPECT_EQ(overlaps.load(), 0);
  for (int k = 0; k < kKeys; ++k) {
    EXPECT_EQ(seen_adds[k].load(), adds[k].load()) << "key " << k << " missed its last add";
    EXPECT_GT(processed[k].load(), 0);
    // Adds of a key already waiting were folded together.
    EXPECT_LE(processed[k].load(), adds[k].load());
  }
}

TEST(WorkQueueTest, AddAfterQueuesTheKeyWhenTheDelayHasPassed) {
  ManualQueue q;
  q.queue.AddAfter("a", milliseconds(100));
  EXPECT_EQ(q.queue.Len(), 0u);
  auto got = std::async(std::launch::async, [&] { return q.queue.Get(); });
  EXPECT_TRUE(StillBlocked(got));
  q.clock->Advance(milliseconds(99));
  EXPECT_TRUE(StillBlocked(got));
  EXPECT_EQ(q.queue.Len(), 0u);
  q.clock->Advance(milliseconds(1));
  ASSERT_TRUE(ReadySoon(got));
  EXPECT_EQ(got.get(), "a");
}

TEST(WorkQueueTest, AddAfterKeepsTheEarlierOfTwoTimes) {
  ManualQueue q;
  q.queue.AddAfter("a", milliseconds(100));
  q.queue.AddAfter("a", milliseconds(10));
  q.queue.AddAfter("a", milliseconds(50));
  q.clock->Advance(milliseconds(10));
  EXPECT_EQ(q.queue.Len(), 1u);
  EXPECT_EQ(q.queue.Get(), "a");
  q.queue.Done("a");
  // The later times were folded into the first: nothing more comes.
  q.clock->Advance(milliseconds(100));
  EXPECT_EQ(q.queue.Len(), 0u);
}

TEST(WorkQueueTest, AddAfterWithoutADelayAddsAtOnce) {
  ManualQueue q;
  q.queue.AddAfter("a", milliseconds(0));
  q.queue.AddAfter("b", milliseconds(-5));
  EXPECT_EQ(q.queue.Len(), 2u);
}

TEST(WorkQueueTest, DelayedKeysComeOutInTheOrderTheyAreDue) {
  ManualQueue q;
  q.queue.AddAfter("late", milliseconds(30));
  q.queue.AddAfter("early", milliseconds(10));
  q.queue.AddAfter("middle", milliseconds(20));
  q.clock->Advance(milliseconds(30));
  EXPECT_EQ(q.queue.Get(), "early");
  EXPECT_EQ(q.queue.Get(), "middle");
  EXPECT_EQ(q.queue.Get(), "late");
}

TEST(WorkQueueTest, AnEarlierDelayWakesAGetterWaitingForALaterOne) {
  ManualQueue q;
  q.queue.AddAfter("later", seconds(3600));
  auto got = std::async(std::launch::async, [&] { return q.queue.Get(); });
  EXPECT_TRUE(StillBlocked(got));
  q.queue.AddAfter("sooner", milliseconds(10));
  q.clock->Advance(milliseconds(10));
  ASSERT_TRUE(ReadySoon(got));
  EXPECT_EQ(got.get(), "sooner");
}

TEST(WorkQueueTest, AddAfterWorksOnTheRealClock) {
  WorkQueue queue;
  const auto start = std::chrono::steady_clock::now();
  queue.AddAfter("a", milliseconds(30));
  EXPECT_EQ(queue.Get(), "a");
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(30));
}

TEST(WorkQueueTest, BackoffDoublesPerKeyUpToTheMaximumAndForgetResetsIt) {
  WorkQueueOptions options;
  options.base_delay = milliseconds(5);
  options.max_delay = milliseconds(40);
  options.qps = 0;  // the per-key backoff alone
  ManualQueue q(options);
  std::vector<milliseconds> delays;
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(q.queue.NumRequeues("a"), i);
    delays.push_back(std::chrono::duration_cast<milliseconds>(q.queue.Backoff("a")));
    q.queue.AddRateLimited("a");
  }
  EXPECT_EQ(delays,
            (std::vector<milliseconds>{milliseconds(5), milliseconds(10), milliseconds(20),
                                       milliseconds(40), milliseconds(40), milliseconds(40)}));
  // Other keys have backoffs of their own.
  EXPECT_EQ(q.queue.NumRequeues("b"), 0);
  EXPECT_EQ(q.queue.Backoff("b"), milliseconds(5));

  q.queue.Forget("a");
  EXPECT_EQ(q.queue.NumRequeues("a"), 0);
  EXPECT_EQ(q.queue.Backoff("a"), milliseconds(5));
}

TEST(WorkQueueTest, AddRateLimitedWaitsOutTheKeysBackoff) {
  WorkQueueOptions options;
  options.base_delay = milliseconds(5);
  options.qps = 0;
  ManualQueue q(options);
  q.queue.AddRateLimited("a");  // 5 ms
  q.clock->Advance(milliseconds(4));
  EXPECT_EQ(q.queue.Len(), 0u);
  q.clock->Advance(milliseconds(1));
  ASSERT_EQ(q.queue.Len(), 1u);
  ASSERT_EQ(q.queue.Get(), "a");
  q.queue.AddRateLimited("a");  // 10 ms
  q.queue.Done("a");
  q.clock->Advance(milliseconds(9));
  EXPECT_EQ(q.queue.Len(), 0u);
  q.clock->Advance(milliseconds(1));
  EXPECT_EQ(q.queue.Len(), 1u);
}

TEST(WorkQueueTest, TheTokenBucketSpacesOutRetriesOfManyKeys) {
  WorkQueueOptions options;
  options.base_delay = std::chrono::nanoseconds(1);
  options.qps = 10;
  options.burst = 2;
  ManualQueue q(options);
  for (const char* key : {"a", "b", "c", "d"}) q.queue.AddRateLimited(key);
  q.clock->Advance(std::chrono::microseconds(1));
  EXPECT_EQ(q.queue.Len(), 2u);  // the burst
  q.clock->Advance(milliseconds(99));
  EXPECT_EQ(q.queue.Len(), 2u);
  q.clock->Advance(milliseconds(1));
  EXPECT_EQ(q.queue.Len(), 3u);  // one more per 1/qps
  q.clock->Advance(milliseconds(100));
  EXPECT_EQ(q.queue.Len(), 4u);
}

TEST(WorkQueueTest, ShutDownWakesEveryGetter) {
  WorkQueue queue;
  std::vector<std::future<std::optional<std::string>>> getters;
  for (int i = 0; i < 4; ++i) {
    getters.push_back(std::async(std::launch::async, [&] { return queue.Get(); }));
  }
  for (auto& getter : getters) EXPECT_TRUE(StillBlocked(getter));
  queue.ShutDown();
  EXPECT_TRUE(queue.ShuttingDown());
  for (auto& getter : getters) {
    ASSERT_TRUE(ReadySoon(getter));
    EXPECT_EQ(getter.get(), std::nullopt);
  }
}

TEST(WorkQueueTest, ShutDownWakesAGetterWaitingForADelayedKey) {
  ManualQueue q;
  q.queue.AddAfter("a", seconds(60));
  auto got = std::async(std::launch::async, [&] { return q.queue.Get(); });
  EXPECT_TRUE(StillBlocked(got));
  q.queue.ShutDown();
  ASSERT_TRUE(ReadySoon(got));
  EXPECT_EQ(got.get(), std::nullopt);
}

TEST(WorkQueueTest, AfterShutDownQueuedKeysDrainAndNewAddsAreIgnored) {
  ManualQueue q;
  q.queue.Add("a");
  q.queue.Add("b");
  q.queue.AddAfter("delayed", milliseconds(10));
  q.queue.ShutDown();
  q.queue.Add("c");
  q.queue.AddAfter("d", milliseconds(1));
  q.queue.AddRateLimited("e");
  q.clock->Advance(milliseconds(20));
  EXPECT_EQ(q.queue.Len(), 2u);
  EXPECT_EQ(q.queue.Get(), "a");
  EXPECT_EQ(q.queue.Get(), "b");
  EXPECT_EQ(q.queue.Get(), std::nullopt);
  EXPECT_EQ(q.queue.NumRequeues("e"), 0);
}

}  // namespace
}  // namespace vf::kube
