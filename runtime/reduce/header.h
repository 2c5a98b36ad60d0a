// The per-step MAX header shared by both reducers (see reducer.h).
#pragma once

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

  // One int64 MAX all-reduce. Non-negative floats are ordered like their bit patterns, so the
  // maxima travel as integers with the flags in the same collective.
  Status AllReduce(Communicator& comm);
};

}  // namespace vf::internal
