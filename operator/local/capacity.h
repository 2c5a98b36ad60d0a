// A schedule of how many local worker slots are free over a run (vf run --capacity).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace vf {

// "0:2,150:4,300:1" (at step 0 two slots, from step 150 four, from step 300 one) or the same
// with seconds, "0s:2,30s:4". Immutable after parsing; thread-compatible.
class CapacitySchedule {
 public:
  // A constant number of slots.
  static CapacitySchedule Constant(int slots);
  // kInvalidArgument naming the bad entry: empty, not increasing, mixed units, slots < 0.
  static Result<CapacitySchedule> Parse(const std::string& text);

  bool by_seconds() const { return by_seconds_; }
  // Slots at `step` (or at `seconds` since the start when by_seconds()).
  int At(int64_t step, double seconds) const;
  int Max() const;
  std::string ToString() const;

 private:
  struct Entry {
    double at = 0;
    int slots = 0;
  };
  bool by_seconds_ = false;
  std::vector<Entry> entries_;
};

}  // namespace vf
