// Reference models. A model computes one virtual node's gradient on its device; it never sees
// other virtual nodes, ranks or the reducer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/job/spec.h"
#include "runtime/status.h"

namespace vf {

// One named tensor inside the flat parameter vector.
struct ParameterTensor {
  std::string name;
  size_t offset = 0;
  size_t size = 0;
  std::vector<int> shape;
};

// Whether ForwardBackward writes the gradient or adds it to what its output holds.
enum class GradientOutput { kWrite, kAdd };

// A trainable model bound to one device. Parameters and gradients are flat float vectors in
// device memory, laid out as tensors() says. Holds scratch memory sized for the largest batch
// it has seen, so memory grows with the micro-batch, never with the global batch.
// Not thread-safe.
class Model {
 public:
  virtual ~Model() = default;

  virtual std::string Describe() const = 0;
  virtual const std::vector<ParameterTensor>& tensors() const = 0;
  virtual size_t parameter_count() const = 0;
  virtual int input_size() const = 0;
  virtual int num_classes() const = 0;

  // Writes the deterministic initial parameters for `seed` into host memory.
  virtual void InitializeHost(uint64_t seed, float* params) const = 0;

  // Loss over a batch of `batch` samples and the gradient of the mean loss with respect to the
  // parameters, written to `grad`, or added to it (how the sum rounds is the device's: fast
  // reduction only). x is [batch, input_size], labels [batch]. The batch's statistics go to
  // *stats in the device's memory: the work is only queued, and a GPU runs on while the host
  // prepares the next batch.
  virtual Status ForwardBackward(const float* params, const float* x, const int32_t* labels,
                                 int batch, GradientOutput output, float* grad,
                                 LossStats* stats) = 0;
  // Loss and accuracy only.
  virtual Result<LossStats> Evaluate(const float* params, const float* x, const int32_t* labels,
                                     int batch) = 0;
};

// Builds the model named by `spec` on `device`. Unknown names are kInvalidArgument.
Result<std::unique_ptr<Model>> CreateModel(const ModelSpec& spec, int input_size, int num_classes,
                                           Device& device);

}  // namespace vf
