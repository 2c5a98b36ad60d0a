#include "runtime/optim/optimizer.h"

#include <cmath>

namespace vf {
namespace {

// SGD with momentum and optional Nesterov, PyTorch semantics (weight decay added to the
// gradient). Thread-compatible.
class Sgd : public Optimizer {
 public:
  explicit Sgd(const OptimizerSpec& s)
      : h_{static_cast<float>(s.learning_rate), static_cast<float>(s.momentum),
           static_cast<float>(s.weight_decay), s.nesterov} {}
  std::string name() const override { return "sgd"; }
  int slot_count() const override { return 1; }
  void Apply(Device& device, float* params, const float* grad, std::span<float* const> slots,
             size_t n, int64_t /*step*/) const override {
    device.SgdMomentumStep(params, grad, slots[0], n, h_);
  }

 private:
  SgdUpdate h_;
};

// AdamW (decoupled weight decay, Loshchilov & Hutter). Thread-compatible.
class AdamW : public Optimizer {
 public:
  explicit AdamW(const OptimizerSpec& s) : s_(s) {}
  std::string name() const override { return "adamw"; }
  int slot_count() const override { return 2; }
  void Apply(Device& device, float* params, const float* grad, std::span<float* const> slots,
             size_t n, int64_t step) const override {
    AdamWUpdate h;
    h.learning_rate = static_cast<float>(s_.learning_rate);
    h.beta1 = static_cast<float>(s_.beta1);
    h.beta2 = static_cast<float>(s_.beta2);
    h.epsilon = static_cast<float>(s_.epsilon);
    h.weight_decay = static_cast<float>(s_.weight_decay);
    // Bias corrections in double: beta^t underflows gracefully and is exact for small t.
    h.bias_correction1 = static_cast<float>(1.0 - std::pow(s_.beta1, static_cast<double>(step)));
    h.bias_correction2 = static_cast<float>(1.0 - std::pow(s_.beta2, static_cast<double>(step)));
    device.AdamWStep(params, grad, slots[0], slots[1], n, h);
  }

 private:
  OptimizerSpec s_;
};

}  // namespace

Result<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerSpec& spec) {
  if (spec.name == "sgd") return std::unique_ptr<Optimizer>(std::make_unique<Sgd>(spec));
  if (spec.name == "adamw") return std::unique_ptr<Optimizer>(std::make_unique<AdamW>(spec));
  return InvalidArgument("unknown optimizer '" + spec.name + "' (known: sgd, adamw)");
}

}  // namespace vf
