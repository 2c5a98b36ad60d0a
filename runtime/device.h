// The compute device seam: every numeric kernel the runtime needs (the MLP, the reducers, the
// optimizers) goes through this interface, so the CPU and CUDA backends are interchangeable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "runtime/status.h"

namespace vf {

enum class DeviceKind { kCpu, kCuda };

// Sum of per-sample losses and number of correct predictions over a batch. The sum is a double
// so that reporting is not the precision bottleneck; devices compute it in a fixed order.
struct LossStats {
  double loss_sum = 0.0;
  int64_t correct = 0;
  int64_t samples = 0;
};

// Hyper-parameters of one optimizer update, already resolved for the current step.
struct SgdUpdate {
  float learning_rate = 0.f;
  float momentum = 0.f;
  float weight_decay = 0.f;
  bool nesterov = false;
};
struct AdamWUpdate {
  float learning_rate = 0.f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
  float weight_decay = 0.f;
  // 1 - beta^t for the current step t, computed by the caller in double precision.
  float bias_correction1 = 1.f;
  float bias_correction2 = 1.f;
};

// A bucket's scale exponent meaning "not chosen yet": its fold only measures the maximum.
inline constexpr int32_t kNoExponent = INT32_MIN;

// One bucket of a virtual node's exact fold (see Device::FoldBuckets): the range
// [offset, offset + size) of the gradient and its fixed-point exponent (kNoExponent: none yet).
struct FoldBucket {
  uint64_t offset = 0;
  uint64_t size = 0;
  int32_t exponent = kNoExponent;
  int32_t unused = 0;  // explicit padding: the struct is copied to devices as bytes
};

// The same bucket table twice: in host memory (for a device that loops over it on the host) and
// in the device's memory (for one kernel over every bucket). The owner keeps both equal.
struct FoldPlan {
  std::span<const FoldBucket> host;
  const FoldBucket* device = nullptr;
};

// Optional speed-ups of a device. Each changes how work is issued, never its results; the
// defaults are what measured faster (docs/benchmarks.md, vf-bench tuning on an H100).
struct DeviceTuning {
  bool record_nodes = true;  // Record(): replay recorded work (a GPU: CUDA graphs)
  bool fused_fold = true;    // FoldBuckets(): one pass over all buckets, not one per bucket
  // AllocateStaging(): page-locked host memory (a GPU: copies without a bounce buffer, which
  // lanes' copies then do not wait for each other on). On the H100 with four lanes a step took
  // 8% less with it; with one lane (nodes in turn) 3% more.
  bool pinned_staging = true;
  // Lanes(): how many virtual nodes' work may run at the same time (a GPU: a stream, a cuBLAS
  // handle and its workspace each). 0 is the device's choice (a GPU: kDefaultCudaLanes; the
  // CPU: 1, which has nothing to overlap; more runs them one after another, which tests use).
  int lanes = 0;
};
inline constexpr int kDefaultCudaLanes = 4;
inline constexpr int kMaxLanes = 16;

// A compute device. All pointers passed to the math functions point to this device's memory.
// All matrices are row-major. Kernels must be deterministic: the same inputs give bitwise the
// same outputs on every call (no floating-point atomics or thread-count-dependent summation
// orders; integer sums and maxima, which no order changes, may combine with atomics).
// Not thread-safe: one device object is driven by one thread.
class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceKind kind() const = 0;
  // Human-readable description, e.g. "cpu (OpenBLAS Haswell, 1 thread)" or "cuda:0 (NVIDIA H100)".
  virtual std::string Name() const = 0;

  // Memory. Allocate returns zero-filled memory of at least `bytes` bytes (aligned to 64 bytes).
  virtual Result<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) noexcept = 0;
  // From ordinary host memory the source has been read when the call returns, so the caller may
  // reuse it at once; from staging memory (AllocateStaging) the copy may still be under way.
  virtual void CopyFromHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void CopyToHost(void* dst, const void* src, size_t bytes) = 0;
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void Fill(float* x, float value, size_t n) = 0;
  virtual void FillInt64(int64_t* x, int64_t value, size_t n) = 0;
  // Waits until all queued work on the device is done.
  virtual void Synchronize() = 0;
  // Host memory from which CopyFromHost may copy without waiting: the copy may still be reading
  // it when the call returns, so the caller must not rewrite it before the device has waited
  // (Synchronize, CopyToHost) since that copy. Zero-filled; freed with FreeStaging.
  virtual Result<void*> AllocateStaging(size_t bytes) {
    void* p = std::calloc(1, bytes == 0 ? 1 : bytes);
    if (p == nullptr) return Internal("cannot allocate " + std::to_string(bytes) + " host bytes");
    return p;
  }
  virtual void FreeStaging(void* ptr) noexcept { std::free(ptr); }
  // Runs `work`, which only queues work on this device (no allocation, no copy to or from the
  // host, no wait) on memory whose addresses stay valid. Equal keys must mean the same work with
  // the same pointers; data behind the pointers may change. A device that can record queued
  // work (a GPU: a CUDA graph) records it at a key's second use and from then on replays the
  // recording: one launch instead of many, with the same results bit for bit. Free() forgets
  // every recording. Errors from `work` are returned.
  virtual Status Record(std::span<const uint64_t> key, const std::function<Status()>& work) {
    (void)key;
    return work();
  }
  virtual void Tune(const DeviceTuning& tuning) { (void)tuning; }
  // Whether `p` points into this device's own memory (Allocate) rather than host memory, for a
  // caller that takes either kind. The CPU's memory is host memory: false.
  virtual bool OwnsMemory(const void* p) const {
    (void)p;
    return false;
  }

  // Lanes: queues of work that the device may run at the same time (a GPU: streams), so that
  // many small virtual nodes fill it. Fork(n) opens lanes 0..n-1 (n <= Lanes()), each starting
  // after all work queued before it, and queues on lane 0; UseLane(l) queues later calls on
  // lane l; Join() makes all later work wait for every lane's and queues on lane 0 again.
  // Between Fork and Join, work on different lanes may overlap, so it must not touch memory
  // another lane writes, except through FoldBuckets (its sums and maxima are integers, which no
  // order changes; a device that overlaps lanes makes it safe to run concurrently). Each lane
  // has its own scratch and its own Record() keys. A device without lanes runs them in turn.
  virtual int Lanes() const { return 1; }
  // Fast mode's float sums: a step's nodes on this device add into this many partial sums (node
  // k into sum k mod n), which are then added in order. Part of fast mode's arithmetic on this
  // kind of device, not a tuning: the lanes never change it, so a device tuned to any number of
  // lanes trains to the same weights. A device whose lanes run at once gives each of its default
  // lanes a sum of its own (a GPU: 4); the CPU, which would only pay for the extra additions, 1.
  virtual int FastPartialSums() const { return 1; }
  virtual void Fork(int lanes) { (void)lanes; }
  virtual void UseLane(int lane) { (void)lane; }
  virtual void Join() {}
  // Bytes in use in the device's own memory now, as its driver counts them (a GPU: the whole
  // device, runtime context and library workspaces included). 0 for a device without memory of
  // its own; on the CPU the process's resident set is the measure.
  virtual size_t MemoryInUse() { return 0; }

  // c[m,n] = alpha * op(a) * op(b) + beta * c, where op(a) is [m,k] and op(b) is [k,n].
  virtual void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                    const float* a, const float* b, float beta, float* c) = 0;
  // out[i] = float(in[i]) * scale - shift, rounded after each operation (no fused
  // multiply-add): turns a staged batch of pixels into the model's input on the device, so
  // that a quarter of the bytes cross to a GPU.
  virtual void NormalizePixels(const uint8_t* in, size_t n, float scale, float shift,
                               float* out) = 0;
  // y[r,c] += bias[c], then y = max(y, 0) when `relu`.
  virtual void AddBiasActivate(float* y, const float* bias, int rows, int cols, bool relu) = 0;
  // dy[i] = y[i] > 0 ? dy[i] : 0 (y is the ReLU output).
  virtual void ReluBackward(float* dy, const float* y, size_t n) = 0;
  // out[c] = sum over r of x[r,c], summed in increasing r; with `add`, out[c] += that sum (the
  // column's sum first, then one addition).
  virtual void SumRows(const float* x, int rows, int cols, bool add, float* out) = 0;
  // Softmax cross-entropy of logits[rows, cols] against integer labels. When dlogits is not
  // null, writes d(loss_sum * grad_scale)/dlogits into it. Returns the batch's statistics.
  virtual LossStats SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                        int cols, float grad_scale, float* dlogits) = 0;
  // The same, with the statistics written to *stats in this device's memory instead of coming
  // back to the host: training reads them once per step. The loss sum is added in a fixed order
  // (each device its own), so it is the same on every run.
  virtual void SoftmaxCrossEntropyInto(const float* logits, const int32_t* labels, int rows,
                                       int cols, float grad_scale, float* dlogits,
                                       LossStats* stats) = 0;

  // Exact reduction kernels (see runtime/reduce/exact.h for the number format).
  // Largest |x[i]|; NaN if any element is NaN, +Inf if any is infinite.
  virtual float MaxAbs(const float* x, size_t n) = 0;
  // acc[i] += round_half_even(x[i] * 2^exponent). Returns false when any |x[i] * 2^exponent|
  // exceeds `limit` (acc is then unspecified and must be discarded).
  virtual bool AccumulateFixed(const float* x, size_t n, int exponent, int64_t limit,
                               int64_t* acc) = 0;
  // The same two without a round trip to the host, for a reducer that reads its results once
  // per step rather than once per virtual node (a GPU waits for each round trip). The results
  // stay in this device's memory: *max_bits = max(*max_bits, bit pattern of the largest |x[i]|)
  // (as unsigned: float order, every NaN above +Inf), and *bad becomes non-zero where
  // AccumulateFixed would return false (it is never cleared here).
  virtual void MaxAbsInto(const float* x, size_t n, uint32_t* max_bits) = 0;
  virtual void AccumulateFixedInto(const float* x, size_t n, int exponent, int64_t limit,
                                   int64_t* acc, uint32_t* bad) = 0;
  // Both of the above over the same x, with exactly their results, in one pass where the
  // device can: the exact reducer reads every virtual node's whole gradient this way, so a
  // device that reads memory twice for it pays per node, not per sample.
  virtual void MaxAbsAccumulateFixedInto(const float* x, size_t n, int exponent, int64_t limit,
                                         int64_t* acc, uint32_t* max_bits, uint32_t* bad) {
    MaxAbsInto(x, n, max_bits);
    AccumulateFixedInto(x, n, exponent, limit, acc, bad);
  }
  // Every bucket of one virtual node's gradient: for bucket b of `plan`,
  // MaxAbsAccumulateFixedInto(grad + offset, size, exponent, limit, acc + offset, max_bits + b,
  // bad), or only MaxAbsInto(grad + offset, size, max_bits + b) when its exponent is
  // kNoExponent. The default loops on the host; a GPU runs one kernel over plan.device.
  virtual void FoldBuckets(const float* grad, const FoldPlan& plan, int64_t limit, int64_t* acc,
                           uint32_t* max_bits, uint32_t* bad) {
    for (size_t b = 0; b < plan.host.size(); ++b) {
      const FoldBucket& k = plan.host[b];
      if (k.exponent == kNoExponent) {
        MaxAbsInto(grad + k.offset, k.size, max_bits + b);
      } else {
        MaxAbsAccumulateFixedInto(grad + k.offset, k.size, k.exponent, limit, acc + k.offset,
                                  max_bits + b, bad);
      }
    }
  }
  // out[i] = float(double(acc[i]) * 2^-exponent * scale).
  virtual void FixedToFloat(const int64_t* acc, size_t n, int exponent, double scale,
                            float* out) = 0;

  // Fast reduction and general helpers.
  virtual void Axpy(float alpha, const float* x, float* y, size_t n) = 0;  // y += alpha * x
  virtual void Scale(float* x, float alpha, size_t n) = 0;                 // x *= alpha

  // Optimizer updates, one fused pass over the parameters.
  virtual void SgdMomentumStep(float* param, const float* grad, float* velocity, size_t n,
                               const SgdUpdate& h) = 0;
  virtual void AdamWStep(float* param, const float* grad, float* m, float* v, size_t n,
                         const AdamWUpdate& h) = 0;
};

// Where an OwnedBuffer's memory is: the device's own (Device::Allocate) or its staging memory
// (Device::AllocateStaging: host memory the device copies from without waiting).
enum class MemoryKind { kDevice, kStaging };

// Owns `count` elements of T in a device's memory of kind `kKind`; frees them on destruction.
// Move-only. Not thread-safe. Use it as DeviceBuffer<T> or StagingBuffer<T>.
template <typename T, MemoryKind kKind>
class OwnedBuffer {
 public:
  OwnedBuffer() = default;
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;
  OwnedBuffer(OwnedBuffer&& o) noexcept { *this = std::move(o); }
  OwnedBuffer& operator=(OwnedBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      std::swap(device_, o.device_);
      std::swap(data_, o.data_);
      std::swap(count_, o.count_);
    }
    return *this;
  }
  ~OwnedBuffer() { Reset(); }

  static Result<OwnedBuffer> Create(Device& device, size_t count) {
    OwnedBuffer b;
    auto p = kKind == MemoryKind::kDevice
                 ? device.Allocate(count * sizeof(T) + (count == 0 ? 1 : 0))
                 : device.AllocateStaging(count * sizeof(T));
    if (!p.ok()) return p.status();
    b.device_ = &device;
    b.data_ = static_cast<T*>(*p);
    b.count_ = count;
    return b;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void Reset() {
    if (device_ != nullptr && data_ != nullptr) {
      if (kKind == MemoryKind::kDevice) {
        device_->Free(data_);
      } else {
        device_->FreeStaging(data_);
      }
    }
    device_ = nullptr;
    data_ = nullptr;
    count_ = 0;
  }

 private:
  Device* device_ = nullptr;
  T* data_ = nullptr;
  size_t count_ = 0;
};

template <typename T>
using DeviceBuffer = OwnedBuffer<T, MemoryKind::kDevice>;
template <typename T>
using StagingBuffer = OwnedBuffer<T, MemoryKind::kStaging>;

// The host CPU. `threads` BLAS threads; workers use 1 so that several share a machine's cores.
std::unique_ptr<Device> CreateCpuDevice(int threads = 1);

// Number of CUDA GPUs this process can use: 0 when the build has no CUDA, there is no driver or
// no GPU, with the reason in `why` when given.
int CudaDeviceCount(std::string* why = nullptr);

// GPU `ordinal` with its own stream and cuBLAS handle. Returns an error, never throws, when the
// build has no CUDA or there is no such GPU.
Result<std::unique_ptr<Device>> CreateCudaDevice(int ordinal = 0);

}  // namespace vf
