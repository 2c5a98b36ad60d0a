#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/cuda/device.h"

namespace vf {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops: enough blocks to fill any current GPU, few enough to launch cheaply.
constexpr int kMaxBlocks = 4096;
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

int Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < kMaxBlocks ? (b == 0 ? 1 : b) : kMaxBlocks);
}

// A CUDA error leaves the context unusable (sticky errors), so the process cannot go on: say
// what failed, in one line, and end with a status of its own.
[[noreturn]] void Die(const char* what, const char* detail) {
  std::fprintf(stderr, "virtualflow: CUDA device: %s: %s\n", what, detail);
  std::fflush(stderr);
  std::_Exit(70);
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Die(what, cudaGetErrorString(e));
}

void CheckBlas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) Die(what, cublasGetStatusString(s));
}

void CheckLaunch(const char* kernel) { Check(cudaGetLastError(), kernel); }

// As on the CPU: the largest double not above the integer limit, which elements are compared
// with.
double LimitAsDouble(int64_t limit) {
  double lim = static_cast<double>(limit);
  if (lim >= 0x1p63 || static_cast<int64_t>(lim) > limit) lim = std::nextafter(lim, 0.0);
  return lim;
}

// ---------------------------------------------------------------- kernels

template <typename T>
__global__ void FillKernel(T* x, T value, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] = value;
  }
}

__global__ void NormalizePixelsKernel(const uint8_t* in, size_t n, float scale, float shift,
                                      float* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __fsub_rn(__fmul_rn(static_cast<float>(in[i]), scale), shift);
  }
}

__global__ void AddBiasActivateKernel(float* y, const float* bias, int rows, int cols, bool relu) {
  const size_t n = static_cast<size_t>(rows) * cols;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float v = y[i] + bias[i % cols];
    // `v < 0` as on the CPU, so that NaN propagates.
    y[i] = relu && v < 0.f ? 0.f : v;
  }
}

__global__ void ReluBackwardKernel(float* dy, const float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dy[i] = y[i] > 0.f ? dy[i] : 0.f;
  }
}

// One thread per column, rows in increasing order: the CPU backend's summation order.
__global__ void SumRowsKernel(const float* x, int rows, int cols, bool add, float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.f;
  for (int r = 0; r < rows; ++r) s += x[static_cast<size_t>(r) * cols + c];
  out[c] = add ? out[c] + s : s;
}

// One thread per row (the models' output layers are narrow). Mirrors the CPU backend's
// arithmetic; exp and log come from CUDA's math library, so the loss and gradient agree with
// the CPU to a few ulps, not bitwise.
__global__ void SoftmaxCrossEntropyKernel(const float* logits, const int32_t* labels, int rows,
                                          int cols, double scale, float* dlogits, double* row_loss,
                                          int32_t* row_correct) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* row = logits + static_cast<size_t>(r) * cols;
  float* grad = dlogits == nullptr ? nullptr : dlogits + static_cast<size_t>(r) * cols;
  const int32_t label = labels[r];
  const bool valid = label >= 0 && label < cols;
  int argmax = 0;
  for (int c = 1; c < cols; ++c) {
    if (row[c] > row[argmax]) argmax = c;
  }
  const double max = row[argmax];
  double sum = 0.0;
  for (int c = 0; c < cols; ++c) sum += exp(static_cast<double>(row[c]) - max);
  const double log_sum = log(sum);
  if (!valid) {
    row_loss[r] = nan("");
    row_correct[r] = 0;
    if (grad != nullptr) {
      for (int c = 0; c < cols; ++c) grad[c] = nanf("");
    }
    return;
  }
  row_loss[r] = log_sum - (static_cast<double>(row[label]) - max);
  row_correct[r] = argmax == label ? 1 : 0;
  if (grad != nullptr) {
    const double inv_sum = 1.0 / sum;
    for (int c = 0; c < cols; ++c) {
      const double p = exp(static_cast<double>(row[c]) - max) * inv_sum;
      grad[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) * scale);
    }
  }
}

// One block sums the per-row statistics: each thread a fixed stride of rows in order, then a
// fixed tree, so the loss sum is the same on every run (no atomics). Needs kThreads threads.
__global__ void SumRowStatsKernel(const double* row_loss, const int32_t* row_correct, int rows,
                                  LossStats* out) {
  __shared__ double loss[kThreads];
  __shared__ long long correct[kThreads];
  double l = 0.0;
  long long c = 0;
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    l += row_loss[r];
    c += row_correct[r];
  }
  loss[threadIdx.x] = l;
  correct[threadIdx.x] = c;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) {
      loss[threadIdx.x] += loss[threadIdx.x + s];
      correct[threadIdx.x] += correct[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out->loss_sum = loss[0];
    out->correct = correct[0];
    out->samples = rows;
  }
}

// Folds each thread's `best` into the block's maximum (a tree over shared memory) and that
// into *out with one atomic max per block (max is order-free, so the result is deterministic).
// Every thread of the block must call it.
__device__ void BlockMaxInto(uint32_t best, uint32_t* out) {
  __shared__ uint32_t block_max[kThreads];
  block_max[threadIdx.x] = best;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) {
      block_max[threadIdx.x] = max(block_max[threadIdx.x], block_max[threadIdx.x + s]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && block_max[0] != 0) atomicMax(out, block_max[0]);
}

// Largest |x| as the bit pattern of a non-negative float: unsigned order is float order and
// every NaN is above +Inf. Max is order-independent, so the atomic gives the same answer on
// every run.
__global__ void MaxAbsBitsKernel(const float* x, size_t n, uint32_t* out) {
  uint32_t best = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    best = max(best, __float_as_uint(x[i]) & 0x7fffffffu);
  }
  BlockMaxInto(best, out);
}

// acc[i] += round_half_even(x[i] * scale), the product exact in double. __double2ll_rn rounds
// half to even like the CPU's magic-number addition, and from 2^52 up every double is an
// integer already; the sums wrap (unsigned) rather than overflow. An element beyond `limit`
// (or NaN) sets *bad and adds nothing.
__global__ void AccumulateFixedKernel(const float* x, size_t n, double scale, double limit,
                                      int64_t* acc, uint32_t* bad) {
  bool flagged = false;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double v = __dmul_rn(static_cast<double>(x[i]), scale);
    const bool ok = fabs(v) <= limit;
    flagged |= !ok;
    const long long q = ok ? __double2ll_rn(v) : 0;
    acc[i] = static_cast<int64_t>(static_cast<unsigned long long>(acc[i]) +
                                  static_cast<unsigned long long>(q));
  }
  if (flagged) atomicOr(bad, 1u);
}

// Every bucket of a virtual node's exact fold in one launch (Device::FoldBuckets): block row y
// serves bucket y, its blocks stride over the bucket, and each element is handled exactly as
// MaxAbsBitsKernel and AccumulateFixedKernel handle it, so the results are theirs bit for bit.
// The scale is computed here from the table's exponent (ldexp is exact, as std::ldexp), with the
// clamp of CudaDevice::AccumulateFixedInto; the exponents change every step and the table, not
// the launch, carries them, so a recorded launch serves every step. kAtomic adds with an integer
// atomic, for nodes folded at the same time on several lanes (the sum is the same in any order).
template <bool kAtomic>
__global__ void FoldBucketsKernel(const float* x, const FoldBucket* buckets, double limit,
                                  int64_t* acc, uint32_t* max_bits, uint32_t* bad) {
  const FoldBucket bucket = buckets[blockIdx.y];
  const bool fold = bucket.exponent != kNoExponent;
  const double scale = fold ? ldexp(1.0, bucket.exponent < 1000 ? bucket.exponent : 1000) : 0.0;
  const float* xb = x + bucket.offset;
  int64_t* ab = acc + bucket.offset;
  uint32_t best = 0;
  bool flagged = false;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < bucket.size;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float xi = xb[i];
    best = max(best, __float_as_uint(xi) & 0x7fffffffu);
    if (fold) {
      const double v = __dmul_rn(static_cast<double>(xi), scale);
      const bool ok = fabs(v) <= limit;
      flagged |= !ok;
      const long long q = ok ? __double2ll_rn(v) : 0;
      if constexpr (kAtomic) {
        atomicAdd(reinterpret_cast<unsigned long long*>(ab + i),
                  static_cast<unsigned long long>(q));
      } else {
        ab[i] = static_cast<int64_t>(static_cast<unsigned long long>(ab[i]) +
                                     static_cast<unsigned long long>(q));
      }
    }
  }
  BlockMaxInto(best, max_bits + blockIdx.y);
  if (flagged) atomicOr(bad, 1u);
}

// out[i] = float((double(acc[i]) * unit) * scale): two IEEE multiplications and one rounding to
// float, the CPU backend's exact operation order.
__global__ void FixedToFloatKernel(const int64_t* acc, size_t n, double unit, double scale,
                                   float* out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __double2float_rn(__dmul_rn(__dmul_rn(__ll2double_rn(acc[i]), unit), scale));
  }
}

__global__ void AxpyKernel(float alpha, const float* x, float* y, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    y[i] = __fadd_rn(y[i], __fmul_rn(alpha, x[i]));
  }
}

__global__ void ScaleKernel(float* x, float alpha, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] = __fmul_rn(x[i], alpha);
  }
}

// The optimizer updates, one fused pass each, in the CPU backend's operation order with every
// multiplication and addition rounded on its own (__fmul_rn/__fadd_rn are never contracted).
__global__ void SgdMomentumKernel(float* param, const float* grad, float* velocity, size_t n,
                                  float lr, float mu, float wd, bool nesterov) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = __fadd_rn(grad[i], __fmul_rn(wd, param[i]));
    const float v = __fadd_rn(__fmul_rn(mu, velocity[i]), g);
    velocity[i] = v;
    const float step = nesterov ? __fadd_rn(g, __fmul_rn(mu, v)) : v;
    param[i] = __fsub_rn(param[i], __fmul_rn(lr, step));
  }
}

__global__ void AdamWKernel(float* param, const float* grad, float* m, float* v, size_t n, float lr,
                            float b1, float b2, float one_minus_b1, float one_minus_b2, float decay,
                            float bc1, float bc2, float eps) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float mi = __fadd_rn(__fmul_rn(b1, m[i]), __fmul_rn(one_minus_b1, g));
    const float vi = __fadd_rn(__fmul_rn(b2, v[i]), __fmul_rn(__fmul_rn(one_minus_b2, g), g));
    m[i] = mi;
    v[i] = vi;
    const float m_hat = __fdiv_rn(mi, bc1);
    const float v_hat = __fdiv_rn(vi, bc2);
    param[i] = __fsub_rn(__fmul_rn(param[i], decay),
                         __fdiv_rn(__fmul_rn(lr, m_hat), __fadd_rn(__fsqrt_rn(v_hat), eps)));
  }
}

}  // namespace

// ---------------------------------------------------------------- the device

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  Check(cudaSetDevice(ordinal), "cudaSetDevice");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  name_ = "cuda:" + std::to_string(ordinal) + " (" + prop.name + ")";
  AddLane();
  cudaEvent_t fork = nullptr;
  Check(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "cudaEventCreate");
  fork_ = fork;
  void* word = nullptr;
  Check(cudaMalloc(&word, sizeof(uint32_t)), "cudaMalloc");
  word_ = static_cast<uint32_t*>(word);
  void* stats = nullptr;
  Check(cudaMalloc(&stats, sizeof(LossStats)), "cudaMalloc");
  stats_ = static_cast<LossStats*>(stats);
}

void CudaDevice::AddLane() {
  Lane l;
  cudaStream_t stream = nullptr;
  Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  l.stream = stream;
  cudaEvent_t done = nullptr;
  Check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  l.done = done;
  cublasHandle_t blas = nullptr;
  CheckBlas(cublasCreate(&blas), "cublasCreate");
  l.blas = blas;
  CheckBlas(cublasSetStream(blas, stream), "cublasSetStream");
  // Full float32 products (no TF32 tensor cores), and no atomics inside cuBLAS: its results
  // are then the same on every run on the same GPU model, on every lane.
  CheckBlas(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  CheckBlas(cublasSetAtomicsMode(blas, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
  // A workspace of our own, of the size cuBLAS's default pool has on Hopper: a product recorded
  // into a CUDA graph (Record) then allocates nothing. Set after the stream, which resets it.
  void* workspace = nullptr;
  Check(cudaMalloc(&workspace, kBlasWorkspaceBytes), "cudaMalloc");
  l.blas_workspace = workspace;
  CheckBlas(cublasSetWorkspace(blas, workspace, kBlasWorkspaceBytes), "cublasSetWorkspace");
  lanes_.push_back(l);
}

CudaDevice::~CudaDevice() {
  // Best effort: a failing teardown must not end the process.
  cudaSetDevice(ordinal_);
  SynchronizeAll();
  ForgetRecordings();
  cudaFree(word_);
  cudaFree(stats_);
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  for (Lane& l : lanes_) {
    cudaFree(l.row_loss);
    cudaFree(l.row_correct);
    if (l.blas != nullptr) cublasDestroy(l.blas);
    cudaFree(l.blas_workspace);
    if (l.done != nullptr) cudaEventDestroy(l.done);
    if (l.stream != nullptr) cudaStreamDestroy(l.stream);
  }
}

void CudaDevice::SynchronizeAll() noexcept {
  for (Lane& l : lanes_) {
    if (l.stream != nullptr) cudaStreamSynchronize(l.stream);
  }
}

int CudaDevice::Lanes() const {
  // Overlapping nodes need the fused fold, the only fold that adds atomically.
  if (!tuning_.fused_fold) return 1;
  return tuning_.lanes > 0 ? std::min(tuning_.lanes, kMaxLanes) : kDefaultCudaLanes;
}

void CudaDevice::Fork(int lanes) {
  if (capturing_) Die("Fork", "lanes cannot open while recording");
  lanes = std::clamp(lanes, 1, kMaxLanes);
  while (lanes_.size() < static_cast<size_t>(lanes)) AddLane();
  current_ = 0;
  forked_ = lanes;
  if (lanes == 1) return;
  Check(cudaEventRecord(fork_, lanes_[0].stream), "cudaEventRecord");
  for (int l = 1; l < lanes; ++l) {
    Check(cudaStreamWaitEvent(lanes_[static_cast<size_t>(l)].stream, fork_, 0),
          "cudaStreamWaitEvent");
  }
}

void CudaDevice::UseLane(int lane) {
  if (lane < 0 || lane >= forked_) Die("UseLane", "the lane is not open (Fork first)");
  current_ = static_cast<size_t>(lane);
}

void CudaDevice::Join() {
  if (capturing_) Die("Join", "lanes cannot close while recording");
  for (int l = 1; l < forked_; ++l) {
    Lane& other = lanes_[static_cast<size_t>(l)];
    Check(cudaEventRecord(other.done, other.stream), "cudaEventRecord");
    Check(cudaStreamWaitEvent(lanes_[0].stream, other.done, 0), "cudaStreamWaitEvent");
  }
  current_ = 0;
  forked_ = 1;
}

Result<void*> CudaDevice::Allocate(size_t bytes) {
  void* p = nullptr;
  // cudaMalloc aligns to at least 256 bytes; a zero-byte request still gets a unique pointer.
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // out-of-memory is not sticky: clear it and report
    return Internal(name_ + ": cannot allocate " + std::to_string(bytes) +
                    " bytes: " + cudaGetErrorString(e));
  }
  Check(cudaMemsetAsync(p, 0, bytes == 0 ? 1 : bytes, stream()), "cudaMemset");
  Check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  return p;
}

void CudaDevice::Free(void* ptr) noexcept {
  if (ptr == nullptr) return;
  // Work queued on the buffer must finish before its memory is reused, and no recording may
  // name it afterwards, on any lane.
  SynchronizeAll();
  ForgetRecordings();
  cudaFree(ptr);
}

Result<void*> CudaDevice::AllocateStaging(size_t bytes) {
  if (!tuning_.pinned_staging) return Device::AllocateStaging(bytes);
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, bytes == 0 ? 1 : bytes, cudaHostAllocDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it and report
    return Internal(name_ + ": cannot allocate " + std::to_string(bytes) +
                    " bytes of page-locked host memory: " + cudaGetErrorString(e));
  }
  std::memset(p, 0, bytes == 0 ? 1 : bytes);
  return p;
}

void CudaDevice::FreeStaging(void* ptr) noexcept {
  if (ptr == nullptr) return;
  // A copy queued from this memory may still be reading it. The tuning may have changed since
  // the allocation, so ask the driver which kind it is.
  SynchronizeAll();
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, ptr) == cudaSuccess &&
      attributes.type == cudaMemoryTypeHost) {
    cudaFreeHost(ptr);
  } else {
    cudaGetLastError();
    Device::FreeStaging(ptr);
  }
}

bool CudaDevice::OwnsMemory(const void* p) const {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // not sticky: an unknown pointer is host memory
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

void CudaDevice::Tune(const DeviceTuning& tuning) {
  tuning_ = tuning;
  if (!tuning_.fused_fold) tuning_.record_nodes = false;
  ForgetRecordings();
}

void CudaDevice::ForgetRecordings() noexcept {
  for (auto& [key, exec] : recordings_) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
  }
  recordings_.clear();
}

Status CudaDevice::Record(std::span<const uint64_t> key, const std::function<Status()>& work) {
  if (!tuning_.record_nodes || capturing_) return work();
  // A graph replays the lane's handle and scratch, and FoldBuckets' kind (atomic while lanes
  // are open): both belong in the key.
  std::vector<uint64_t> k = {current_, forked_ > 1 ? 1u : 0u};
  k.insert(k.end(), key.begin(), key.end());
  auto it = recordings_.find(k);
  if (it == recordings_.end()) {
    // The first use runs as is: the allocations and library set-up the work needs happen here,
    // and a capture could not contain them.
    recordings_.emplace(std::move(k), nullptr);
    return work();
  }
  if (it->second == nullptr) {
    Check(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal),
          "cudaStreamBeginCapture");
    capturing_ = true;
    const Status s = work();
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream(), &graph);
    if (!s.ok()) {
      // Nothing captured ran; the caller sees the error (the step fails).
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      return s;
    }
    Check(e, "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    Check(ie, "cudaGraphInstantiate");
    it->second = exec;
  }
  Check(cudaGraphLaunch(it->second, stream()), "cudaGraphLaunch");
  return Status::Ok();
}

void CudaDevice::CopyFromHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  // From pageable memory the call returns once the source has been staged, so the caller may
  // reuse it at once.
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()), "copy to device");
}

void CudaDevice::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()), "copy to host");
  Check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
}

void CudaDevice::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()), "copy on device");
}

void CudaDevice::Fill(float* x, float value, size_t n) {
  if (n == 0) return;
  FillKernel<<<Blocks(n), kThreads, 0, stream()>>>(x, value, n);
  CheckLaunch("Fill");
}

void CudaDevice::FillInt64(int64_t* x, int64_t value, size_t n) {
  if (n == 0) return;
  FillKernel<<<Blocks(n), kThreads, 0, stream()>>>(x, value, n);
  CheckLaunch("FillInt64");
}

void CudaDevice::Synchronize() {
  for (Lane& l : lanes_) Check(cudaStreamSynchronize(l.stream), "cudaStreamSynchronize");
}

size_t CudaDevice::MemoryInUse() {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  Check(cudaSetDevice(ordinal_), "cudaSetDevice");
  Check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return total_bytes - free_bytes;
}

void CudaDevice::Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha,
                      const float* a, const float* b, float beta, float* c) {
  if (m <= 0 || n <= 0) return;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same memory, the
  // operands swapped, the leading dimensions the stored row lengths (as for the CPU's BLAS).
  const int lda = transpose_a ? m : k;
  const int ldb = transpose_b ? k : n;
  CheckBlas(cublasSgemm(lane().blas, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                        transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b,
                        ldb < 1 ? 1 : ldb, a, lda < 1 ? 1 : lda, &beta, c, n),
            "cublasSgemm");
}

void CudaDevice::NormalizePixels(const uint8_t* in, size_t n, float scale, float shift,
                                 float* out) {
  if (n == 0) return;
  NormalizePixelsKernel<<<Blocks(n), kThreads, 0, stream()>>>(in, n, scale, shift, out);
  CheckLaunch("NormalizePixels");
}

void CudaDevice::AddBiasActivate(float* y, const float* bias, int rows, int cols, bool relu) {
  if (rows <= 0 || cols <= 0) return;
  AddBiasActivateKernel<<<Blocks(static_cast<size_t>(rows) * cols), kThreads, 0, stream()>>>(
      y, bias, rows, cols, relu);
  CheckLaunch("AddBiasActivate");
}

void CudaDevice::ReluBackward(float* dy, const float* y, size_t n) {
  if (n == 0) return;
  ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream()>>>(dy, y, n);
  CheckLaunch("ReluBackward");
}

void CudaDevice::SumRows(const float* x, int rows, int cols, bool add, float* out) {
  if (cols <= 0) return;
  SumRowsKernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, stream()>>>(x, rows < 0 ? 0 : rows,
                                                                             cols, add, out);
  CheckLaunch("SumRows");
}

void CudaDevice::EnsureRowScratch(int rows) {
  Lane& l = lane();
  if (rows <= l.row_capacity) return;
  if (capturing_) Die("SoftmaxCrossEntropy", "the row scratch grew while recording");
  SynchronizeAll();
  ForgetRecordings();
  cudaFree(l.row_loss);
  cudaFree(l.row_correct);
  void* loss = nullptr;
  void* correct = nullptr;
  Check(cudaMalloc(&loss, sizeof(double) * static_cast<size_t>(rows)), "cudaMalloc");
  Check(cudaMalloc(&correct, sizeof(int32_t) * static_cast<size_t>(rows)), "cudaMalloc");
  l.row_loss = static_cast<double*>(loss);
  l.row_correct = static_cast<int32_t*>(correct);
  l.row_capacity = rows;
}

void CudaDevice::SoftmaxCrossEntropyInto(const float* logits, const int32_t* labels, int rows,
                                         int cols, float grad_scale, float* dlogits,
                                         LossStats* stats) {
  if (cols <= 0 || rows <= 0) {
    LossStats empty;
    empty.samples = rows < 0 ? 0 : rows;
    CopyFromHost(stats, &empty, sizeof(empty));
    return;
  }
  EnsureRowScratch(rows);
  SoftmaxCrossEntropyKernel<<<(rows + kThreads - 1) / kThreads, kThreads, 0, stream()>>>(
      logits, labels, rows, cols, static_cast<double>(grad_scale), dlogits, lane().row_loss,
      lane().row_correct);
  CheckLaunch("SoftmaxCrossEntropy");
  SumRowStatsKernel<<<1, kThreads, 0, stream()>>>(lane().row_loss, lane().row_correct, rows, stats);
  CheckLaunch("SoftmaxCrossEntropy sums");
}

LossStats CudaDevice::SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                                          int cols, float grad_scale, float* dlogits) {
  SoftmaxCrossEntropyInto(logits, labels, rows, cols, grad_scale, dlogits, stats_);
  LossStats stats;
  CopyToHost(&stats, stats_, sizeof(stats));
  return stats;
}

void CudaDevice::MaxAbsInto(const float* x, size_t n, uint32_t* max_bits) {
  if (n == 0) return;
  MaxAbsBitsKernel<<<Blocks(n), kThreads, 0, stream()>>>(x, n, max_bits);
  CheckLaunch("MaxAbs");
}

float CudaDevice::MaxAbs(const float* x, size_t n) {
  uint32_t bits = 0;
  if (n > 0) {
    Check(cudaMemsetAsync(word_, 0, sizeof(uint32_t), stream()), "cudaMemset");
    MaxAbsInto(x, n, word_);
    CopyToHost(&bits, word_, sizeof(bits));
  }
  if (bits > 0x7f800000u) return std::numeric_limits<float>::quiet_NaN();
  float out;
  static_assert(sizeof(out) == sizeof(bits));
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

void CudaDevice::AccumulateFixedInto(const float* x, size_t n, int exponent, int64_t limit,
                                     int64_t* acc, uint32_t* bad) {
  if (n == 0) return;
  // As on the CPU: clamp the exponent (every non-zero float overflows anyway), and compare with
  // the largest double not above the integer limit.
  const double scale = std::ldexp(1.0, exponent < 1000 ? exponent : 1000);
  AccumulateFixedKernel<<<Blocks(n), kThreads, 0, stream()>>>(x, n, scale, LimitAsDouble(limit),
                                                              acc, bad);
  CheckLaunch("AccumulateFixed");
}

bool CudaDevice::AccumulateFixed(const float* x, size_t n, int exponent, int64_t limit,
                                 int64_t* acc) {
  if (n == 0) return true;
  Check(cudaMemsetAsync(word_, 0, sizeof(uint32_t), stream()), "cudaMemset");
  AccumulateFixedInto(x, n, exponent, limit, acc, word_);
  uint32_t bad = 0;
  CopyToHost(&bad, word_, sizeof(bad));
  return bad == 0;
}

void CudaDevice::FoldBuckets(const float* grad, const FoldPlan& plan, int64_t limit, int64_t* acc,
                             uint32_t* max_bits, uint32_t* bad) {
  if (!tuning_.fused_fold || plan.device == nullptr) {
    if (capturing_) Die("FoldBuckets", "only the fused fold can be recorded");
    if (forked_ > 1) Die("FoldBuckets", "only the fused fold can run on open lanes");
    Device::FoldBuckets(grad, plan, limit, acc, max_bits, bad);
    return;
  }
  // A grid's second dimension holds at most 65535 block rows: more buckets take more launches.
  constexpr size_t kMaxRows = 65535;
  const double lim = LimitAsDouble(limit);
  for (size_t first = 0; first < plan.host.size(); first += kMaxRows) {
    const size_t rows = std::min(kMaxRows, plan.host.size() - first);
    size_t largest = 0;
    for (size_t b = first; b < first + rows; ++b)
      largest = std::max<size_t>(largest, plan.host[b].size);
    if (largest == 0) continue;
    const dim3 grid(static_cast<unsigned>(Blocks(largest)), static_cast<unsigned>(rows));
    if (forked_ > 1) {
      FoldBucketsKernel<true><<<grid, kThreads, 0, stream()>>>(grad, plan.device + first, lim, acc,
                                                               max_bits + first, bad);
    } else {
      FoldBucketsKernel<false><<<grid, kThreads, 0, stream()>>>(grad, plan.device + first, lim, acc,
                                                                max_bits + first, bad);
    }
    CheckLaunch("FoldBuckets");
  }
}

void CudaDevice::FixedToFloat(const int64_t* acc, size_t n, int exponent, double scale,
                              float* out) {
  if (n == 0) return;
  FixedToFloatKernel<<<Blocks(n), kThreads, 0, stream()>>>(acc, n, std::ldexp(1.0, -exponent),
                                                           scale, out);
  CheckLaunch("FixedToFloat");
}

void CudaDevice::Axpy(float alpha, const float* x, float* y, size_t n) {
  if (n == 0) return;
  AxpyKernel<<<Blocks(n), kThreads, 0, stream()>>>(alpha, x, y, n);
  CheckLaunch("Axpy");
}

void CudaDevice::Scale(float* x, float alpha, size_t n) {
  if (n == 0) return;
  ScaleKernel<<<Blocks(n), kThreads, 0, stream()>>>(x, alpha, n);
  CheckLaunch("Scale");
}

void CudaDevice::SgdMomentumStep(float* param, const float* grad, float* velocity, size_t n,
                                 const SgdUpdate& h) {
  if (n == 0) return;
  SgdMomentumKernel<<<Blocks(n), kThreads, 0, stream()>>>(param, grad, velocity, n, h.learning_rate,
                                                          h.momentum, h.weight_decay, h.nesterov);
  CheckLaunch("SgdMomentumStep");
}

void CudaDevice::AdamWStep(float* param, const float* grad, float* m, float* v, size_t n,
                           const AdamWUpdate& h) {
  if (n == 0) return;
  AdamWKernel<<<Blocks(n), kThreads, 0, stream()>>>(
      param, grad, m, v, n, h.learning_rate, h.beta1, h.beta2, 1.f - h.beta1, 1.f - h.beta2,
      1.f - h.learning_rate * h.weight_decay, h.bias_correction1, h.bias_correction2, h.epsilon);
  CheckLaunch("AdamWStep");
}

}  // namespace vf
