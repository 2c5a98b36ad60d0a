// The operator's work queue: keys ("namespace/name") of objects to reconcile, deduplicated,
// delayed and rate-limited as client-go's workqueue does them.
//
//   WorkQueue queue;
//   informer handlers:  queue.Add(key);
//   each worker:        while (std::optional<std::string> key = queue.Get()) {
//                         Status done = Reconcile(*key);
//                         if (done.ok()) queue.Forget(*key); else queue.AddRateLimited(*key);
//                         queue.Done(*key);
//                       }
//   shutting down:      queue.ShutDown();  // workers drain what is queued, then Get ends
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "operator/kube/rate_limiter.h"

namespace vf::kube {

// Time as a WorkQueue sees it, so that tests can move it by hand. Implementations are
// thread-safe.
class WorkQueueClock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~WorkQueueClock() = default;

  virtual TimePoint Now() const = 0;
  // Asks for `on_advance` to be called whenever the time jumps (a clock that only moves at
  // the rate of real time never calls it); returns an id for Unsubscribe.
  virtual uint64_t Subscribe(std::function<void()> on_advance) = 0;
  virtual void Unsubscribe(uint64_t id) = 0;
};

// std::chrono::steady_clock. Thread-safe.
class SteadyWorkQueueClock : public WorkQueueClock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
  uint64_t Subscribe(std::function<void()>) override { return 0; }
  void Unsubscribe(uint64_t) override {}
};

// A clock that stands still until Advance moves it; for tests. Thread-safe.
class ManualWorkQueueClock : public WorkQueueClock {
 public:
  // Starts at an arbitrary, fixed point.
  ManualWorkQueueClock();

  TimePoint Now() const override;
  uint64_t Subscribe(std::function<void()> on_advance) override;
  void Unsubscribe(uint64_t id) override;

  // Moves the time forward by `by` and tells the subscribers (on this thread).
  void Advance(std::chrono::nanoseconds by);

 private:
  std::atomic<int64_t> now_ns_;
  // Guards the subscribers and is held while they run, so that once Unsubscribe returns the
  // subscriber is not running and will not run again.
  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::function<void()>> subscribers_;
};

// How a WorkQueue paces retries; value type.
struct WorkQueueOptions {
  // AddRateLimited waits base_delay * 2^(earlier AddRateLimited calls since the last Forget),
  // at most max_delay...
  std::chrono::nanoseconds base_delay = std::chrono::milliseconds(5);
  std::chrono::nanoseconds max_delay = std::chrono::seconds(1000);
  // ...and no less than an overall token bucket allows, so that many failing keys together
  // cannot retry faster than this. qps <= 0 disables the bucket.
  double qps = 10;
  int burst = 100;
  // Null: the steady clock.
  std::shared_ptr<WorkQueueClock> clock;
};

// A queue of keys to process with client-go's guarantees: a key waiting in the queue is there
// once however often it is added; a key being processed (between Get and Done) is handed to no
// other worker, and if it is added meanwhile it is queued again when Done is called, so the same
// key never runs on two workers at once and no change is missed; keys come out in the order they
// were (first) added. Thread-safe: any number of threads may add, and any number of workers may
// Get and Done, at once.
class WorkQueue {
 public:
  explicit WorkQueue(WorkQueueOptions options = {});
  ~WorkQueue();
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues `key` unless it is queued already. Ignored after ShutDown.
  void Add(const std::string& key);
  // Queues `key` once `delay` has passed (at once if it is not positive). A key already waiting
  // keeps the earlier of its two times. Ignored after ShutDown.
  void AddAfter(const std::string& key, std::chrono::nanoseconds delay);
  // AddAfter with the key's backoff (see WorkQueueOptions), which it then doubles: for a key
  // whose processing failed.
  void AddRateLimited(const std::string& key);
  // Resets the key's backoff: for a key whose processing succeeded. Does not remove it from the
  // queue.
  void Forget(const std::string& key);
  // AddRateLimited calls for `key` since it was last forgotten.
  int NumRequeues(const std::string& key) const;
  // What AddRateLimited would wait for `key` now, without counting it; for tests and logs.
  std::chrono::nanoseconds Backoff(const std::string& key) const;

  // Blocks until a key is ready and returns it, marking it as being processed; the caller must
  // call Done(key) when it has finished. After ShutDown, returns what is still queued, then
  // std::nullopt (keys still waiting out a delay are dropped).
  std::optional<std::string> Get();
  // Ends the processing of `key`; queues it again if it was added meanwhile.
  void Done(const std::string& key);

  // Keys queued and ready, not counting those being processed or waiting out a delay.
  size_t Len() const;
  // Wakes every Get; later adds are ignored.
  void ShutDown();
  bool ShuttingDown() const;

 private:
  using TimePoint = WorkQueueClock::TimePoint;

  void AddLocked(const std::string& key);
  // Moves the keys whose delay has passed into the queue.
  void PromoteReadyLocked(TimePoint now);
  std::chrono::nanoseconds BackoffLocked(const std::string& key) const;

  const WorkQueueOptions options_;
  const std::shared_ptr<WorkQueueClock> clock_;
  RateLimiter bucket_;
  uint64_t subscription_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool shutting_down_ = false;
  std::deque<std::string> queue_;
  // Keys that need processing: queued, or added again while being processed.
  std::unordered_set<std::string> dirty_;
  std::unordered_set<std::string> processing_;
  // Keys waiting out a delay, by when they are due (and the other way round).
  std::set<std::pair<TimePoint, std::string>> waiting_;
  std::unordered_map<std::string, TimePoint> waiting_until_;
  std::unordered_map<std::string, int> failures_;
};

}  // namespace vf::kube
