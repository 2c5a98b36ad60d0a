#include "runtime/models/mlp.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "runtime/data/dataset.h"

namespace vf {
namespace {
constexpr uint64_t kInitTag = 0x494e4954;  // "INIT"
}  // namespace

Mlp::Mlp(std::vector<int> layer_sizes, Device& device)
    : sizes_(std::move(layer_sizes)), device_(device) {
  size_t offset = 0;
  for (size_t l = 0; l + 1 < sizes_.size(); ++l) {
    const size_t in = static_cast<size_t>(sizes_[l]);
    const size_t out = static_cast<size_t>(sizes_[l + 1]);
    tensors_.push_back(
        {"layer" + std::to_string(l) + ".weight", offset, in * out, {sizes_[l], sizes_[l + 1]}});
    offset += in * out;
    tensors_.push_back({"layer" + std::to_string(l) + ".bias", offset, out, {sizes_[l + 1]}});
    offset += out;
  }
  parameter_count_ = offset;
}

std::string Mlp::Describe() const {
  std::ostringstream s;
  s << "mlp ";
  for (size_t i = 0; i < sizes_.size(); ++i) s << (i ? " -> " : "") << sizes_[i];
  s << " (" << parameter_count_ << " parameters)";
  return s.str();
}

void Mlp::InitializeHost(uint64_t seed, float* params) const {
  // PyTorch's nn.Linear default: weights and biases uniform in +-1/sqrt(fan_in), drawn from a
  // counter-based generator so every rank and every build of the job starts identically.
  for (size_t t = 0; t < tensors_.size(); ++t) {
    const size_t layer = t / 2;
    const double bound = 1.0 / std::sqrt(static_cast<double>(sizes_[layer]));
    CounterRng rng(MixKey(seed, kInitTag, t));
    float* p = params + tensors_[t].offset;
    for (size_t i = 0; i < tensors_[t].size; ++i) {
      p[i] = static_cast<float>((2.0 * rng.Uniform() - 1.0) * bound);
    }
  }
}

Status Mlp::Reserve(int batch) {
  if (batch <= reserved_batch_) return Status::Ok();
  const size_t layers = sizes_.size() - 1;
  activations_.clear();
  activations_.resize(layers + 1);
  size_t widest = 0;
  for (size_t l = 1; l <= layers; ++l) {
    const size_t n = static_cast<size_t>(batch) * static_cast<size_t>(sizes_[l]);
    VF_ASSIGN_OR_RETURN(activations_[l], DeviceBuffer<float>::Create(device_, n));
    widest = std::max(widest, n);
  }
  VF_ASSIGN_OR_RETURN(delta_a_, DeviceBuffer<float>::Create(device_, widest));
  VF_ASSIGN_OR_RETURN(delta_b_, DeviceBuffer<float>::Create(device_, widest));
  reserved_batch_ = batch;
  return Status::Ok();
}

void Mlp::Forward(const float* params, const float* x, int batch) {
  const size_t layers = sizes_.size() - 1;
  const float* in = x;
  for (size_t l = 0; l < layers; ++l) {
    float* out = activations_[l + 1].data();
    device_.Gemm(false, false, batch, sizes_[l + 1], sizes_[l], 1.f, in, Weight(params, l), 0.f,
                 out);
    device_.AddBiasActivate(out, Bias(params, l), batch, sizes_[l + 1],
                            /*relu=*/l + 1 < layers);
    in = out;
  }
}

Status Mlp::ForwardBackward(const float* params, const float* x, const int32_t* labels, int batch,
                            GradientOutput output, float* grad, LossStats* stats) {
  VF_RETURN_IF_ERROR(Reserve(batch));
  Forward(params, x, batch);
  const size_t layers = sizes_.size() - 1;
  float* delta = delta_a_.data();
  float* next = delta_b_.data();
  // Gradient of the mean loss over the batch: each sample's share is 1/batch.
  device_.SoftmaxCrossEntropyInto(activations_[layers].data(), labels, batch, sizes_.back(),
                                  1.f / static_cast<float>(batch), delta, stats);
  for (size_t l = layers; l-- > 0;) {
    const float* input = l == 0 ? x : activations_[l].data();
    float* dw = grad + tensors_[2 * l].offset;
    float* db = grad + tensors_[2 * l + 1].offset;
    // Adding through the product's beta saves clearing the weight gradient and a pass over it.
    const bool add = output == GradientOutput::kAdd;
    device_.Gemm(true, false, sizes_[l], sizes_[l + 1], batch, 1.f, input, delta, add ? 1.f : 0.f,
                 dw);
    device_.SumRows(delta, batch, sizes_[l + 1], add, db);
    if (l > 0) {
      device_.Gemm(false, true, batch, sizes_[l], sizes_[l + 1], 1.f, delta, Weight(params, l), 0.f,
                   next);
      device_.ReluBackward(next, activations_[l].data(),
                           static_cast<size_t>(batch) * static_cast<size_t>(sizes_[l]));
      std::swap(delta, next);
    }
  }
  return Status::Ok();
}

Result<LossStats> Mlp::Evaluate(const float* params, const float* x, const int32_t* labels,
                                int batch) {
  VF_RETURN_IF_ERROR(Reserve(batch));
  Forward(params, x, batch);
  LossStats stats = device_.SoftmaxCrossEntropy(activations_[sizes_.size() - 1].data(), labels,
                                                batch, sizes_.back(), 0.f, nullptr);
  stats.samples = batch;
  return stats;
}

Result<std::unique_ptr<Model>> CreateModel(const ModelSpec& spec, int input_size, int num_classes,
                                           Device& device) {
  if (spec.name == "mlp") {
    std::vector<int> sizes;
    sizes.push_back(input_size);
    sizes.insert(sizes.end(), spec.hidden_sizes.begin(), spec.hidden_sizes.end());
    sizes.push_back(num_classes);
    return std::unique_ptr<Model>(std::make_unique<Mlp>(std::move(sizes), device));
  }
  return InvalidArgument("unknown model '" + spec.name + "' (known: mlp)");
}

}  // namespace vf
