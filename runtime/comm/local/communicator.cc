#include "runtime/comm/local/communicator.h"

#include <memory>
#include <string>

namespace vf {

Status LocalCommunicator::AllReduce(int64_t* /*data*/, size_t /*count*/, ReduceOp /*op*/) {
  return Status::Ok();
}

Status LocalCommunicator::AllReduce(float* /*data*/, size_t /*count*/, ReduceOp /*op*/) {
  return Status::Ok();
}

Status LocalCommunicator::ReduceScatter(int64_t* /*data*/, size_t /*shard*/, ReduceOp /*op*/) {
  return Status::Ok();
}

Status LocalCommunicator::AllGather(void* /*data*/, size_t /*shard_bytes*/) { return Status::Ok(); }

Status LocalCommunicator::Broadcast(void* /*data*/, size_t /*bytes*/, int root) {
  // Rejected rather than ignored so a caller's rank arithmetic bug shows up in single-worker runs
  // too, not only once the job scales out.
  if (root != 0) {
    return InvalidArgument("broadcast root " + std::to_string(root) +
                           " is not a rank of a world of size 1");
  }
  return Status::Ok();
}

Status LocalCommunicator::Barrier() { return Status::Ok(); }

std::unique_ptr<Communicator> CreateLocalCommunicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace vf
