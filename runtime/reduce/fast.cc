// Fast reduction: float32 sums. Results depend on the mapping to tolerance only (invariant 5).
#include <cmath>

#include "runtime/reduce/header.h"
#include "runtime/reduce/reducer.h"

namespace vf {
namespace {

// Float32 reducer. Not thread-safe.
class FastReducer : public Reducer {
 public:
  FastReducer(Device& device, std::vector<GradientBucket> buckets, int virtual_nodes)
      : device_(device), buckets_(std::move(buckets)), virtual_nodes_(virtual_nodes) {
    for (const auto& b : buckets_) count_ = std::max(count_, b.offset + b.size);
  }

  Status Init() {
    // Gradient sum plus three slots of loss statistics, moved by one SUM collective.
    VF_ASSIGN_OR_RETURN(acc_, DeviceBuffer<float>::Create(device_, count_ + 3));
    return Status::Ok();
  }

  void Begin() override {
    device_.Fill(acc_.data(), 0.f, acc_.size());
    loss_sum_ = 0.0;
    correct_ = 0;
    samples_ = 0;
  }

  Status Add(const float* grad) override {
    device_.Axpy(1.f, grad, acc_.data(), count_);
    return Status::Ok();
  }

  float* sum_in_place() override { return acc_.data(); }

  void AddLoss(const LossStats& stats) override {
    loss_sum_ += stats.loss_sum;
    correct_ += stats.correct;
    samples_ += stats.samples;
  }

  Result<ReduceResult> Finish(Communicator& comm, std::span<const int64_t> header_extra,
                              float* mean_grad) override {
    internal::StepHeader h;
    h.extra.assign(header_extra.begin(), header_extra.end());
    // NaN and Inf survive summation, so one pass over the local sum finds any virtual node's.
    h.non_finite = !std::isfinite(device_.MaxAbs(acc_.data(), count_)) || !std::isfinite(loss_sum_);
    VF_RETURN_IF_ERROR(h.AllReduce(comm));
    ReduceResult result;
    result.header_extra = h.extra;
    if (h.non_finite) {
      return NumericalError(
          "a gradient contains NaN or Inf (the loss diverged; lower the learning rate)");
    }
    const float stats[3] = {static_cast<float>(loss_sum_), static_cast<float>(correct_),
                            static_cast<float>(samples_)};
    device_.CopyFromHost(acc_.data() + count_, stats, sizeof(stats));
    VF_RETURN_IF_ERROR(comm.AllReduce(acc_.data(), acc_.size(), ReduceOp::kSum)
                           .WithContext("gradient all-reduce"));
    device_.Copy(mean_grad, acc_.data(), count_ * sizeof(float));
    device_.Scale(mean_grad, 1.f / static_cast<float>(virtual_nodes_), count_);
    float totals[3];
    device_.CopyToHost(totals, acc_.data() + count_, sizeof(totals));
    result.totals.loss_sum = totals[0];
    result.totals.correct = std::llround(totals[1]);
    result.totals.samples = std::llround(totals[2]);
    return result;
  }

  std::vector<int32_t> exponents() const override { return {}; }
  Status set_exponents(std::span<const int32_t> exponents) override {
    if (!exponents.empty()) {
      return InvalidArgument("state carries exact-reduction scales but the job uses fast mode");
    }
    return Status::Ok();
  }

 private:
  Device& device_;
  std::vector<GradientBucket> buckets_;
  int virtual_nodes_;
  size_t count_ = 0;
  DeviceBuffer<float> acc_;
  double loss_sum_ = 0.0;
  int64_t correct_ = 0;
  int64_t samples_ = 0;
};

}  // namespace

Result<std::unique_ptr<Reducer>> CreateFastReducer(Device& device,
                                                   std::vector<GradientBucket> buckets,
                                                   int virtual_nodes) {
  auto r = std::make_unique<FastReducer>(device, std::move(buckets), virtual_nodes);
  VF_RETURN_IF_ERROR(r->Init());
  return std::unique_ptr<Reducer>(std::move(r));
}

}  // namespace vf
