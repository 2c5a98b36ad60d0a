// The NCCL backend: GPU collectives on CUDA device memory between the ranks of one membership
// epoch.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "runtime/comm/communicator.h"
#include "runtime/status.h"

// The NCCL and CUDA types the header needs, declared as nccl.h and the CUDA headers do, so that
// users of this header need no CUDA include path.
struct ncclComm;
typedef struct ncclComm* ncclComm_t;  // NOLINT(modernize-use-using): must match nccl.h
struct CUstream_st;

namespace vf {

// Communicator over a non-blocking NCCL communicator on one GPU; every NCCL and CUDA error
// becomes a Status and every wait is bounded by the timeout (a dead peer gets the NCCL
// communicator aborted, not a hang). After the first failed collective it refuses further work.
// Collectives run on the communicator's own non-blocking stream after all work queued on the GPU
// so far (so `data` may come from kernels on any stream), and return once the result is in
// `data`. Buffers are device memory of this GPU, or host memory, which is staged through a device
// buffer of the communicator's (meant for small buffers: headers, metadata). Not thread-safe
// (like Communicator).
class NcclCommunicator final : public Communicator {
 public:
  // Rendezvous through `store` and NCCL initialisation on `cuda_device`; see
  // CreateNcclCommunicator.
  static Result<std::unique_ptr<Communicator>> Create(Store& store, int rank, int size,
                                                      const CommOptions& options, int cuda_device);
  // Finalizes and destroys a healthy communicator (bounded by the timeout), aborts a broken one.
  // Never throws.
  ~NcclCommunicator() override;

  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "nccl"; }
  int cuda_device() const { return device_; }

  Status AllReduce(int64_t* data, size_t count, ReduceOp op) override;
  Status AllReduce(float* data, size_t count, ReduceOp op) override;
  Status ReduceScatter(int64_t* data, size_t shard, ReduceOp op) override;
  Status AllGather(void* data, size_t shard_bytes) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;

 private:
  NcclCommunicator(int rank, int size, int device, std::chrono::milliseconds timeout);

  // Creates the stream and the barrier scratch, then the NCCL communicator from `unique_id`
  // (the bytes of an ncclUniqueId), waiting for its non-blocking initialisation.
  Status Init(const std::string& unique_id);

  template <typename T>
  Status AllReduceImpl(T* data, size_t count, ReduceOp op);

  // True for host memory, false for memory of this communicator's GPU; else the
  // kInvalidArgument that spares the GPU a fault (which would end its CUDA context).
  Result<bool> IsHostBuffer(std::string_view op, const void* data) const;
  // The staging buffer, grown to at least `bytes`.
  Result<void*> Staging(std::string_view op, size_t bytes);
  // Runs `enqueue(buffer)` through Run on `data` itself (device memory) or on the staging buffer
  // with `bytes` copied in and back (host memory).
  template <typename Fn>
  Status RunOn(std::string_view op, void* data, size_t bytes, Fn&& enqueue);

  // Runs one collective: `enqueue` queues it on stream_ and returns the ncclResult_t of the NCCL
  // call; Run then waits until it completed, failed or timed out. Any failure aborts the NCCL
  // communicator, breaks this one and comes back with context "nccl <op> (rank r of n)".
  template <typename Fn>
  Status Run(std::string_view op, Fn&& enqueue);

  // Records `status` as the first failure and aborts the NCCL communicator, which also stops
  // whatever of it still runs on the GPU. Returns `status`.
  Status Break(Status status);

  // "nccl <op> (rank r of n)", the context added to every error.
  std::string Describe(std::string_view op) const;
  // OK, or the kFailedPrecondition that a broken communicator answers with.
  Status CheckUsable(std::string_view op) const;

  const int rank_;
  const int size_;
  const int device_;
  // Bound on initialisation, on each collective and on finalisation in the destructor.
  const std::chrono::milliseconds timeout_;
  // Null before initialisation and after an abort.
  ncclComm_t comm_ = nullptr;
  CUstream_st* stream_ = nullptr;
  // One device word that Barrier all-reduces.
  int64_t* scratch_ = nullptr;
  // Device copy of host buffers for collectives (grown on demand).
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  // The first failure; OK while the communicator is usable.
  Status broken_;
};

}  // namespace vf
