// Gradient reduction across virtual nodes and ranks (invariants 3-5).
//
// Every step first runs a small int64 MAX "header" collective (each bucket's largest gradient
// magnitude, NaN and overflow flags, and caller-supplied fields such as the newest membership
// epoch a rank has seen, so agreeing on membership costs no extra round trip), then sums the
// gradients themselves: fast mode with a float all-reduce, exact mode with an int64
// reduce-scatter, a conversion of each rank's shard to float, and a float all-gather.
//
// Exact mode keeps one power-of-two scale 2^e per bucket. A virtual node's gradient is rounded
// to int64 at that scale the moment it is computed and summed as integers, locally and then
// across ranks; integer addition is associative, so the result is bit-for-bit the same for any
// mapping of virtual nodes to ranks. The scale of step s is chosen from the all-reduced MAX of
// step s-1 (the bucket's largest magnitude lands near 2^44, leaving 64x headroom below the 2^50
// per-value limit), which keeps memory flat in the number of virtual nodes: no per-node gradient
// is stored. When a value would exceed the limit (a gradient grew more than 64x in one step) or
// no scale is known yet (the first step), every rank learns it from the header, takes the scale
// from this step's MAX and recomputes the step; the recomputation is deterministic, so the
// result still depends only on (state, data). Sums of up to kMaxVirtualNodes values stay below
// 2^62.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/device.h"
#include "runtime/job/spec.h"
#include "runtime/status.h"

namespace vf {

// A contiguous range of the flat gradient that shares one fixed-point scale.
struct GradientBucket {
  size_t offset = 0;
  size_t size = 0;
};

// Splits [0, total) into buckets at the given tensor boundaries, cutting tensors larger than
// `max_bucket` elements.
std::vector<GradientBucket> MakeBuckets(std::span<const size_t> tensor_sizes, size_t max_bucket);

// Scale exponent meaning "not chosen yet".
inline constexpr int32_t kUnsetExponent = kNoExponent;
// Largest |value * 2^e| one virtual node may contribute (the magic-number rounding is exact
// below 2^51).
inline constexpr int64_t kFixedPointLimit = int64_t{1} << 50;
// Exponent that places a bucket whose largest magnitude is `max_abs` just below 2^44.
int32_t ExponentFor(float max_abs);

// Outcome of one reduction.
struct ReduceResult {
  bool redo = false;  // exact mode chose a new scale: recompute the step's gradients
  LossStats totals;   // summed over all virtual nodes of all ranks
  std::vector<int64_t> header_extra;  // the caller's header fields, MAX over ranks
};

// Accumulates the gradients of a rank's virtual nodes and combines them across ranks.
// Not thread-safe.
class Reducer {
 public:
  virtual ~Reducer() = default;
  // Starts a step (or a redo of it): clears the local accumulators.
  virtual void Begin() = 0;
  // Adds one virtual node's gradient (device memory, parameter_count floats). Only queues work
  // on the device: nothing comes back to the host before Finish.
  virtual Status Add(const float* grad) = 0;
  // Where a node's gradient may be added in place instead of coming through Add (device memory,
  // parameter_count floats, cleared by Begin), or null when each node's gradient must come
  // through Add. Fast mode's sum is a plain float sum, so the model can add into it directly and
  // save a pass per node; exact mode converts each node's gradient on its own.
  virtual float* sum_in_place() { return nullptr; }
  // Takes the place of a step's Add calls for a caller that folds its nodes itself, bit for bit
  // as Add would (virtualflow.torch folds on the gradients' own device and hands the result over
  // once per step): `sums` (host memory, parameter_count values) is the int64 sum over this
  // rank's nodes of round_half_even(grad * 2^e) per element with e the bucket's exponent of this
  // step (exponents(); a bucket whose exponent is kUnsetExponent is only measured, its sums stay
  // 0), `max_bits` holds per
  // bucket the largest bit pattern of |grad| over those nodes (NaN above +Inf), and `bad` says
  // that some element of a bucket with an exponent had |grad * 2^e| > kFixedPointLimit or was
  // not finite (its sums may then hold anything: the step is redone or fails). Once per step,
  // after Begin, and not with Add; exact mode only (fast mode: kFailedPrecondition). `sums` may
  // be null in a world of one, where the caller keeps the sums and converts them itself (the
  // conversion is FixedToFloat's, with this step's exponents): Finish then gets a null
  // `mean_grad` and decides only the redo, the statistics and the next step's exponents.
  virtual Status AddFolded(const int64_t* sums, std::span<const uint32_t> max_bits, bool bad) {
    (void)sums;
    (void)max_bits;
    (void)bad;
    return FailedPrecondition("folded sums need exact reduction");
  }
  // Adds one virtual node's loss statistics (host memory), the nodes in a fixed order.
  virtual void AddLoss(const LossStats& stats) = 0;
  // Runs the collectives and writes the mean gradient (1/V) * sum into `mean_grad` (device
  // memory; null after AddFolded without sums, in a world of one only: nothing converted).
  // `header_extra` is MAX-reduced along with the header. A NaN or Inf anywhere is a kNumerical
  // error on every rank; a failed collective is returned as is. Exact mode leaves this rank's sums
  // of the step as the Add calls made them, also when a collective fails: the caller may then Add
  // the nodes a new plan gives it on top (no Begin) and Finish again with the new communicator, and
  // gets what computing them all again would give, bit for bit. (Fast mode sums in place: after a
  // failure it starts the step again with Begin.)
  virtual Result<ReduceResult> Finish(Communicator& comm, std::span<const int64_t> header_extra,
                                      float* mean_grad) = 0;

  // Exact mode's per-bucket exponents (empty for fast mode): part of the training state.
  virtual std::vector<int32_t> exponents() const = 0;
  virtual Status set_exponents(std::span<const int32_t> exponents) = 0;
};

// `virtual_nodes` is the job's V (the divisor of the mean), not the local count.
Result<std::unique_ptr<Reducer>> CreateReducer(Reduction mode, Device& device,
                                               std::vector<GradientBucket> buckets,
                                               int virtual_nodes);

}  // namespace vf
