// Exact reduction: per-bucket fixed point in int64 (see reducer.h for the scheme).
#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/reduce/header.h"
#include "runtime/reduce/reducer.h"

namespace vf {
namespace {

// Loss sums travel as fixed point too, so the reported loss is mapping-independent.
constexpr double kLossScale = 16777216.0;  // 2^24

// Fixed-point reducer. Not thread-safe.
class ExactReducer : public Reducer {
 public:
  ExactReducer(Device& device, std::vector<GradientBucket> buckets, int virtual_nodes)
      : device_(device),
        buckets_(std::move(buckets)),
        virtual_nodes_(virtual_nodes),
        exponents_(buckets_.size(), kUnsetExponent),
        local_max_(buckets_.size(), 0.f) {
    for (const auto& b : buckets_) count_ = std::max(count_, b.offset + b.size);
  }

  Status Init() {
    // The accumulator carries the loss statistics in its first three slots (three more give
    // their bytes room in the gathered float buffer, see Combine), then the gradient, then room
    // for padding to whole shards: with n <= V ranks, n * shard never exceeds this.
    const size_t total = kHead + count_;
    const size_t v = static_cast<size_t>(std::max(virtual_nodes_, 1));
    capacity_ = std::max(total + v, kHead * v);
    VF_ASSIGN_OR_RETURN(acc_, DeviceBuffer<int64_t>::Create(device_, capacity_));
    // One maximum per bucket and the overflow flag, collected on the device over a step's
    // virtual nodes and read once in Finish.
    host_flags_.assign(buckets_.size() + 1, 0);
    VF_ASSIGN_OR_RETURN(flags_, DeviceBuffer<uint32_t>::Create(device_, host_flags_.size()));
    // The bucket table of Add's fold, on the host and on the device; Begin refreshes the
    // exponents of both. 24 bytes per bucket.
    plan_.resize(buckets_.size());
    for (size_t i = 0; i < buckets_.size(); ++i) {
      plan_[i].offset = buckets_[i].offset;
      plan_[i].size = buckets_[i].size;
    }
    VF_ASSIGN_OR_RETURN(device_plan_, DeviceBuffer<FoldBucket>::Create(device_, plan_.size()));
    return Status::Ok();
  }

  void Begin() override {
    device_.FillInt64(acc_.data(), 0, acc_.size());
    std::fill(host_flags_.begin(), host_flags_.end(), 0u);
    device_.CopyFromHost(flags_.data(), host_flags_.data(), host_flags_.size() * sizeof(uint32_t));
    for (size_t i = 0; i < buckets_.size(); ++i) plan_[i].exponent = exponents_[i];
    device_.CopyFromHost(device_plan_.data(), plan_.data(), plan_.size() * sizeof(FoldBucket));
    non_finite_ = false;
    overflow_ = false;
    source_ = Source::kNone;
    loss_fixed_ = 0;
    correct_ = 0;
    samples_ = 0;
  }

  // Queues the node's work and returns: maxima and overflow stay on the device until Finish, so
  // a GPU runs a step's virtual nodes without waiting for the host between them. A NaN or an
  // overflow spoils the sums of its bucket, which Finish then discards. A bucket with no scale
  // yet is only measured; the step is recomputed once the scale is agreed (see reducer.h).
  // The exponents come from the table Begin wrote, so the same call serves every step.
  Status Add(const float* grad) override {
    if (source_ == Source::kFolded) return FailedPrecondition("Add after AddFolded in one step");
    source_ = Source::kAdd;
    device_.FoldBuckets(grad, FoldPlan{plan_, device_plan_.data()}, kFixedPointLimit,
                        acc_.data() + kHead, flags_.data(), flags_.data() + buckets_.size());
    return Status::Ok();
  }

  // The sums replace the accumulator's (Begin cleared it), so the C++ side goes on exactly as
  // after the same nodes' Add calls; the maxima and the flag join the device's in ReadFlags.
  Status AddFolded(const int64_t* sums, std::span<const uint32_t> max_bits, bool bad) override {
    if (max_bits.size() != buckets_.size()) {
      return InvalidArgument("folded sums come with " + std::to_string(max_bits.size()) +
                             " bucket maxima, the reducer has " + std::to_string(buckets_.size()) +
                             " buckets");
    }
    if (source_ != Source::kNone) {
      return FailedPrecondition("AddFolded after Add or AddFolded in one step (once per step)");
    }
    source_ = Source::kFolded;
    // Without sums the caller keeps them (a world of one; see reducer.h): the accumulator's
    // gradient slots stay as Begin cleared them and Finish converts nothing.
    if (sums != nullptr) device_.CopyFromHost(acc_.data() + kHead, sums, count_ * sizeof(int64_t));
    folded_max_.assign(max_bits.begin(), max_bits.end());
    folded_bad_ = bad;
    return Status::Ok();
  }

  void AddLoss(const LossStats& stats) override {
    const double fixed = stats.loss_sum * kLossScale;
    if (!(std::fabs(fixed) < loss_limit_)) non_finite_ = true;  // NaN fails the comparison too
    if (!non_finite_) loss_fixed_ += std::llround(fixed);
    correct_ += stats.correct;
    samples_ += stats.samples;
  }

  Result<ReduceResult> Finish(Communicator& comm, std::span<const int64_t> header_extra,
                              float* mean_grad) override {
    ReadFlags();
    internal::StepHeader h;
    h.extra.assign(header_extra.begin(), header_extra.end());
    h.non_finite = non_finite_;
    h.overflow = overflow_;
    h.unset_scale = std::any_of(exponents_.begin(), exponents_.end(),
                                [](int32_t e) { return e == kUnsetExponent; });
    h.bucket_max = local_max_;
    // This rank already knows the step will be redone or fail: its sums mean nothing.
    const bool convert = mean_grad != nullptr && !(h.non_finite || h.overflow || h.unset_scale);
    if (mean_grad == nullptr && comm.size() != 1) {
      return FailedPrecondition(
          "a step whose sums stayed with the caller needs a world of one, not " +
          std::to_string(comm.size()));
    }

    const int64_t stats[kStats] = {loss_fixed_, correct_, samples_};
    device_.CopyFromHost(acc_.data(), stats, sizeof(stats));
    int64_t totals[kStats];
    VF_RETURN_IF_ERROR(Combine(comm, convert, mean_grad, h, totals));

    // From here on `h` is the MAX over all ranks, so every rank takes the same branch.
    ReduceResult result;
    result.header_extra = h.extra;
    if (h.non_finite) {
      return NumericalError(
          "a gradient contains NaN or Inf (the loss diverged; lower the learning rate)");
    }
    if (h.overflow || h.unset_scale) {
      for (size_t i = 0; i < buckets_.size(); ++i) exponents_[i] = ExponentFor(h.bucket_max[i]);
      result.redo = true;
      return result;
    }
    result.totals.loss_sum = static_cast<double>(totals[0]) / kLossScale;
    result.totals.correct = totals[1];
    result.totals.samples = totals[2];
    // Next step's scale follows this step's magnitudes; an all-zero bucket keeps its scale.
    for (size_t i = 0; i < buckets_.size(); ++i) {
      if (h.bucket_max[i] > 0.f) exponents_[i] = ExponentFor(h.bucket_max[i]);
    }
    return result;
  }

  std::vector<int32_t> exponents() const override { return exponents_; }

  Status set_exponents(std::span<const int32_t> exponents) override {
    if (exponents.size() != exponents_.size()) {
      return InvalidArgument("state has " + std::to_string(exponents.size()) +
                             " reducer exponents, the model has " +
                             std::to_string(exponents_.size()) + " gradient buckets");
    }
    exponents_.assign(exponents.begin(), exponents.end());
    return Status::Ok();
  }

 private:
  static constexpr size_t kStats = 3;  // loss sum, correct predictions, samples
  static constexpr size_t kHead = 2 * kStats;

  // Sums the accumulators of all ranks, writes the mean gradient (when `convert`) and the summed
  // statistics, and turns `h` into the MAX of every rank's header.
  //
  // Alone, a rank converts its accumulator directly. Otherwise two collectives do it all:
  //  1. a reduce-scatter sums copies of the int64 accumulators, leaving each rank one shard of
  //     the total (the accumulator itself is left as it was);
  //  2. each rank converts its shard to float and appends its header, and an all-gather of
  //     these chunks gives everyone the whole mean gradient and every rank's header.
  // Each rank sends 1.5x the bytes of a float all-reduce (2x for an int64 all-reduce) and
  // converts 1/n of the values, and the header costs no collective of its own. The conversion
  // is a function of the integer sum alone, so the result has the same bits whichever rank
  // converts a value. The statistics stay integers: rank 0 owns them (shard 0 holds at least
  // kHead slots) and passes their bytes through its chunk's first kHead float slots, which the
  // all-gather copies without arithmetic. When the headers call for a redo or report a NaN, the
  // gathered gradient is discarded, so a rank that knew it would not be used skips converting.
  Status Combine(Communicator& comm, bool convert, float* mean_grad, internal::StepHeader& h,
                 int64_t* totals) {
    const double inv_v = 1.0 / static_cast<double>(virtual_nodes_);
    const size_t n = static_cast<size_t>(comm.size());
    if (n == 1) {
      if (convert) {
        for (size_t i = 0; i < buckets_.size(); ++i) {
          const GradientBucket& b = buckets_[i];
          device_.FixedToFloat(acc_.data() + kHead + b.offset, b.size, exponents_[i], inv_v,
                               mean_grad + b.offset);
        }
      }
      device_.CopyToHost(totals, acc_.data(), kStats * sizeof(int64_t));
      return Status::Ok();
    }
    const size_t shard = std::max((kHead + count_ + n - 1) / n, kHead);
    if (shard * n > capacity_) {
      return Internal("a world of " + std::to_string(n) + " ranks is larger than the job's " +
                      std::to_string(virtual_nodes_) + " virtual nodes");
    }
    const std::vector<int64_t> wire = h.ToWire();
    const size_t wire_bytes = wire.size() * sizeof(int64_t);
    const size_t chunk = shard + wire_bytes / sizeof(float);  // in float slots
    if (gathered_.size() < n * chunk) {
      gathered_.Reset();
      VF_ASSIGN_OR_RETURN(gathered_, DeviceBuffer<float>::Create(device_, n * chunk));
    }

    // The collectives work on a copy, so that acc_ keeps this rank's sums whatever they do:
    // after one fails (a member lost mid-step), the caller adds the nodes its next plan gives it
    // to the nodes it already has rather than computing them all again (see reducer.h).
    if (wire_.size() < shard * n) {
      wire_.Reset();
      VF_ASSIGN_OR_RETURN(wire_, DeviceBuffer<int64_t>::Create(device_, capacity_));
    }
    device_.Copy(wire_.data(), acc_.data(), shard * n * sizeof(int64_t));
    VF_RETURN_IF_ERROR(comm.ReduceScatter(wire_.data(), shard, ReduceOp::kSum)
                           .WithContext("gradient reduce-scatter"));
    const size_t rank = static_cast<size_t>(comm.rank());
    const size_t lo = rank * shard;
    const size_t hi = lo + shard;
    float* mine = gathered_.data() + rank * chunk;
    if (convert) {
      for (size_t i = 0; i < buckets_.size(); ++i) {
        const GradientBucket& b = buckets_[i];
        const size_t begin = std::max(lo, kHead + b.offset);
        const size_t end = std::min(hi, kHead + b.offset + b.size);
        if (begin >= end) continue;
        device_.FixedToFloat(wire_.data() + begin, end - begin, exponents_[i], inv_v,
                             mine + (begin - lo));
      }
    }
    static_assert(kHead * sizeof(float) == kStats * sizeof(int64_t));
    if (rank == 0) device_.Copy(mine, wire_.data(), kStats * sizeof(int64_t));
    device_.CopyFromHost(mine + shard, wire.data(), wire_bytes);
    VF_RETURN_IF_ERROR(
        comm.AllGather(gathered_.data(), chunk * sizeof(float)).WithContext("gradient all-gather"));

    std::vector<int64_t> merged = wire;
    std::vector<int64_t> theirs(wire.size());
    for (size_t c = 0; c < n; ++c) {
      device_.CopyToHost(theirs.data(), gathered_.data() + c * chunk + shard, wire_bytes);
      for (size_t k = 0; k < merged.size(); ++k) merged[k] = std::max(merged[k], theirs[k]);
      // Chunk c holds accumulator slots [c * shard, (c + 1) * shard); the gradient starts at
      // slot kHead and ends at kHead + count_, and the rest is statistics and padding.
      const size_t begin = std::max(c * shard, kHead);
      const size_t end = std::min((c + 1) * shard, kHead + count_);
      if (begin < end) {
        device_.Copy(mean_grad + (begin - kHead),
                     gathered_.data() + c * chunk + (begin - c * shard),
                     (end - begin) * sizeof(float));
      }
    }
    h.FromWire(merged);
    device_.CopyToHost(totals, gathered_.data(), kStats * sizeof(int64_t));
    return Status::Ok();
  }

  // The step's per-bucket maxima and overflow flag, from the device: a bucket whose maximum is
  // not finite (NaN bits sort above +Inf's) makes the step non-finite.
  void ReadFlags() {
    device_.CopyToHost(host_flags_.data(), flags_.data(), host_flags_.size() * sizeof(uint32_t));
    if (source_ == Source::kFolded) {
      for (size_t i = 0; i < buckets_.size(); ++i) {
        host_flags_[i] = std::max(host_flags_[i], folded_max_[i]);
      }
      if (folded_bad_) host_flags_[buckets_.size()] = 1;
    }
    constexpr uint32_t kInfBits = 0x7f800000u;
    local_max_.assign(buckets_.size(), 0.f);
    for (size_t i = 0; i < buckets_.size(); ++i) {
      if (host_flags_[i] >= kInfBits) {
        non_finite_ = true;
      } else {
        local_max_[i] = std::bit_cast<float>(host_flags_[i]);
      }
    }
    overflow_ = host_flags_[buckets_.size()] != 0;
  }

  Device& device_;
  std::vector<GradientBucket> buckets_;
  int virtual_nodes_;
  // The fixed-point loss sums of all V nodes must fit an int64: a node's loss beyond its share
  // of that has diverged as surely as a NaN, and is reported the same way.
  double loss_limit_ = std::ldexp(1.0, 62) / static_cast<double>(std::max(virtual_nodes_, 1));
  size_t count_ = 0;
  std::vector<int32_t> exponents_;
  std::vector<float> local_max_;
  size_t capacity_ = 0;           // elements of acc_
  DeviceBuffer<int64_t> acc_;     // statistics, gradient sums, padding (see Init)
  DeviceBuffer<int64_t> wire_;    // acc_'s copy that the collectives sum (see Combine)
  DeviceBuffer<float> gathered_;  // every rank's converted shard and header (see Combine)
  DeviceBuffer<uint32_t> flags_;  // per bucket: bits of max |gradient|; then overflow (Init)
  std::vector<uint32_t> host_flags_;
  std::vector<FoldBucket> plan_;          // buckets and this step's exponents (Begin)
  DeviceBuffer<FoldBucket> device_plan_;  // the same on the device
  bool non_finite_ = false;
  bool overflow_ = false;
  // Where this step's gradient sums come from: the nodes' Add calls or one AddFolded.
  enum class Source { kNone, kAdd, kFolded };
  Source source_ = Source::kNone;
  std::vector<uint32_t> folded_max_;  // AddFolded's per-bucket maxima
  bool folded_bad_ = false;
  int64_t loss_fixed_ = 0;
  int64_t correct_ = 0;
  int64_t samples_ = 0;
};

}  // namespace

Result<std::unique_ptr<Reducer>> CreateExactReducer(Device& device,
                                                    std::vector<GradientBucket> buckets,
                                                    int virtual_nodes) {
  auto r = std::make_unique<ExactReducer>(device, std::move(buckets), virtual_nodes);
  VF_RETURN_IF_ERROR(r->Init());
  return std::unique_ptr<Reducer>(std::move(r));
}

}  // namespace vf
