// Collectives on a device's memory through a communicator on host memory (Gloo): for workers
// whose device has no collective library that can join them, such as several workers sharing
// one GPU, which NCCL refuses.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/device.h"

namespace vf {

// Each collective on the device's own memory copies its buffer to the host, runs the host
// communicator's collective there and copies the result back: twice the device's copies of a
// native backend, and the same results bit for bit (the sums are the host backend's). A buffer
// in host memory (Device::OwnsMemory says which) goes to the host communicator as it is: callers
// pass both kinds, as they may to NCCL's communicator. The device must outlive this object. Not
// thread-safe: one thread drives it (and the device).
class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(Device& device, std::unique_ptr<Communicator> host);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  // The host backend's name, e.g. "gloo (staged through cuda:0 (NVIDIA H100))".
  std::string backend() const override;
  Status AllReduce(int64_t* data, size_t count, ReduceOp op) override;
  Status AllReduce(float* data, size_t count, ReduceOp op) override;
  Status ReduceScatter(int64_t* data, size_t shard, ReduceOp op) override;
  Status AllGather(void* data, size_t shard_bytes) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override { return host_->Barrier(); }

 private:
  // Copies `bytes` at device address `data` to the host buffer, runs `collective` on it, and
  // copies the buffer back when it succeeded.
  template <typename Collective>
  Status Staged(void* data, size_t bytes, Collective collective);

  Device& device_;
  std::unique_ptr<Communicator> host_;
  std::vector<uint64_t> buffer_;  // 8-byte aligned for the int64 collectives
};

}  // namespace vf
