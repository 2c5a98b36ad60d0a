// Exact reduction: per-bucket fixed point in int64 (see reducer.h for the scheme).
#include <algorithm>
#include <cmath>
#include <string>

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
    // The accumulator carries the gradient and, in its last three slots, the loss statistics,
    // so one SUM collective moves both.
    VF_ASSIGN_OR_RETURN(acc_, DeviceBuffer<int64_t>::Create(device_, count_ + 3));
    return Status::Ok();
  }

  void Begin() override {
    device_.FillInt64(acc_.data(), 0, acc_.size());
    std::fill(local_max_.begin(), local_max_.end(), 0.f);
    non_finite_ = false;
    overflow_ = false;
    loss_fixed_ = 0;
    correct_ = 0;
    samples_ = 0;
  }

  Status Add(const float* grad, const LossStats& stats) override {
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const GradientBucket& b = buckets_[i];
      const float m = device_.MaxAbs(grad + b.offset, b.size);
      if (!std::isfinite(m)) {
        non_finite_ = true;
        continue;
      }
      local_max_[i] = std::max(local_max_[i], m);
      // With no scale yet this pass only measures; the step is recomputed once the scale is
      // agreed (see reducer.h).
      if (exponents_[i] == kUnsetExponent || overflow_) continue;
      if (!device_.AccumulateFixed(grad + b.offset, b.size, exponents_[i], kFixedPointLimit,
                                   acc_.data() + b.offset)) {
        overflow_ = true;
      }
    }
    if (!std::isfinite(stats.loss_sum)) non_finite_ = true;
    if (!non_finite_) loss_fixed_ += std::llround(stats.loss_sum * kLossScale);
    correct_ += stats.correct;
    samples_ += stats.samples;
    return Status::Ok();
  }

  Result<ReduceResult> Finish(Communicator& comm, std::span<const int64_t> header_extra,
                              float* mean_grad) override {
    internal::StepHeader h;
    h.extra.assign(header_extra.begin(), header_extra.end());
    h.non_finite = non_finite_;
    h.overflow = overflow_;
    h.unset_scale = std::any_of(exponents_.begin(), exponents_.end(),
                                [](int32_t e) { return e == kUnsetExponent; });
    h.bucket_max = local_max_;
    VF_RETURN_IF_ERROR(h.AllReduce(comm));

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

    const int64_t stats[3] = {loss_fixed_, correct_, samples_};
    device_.CopyFromHost(acc_.data() + count_, stats, sizeof(stats));
    VF_RETURN_IF_ERROR(comm.AllReduce(acc_.data(), acc_.size(), ReduceOp::kSum)
                           .WithContext("gradient all-reduce"));
    const double inv_v = 1.0 / static_cast<double>(virtual_nodes_);
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const GradientBucket& b = buckets_[i];
      device_.FixedToFloat(acc_.data() + b.offset, b.size, exponents_[i], inv_v,
                           mean_grad + b.offset);
    }
    int64_t totals[3];
    device_.CopyToHost(totals, acc_.data() + count_, sizeof(totals));
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
  Device& device_;
  std::vector<GradientBucket> buckets_;
  int virtual_nodes_;
  size_t count_ = 0;
  std::vector<int32_t> exponents_;
  std::vector<float> local_max_;
  DeviceBuffer<int64_t> acc_;
  bool non_finite_ = false;
  bool overflow_ = false;
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
