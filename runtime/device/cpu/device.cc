#include "runtime/device/cpu/device.h"

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>

namespace vf {
namespace {

constexpr size_t kAlignment = 64;

// Adding 1.5 * 2^52 to a double v with |v| <= 2^51 lands in [2^52, 2^53] where doubles are
// spaced exactly 1 apart, so the addition itself rounds v to an integer (half to even) and the
// difference of the bit patterns is that integer. Unlike a double->int64 conversion this is
// plain SIMD arithmetic on every x86-64 level, so the loop vectorises.
constexpr double kMagic = 0x1.8p52;
constexpr int64_t kMagicBits = std::bit_cast<int64_t>(kMagic);
constexpr int64_t kMagicRange = int64_t{1} << 51;

// Exact power of two for the exponents that can occur. Above 1000 every non-zero float scales
// past any int64 limit and zero stays zero, so clamping keeps the answer and avoids an infinite
// factor (0 * inf would be NaN).
double PowerOfTwo(int exponent) { return std::ldexp(1.0, std::min(exponent, 1000)); }

// The largest double that is <= limit, so that comparing doubles never lets through a value
// above the integer limit.
double LargestDoubleAtMost(int64_t limit) {
  double d = static_cast<double>(limit);
  if (d >= 0x1p63 || static_cast<int64_t>(d) > limit) d = std::nextafter(d, 0.0);
  return d;
}

// The sums wrap instead of being undefined on int64 overflow; the caller's limit keeps them in
// range, and an out-of-range element leaves acc unspecified anyway.
inline int64_t WrappingAdd(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// The exact kernels below use only exact operations (a power-of-two scale, integer adds and
// compares), so every instruction-set clone gives bitwise the same result; the baseline x86-64
// build is several times slower on them. Clones need x86 and glibc's ifunc.
#if defined(__x86_64__) && defined(__GLIBC__)
#define VF_EXACT_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define VF_EXACT_CLONES
#endif

VF_EXACT_CLONES bool AccumulateFixedFast(const float* __restrict x, size_t n, double scale,
                                         double limit, int64_t* __restrict acc) {
  // Branch-free so that the loop vectorises; out-of-range elements only set the flag.
  uint64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]) * scale;
    bad |= !(std::fabs(v) <= limit);  // NaN fails the comparison too
    // Unsigned arithmetic: an out-of-range v (flagged above) must wrap, not overflow.
    const uint64_t q = std::bit_cast<uint64_t>(v + kMagic) - static_cast<uint64_t>(kMagicBits);
    acc[i] = WrappingAdd(acc[i], static_cast<int64_t>(q));
  }
  return bad == 0;
}

// MaxAbsBits and AccumulateFixedFast in one pass, for the exact reducer, which needs both for
// every virtual node's gradient: reading it once saves a fifth of the time. No element is
// checked against the limit: all are within it exactly when the largest is, which the caller
// tests once. An element beyond it (NaN included) adds garbage, harmlessly: the wrapping sum
// is well defined, and the caller flags the accumulator as unspecified.
VF_EXACT_CLONES uint32_t MaxAbsAccumulateFixedFast(const float* __restrict x, size_t n,
                                                   double scale, int64_t* __restrict acc) {
  uint32_t best = 0;
  for (size_t i = 0; i < n; ++i) {
    best = std::max(best, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
    const double v = static_cast<double>(x[i]) * scale;
    const uint64_t q = std::bit_cast<uint64_t>(v + kMagic) - static_cast<uint64_t>(kMagicBits);
    acc[i] = WrappingAdd(acc[i], static_cast<int64_t>(q));
  }
  return best;
}

// For limits above 2^51, where the magic-number rounding no longer applies. Adding and
// subtracting 2^52 (with v's sign) rounds half to even the same way; from 2^52 up every double
// is an integer already.
VF_EXACT_CLONES bool AccumulateFixedWide(const float* __restrict x, size_t n, double scale,
                                         double limit, int64_t* __restrict acc) {
  uint64_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(x[i]) * scale;
    const double a = std::fabs(v);
    const bool ok = a <= limit;  // NaN fails too; limit < 2^63 keeps the conversion defined
    bad |= !ok;
    const double shift = std::copysign(0x1p52, v);
    const double r = a < 0x1p52 ? (v + shift) - shift : v;
    acc[i] = WrappingAdd(acc[i], static_cast<int64_t>(ok ? r : 0.0));
  }
  return bad == 0;
}

// Converting int64 to double rounds the same way in scalar and vector instructions, and the
// multiplications are single IEEE operations, so the clones agree bit for bit here too.
VF_EXACT_CLONES void FixedToFloatLoop(const int64_t* __restrict acc, size_t n, double unit,
                                      double scale, float* __restrict out) {
  for (size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(static_cast<double>(acc[i]) * unit * scale);
  }
}

// On the bit patterns of |x|, unsigned order is float order, every NaN is above +Inf, and an
// integer max vectorises where a float max that has to honour NaN does not.
VF_EXACT_CLONES uint32_t MaxAbsBits(const float* __restrict x, size_t n) {
  uint32_t best = 0;
  for (size_t i = 0; i < n; ++i) {
    best = std::max(best, std::bit_cast<uint32_t>(x[i]) & 0x7fffffffu);
  }
  return best;
}

}  // namespace

CpuDevice::CpuDevice(int threads) : threads_(std::max(threads, 1)) {
  // Workers run with one thread: several workers share a machine's cores, and a result must not
  // depend on how OpenBLAS partitions a product between its threads.
  openblas_set_num_threads(threads_);
}

std::string CpuDevice::Name() const {
  // The kernel set decides the products' bits (and speed), so the name carries it: OpenBLAS
  // picks it by CPU model, or from OPENBLAS_CORETYPE.
  const char* core = openblas_get_corename();
  const std::string blas =
      core != nullptr && *core != '\0' ? "OpenBLAS " + std::string(core) : "OpenBLAS";
  return "cpu (" + blas + ", " + std::to_string(threads_) +
         (threads_ == 1 ? " thread)" : " threads)");
}

Result<void*> CpuDevice::Allocate(size_t bytes) {
  // aligned_alloc wants a multiple of the alignment, and a zero-byte request still gets a
  // unique pointer.
  if (bytes > std::numeric_limits<size_t>::max() - kAlignment) {
    return Internal("cpu device: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  const size_t rounded = std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) {
    return Internal("cpu device: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  std::memset(p, 0, rounded);
  allocations_[reinterpret_cast<uintptr_t>(p)] = rounded;
  return p;
}

void CpuDevice::Free(void* ptr) noexcept {
  allocations_.erase(reinterpret_cast<uintptr_t>(ptr));
  std::free(ptr);
}

bool CpuDevice::OwnsMemory(const void* p) const {
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return false;
  --it;
  return address < it->first + it->second;
}

// memcpy with a null pointer is undefined even for zero bytes, and empty buffers may be null.
void CpuDevice::CopyFromHost(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}
void CpuDevice::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
}
void CpuDevice::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes != 0) std::memmove(dst, src, bytes);
}

void CpuDevice::Fill(float* x, float value, size_t n) { std::fill_n(x, n, value); }
void CpuDevice::FillInt64(int64_t* x, int64_t value, size_t n) { std::fill_n(x, n, value); }

void CpuDevice::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                     const float* a, const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  // Row-major leading dimensions are the stored row lengths: a is [m,k] or, transposed, [k,m].
  // BLAS rejects a leading dimension below 1 even when k is 0.
  const int lda = std::max(transpose_a ? m : k, 1);
  const int ldb = std::max(transpose_b ? k : n, 1);
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
}

void CpuDevice::NormalizePixels(const uint8_t* in, size_t n, float scale, float shift, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * scale - shift;
}

void CpuDevice::AddBiasActivate(float* y, const float* bias, int rows, int cols, bool relu) {
  for (int r = 0; r < rows; ++r) {
    float* __restrict row = y + static_cast<size_t>(r) * cols;
    if (relu) {
      // `v < 0` rather than `v > 0` so that NaN propagates and is caught by the reduction.
      for (int c = 0; c < cols; ++c) {
        const float v = row[c] + bias[c];
        row[c] = v < 0.f ? 0.f : v;
      }
    } else {
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
  }
}

void CpuDevice::ReluBackward(float* dy, const float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) dy[i] = y[i] > 0.f ? dy[i] : 0.f;
}

void CpuDevice::SumRows(const float* x, int rows, int cols, bool add, float* out) {
  const auto n = static_cast<size_t>(std::max(cols, 0));
  if (add && column_sums_.size() < n) column_sums_.resize(n);
  float* __restrict sums = add ? column_sums_.data() : out;
  // Row by row so that each column is summed in increasing r while the inner loop runs
  // across columns and vectorises without reordering any sum.
  std::fill_n(sums, n, 0.f);
  for (int r = 0; r < rows; ++r) {
    const float* __restrict row = x + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) sums[c] += row[c];
  }
  if (add) {
    for (size_t c = 0; c < n; ++c) out[c] += sums[c];
  }
}

LossStats CpuDevice::SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                         int cols, float grad_scale, float* dlogits) {
  LossStats stats;
  stats.samples = std::max(rows, 0);
  if (cols <= 0) return stats;
  const double scale = grad_scale;
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + static_cast<size_t>(r) * cols;
    float* grad = dlogits == nullptr ? nullptr : dlogits + static_cast<size_t>(r) * cols;
    const int32_t label = labels[r];
    assert(label >= 0 && label < cols && "label out of range");
    const bool valid = label >= 0 && label < cols;

    // The strict comparison makes the first maximum the prediction.
    int argmax = 0;
    for (int c = 1; c < cols; ++c) {
      if (row[c] > row[argmax]) argmax = c;
    }
    // Subtracting the maximum keeps exp() below 1, so huge logits cannot overflow.
    const double max = row[argmax];
    double sum = 0.0;
    for (int c = 0; c < cols; ++c) sum += std::exp(row[c] - max);
    const double log_sum = std::log(sum);

    if (!valid) {
      stats.loss_sum += std::numeric_limits<double>::quiet_NaN();
      if (grad != nullptr) std::fill_n(grad, cols, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    // logsumexp - logit[label], with the maximum cancelled out of both terms.
    stats.loss_sum += log_sum - (row[label] - max);
    if (argmax == label) ++stats.correct;
    if (grad != nullptr) {
      const double inv_sum = 1.0 / sum;
      for (int c = 0; c < cols; ++c) {
        const double p = std::exp(row[c] - max) * inv_sum;
        grad[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) * scale);
      }
    }
  }
  return stats;
}

void CpuDevice::SoftmaxCrossEntropyInto(const float* logits, const int32_t* labels, int rows,
                                        int cols, float grad_scale, float* dlogits,
                                        LossStats* stats) {
  *stats = SoftmaxCrossEntropy(logits, labels, rows, cols, grad_scale, dlogits);
}

float CpuDevice::MaxAbs(const float* x, size_t n) {
  const uint32_t bits = MaxAbsBits(x, n);
  if (bits > 0x7f800000u) return std::numeric_limits<float>::quiet_NaN();
  return std::bit_cast<float>(bits);
}

void CpuDevice::MaxAbsInto(const float* x, size_t n, uint32_t* max_bits) {
  *max_bits = std::max(*max_bits, MaxAbsBits(x, n));
}

bool CpuDevice::AccumulateFixed(const float* x, size_t n, int exponent, int64_t limit,
                                int64_t* acc) {
  // The product of a float and a power of two is exact in double, so the only rounding is the
  // final one to an integer.
  const double scale = PowerOfTwo(exponent);
  if (limit <= kMagicRange) {
    return AccumulateFixedFast(x, n, scale, static_cast<double>(limit), acc);
  }
  return AccumulateFixedWide(x, n, scale, LargestDoubleAtMost(limit), acc);
}

void CpuDevice::AccumulateFixedInto(const float* x, size_t n, int exponent, int64_t limit,
                                    int64_t* acc, uint32_t* bad) {
  if (!AccumulateFixed(x, n, exponent, limit, acc)) *bad = 1;
}

void CpuDevice::MaxAbsAccumulateFixedInto(const float* x, size_t n, int exponent, int64_t limit,
                                          int64_t* acc, uint32_t* max_bits, uint32_t* bad) {
  if (limit > kMagicRange) {  // the wide path has no one-pass form: the two calls
    Device::MaxAbsAccumulateFixedInto(x, n, exponent, limit, acc, max_bits, bad);
    return;
  }
  const double scale = PowerOfTwo(exponent);
  const uint32_t bits = MaxAbsAccumulateFixedFast(x, n, scale, acc);
  *max_bits = std::max(*max_bits, bits);
  // Scaling by a power of two is exact and monotonic, so this is AccumulateFixed's test of
  // every element. NaN bits sort above +Inf's, and an infinite maximum fails the comparison.
  constexpr uint32_t kInfBits = 0x7f800000u;
  if (bits >= kInfBits ||
      !(static_cast<double>(std::bit_cast<float>(bits)) * scale <= static_cast<double>(limit))) {
    *bad = 1;
  }
}

void CpuDevice::FixedToFloat(const int64_t* acc, size_t n, int exponent, double scale, float* out) {
  // The operation order is part of the format: (acc * 2^-exponent) * scale, then one rounding
  // to float. Every backend does the same.
  FixedToFloatLoop(acc, n, std::ldexp(1.0, -exponent), scale, out);
}

// Plain loops rather than cblas_saxpy/sscal: OpenBLAS picks its kernel (and whether it fuses
// multiply-adds) by CPU model, and these results must not depend on the machine.
void CpuDevice::Axpy(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void CpuDevice::Scale(float* x, float alpha, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] *= alpha;
}

void CpuDevice::SgdMomentumStep(float* param, const float* grad, float* velocity, size_t n,
                                const SgdUpdate& h) {
  const float lr = h.learning_rate;
  const float mu = h.momentum;
  const float wd = h.weight_decay;
  if (h.nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] + wd * param[i];
      const float v = mu * velocity[i] + g;
      velocity[i] = v;
      param[i] -= lr * (g + mu * v);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float v = mu * velocity[i] + (grad[i] + wd * param[i]);
      velocity[i] = v;
      param[i] -= lr * v;
    }
  }
}

void CpuDevice::AdamWStep(float* param, const float* grad, float* m, float* v, size_t n,
                          const AdamWUpdate& h) {
  const float lr = h.learning_rate;
  const float b1 = h.beta1;
  const float b2 = h.beta2;
  const float one_minus_b1 = 1.f - b1;
  const float one_minus_b2 = 1.f - b2;
  // Decoupled weight decay: the parameter shrinks independently of the gradient's moments.
  const float decay = 1.f - lr * h.weight_decay;
  const float bc1 = h.bias_correction1;
  const float bc2 = h.bias_correction2;
  const float eps = h.epsilon;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float mi = b1 * m[i] + one_minus_b1 * g;
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / bc1;
    const float v_hat = vi / bc2;
    param[i] = param[i] * decay - lr * m_hat / (std::sqrt(v_hat) + eps);
  }
}

std::unique_ptr<Device> CreateCpuDevice(int threads) {
  return std::make_unique<CpuDevice>(threads);
}

}  // namespace vf
