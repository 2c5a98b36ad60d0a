#include "runtime/comm/staged/communicator.h"

#include <utility>

namespace vf {

StagedCommunicator::StagedCommunicator(Device& device, std::unique_ptr<Communicator> host)
    : device_(device), host_(std::move(host)) {}

std::string StagedCommunicator::backend() const {
  return host_->backend() + " (staged through " + device_.Name() + ")";
}

template <typename Collective>
Status StagedCommunicator::Staged(void* data, size_t bytes, Collective collective) {
  // Host buffers (the step's header, a state transfer's metadata) go to the host backend as
  // they are; only the device's own memory is copied.
  if (!device_.OwnsMemory(data)) return collective(data);
  buffer_.resize((bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t));
  // CopyToHost waits for the device, so the buffer holds everything queued before the call.
  device_.CopyToHost(buffer_.data(), data, bytes);
  VF_RETURN_IF_ERROR(collective(static_cast<void*>(buffer_.data())));
  // From pageable memory the copy has read the buffer when the call returns.
  device_.CopyFromHost(data, buffer_.data(), bytes);
  return Status::Ok();
}

Status StagedCommunicator::AllReduce(int64_t* data, size_t count, ReduceOp op) {
  return Staged(data, count * sizeof(int64_t), [&](void* host) {
    return host_->AllReduce(static_cast<int64_t*>(host), count, op);
  });
}

Status StagedCommunicator::AllReduce(float* data, size_t count, ReduceOp op) {
  return Staged(data, count * sizeof(float),
                [&](void* host) { return host_->AllReduce(static_cast<float*>(host), count, op); });
}

Status StagedCommunicator::ReduceScatter(int64_t* data, size_t shard, ReduceOp op) {
  const size_t count = shard * static_cast<size_t>(size());
  return Staged(data, count * sizeof(int64_t), [&](void* host) {
    return host_->ReduceScatter(static_cast<int64_t*>(host), shard, op);
  });
}

Status StagedCommunicator::AllGather(void* data, size_t shard_bytes) {
  return Staged(data, shard_bytes * static_cast<size_t>(size()),
                [&](void* host) { return host_->AllGather(host, shard_bytes); });
}

Status StagedCommunicator::Broadcast(void* data, size_t bytes, int root) {
  return Staged(data, bytes, [&](void* host) { return host_->Broadcast(host, bytes, root); });
}

}  // namespace vf
