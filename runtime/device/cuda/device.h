// The CUDA backend of Device: cuBLAS for matrix products, fused elementwise kernels for the
// rest, queued on the streams of one GPU (one per lane).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/device.h"

// The CUDA types the header needs, declared as the CUDA headers do, so that users of this header
// need no CUDA include path.
struct CUstream_st;
struct CUevent_st;
struct CUgraphExec_st;
struct cublasContext;

namespace vf {

// One GPU as a Device. Kernels are queued in order on the current lane's stream (lane 0 outside
// Fork/Join); results that come back to the host (CopyToHost, MaxAbs, AccumulateFixed's flag,
// the loss statistics) wait for that stream. Every kernel is deterministic: reductions run in a
// fixed order or combine with max/or, never with floating-point atomics; multiply-adds are not
// contracted (--fmad=false) so elementwise results equal the CPU backend's bit for bit, and the
// exact-reduction kernels equal them everywhere. A CUDA error leaves a CUDA context unusable, so it
// ends the process with a one-line message and exit status 70; the job's other workers go on
// without it. Not thread-safe: one thread drives a device.
class CudaDevice final : public Device {
 public:
  // Use CreateCudaDevice(), which reports a missing GPU as a Status.
  explicit CudaDevice(int ordinal);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string Name() const override { return name_; }
  int ordinal() const { return ordinal_; }

  Result<void*> Allocate(size_t bytes) override;
  void Free(void* ptr) noexcept override;
  void CopyFromHost(void* dst, const void* src, size_t bytes) override;
  void CopyToHost(void* dst, const void* src, size_t bytes) override;
  void Copy(void* dst, const void* src, size_t bytes) override;
  void Fill(float* x, float value, size_t n) override;
  void FillInt64(int64_t* x, int64_t value, size_t n) override;
  void Synchronize() override;
  size_t MemoryInUse() override;
  // Page-locked (pinned) host memory: copies from it are asynchronous DMA, where a copy from
  // pageable memory can wait for the stream to drain first.
  Result<void*> AllocateStaging(size_t bytes) override;
  void FreeStaging(void* ptr) noexcept override;
  // CUDA graphs: a key's first use runs as is (it may allocate: cuBLAS sets up, scratch grows),
  // its second is captured from the stream and instantiated, later ones launch the graph.
  Status Record(std::span<const uint64_t> key, const std::function<Status()>& work) override;
  // Recording needs the fused fold, the only fold that reads its exponents from device memory:
  // turning fused_fold off turns record_nodes off too.
  void Tune(const DeviceTuning& tuning) override;
  // Device or managed memory, as the driver sees the pointer.
  bool OwnsMemory(const void* p) const override;
  // Lanes are streams, each with its own cuBLAS handle, workspace and loss scratch, made the
  // first time a Fork needs them. Between Fork and Join, FoldBuckets adds with integer atomics.
  int Lanes() const override;
  int FastPartialSums() const override { return kDefaultCudaLanes; }
  void Fork(int lanes) override;
  void UseLane(int lane) override;
  void Join() override;

  void Gemm(bool transpose_a, bool transpose_b, int m, int n, int k, float alpha, const float* a,
            const float* b, float beta, float* c) override;
  void NormalizePixels(const uint8_t* in, size_t n, float scale, float shift, float* out) override;
  void AddBiasActivate(float* y, const float* bias, int rows, int cols, bool relu) override;
  void ReluBackward(float* dy, const float* y, size_t n) override;
  void SumRows(const float* x, int rows, int cols, bool add, float* out) override;
  // The loss sum is added on the host in row order, as the CPU backend does.
  LossStats SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows, int cols,
                                float grad_scale, float* dlogits) override;
  void SoftmaxCrossEntropyInto(const float* logits, const int32_t* labels, int rows, int cols,
                               float grad_scale, float* dlogits, LossStats* stats) override;

  float MaxAbs(const float* x, size_t n) override;
  bool AccumulateFixed(const float* x, size_t n, int exponent, int64_t limit,
                       int64_t* acc) override;
  void MaxAbsInto(const float* x, size_t n, uint32_t* max_bits) override;
  void AccumulateFixedInto(const float* x, size_t n, int exponent, int64_t limit, int64_t* acc,
                           uint32_t* bad) override;
  void FoldBuckets(const float* grad, const FoldPlan& plan, int64_t limit, int64_t* acc,
                   uint32_t* max_bits, uint32_t* bad) override;
  void FixedToFloat(const int64_t* acc, size_t n, int exponent, double scale, float* out) override;

  void Axpy(float alpha, const float* x, float* y, size_t n) override;
  void Scale(float* x, float alpha, size_t n) override;
  void SgdMomentumStep(float* param, const float* grad, float* velocity, size_t n,
                       const SgdUpdate& h) override;
  void AdamWStep(float* param, const float* grad, float* m, float* v, size_t n,
                 const AdamWUpdate& h) override;

 private:
  // What one lane queues on: a stream, a cuBLAS handle with a workspace of its own (a recorded
  // product then allocates nothing, and concurrent products share no scratch), and the per-row
  // scratch of SoftmaxCrossEntropy.
  struct Lane {
    CUstream_st* stream = nullptr;
    CUevent_st* done = nullptr;  // Join's marker of the lane's work
    cublasContext* blas = nullptr;
    void* blas_workspace = nullptr;
    double* row_loss = nullptr;
    int32_t* row_correct = nullptr;
    int row_capacity = 0;
  };

  Lane& lane() { return lanes_[current_]; }
  CUstream_st* stream() { return lanes_[current_].stream; }
  // Appends a lane with its stream, handle and workspace.
  void AddLane();
  // Waits for every lane's queued work.
  void SynchronizeAll() noexcept;
  // Grows the current lane's per-row scratch of SoftmaxCrossEntropy to `rows` rows.
  void EnsureRowScratch(int rows);
  // Destroys every recording: memory they name may have been freed.
  void ForgetRecordings() noexcept;

  int ordinal_;
  std::string name_;
  std::vector<Lane> lanes_;     // lane 0 always exists
  size_t current_ = 0;          // the lane calls queue on
  int forked_ = 1;              // lanes open since Fork (1: none)
  CUevent_st* fork_ = nullptr;  // Fork's marker of the work queued before it
  // Device scratch: one word for MaxAbs and AccumulateFixed's flag.
  uint32_t* word_ = nullptr;
  LossStats* stats_ = nullptr;  // SoftmaxCrossEntropy's statistics on their way to the host
  DeviceTuning tuning_;
  bool capturing_ = false;
  // Record()'s graphs by key (the lane, whether lanes are open, then the caller's key); null
  // until the key's second use.
  std::map<std::vector<uint64_t>, CUgraphExec_st*> recordings_;
};

}  // namespace vf
