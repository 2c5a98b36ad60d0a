// The CUDA device against the CPU device: the exact-reduction and elementwise kernels must agree
// bit for bit, the matrix product and softmax to a stated tolerance. Without a GPU (or a
// driver) every case but the first skips and says why.
#include "runtime/device/cuda/device.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/device/test_util.h"

namespace vf {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

using testing_util::RandomFloats;
using testing_util::SameBits;

// A CPU device and GPU 0, with helpers that run the same kernel on both.
class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    auto gpu = CreateCudaDevice(0);
    ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
    gpu_ = std::move(*gpu);
  }

  template <typename T>
  DeviceBuffer<T> Upload(Device& d, const std::vector<T>& host) {
    auto b = DeviceBuffer<T>::Create(d, host.size());
    EXPECT_TRUE(b.ok());
    d.CopyFromHost(b->data(), host.data(), host.size() * sizeof(T));
    return std::move(*b);
  }

  template <typename T>
  std::vector<T> Download(Device& d, const DeviceBuffer<T>& b) {
    std::vector<T> host(b.size());
    d.CopyToHost(host.data(), b.data(), host.size() * sizeof(T));
    return host;
  }

  std::unique_ptr<Device> cpu_ = CreateCpuDevice(1);
  std::unique_ptr<Device> gpu_;
};

TEST_F(CudaDeviceTest, NameAndZeroedMemory) {
  EXPECT_EQ(gpu_->kind(), DeviceKind::kCuda);
  EXPECT_EQ(gpu_->Name().rfind("cuda:0 (", 0), 0u) << gpu_->Name();
  auto b = DeviceBuffer<float>::Create(*gpu_, 1 << 20);
  ASSERT_TRUE(b.ok());
  for (float x : Download(*gpu_, *b)) ASSERT_EQ(x, 0.f);
  EXPECT_EQ(CreateCudaDevice(1 << 20).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceTest, OwnsDeviceMemoryNotHostMemory) {
  auto b = DeviceBuffer<float>::Create(*gpu_, 1000);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(gpu_->OwnsMemory(b->data()));
  EXPECT_TRUE(gpu_->OwnsMemory(b->data() + 999));
  std::vector<float> host(1000);
  EXPECT_FALSE(gpu_->OwnsMemory(host.data()));
  auto pinned = StagingBuffer<float>::Create(*gpu_, 1000);
  ASSERT_TRUE(pinned.ok());
  EXPECT_FALSE(gpu_->OwnsMemory(pinned->data()));
}

TEST_F(CudaDeviceTest, MemoryInUseCountsAnAllocation) {
  // The driver hands out memory in pages of up to 2 MiB, so 64 MiB moves the count by at least
  // 62 MiB. The count is the whole GPU's, so nothing else may allocate on it meanwhile: the
  // suite runs its GPU tests one at a time (RESOURCE_LOCK gpu); seen failing on an H200 while
  // other processes trained on it.
  const size_t before = gpu_->MemoryInUse();
  EXPECT_GT(before, 0u);
  size_t during = 0;
  {
    auto b = DeviceBuffer<float>::Create(*gpu_, size_t{16} << 20);
    ASSERT_TRUE(b.ok());
    during = gpu_->MemoryInUse();
    EXPECT_GE(during, before + (size_t{62} << 20));
  }
  EXPECT_LE(gpu_->MemoryInUse() + (size_t{62} << 20), during);
}

TEST_F(CudaDeviceTest, ExactKernelsMatchTheCpuBitForBit) {
  const size_t n = 300001;
  auto x = RandomFloats(n, 1, -3.f, 3.f);
  x[7] = 1e-30f;
  x[8] = -0.f;
  for (int64_t limit : {int64_t{1} << 50, (int64_t{1} << 62) - 1}) {
    for (int exponent : {20, 44, -3}) {
      std::vector<int64_t> start(n);
      for (size_t i = 0; i < n; ++i) start[i] = static_cast<int64_t>(i) * 977 - 5000;
      auto c_acc = Upload(*cpu_, start);
      auto g_acc = Upload(*gpu_, start);
      auto c_x = Upload(*cpu_, x);
      auto g_x = Upload(*gpu_, x);
      EXPECT_EQ(cpu_->MaxAbs(c_x.data(), n), gpu_->MaxAbs(g_x.data(), n));
      const bool c_ok = cpu_->AccumulateFixed(c_x.data(), n, exponent, limit, c_acc.data());
      const bool g_ok = gpu_->AccumulateFixed(g_x.data(), n, exponent, limit, g_acc.data());
      EXPECT_TRUE(c_ok);
      EXPECT_EQ(c_ok, g_ok);
      EXPECT_EQ(Download(*cpu_, c_acc), Download(*gpu_, g_acc)) << exponent << " " << limit;
      auto c_out = DeviceBuffer<float>::Create(*cpu_, n);
      auto g_out = DeviceBuffer<float>::Create(*gpu_, n);
      cpu_->FixedToFloat(c_acc.data(), n, exponent, 0.125, c_out->data());
      gpu_->FixedToFloat(g_acc.data(), n, exponent, 0.125, g_out->data());
      EXPECT_TRUE(SameBits(Download(*cpu_, *c_out), Download(*gpu_, *g_out))) << exponent;
    }
  }
}

TEST_F(CudaDeviceTest, OverflowNanAndInfAreReportedAsOnTheCpu) {
  std::vector<float> x = {1.f, 2.f, -4.f};
  auto g = Upload(*gpu_, x);
  auto acc = DeviceBuffer<int64_t>::Create(*gpu_, x.size());
  EXPECT_TRUE(gpu_->AccumulateFixed(g.data(), x.size(), 10, 4096, acc->data()));
  EXPECT_FALSE(gpu_->AccumulateFixed(g.data(), x.size(), 11, 4096, acc->data()));
  EXPECT_EQ(gpu_->MaxAbs(g.data(), x.size()), 4.f);
  x[1] = kInf;
  auto inf = Upload(*gpu_, x);
  EXPECT_EQ(gpu_->MaxAbs(inf.data(), x.size()), kInf);
  x[2] = kNaN;
  auto nan = Upload(*gpu_, x);
  EXPECT_TRUE(std::isnan(gpu_->MaxAbs(nan.data(), x.size())));
  EXPECT_FALSE(gpu_->AccumulateFixed(nan.data(), x.size(), 0, 1 << 20, acc->data()));
  EXPECT_EQ(gpu_->MaxAbs(g.data(), 0), 0.f);
}

TEST_F(CudaDeviceTest, IntoFormsMatchTheCpuAndLeaveResultsOnTheDevice) {
  // Two calls accumulate into device words as the CPU's do into host words.
  const size_t n = 100003;
  const auto a = RandomFloats(n, 3, -2.f, 2.f);
  auto b = RandomFloats(n, 4, -1.f, 1.f);
  b[n - 1] = 2.5f;
  std::vector<int64_t> c_acc(n, 5);
  uint32_t c_words[2] = {0, 0};
  cpu_->MaxAbsInto(a.data(), n, &c_words[0]);
  cpu_->MaxAbsInto(b.data(), n, &c_words[0]);
  cpu_->AccumulateFixedInto(a.data(), n, 30, int64_t{1} << 40, c_acc.data(), &c_words[1]);
  cpu_->AccumulateFixedInto(b.data(), n, 30, int64_t{1} << 40, c_acc.data(), &c_words[1]);

  auto g_a = Upload(*gpu_, a);
  auto g_b = Upload(*gpu_, b);
  auto g_acc = Upload(*gpu_, std::vector<int64_t>(n, 5));
  auto words = Upload(*gpu_, std::vector<uint32_t>{0, 0});
  gpu_->MaxAbsInto(g_a.data(), n, words.data());
  gpu_->MaxAbsInto(g_b.data(), n, words.data());
  gpu_->AccumulateFixedInto(g_a.data(), n, 30, int64_t{1} << 40, g_acc.data(), words.data() + 1);
  gpu_->AccumulateFixedInto(g_b.data(), n, 30, int64_t{1} << 40, g_acc.data(), words.data() + 1);
  EXPECT_EQ(Download(*gpu_, words), (std::vector<uint32_t>{c_words[0], c_words[1]}));
  EXPECT_EQ(c_words[0], std::bit_cast<uint32_t>(2.5f));
  EXPECT_EQ(c_words[1], 0u);
  EXPECT_EQ(Download(*gpu_, g_acc), c_acc);
  // Overflow sets the flag on the device and a clean call leaves it set.
  gpu_->AccumulateFixedInto(g_a.data(), n, 60, int64_t{1} << 40, g_acc.data(), words.data() + 1);
  gpu_->AccumulateFixedInto(g_b.data(), n, 30, int64_t{1} << 40, g_acc.data(), words.data() + 1);
  EXPECT_NE(Download(*gpu_, words)[1], 0u);
}

// A node's buckets with mixed scales: one unset (measured only), one empty, one that
// overflows; the fused kernel against the CPU's per-bucket calls, and against the GPU's own
// per-bucket calls with the fused fold tuned off.
std::vector<FoldBucket> MixedBuckets() {
  // |x| < 3 in the test: 3 * 2^28 is within its limit of 2^30, so only bucket 1 (one element of
  // 1e6 at 2^12) overflows, and the sums of the others are specified.
  return {{0, 70000, 20, 0},      {70000, 1, 12, 0},
          {70001, 0, 30, 0},      {70001, 5000, kNoExponent, 0},
          {75001, 300000, 28, 0}, {375001, 999, -3, 0}};
}

TEST_F(CudaDeviceTest, FoldBucketsMatchesThePerBucketCallsBitForBit) {
  const size_t n = 376000;
  auto x = RandomFloats(n, 9, -3.f, 3.f);
  x[70000] = 1e6f;  // 1e6 * 2^12 is beyond the limit below: that bucket overflows
  x[76000] = -0.f;
  const int64_t limit = int64_t{1} << 30;
  std::vector<int64_t> start(n);
  for (size_t i = 0; i < n; ++i) start[i] = static_cast<int64_t>(i) * 31 - 999;
  const auto plan = MixedBuckets();
  std::vector<int64_t> c_acc = start;
  std::vector<uint32_t> c_max(plan.size(), 0);
  uint32_t c_bad = 0;
  cpu_->FoldBuckets(x.data(), FoldPlan{plan, plan.data()}, limit, c_acc.data(), c_max.data(),
                    &c_bad);
  EXPECT_NE(c_bad, 0u);
  EXPECT_EQ(c_max[1], std::bit_cast<uint32_t>(1e6f));
  EXPECT_EQ(c_max[2], 0u);
  for (bool fused : {true, false}) {
    DeviceTuning tuning;
    tuning.fused_fold = fused;
    gpu_->Tune(tuning);
    auto g_x = Upload(*gpu_, x);
    auto g_acc = Upload(*gpu_, start);
    auto g_max = Upload(*gpu_, std::vector<uint32_t>(plan.size(), 0));
    auto g_bad = Upload(*gpu_, std::vector<uint32_t>{0});
    auto g_plan = Upload(*gpu_, plan);
    gpu_->FoldBuckets(g_x.data(), FoldPlan{plan, g_plan.data()}, limit, g_acc.data(), g_max.data(),
                      g_bad.data());
    // The overflowing element's sum is unspecified (the CPU adds what its rounding gave).
    auto g_sums = Download(*gpu_, g_acc);
    g_sums[70000] = c_acc[70000];
    EXPECT_EQ(g_sums, c_acc) << "fused " << fused;
    EXPECT_EQ(Download(*gpu_, g_max), c_max) << "fused " << fused;
    EXPECT_NE(Download(*gpu_, g_bad)[0], 0u) << "fused " << fused;
  }
  gpu_->Tune(DeviceTuning{});
}

TEST_F(CudaDeviceTest, FoldBucketsTakesMoreBucketsThanOneGridHolds) {
  // 70,000 one-element buckets: more block rows than a grid's second dimension allows.
  const size_t n = 70000;
  const auto x = RandomFloats(n, 10, -1.f, 1.f);
  std::vector<FoldBucket> plan(n);
  for (size_t i = 0; i < n; ++i) plan[i] = {i, 1, static_cast<int32_t>(i % 50), 0};
  std::vector<int64_t> c_acc(n, 0);
  std::vector<uint32_t> c_max(n, 0);
  uint32_t c_bad = 0;
  cpu_->FoldBuckets(x.data(), FoldPlan{plan, plan.data()}, int64_t{1} << 50, c_acc.data(),
                    c_max.data(), &c_bad);
  auto g_x = Upload(*gpu_, x);
  auto g_acc = Upload(*gpu_, std::vector<int64_t>(n, 0));
  auto g_max = Upload(*gpu_, std::vector<uint32_t>(n, 0));
  auto g_bad = Upload(*gpu_, std::vector<uint32_t>{0});
  auto g_plan = Upload(*gpu_, plan);
  gpu_->FoldBuckets(g_x.data(), FoldPlan{plan, g_plan.data()}, int64_t{1} << 50, g_acc.data(),
                    g_max.data(), g_bad.data());
  EXPECT_EQ(Download(*gpu_, g_acc), c_acc);
  EXPECT_EQ(Download(*gpu_, g_max), c_max);
  EXPECT_EQ(Download(*gpu_, g_bad)[0], c_bad);
}

TEST_F(CudaDeviceTest, RecordedWorkReplaysWithTheDataOfEachCall) {
  // y = 0.5 * (y + 2x) + exact fold of y, recorded at the second call and replayed after that;
  // x changes between calls, as a node's batch does. The CPU runs the same calls unrecorded.
  const size_t n = 4099;
  const std::vector<FoldBucket> plan = {{0, n, 30, 0}};
  auto g_x = Upload(*gpu_, RandomFloats(n, 20));
  auto g_y = Upload(*gpu_, RandomFloats(n, 21));
  auto g_acc = Upload(*gpu_, std::vector<int64_t>(n, 0));
  auto g_words = Upload(*gpu_, std::vector<uint32_t>{0, 0});
  auto g_plan = Upload(*gpu_, plan);
  std::vector<float> c_y = RandomFloats(n, 21);
  std::vector<int64_t> c_acc(n, 0);
  uint32_t c_words[2] = {0, 0};
  const uint64_t key[] = {1, 2, 3};
  for (uint32_t call = 0; call < 5; ++call) {
    const auto x = RandomFloats(n, 100 + call);
    gpu_->CopyFromHost(g_x.data(), x.data(), n * sizeof(float));
    const Status s = gpu_->Record(key, [&]() -> Status {
      gpu_->Axpy(2.f, g_x.data(), g_y.data(), n);
      gpu_->Scale(g_y.data(), 0.5f, n);
      gpu_->FoldBuckets(g_y.data(), FoldPlan{plan, g_plan.data()}, int64_t{1} << 50, g_acc.data(),
                        g_words.data(), g_words.data() + 1);
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
    cpu_->Axpy(2.f, x.data(), c_y.data(), n);
    cpu_->Scale(c_y.data(), 0.5f, n);
    cpu_->FoldBuckets(c_y.data(), FoldPlan{plan, plan.data()}, int64_t{1} << 50, c_acc.data(),
                      &c_words[0], &c_words[1]);
    EXPECT_TRUE(SameBits(Download(*gpu_, g_y), c_y)) << "call " << call;
    EXPECT_EQ(Download(*gpu_, g_acc), c_acc) << "call " << call;
    EXPECT_EQ(Download(*gpu_, g_words), (std::vector<uint32_t>{c_words[0], c_words[1]}));
  }
  // A failing piece of work reports its error, recorded or not.
  const uint64_t other[] = {9};
  for (int call = 0; call < 3; ++call) {
    EXPECT_EQ(gpu_->Record(other, [] { return Internal("no"); }).code(), StatusCode::kInternal);
  }
}

TEST_F(CudaDeviceTest, LanesFoldAtTheSameTimeIntoTheSameSums) {
  // Sixteen gradients folded on four lanes at once into one accumulator, each lane copying its
  // node's gradient into a buffer of its own and folding it there (run, recorded at its second
  // use, then replayed, as the executor does): the integer sums and maxima are the CPU's, which
  // folds the gradients in turn.
  const size_t n = 200003;
  const std::vector<FoldBucket> plan = {{0, 100000, 20, 0}, {100000, n - 100000, 24, 0}};
  std::vector<std::vector<float>> grads;
  for (uint32_t g = 0; g < 16; ++g) grads.push_back(RandomFloats(n, 300 + g, -4.f, 4.f));
  std::vector<int64_t> c_acc(n, 0);
  std::vector<uint32_t> c_words(plan.size() + 1, 0);
  for (const auto& g : grads) {
    cpu_->FoldBuckets(g.data(), FoldPlan{plan, plan.data()}, int64_t{1} << 50, c_acc.data(),
                      c_words.data(), c_words.data() + plan.size());
  }
  auto g_acc = Upload(*gpu_, std::vector<int64_t>(n, 0));
  auto g_words = Upload(*gpu_, std::vector<uint32_t>(plan.size() + 1, 0));
  auto g_plan = Upload(*gpu_, plan);
  std::vector<DeviceBuffer<float>> inputs, lane_x;
  for (const auto& g : grads) inputs.push_back(Upload(*gpu_, g));
  for (int l = 0; l < 4; ++l) lane_x.push_back(Upload(*gpu_, std::vector<float>(n, 0.f)));
  ASSERT_GE(gpu_->Lanes(), 2);
  gpu_->Fork(4);
  for (size_t g = 0; g < grads.size(); ++g) {
    const size_t l = g % 4;
    gpu_->UseLane(static_cast<int>(l));
    gpu_->Copy(lane_x[l].data(), inputs[g].data(), n * sizeof(float));
    const uint64_t key[] = {l};
    const Status s = gpu_->Record(key, [&]() -> Status {
      gpu_->FoldBuckets(lane_x[l].data(), FoldPlan{plan, g_plan.data()}, int64_t{1} << 50,
                        g_acc.data(), g_words.data(), g_words.data() + plan.size());
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  gpu_->Join();
  EXPECT_EQ(Download(*gpu_, g_acc), c_acc);
  EXPECT_EQ(Download(*gpu_, g_words), c_words);
}

TEST_F(CudaDeviceTest, StagingMemoryFeedsCopiesPinnedOrNot) {
  for (bool pinned : {true, false}) {
    DeviceTuning tuning;
    tuning.pinned_staging = pinned;
    gpu_->Tune(tuning);
    auto staging = StagingBuffer<float>::Create(*gpu_, 1000);
    ASSERT_TRUE(staging.ok()) << staging.status().ToString();
    const auto x = RandomFloats(1000, 30);
    std::memcpy(staging->data(), x.data(), x.size() * sizeof(float));
    auto g = DeviceBuffer<float>::Create(*gpu_, x.size());
    gpu_->CopyFromHost(g->data(), staging->data(), x.size() * sizeof(float));
    EXPECT_TRUE(SameBits(Download(*gpu_, *g), x)) << "pinned " << pinned;
    staging->Reset();
  }
  gpu_->Tune(DeviceTuning{});
}

TEST_F(CudaDeviceTest, NormalizePixelsMatchesTheCpuBitForBit) {
  std::vector<uint8_t> in(70001);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 131 % 256);
  const float scale = 1.f / (255.f * 0.353f);
  const float shift = 0.286f / 0.353f;
  std::vector<float> want(in.size());
  cpu_->NormalizePixels(in.data(), in.size(), scale, shift, want.data());
  auto g_in = Upload(*gpu_, in);
  auto g_out = DeviceBuffer<float>::Create(*gpu_, in.size());
  gpu_->NormalizePixels(g_in.data(), in.size(), scale, shift, g_out->data());
  EXPECT_TRUE(SameBits(want, Download(*gpu_, *g_out)));
}

TEST_F(CudaDeviceTest, ElementwiseKernelsAndOptimizersMatchTheCpuBitForBit) {
  const int rows = 37;
  const int cols = 515;
  const size_t n = static_cast<size_t>(rows) * cols;
  const auto y0 = RandomFloats(n, 2);
  const auto bias = RandomFloats(cols, 3);
  const auto g0 = RandomFloats(n, 4);
  const auto p0 = RandomFloats(n, 5);
  const auto v0 = RandomFloats(n, 6, 0.f, 1.f);
  for (bool relu : {false, true}) {
    auto cy = Upload(*cpu_, y0);
    auto gy = Upload(*gpu_, y0);
    auto cb = Upload(*cpu_, bias);
    auto gb = Upload(*gpu_, bias);
    cpu_->AddBiasActivate(cy.data(), cb.data(), rows, cols, relu);
    gpu_->AddBiasActivate(gy.data(), gb.data(), rows, cols, relu);
    ASSERT_TRUE(SameBits(Download(*cpu_, cy), Download(*gpu_, gy))) << relu;
    auto cd = Upload(*cpu_, g0);
    auto gd = Upload(*gpu_, g0);
    cpu_->ReluBackward(cd.data(), cy.data(), n);
    gpu_->ReluBackward(gd.data(), gy.data(), n);
    EXPECT_TRUE(SameBits(Download(*cpu_, cd), Download(*gpu_, gd)));
    auto cs = DeviceBuffer<float>::Create(*cpu_, cols);
    auto gs = DeviceBuffer<float>::Create(*gpu_, cols);
    cpu_->SumRows(cy.data(), rows, cols, /*add=*/false, cs->data());
    gpu_->SumRows(gy.data(), rows, cols, /*add=*/false, gs->data());
    EXPECT_TRUE(SameBits(Download(*cpu_, *cs), Download(*gpu_, *gs)));
    cpu_->SumRows(cd.data(), rows, cols, /*add=*/true, cs->data());
    gpu_->SumRows(gd.data(), rows, cols, /*add=*/true, gs->data());
    EXPECT_TRUE(SameBits(Download(*cpu_, *cs), Download(*gpu_, *gs)));
  }
  {
    auto cx = Upload(*cpu_, g0);
    auto gx = Upload(*gpu_, g0);
    auto cy = Upload(*cpu_, p0);
    auto gy = Upload(*gpu_, p0);
    cpu_->Axpy(0.3f, cx.data(), cy.data(), n);
    gpu_->Axpy(0.3f, gx.data(), gy.data(), n);
    cpu_->Scale(cy.data(), 1.7f, n);
    gpu_->Scale(gy.data(), 1.7f, n);
    EXPECT_TRUE(SameBits(Download(*cpu_, cy), Download(*gpu_, gy)));
  }
  for (bool nesterov : {false, true}) {
    auto cp = Upload(*cpu_, p0);
    auto gp = Upload(*gpu_, p0);
    auto cg = Upload(*cpu_, g0);
    auto gg = Upload(*gpu_, g0);
    auto cv = Upload(*cpu_, v0);
    auto gv = Upload(*gpu_, v0);
    const SgdUpdate h{
        .learning_rate = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f, .nesterov = nesterov};
    for (int step = 0; step < 3; ++step) {
      cpu_->SgdMomentumStep(cp.data(), cg.data(), cv.data(), n, h);
      gpu_->SgdMomentumStep(gp.data(), gg.data(), gv.data(), n, h);
    }
    EXPECT_TRUE(SameBits(Download(*cpu_, cp), Download(*gpu_, gp))) << nesterov;
    EXPECT_TRUE(SameBits(Download(*cpu_, cv), Download(*gpu_, gv))) << nesterov;
  }
  {
    auto cp = Upload(*cpu_, p0);
    auto gp = Upload(*gpu_, p0);
    auto cg = Upload(*cpu_, g0);
    auto gg = Upload(*gpu_, g0);
    auto cm = Upload(*cpu_, v0);
    auto gm = Upload(*gpu_, v0);
    auto cv = Upload(*cpu_, v0);
    auto gv = Upload(*gpu_, v0);
    const AdamWUpdate h{.learning_rate = 1e-3f,
                        .weight_decay = 0.01f,
                        .bias_correction1 = 0.1f,
                        .bias_correction2 = 0.001f};
    cpu_->AdamWStep(cp.data(), cg.data(), cm.data(), cv.data(), n, h);
    gpu_->AdamWStep(gp.data(), gg.data(), gm.data(), gv.data(), n, h);
    EXPECT_TRUE(SameBits(Download(*cpu_, cp), Download(*gpu_, gp)));
    EXPECT_TRUE(SameBits(Download(*cpu_, cm), Download(*gpu_, gm)));
    EXPECT_TRUE(SameBits(Download(*cpu_, cv), Download(*gpu_, gv)));
  }
}

TEST_F(CudaDeviceTest, GemmAgreesWithTheCpuAndRepeatsBitForBit) {
  const int m = 33;
  const int n = 70;
  const int k = 129;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const auto a = RandomFloats(static_cast<size_t>(m) * k, 7);
      const auto b = RandomFloats(static_cast<size_t>(k) * n, 8);
      const auto c0 = RandomFloats(static_cast<size_t>(m) * n, 9);
      auto ca = Upload(*cpu_, a);
      auto cb = Upload(*cpu_, b);
      auto cc = Upload(*cpu_, c0);
      auto ga = Upload(*gpu_, a);
      auto gb = Upload(*gpu_, b);
      auto gc = Upload(*gpu_, c0);
      auto gc2 = Upload(*gpu_, c0);
      cpu_->Gemm(ta, tb, m, n, k, 0.5f, ca.data(), cb.data(), 0.25f, cc.data());
      gpu_->Gemm(ta, tb, m, n, k, 0.5f, ga.data(), gb.data(), 0.25f, gc.data());
      gpu_->Gemm(ta, tb, m, n, k, 0.5f, ga.data(), gb.data(), 0.25f, gc2.data());
      const auto want = Download(*cpu_, cc);
      const auto got = Download(*gpu_, gc);
      EXPECT_TRUE(SameBits(got, Download(*gpu_, gc2))) << "not deterministic";
      // Each entry sums k products of magnitude <= 1: float32 rounding stays within k ulps of
      // the largest partial sum.
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5f * k) << "ta=" << ta << " tb=" << tb << " i=" << i;
      }
    }
  }
}

TEST_F(CudaDeviceTest, SoftmaxCrossEntropyAgreesWithTheCpu) {
  const int rows = 257;
  const int cols = 10;
  const auto logits = RandomFloats(static_cast<size_t>(rows) * cols, 10, -8.f, 8.f);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[static_cast<size_t>(r)] = (r * 7) % cols;
  auto cl = Upload(*cpu_, logits);
  auto gl = Upload(*gpu_, logits);
  auto cy = Upload(*cpu_, labels);
  auto gy = Upload(*gpu_, labels);
  auto cg = DeviceBuffer<float>::Create(*cpu_, logits.size());
  auto gg = DeviceBuffer<float>::Create(*gpu_, logits.size());
  const LossStats c = cpu_->SoftmaxCrossEntropy(cl.data(), cy.data(), rows, cols, 0.5f, cg->data());
  const LossStats g = gpu_->SoftmaxCrossEntropy(gl.data(), gy.data(), rows, cols, 0.5f, gg->data());
  EXPECT_EQ(c.samples, g.samples);
  EXPECT_EQ(c.correct, g.correct);
  EXPECT_NEAR(c.loss_sum, g.loss_sum, 1e-9 * std::abs(c.loss_sum));
  const auto want = Download(*cpu_, *cg);
  const auto got = Download(*gpu_, *gg);
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-7f) << i;
}

TEST_F(CudaDeviceTest, SoftmaxCrossEntropyIntoRepeatsAndMatchesTheReturningForm) {
  const int rows = 1000;  // more rows than threads in a block
  const int cols = 10;
  const auto logits = RandomFloats(static_cast<size_t>(rows) * cols, 12, -6.f, 6.f);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[static_cast<size_t>(r)] = (r * 3) % cols;
  auto gl = Upload(*gpu_, logits);
  auto gy = Upload(*gpu_, labels);
  auto gg = DeviceBuffer<float>::Create(*gpu_, logits.size());
  auto slots = DeviceBuffer<LossStats>::Create(*gpu_, 2);
  ASSERT_TRUE(slots.ok());
  gpu_->SoftmaxCrossEntropyInto(gl.data(), gy.data(), rows, cols, 1.f, gg->data(), slots->data());
  gpu_->SoftmaxCrossEntropyInto(gl.data(), gy.data(), rows, cols, 1.f, nullptr, slots->data() + 1);
  const LossStats returned =
      gpu_->SoftmaxCrossEntropy(gl.data(), gy.data(), rows, cols, 1.f, nullptr);
  const auto got = Download(*gpu_, *slots);
  EXPECT_EQ(got[0].loss_sum, got[1].loss_sum);  // a fixed order: the same bits every time
  EXPECT_EQ(got[0].loss_sum, returned.loss_sum);
  EXPECT_EQ(got[0].correct, returned.correct);
  EXPECT_EQ(got[0].samples, rows);
  LossStats cpu;
  cpu_->SoftmaxCrossEntropyInto(logits.data(), labels.data(), rows, cols, 1.f, nullptr, &cpu);
  EXPECT_EQ(cpu.correct, got[0].correct);
  EXPECT_NEAR(cpu.loss_sum, got[0].loss_sum, 1e-9 * std::abs(cpu.loss_sum));
}

}  // namespace
}  // namespace vf
