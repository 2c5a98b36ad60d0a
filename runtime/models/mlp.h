// Multi-layer perceptron: Linear -> ReLU -> ... -> Linear, softmax cross-entropy loss.
#pragma once

#include <memory>
#include <vector>

#include "runtime/models/model.h"

namespace vf {

// The reference model (Fashion-MNIST: 784 -> 512 -> 256 -> 10). GEMMs and elementwise kernels
// go through the Device. Not thread-safe.
class Mlp : public Model {
 public:
  Mlp(std::vector<int> layer_sizes, Device& device);

  std::string Describe() const override;
  const std::vector<ParameterTensor>& tensors() const override { return tensors_; }
  size_t parameter_count() const override { return parameter_count_; }
  int input_size() const override { return sizes_.front(); }
  int num_classes() const override { return sizes_.back(); }
  void InitializeHost(uint64_t seed, float* params) const override;
  Status ForwardBackward(const float* params, const float* x, const int32_t* labels, int batch,
                         GradientOutput output, float* grad, LossStats* stats) override;
  Result<LossStats> Evaluate(const float* params, const float* x, const int32_t* labels,
                             int batch) override;

 private:
  Status Reserve(int batch);
  // Runs the layers; activations_[l] holds layer l's output for l >= 1.
  void Forward(const float* params, const float* x, int batch);
  const float* Weight(const float* params, size_t layer) const {
    return params + tensors_[2 * layer].offset;
  }
  const float* Bias(const float* params, size_t layer) const {
    return params + tensors_[2 * layer + 1].offset;
  }

  std::vector<int> sizes_;  // input, hidden..., classes
  Device& device_;
  std::vector<ParameterTensor> tensors_;
  size_t parameter_count_ = 0;
  int reserved_batch_ = 0;
  std::vector<DeviceBuffer<float>> activations_;  // [0] unused: the input is borrowed
  DeviceBuffer<float> delta_a_, delta_b_;
};

}  // namespace vf
