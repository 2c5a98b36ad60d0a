// The single-rank backend: a world of one, used when a job runs on one worker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/comm/communicator.h"

namespace vf {

// Communicator for a world of one rank, where every collective already has its result in place.
// Stateless, so thread-safe.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }

  Status AllReduce(int64_t* data, size_t count, ReduceOp op) override;
  Status AllReduce(float* data, size_t count, ReduceOp op) override;
  Status ReduceScatter(int64_t* data, size_t shard, ReduceOp op) override;
  Status AllGather(void* data, size_t shard_bytes) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;
};

}  // namespace vf
