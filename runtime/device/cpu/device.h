// The CPU backend of Device: OpenBLAS for matrix products, plain loops for the rest.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/device.h"

namespace vf {

// The host CPU as a Device; every kernel runs synchronously on the calling thread (plus
// OpenBLAS's threads inside Gemm). Not thread-safe: one thread drives a device.
class CpuDevice : public Device {
 public:
  // `threads` OpenBLAS threads (at least 1). OpenBLAS keeps the count process-wide, so the
  // last CpuDevice constructed decides it for all of them.
  explicit CpuDevice(int threads);

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string Name() const override;

  Result<void*> Allocate(size_t bytes) override;
  void Free(void* ptr) noexcept override;
  void CopyFromHost(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  void Copy(void* dst, const void* src, size_t bytes) override;
  void Fill(float* x, float value, size_t n) override;
  void FillInt64(int64_t* x, int64_t value, size_t n) override;
  void Synchronize() override {}
  // Inside a block this device allocated (it keeps their ranges), though all of it is host
  // memory: callers that stage the device's own memory do so on the CPU too, which tests use.
  bool OwnsMemory(const void* p) const override;
  // Lanes run one after another here; more than one only exercises a caller's lane logic.
  void Tune(const DeviceTuning& tuning) override {
    lanes_ = tuning.lanes > 0 ? std::min(tuning.lanes, kMaxLanes) : 1;
  }
  int Lanes() const override { return lanes_; }

  void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override;
  void NormalizePixels(const uint8_t* in, size_t n, float scale, float shift, float* out) override;
  void AddBiasActivate(float* y, const float* bias, int rows, int cols, bool relu) override;
  void ReluBackward(float* dy, const float* y, size_t n) override;
  void SumRows(const float* x, int rows, int cols, bool add, float* out) override;
  // Labels are validated by the dataset loader. A label outside [0, cols) is a bug: it asserts
  // in debug builds and otherwise makes that row's loss and gradient NaN, so the step fails
  // the NaN check of the reduction instead of training on garbage.
  LossStats SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                                float grad_scale, float* dlogits) override;
  void SoftmaxCrossEntropyInto(const float* logits, const int32_t* labels, int rows, int cols,
                               float grad_scale, float* dlogits, LossStats* stats) override;

  float MaxAbs(const float* x, size_t n) override;
  // Assumes the default round-to-nearest-even floating-point mode, which the runtime never
  // changes.
  bool AccumulateFixed(const float* x, size_t n, int exponent, int64_t limit,
                       int64_t* acc) override;
  void MaxAbsInto(const float* x, size_t n, uint32_t* max_bits) override;
  void AccumulateFixedInto(const float* x, size_t n, int exponent, int64_t limit, int64_t* acc,
                           uint32_t* bad) override;
  void MaxAbsAccumulateFixedInto(const float* x, size_t n, int exponent, int64_t limit,
                                 int64_t* acc, uint32_t* max_bits, uint32_t* bad) override;
  void FixedToFloat(const int64_t* acc, size_t n, int exponent, double scale, float* out) override;

  void Axpy(float alpha, const float* x, float* y, size_t n) override;
  void Scale(float* x, float alpha, size_t n) override;

  void SgdMomentumStep(float* param, const float* grad, float* velocity, size_t n,
                       const SgdUpdate& h) override;
  void AdamWStep(float* param, const float* grad, float* m, float* v, size_t n,
                 const AdamWUpdate& h) override;

 private:
  int threads_;
  int lanes_ = 1;
  std::map<uintptr_t, size_t> allocations_;  // address -> bytes of every live Allocate
  std::vector<float> column_sums_;  // SumRows's column sums when it adds them to its output
};

}  // namespace vf
