// Optimizers: the update rule applied to the (already reduced) mean gradient. Their state lives
// in "slots" owned by the caller, so it can be serialized and sent to joiners (invariant 6).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "runtime/device.h"
#include "runtime/job/spec.h"
#include "runtime/status.h"

namespace vf {

// An update rule. Stateless apart from its hyper-parameters; thread-compatible.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // Number of per-parameter state vectors: 1 for SGD (velocity), 2 for AdamW (m, v).
  virtual int slot_count() const = 0;
  // Applies update number `step` (1-based) to `n` parameters on `device`.
  virtual void Apply(Device& device, float* params, const float* grad,
                     std::span<float* const> slots, size_t n, int64_t step) const = 0;
};

// kInvalidArgument for an unknown optimizer name.
Result<std::unique_ptr<Optimizer>> CreateOptimizer(const OptimizerSpec& spec);

}  // namespace vf
