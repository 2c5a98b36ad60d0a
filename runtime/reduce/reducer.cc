#include "runtime/reduce/reducer.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "runtime/reduce/header.h"

namespace vf {

std::vector<GradientBucket> MakeBuckets(std::span<const size_t> tensor_sizes, size_t max_bucket) {
  std::vector<GradientBucket> buckets;
  size_t offset = 0;
  for (size_t size : tensor_sizes) {
    for (size_t done = 0; done < size;) {
      const size_t n = std::min(max_bucket, size - done);
      buckets.push_back({offset + done, n});
      done += n;
    }
    offset += size;
  }
  return buckets;
}

int32_t ExponentFor(float max_abs) {
  int k = 0;
  std::frexp(static_cast<double>(max_abs), &k);  // max_abs < 2^k
  // Keep 2^e finite and exact in double even for denormal gradients.
  return std::clamp(44 - k, -960, 960);
}

namespace internal {

std::vector<int64_t> StepHeader::ToWire() const {
  std::vector<int64_t> wire;
  wire.reserve(WireSize());
  wire.insert(wire.end(), extra.begin(), extra.end());
  wire.push_back(non_finite ? 1 : 0);
  wire.push_back(overflow ? 1 : 0);
  wire.push_back(unset_scale ? 1 : 0);
  for (float m : bucket_max) {
    // A non-finite maximum is carried by the flag; keep the integer order meaningful.
    const float v = std::isfinite(m) ? std::fabs(m) : 0.f;
    wire.push_back(static_cast<int64_t>(std::bit_cast<uint32_t>(v)));
  }
  return wire;
}

void StepHeader::FromWire(std::span<const int64_t> wire) {
  size_t i = 0;
  for (auto& e : extra) e = wire[i++];
  non_finite = wire[i++] != 0;
  overflow = wire[i++] != 0;
  unset_scale = wire[i++] != 0;
  for (auto& m : bucket_max) m = std::bit_cast<float>(static_cast<uint32_t>(wire[i++]));
}

Status StepHeader::AllReduce(Communicator& comm) {
  std::vector<int64_t> wire = ToWire();
  VF_RETURN_IF_ERROR(comm.AllReduce(wire.data(), wire.size(), ReduceOp::kMax)
                         .WithContext("step header all-reduce"));
  FromWire(wire);
  return Status::Ok();
}

}  // namespace internal

// Defined in exact.cc and fast.cc.
Result<std::unique_ptr<Reducer>> CreateExactReducer(Device& device,
                                                    std::vector<GradientBucket> buckets,
                                                    int virtual_nodes);
Result<std::unique_ptr<Reducer>> CreateFastReducer(Device& device,
                                                   std::vector<GradientBucket> buckets,
                                                   int virtual_nodes);

Result<std::unique_ptr<Reducer>> CreateReducer(Reduction mode, Device& device,
                                               std::vector<GradientBucket> buckets,
                                               int virtual_nodes) {
  if (virtual_nodes < 1 || virtual_nodes > kMaxVirtualNodes) {
    return InvalidArgument("virtual nodes must be in 1.." + std::to_string(kMaxVirtualNodes));
  }
  if (mode == Reduction::kExact) {
    return CreateExactReducer(device, std::move(buckets), virtual_nodes);
  }
  return CreateFastReducer(device, std::move(buckets), virtual_nodes);
}

}  // namespace vf
