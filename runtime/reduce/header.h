// The per-step MAX header shared by both reducers (see reducer.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/status.h"

namespace vf::internal {

// Flags and per-bucket maxima a rank contributes to the header; after AllReduce they hold the
// MAX over ranks. Value type; thread-compatible.
struct StepHeader {
  std::vector<int64_t> extra;
  bool non_finite = false;        // some gradient had a NaN or Inf
  bool overflow = false;          // exact mode: a value exceeded the fixed-point limit
  bool unset_scale = false;       // exact mode: no scale chosen yet
  std::vector<float> bucket_max;  // largest |gradient| per bucket, all finite when !non_finite

  // One int64 MAX all-reduce of the wire form.
  Status AllReduce(Communicator& comm);

  // The wire form: int64 words whose elementwise MAX over ranks is the header's MAX.
  // Non-negative floats are ordered like their bit patterns, so the maxima travel as integers
  // with the flags. Its length depends only on extra.size() and bucket_max.size().
  std::vector<int64_t> ToWire() const;
  // Replaces the fields with those of `wire` (a ToWire of a header of the same shape).
  void FromWire(std::span<const int64_t> wire);
  // Words in the wire form of a header of this shape.
  size_t WireSize() const { return extra.size() + 3 + bucket_max.size(); }
};

}  // namespace vf::internal
