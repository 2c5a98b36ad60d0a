// Collective communication between the ranks of one membership epoch. One implementation per
// backend (local/, gloo/, later nccl/), each in its own folder with the same file names.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/comm/store.h"
#include "runtime/status.h"

namespace vf {

enum class ReduceOp { kSum, kMax };

// A fixed group of ranks that run collectives together. Every rank must call the same
// collectives in the same order. A collective that fails (a peer died, a timeout) returns
// kUnavailable or kDeadlineExceeded; the communicator is then unusable and must be rebuilt.
// Buffers live in the memory of the device the communicator was built for (host memory for
// local and Gloo). Not thread-safe: one thread drives a communicator.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;

  virtual Status AllReduce(int64_t* data, size_t count, ReduceOp op) = 0;
  virtual Status AllReduce(float* data, size_t count, ReduceOp op) = 0;
  // In-place reduce-scatter: `data` holds size() * shard elements, in size() shards of `shard`
  // elements; afterwards shard rank() holds the reduction over ranks and the other shards are
  // unspecified. Together with AllGather it is an all-reduce whose two halves may move
  // different types (exact mode sums int64 and gathers float).
  virtual Status ReduceScatter(int64_t* data, size_t shard, ReduceOp op) = 0;
  // In-place all-gather: `data` holds size() * shard_bytes bytes; rank r's bytes
  // [r * shard_bytes, (r + 1) * shard_bytes) are copied to every other rank.
  virtual Status AllGather(void* data, size_t shard_bytes) = 0;
  // Copies `bytes` bytes at `data` on rank `root` into `data` on every other rank.
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual Status Barrier() = 0;
};

// Options shared by the networked backends.
struct CommOptions {
  // Address the rank listens on for its peers.
  std::string hostname = "127.0.0.1";
  // Bound on rendezvous and on every collective; past it the collective fails.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // Gloo only: the nice value (0..19) of the thread that reads the sockets. That thread spins
  // while the training thread holds a connection's lock, and where a run's own workers
  // outnumber the cores it takes the CPU from the very thread it waits for; raised, it yields
  // it, but other busy work on the machine then starves it. 0 leaves it as it is.
  int event_thread_nice = 0;
};

// A world of one rank: collectives are copies or no-ops.
std::unique_ptr<Communicator> CreateLocalCommunicator();

// Gloo over TCP. Ranks find each other through `store` (use a PrefixStore per epoch).
// Returns an error, never throws, if the backend is not compiled in or rendezvous fails.
Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store& store, int rank, int size,
                                                             const CommOptions& options);

// NCCL on CUDA device `cuda_device`; buffers are device memory. Rank 0 publishes the NCCL
// unique id in `store` (use a PrefixStore per epoch), the others read it; initialisation is
// non-blocking and bounded by options.timeout, and so is every collective (a dead peer gets the
// communicator aborted, not a hang). Returns an error, never throws, if NCCL is not compiled in,
// there is no such device (kFailedPrecondition), or rendezvous fails: kInvalidArgument where
// NCCL refuses the communicator itself, as it refuses two ranks on one GPU, which no new attempt
// would change; another code where one may (a peer that died or never came).
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store& store, int rank, int size,
                                                             const CommOptions& options,
                                                             int cuda_device = 0);

}  // namespace vf
