#include "runtime/device/cpu/device.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device.h"
#include "runtime/device/test_util.h"

namespace vf {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

class CpuDeviceTest : public ::testing::Test {
 protected:
  std::unique_ptr<Device> device_ = CreateCpuDevice(1);
};

using testing_util::RandomFloats;
using testing_util::SameBits;

// ---- Identity and memory ----

TEST_F(CpuDeviceTest, NameReportsBackendAndThreadCount) {
  EXPECT_EQ(device_->kind(), DeviceKind::kCpu);
  const std::string blas = "cpu (OpenBLAS " + std::string(openblas_get_corename());
  EXPECT_EQ(device_->Name(), blas + ", 1 thread)");
  EXPECT_EQ(CpuDevice(2).Name(), blas + ", 2 threads)");
}

TEST_F(CpuDeviceTest, AllocateReturnsZeroedAlignedMemory) {
  for (size_t bytes :
       {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{1000}, size_t{1} << 20}) {
    Result<void*> p = device_->Allocate(bytes);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 64, 0u) << bytes;
    const auto* bytes_ptr = static_cast<const unsigned char*>(*p);
    EXPECT_TRUE(std::all_of(bytes_ptr, bytes_ptr + bytes, [](unsigned char c) { return c == 0; }))
        << bytes;
    device_->Free(*p);
  }
}

TEST_F(CpuDeviceTest, HasNoMemoryOfItsOwn) {
  auto b = DeviceBuffer<float>::Create(*device_, 1 << 20);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(device_->MemoryInUse(), 0u);
}

TEST_F(CpuDeviceTest, OwnsWhatItAllocatedUntilItIsFreed) {
  auto b = DeviceBuffer<float>::Create(*device_, 100);
  ASSERT_TRUE(b.ok());
  const float* inside = b->data() + 99;
  EXPECT_TRUE(device_->OwnsMemory(b->data()));
  EXPECT_TRUE(device_->OwnsMemory(inside));
  std::vector<float> host(100);
  EXPECT_FALSE(device_->OwnsMemory(host.data()));
  const void* gone = b->data();
  b->Reset();
  EXPECT_FALSE(device_->OwnsMemory(gone));
}

TEST_F(CpuDeviceTest, AllocateZeroesReusedMemory) {
  for (int round = 0; round < 4; ++round) {
    Result<void*> p = device_->Allocate(4096);
    ASSERT_TRUE(p.ok());
    auto* bytes = static_cast<unsigned char*>(*p);
    EXPECT_TRUE(std::all_of(bytes, bytes + 4096, [](unsigned char c) { return c == 0; }));
    std::memset(bytes, 0xff, 4096);  // dirty it for the next round to reuse
    device_->Free(*p);
  }
}

TEST_F(CpuDeviceTest, AllocateFailureIsInternalErrorNamingTheSize) {
  Result<void*> p = device_->Allocate(std::numeric_limits<size_t>::max() - 8);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInternal);
  EXPECT_NE(p.status().message().find(std::to_string(std::numeric_limits<size_t>::max() - 8)),
            std::string::npos)
      << p.status().message();
}

TEST_F(CpuDeviceTest, DeviceBufferMoveTransfersOwnership) {
  Result<DeviceBuffer<float>> created = DeviceBuffer<float>::Create(*device_, 100);
  ASSERT_TRUE(created.ok());
  DeviceBuffer<float> a = std::move(created).value();
  float* data = a.data();
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(a.size(), 100u);
  EXPECT_EQ(a.bytes(), 400u);
  data[99] = 7.f;

  DeviceBuffer<float> b(std::move(a));
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(b.size(), 100u);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): the moved-from state matters
  EXPECT_EQ(a.size(), 0u);

  DeviceBuffer<float> c;
  c = std::move(b);
  EXPECT_EQ(c.data(), data);
  EXPECT_EQ(c.data()[99], 7.f);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)

  c.Reset();
  EXPECT_EQ(c.data(), nullptr);
  EXPECT_EQ(c.size(), 0u);
}

TEST_F(CpuDeviceTest, EmptyDeviceBufferHasUniqueMemory) {
  Result<DeviceBuffer<int64_t>> b = DeviceBuffer<int64_t>::Create(*device_, 0);
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->data(), nullptr);
  EXPECT_EQ(b->size(), 0u);
}

TEST_F(CpuDeviceTest, CopiesAndFillsMoveExactBytes) {
  std::vector<float> src = RandomFloats(37, 1);
  std::vector<float> dev(37), back(37), copy(37);
  device_->CopyFromHost(dev.data(), src.data(), src.size() * sizeof(float));
  device_->Copy(copy.data(), dev.data(), dev.size() * sizeof(float));
  device_->CopyToHost(back.data(), copy.data(), copy.size() * sizeof(float));
  device_->Synchronize();
  EXPECT_TRUE(SameBits(src, back));
  device_->CopyFromHost(nullptr, nullptr, 0);  // empty copies are allowed on null buffers

  device_->Fill(back.data(), -2.5f, back.size());
  EXPECT_TRUE(std::all_of(back.begin(), back.end(), [](float x) { return x == -2.5f; }));
  std::vector<int64_t> ints(19, 3);
  device_->FillInt64(ints.data(), -(int64_t{1} << 60), ints.size());
  EXPECT_TRUE(
      std::all_of(ints.begin(), ints.end(), [](int64_t x) { return x == -(int64_t{1} << 60); }));
}

// ---- Matrix kernels ----

struct GemmCase {
  bool transpose_a;
  bool transpose_b;
};

void PrintTo(const GemmCase& c, std::ostream* os) {
  *os << "transpose_a=" << c.transpose_a << " transpose_b=" << c.transpose_b;
}

class CpuGemmTest : public CpuDeviceTest, public ::testing::WithParamInterface<GemmCase> {};

TEST_P(CpuGemmTest, MatchesDoublePrecisionReference) {
  const auto [ta, tb] = GetParam();
  for (auto [m, n, k] :
       {std::tuple{7, 5, 13}, std::tuple{1, 1, 1}, std::tuple{33, 17, 65}, std::tuple{3, 64, 9}}) {
    const std::vector<float> a = RandomFloats(static_cast<size_t>(m) * k, 10 + m);
    const std::vector<float> b = RandomFloats(static_cast<size_t>(k) * n, 20 + n);
    const std::vector<float> c0 = RandomFloats(static_cast<size_t>(m) * n, 30 + k);
    const float alpha = 1.5f, beta = -0.5f;
    std::vector<float> c = c0;
    device_->Gemm(ta, tb, m, n, k, alpha, a.data(), b.data(), beta, c.data());
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double sum = 0;
        for (int p = 0; p < k; ++p) {
          const double av =
              ta ? a[static_cast<size_t>(p) * m + i] : a[static_cast<size_t>(i) * k + p];
          const double bv =
              tb ? b[static_cast<size_t>(j) * k + p] : b[static_cast<size_t>(p) * n + j];
          sum += av * bv;
        }
        const double want = alpha * sum + beta * c0[static_cast<size_t>(i) * n + j];
        const double got = c[static_cast<size_t>(i) * n + j];
        EXPECT_NEAR(got, want, 1e-4 * std::max(1.0, std::fabs(want)))
            << "m=" << m << " n=" << n << " k=" << k << " at " << i << "," << j;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTransposes, CpuGemmTest,
                         ::testing::Values(GemmCase{false, false}, GemmCase{true, false},
                                           GemmCase{false, true}, GemmCase{true, true}),
                         [](const ::testing::TestParamInfo<GemmCase>& param_info) {
                           return std::string(param_info.param.transpose_a ? "AT" : "A") +
                                  (param_info.param.transpose_b ? "BT" : "B");
                         });

TEST_F(CpuDeviceTest, GemmIsBitwiseRepeatable) {
  const std::vector<float> a = RandomFloats(size_t{64} * 128, 1),
                           b = RandomFloats(size_t{128} * 96, 2);
  std::vector<float> c1(size_t{64} * 96), c2(size_t{64} * 96);
  device_->Gemm(false, false, 64, 96, 128, 1.f, a.data(), b.data(), 0.f, c1.data());
  device_->Gemm(false, false, 64, 96, 128, 1.f, a.data(), b.data(), 0.f, c2.data());
  EXPECT_TRUE(SameBits(c1, c2));
}

TEST_F(CpuDeviceTest, GemmWithEmptyInnerDimensionScalesC) {
  std::vector<float> c = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  const float dummy = 0.f;
  device_->Gemm(false, false, 2, 3, 0, 1.f, &dummy, &dummy, 2.f, c.data());
  EXPECT_EQ(c, (std::vector<float>{2.f, 4.f, 6.f, 8.f, 10.f, 12.f}));
}

TEST_F(CpuDeviceTest, NormalizePixelsRoundsAfterEachOperation) {
  std::vector<uint8_t> in(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 37 % 256);
  const float scale = 1.f / (255.f * 0.353f);
  const float shift = 0.286f / 0.353f;
  std::vector<float> out(in.size());
  device_->NormalizePixels(in.data(), in.size(), scale, shift, out.data());
  for (size_t i = 0; i < in.size(); ++i) {
    volatile float product = static_cast<float>(in[i]) * scale;  // rounded to float here
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(product - shift)) << i;
  }
  EXPECT_EQ(out[0], -shift);
}

TEST_F(CpuDeviceTest, AddBiasActivateWithoutReluAddsBiasToEveryRow) {
  std::vector<float> y = {1.f, -2.f, 3.f, -4.f, 5.f, -6.f};
  const std::vector<float> bias = {0.5f, 1.f, -10.f};
  device_->AddBiasActivate(y.data(), bias.data(), 2, 3, false);
  EXPECT_EQ(y, (std::vector<float>{1.5f, -1.f, -7.f, -3.5f, 6.f, -16.f}));
}

TEST_F(CpuDeviceTest, AddBiasActivateWithReluClampsNegativesToZero) {
  std::vector<float> y = {1.f, -2.f, 3.f, -4.f, 5.f, -6.f};
  const std::vector<float> bias = {0.5f, 1.f, -10.f};
  device_->AddBiasActivate(y.data(), bias.data(), 2, 3, true);
  EXPECT_EQ(y, (std::vector<float>{1.5f, 0.f, 0.f, 0.f, 6.f, 0.f}));
}

TEST_F(CpuDeviceTest, AddBiasActivateWithReluPropagatesNaN) {
  std::vector<float> y = {kNaN, -1.f};
  const std::vector<float> bias = {0.f, 0.f};
  device_->AddBiasActivate(y.data(), bias.data(), 1, 2, true);
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.f);
}

TEST_F(CpuDeviceTest, ReluBackwardPassesGradientOnlyWhereOutputIsPositive) {
  const std::vector<float> y = {0.f, 2.f, 0.f, 0.5f, -0.f};
  std::vector<float> dy = {1.f, -2.f, 3.f, -4.f, 5.f};
  device_->ReluBackward(dy.data(), y.data(), dy.size());
  EXPECT_EQ(dy, (std::vector<float>{0.f, -2.f, 0.f, -4.f, 0.f}));
}

TEST_F(CpuDeviceTest, SumRowsSumsEachColumnInIncreasingRowOrder) {
  // Rows chosen so that any other summation order gives a different float.
  const int rows = 4, cols = 19;
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  for (int c = 0; c < cols; ++c) {
    x[0 * cols + c] = 1e8f;
    x[1 * cols + c] = 1.f + static_cast<float>(c);
    x[2 * cols + c] = -1e8f;
    x[3 * cols + c] = 3.f;
  }
  std::vector<float> out(cols, -1.f);
  device_->SumRows(x.data(), rows, cols, /*add=*/false, out.data());
  for (int c = 0; c < cols; ++c) {
    float want = 0.f;
    for (int r = 0; r < rows; ++r) want += x[r * cols + c];
    EXPECT_EQ(std::bit_cast<uint32_t>(out[c]), std::bit_cast<uint32_t>(want)) << c;
  }
  EXPECT_EQ(out[0], 3.f);  // (1e8 + 1) rounds back to 1e8, so the 1 is lost
}

TEST_F(CpuDeviceTest, SumRowsMatchesSequentialSumOnRandomData) {
  const int rows = 37, cols = 71;
  const std::vector<float> x = RandomFloats(static_cast<size_t>(rows) * cols, 5, -100.f, 100.f);
  std::vector<float> out(cols);
  device_->SumRows(x.data(), rows, cols, /*add=*/false, out.data());
  std::vector<float> want(cols, 0.f);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) want[c] += x[r * cols + c];
  }
  EXPECT_TRUE(SameBits(out, want));
}

TEST_F(CpuDeviceTest, SumRowsThatAddsAddsTheColumnSumOnceToEachOutput) {
  // Adding the rows to the output one by one would round differently: the output's 1e8 would
  // swallow the small rows, where their own sum (3 + c) survives the one addition.
  const int rows = 3, cols = 9;
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  for (int c = 0; c < cols; ++c) {
    x[0 * cols + c] = 1.f;
    x[1 * cols + c] = 2.f;
    x[2 * cols + c] = static_cast<float>(c);
  }
  std::vector<float> out(cols, 1e8f);
  // Twice, the second time with fewer columns: the scratch of a wider call must not leak in.
  device_->SumRows(x.data(), rows, cols, /*add=*/true, out.data());
  for (int c = 0; c < cols; ++c) {
    EXPECT_EQ(out[c], 1e8f + (3.f + static_cast<float>(c))) << c;
  }
  std::vector<float> narrow(2, 0.5f);
  device_->SumRows(x.data() + cols, 1, 2, /*add=*/true, narrow.data());
  EXPECT_EQ(narrow, (std::vector<float>{2.5f, 2.5f}));
}

// ---- Softmax cross-entropy ----

// Per-row loss logsumexp(z) - z[label] in double.
double ReferenceRowLoss(const std::vector<double>& z, int label) {
  double max = z.at(0);
  for (double v : z) max = std::max(max, v);
  double sum = 0;
  for (double v : z) sum += std::exp(v - max);
  return max + std::log(sum) - z[label];
}

TEST_F(CpuDeviceTest, SoftmaxCrossEntropyLossAndCorrectCountMatchReference) {
  const int rows = 50, cols = 10;
  const std::vector<float> logits = RandomFloats(static_cast<size_t>(rows) * cols, 7, -5.f, 5.f);
  std::vector<int32_t> labels(rows);
  std::mt19937 rng(8);
  for (int32_t& l : labels) l = static_cast<int32_t>(rng() % cols);
  double want_loss = 0;
  int64_t want_correct = 0;
  for (int r = 0; r < rows; ++r) {
    std::vector<double> z(logits.begin() + ptrdiff_t{r} * cols,
                          logits.begin() + ptrdiff_t{r + 1} * cols);
    want_loss += ReferenceRowLoss(z, labels[r]);
    want_correct += (std::max_element(z.begin(), z.end()) - z.begin()) == labels[r];
  }
  ASSERT_GT(want_correct, 0);
  const LossStats stats =
      device_->SoftmaxCrossEntropy(logits.data(), labels.data(), rows, cols, 1.f, nullptr);
  EXPECT_NEAR(stats.loss_sum, want_loss, 1e-9 * want_loss);
  EXPECT_EQ(stats.correct, want_correct);
  EXPECT_EQ(stats.samples, rows);
}

TEST_F(CpuDeviceTest, SoftmaxCrossEntropyGradientMatchesFiniteDifferences) {
  const int rows = 6, cols = 7;
  const float grad_scale = 0.25f;
  const std::vector<float> logits = RandomFloats(static_cast<size_t>(rows) * cols, 9, -3.f, 3.f);
  const std::vector<int32_t> labels = {0, 6, 3, 3, 1, 5};
  std::vector<float> grad(static_cast<size_t>(rows) * cols, kNaN);
  device_->SoftmaxCrossEntropy(logits.data(), labels.data(), rows, cols, grad_scale, grad.data());
  const double h = 1e-5;
  for (int r = 0; r < rows; ++r) {
    std::vector<double> z(logits.begin() + ptrdiff_t{r} * cols,
                          logits.begin() + ptrdiff_t{r + 1} * cols);
    for (int c = 0; c < cols; ++c) {
      std::vector<double> plus = z, minus = z;
      plus[c] += h;
      minus[c] -= h;
      const double numeric =
          (ReferenceRowLoss(plus, labels[r]) - ReferenceRowLoss(minus, labels[r])) / (2 * h);
      EXPECT_NEAR(grad[r * cols + c], numeric * grad_scale, 1e-6) << r << "," << c;
    }
  }
}

TEST_F(CpuDeviceTest, SoftmaxCrossEntropyFirstMaximumWinsTies) {
  const std::vector<float> logits = {2.f, 5.f, 5.f, 5.f, 1.f, 5.f};
  const std::vector<int32_t> labels = {1, 0};
  const LossStats stats =
      device_->SoftmaxCrossEntropy(logits.data(), labels.data(), 2, 3, 1.f, nullptr);
  EXPECT_EQ(stats.correct, 2);
}

TEST_F(CpuDeviceTest, SoftmaxCrossEntropyStaysFiniteForHugeLogits) {
  const std::vector<float> logits = {1e4f, -1e4f, 0.f, -1e4f, 1e4f, 1e4f};
  const std::vector<int32_t> labels = {1, 2};
  std::vector<float> grad(6);
  const LossStats stats =
      device_->SoftmaxCrossEntropy(logits.data(), labels.data(), 2, 3, 1.f, grad.data());
  EXPECT_TRUE(std::isfinite(stats.loss_sum));
  EXPECT_NEAR(stats.loss_sum, 2e4 + std::log(2.0), 1e-3);
  for (float g : grad) EXPECT_TRUE(std::isfinite(g)) << g;
  EXPECT_FLOAT_EQ(grad[0], 1.f);
  EXPECT_FLOAT_EQ(grad[1], -1.f);
  EXPECT_FLOAT_EQ(grad[4], 0.5f);
  EXPECT_FLOAT_EQ(grad[5], -0.5f);
}

TEST_F(CpuDeviceTest, SoftmaxCrossEntropyOutOfRangeLabelPoisonsRowWithNaN) {
  const std::vector<float> logits = {1.f, 2.f, 3.f, 4.f};
  const std::vector<int32_t> labels = {0, 2};
  std::vector<float> grad(4);
  LossStats stats;
  EXPECT_DEBUG_DEATH(
      stats = device_->SoftmaxCrossEntropy(logits.data(), labels.data(), 2, 2, 1.f, grad.data()),
      "label");
#ifdef NDEBUG
  EXPECT_TRUE(std::isnan(stats.loss_sum));
  EXPECT_TRUE(std::isfinite(grad[0]));
  EXPECT_TRUE(std::isnan(grad[2]));
  EXPECT_TRUE(std::isnan(grad[3]));
#endif
}

// ---- MaxAbs ----

TEST_F(CpuDeviceTest, MaxAbsReturnsLargestMagnitude) {
  std::vector<float> x = RandomFloats(1001, 11);
  x[517] = -3.25f;
  EXPECT_EQ(device_->MaxAbs(x.data(), x.size()), 3.25f);
  x[1000] = 4.f;  // the scalar tail of a vector loop
  EXPECT_EQ(device_->MaxAbs(x.data(), x.size()), 4.f);
  const float tiny[] = {-0.f, std::numeric_limits<float>::denorm_min()};
  EXPECT_EQ(device_->MaxAbs(tiny, 2), std::numeric_limits<float>::denorm_min());
}

TEST_F(CpuDeviceTest, IntoFormsAccumulateAcrossCallsAndKeepTheFlag) {
  const std::vector<float> a = {1.f, -3.f, 2.f};
  const std::vector<float> b = {-0.5f, 1.5f, 0.25f};
  uint32_t bits = 0;
  device_->MaxAbsInto(a.data(), a.size(), &bits);
  device_->MaxAbsInto(b.data(), b.size(), &bits);
  EXPECT_EQ(bits, std::bit_cast<uint32_t>(3.f));  // the larger of the two calls' maxima
  device_->MaxAbsInto(nullptr, 0, &bits);
  EXPECT_EQ(bits, std::bit_cast<uint32_t>(3.f));

  // The same sums as the returning form, and a flag that a later clean call does not clear.
  std::vector<int64_t> into(3, 7), plain(3, 7);
  uint32_t bad = 0;
  device_->AccumulateFixedInto(a.data(), a.size(), 4, 1000, into.data(), &bad);
  device_->AccumulateFixedInto(b.data(), b.size(), 4, 1000, into.data(), &bad);
  ASSERT_TRUE(device_->AccumulateFixed(a.data(), a.size(), 4, 1000, plain.data()));
  ASSERT_TRUE(device_->AccumulateFixed(b.data(), b.size(), 4, 1000, plain.data()));
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(into, plain);
  EXPECT_EQ(into, (std::vector<int64_t>{7 + 16 - 8, 7 - 48 + 24, 7 + 32 + 4}));
  device_->AccumulateFixedInto(a.data(), a.size(), 10, 1000, into.data(), &bad);  // 3072 > 1000
  EXPECT_NE(bad, 0u);
  device_->AccumulateFixedInto(b.data(), b.size(), 4, 1000, into.data(), &bad);
  EXPECT_NE(bad, 0u);

  const float nan[] = {1.f, std::numeric_limits<float>::quiet_NaN()};
  uint32_t nan_bits = 0;
  device_->MaxAbsInto(nan, 2, &nan_bits);
  EXPECT_GT(nan_bits, std::bit_cast<uint32_t>(std::numeric_limits<float>::infinity()));
}

TEST_F(CpuDeviceTest, MaxAbsIsNaNWhenAnyElementIsNaN) {
  for (size_t pos : {size_t{0}, size_t{5}, size_t{64}, size_t{999}}) {
    std::vector<float> x = RandomFloats(1000, 12);
    x[pos] = pos % 2 == 0 ? kNaN : -kNaN;
    x[(pos + 1) % x.size()] = kInf;  // NaN must win over Inf
    EXPECT_TRUE(std::isnan(device_->MaxAbs(x.data(), x.size()))) << pos;
  }
}

TEST_F(CpuDeviceTest, MaxAbsIsInfinityWhenAnyElementIsInfinite) {
  std::vector<float> x = RandomFloats(100, 13);
  x[42] = -kInf;
  EXPECT_EQ(device_->MaxAbs(x.data(), x.size()), kInf);
}

TEST_F(CpuDeviceTest, MaxAbsOfNothingIsZero) { EXPECT_EQ(device_->MaxAbs(nullptr, 0), 0.f); }

// ---- Fixed point ----

constexpr int64_t kLimit51 = int64_t{1} << 51;

TEST_F(CpuDeviceTest, AccumulateFixedRoundsHalfToEven) {
  const std::vector<float> x = {0.5f, 1.5f, -2.5f, 2.5f, -0.5f, -1.5f, 0.25f, 0.75f};
  std::vector<int64_t> acc(x.size(), 0);
  ASSERT_TRUE(device_->AccumulateFixed(x.data(), x.size(), 0, kLimit51, acc.data()));
  EXPECT_EQ(acc, (std::vector<int64_t>{0, 2, -2, 2, 0, -2, 0, 1}));
}

TEST_F(CpuDeviceTest, AccumulateFixedScalesByPowerOfTwoAndAddsToAccumulator) {
  const std::vector<float> x = {1.f, -0.75f, 3.1f, -1e-3f, 0.f, -0.f};
  std::vector<int64_t> acc = {10, 10, -10, 0, 5, -5};
  ASSERT_TRUE(device_->AccumulateFixed(x.data(), x.size(), 10, kLimit51, acc.data()));
  // 3.1f * 1024 = 3174.39990234375 and -1e-3f * 1024 = -1.024...
  EXPECT_EQ(acc, (std::vector<int64_t>{1034, -758, 3164, -1, 5, -5}));
  const std::vector<float> big = {96.f, -8.f};
  std::vector<int64_t> acc2(2, 0);
  ASSERT_TRUE(device_->AccumulateFixed(big.data(), 2, -3, kLimit51, acc2.data()));
  EXPECT_EQ(acc2, (std::vector<int64_t>{12, -1}));
}

TEST_F(CpuDeviceTest, AccumulateFixedSumIsIndependentOfOrder) {
  const size_t n = 1000, count = 64;
  const int exponent = 40;
  std::vector<std::vector<float>> parts;
  for (size_t p = 0; p < count; ++p) parts.push_back(RandomFloats(n, 100 + p, -1.f, 1.f));
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::vector<int64_t> forward(n, 0);
  for (size_t p : order) {
    ASSERT_TRUE(device_->AccumulateFixed(parts[p].data(), n, exponent, kLimit51, forward.data()));
  }
  std::shuffle(order.begin(), order.end(), std::mt19937(3));
  std::vector<int64_t> shuffled(n, 0);
  for (size_t p : order) {
    ASSERT_TRUE(device_->AccumulateFixed(parts[p].data(), n, exponent, kLimit51, shuffled.data()));
  }
  EXPECT_EQ(forward, shuffled);
  std::vector<float> back_forward(n), back_shuffled(n);
  device_->FixedToFloat(forward.data(), n, exponent, 1.0 / count, back_forward.data());
  device_->FixedToFloat(shuffled.data(), n, exponent, 1.0 / count, back_shuffled.data());
  EXPECT_TRUE(SameBits(back_forward, back_shuffled));
}

TEST_F(CpuDeviceTest, AccumulateFixedAcceptsMagnitudeEqualToLimit) {
  const std::vector<float> x = {0x1p51f, -0x1p51f, 1000.f, -1000.f};
  std::vector<int64_t> acc(2, 0);
  ASSERT_TRUE(device_->AccumulateFixed(x.data(), 2, 0, kLimit51, acc.data()));
  EXPECT_EQ(acc, (std::vector<int64_t>{kLimit51, -kLimit51}));
  std::vector<int64_t> acc2(2, 0);
  ASSERT_TRUE(device_->AccumulateFixed(x.data() + 2, 2, 0, 1000, acc2.data()));
  EXPECT_EQ(acc2, (std::vector<int64_t>{1000, -1000}));
}

TEST_F(CpuDeviceTest, AccumulateFixedFlagsValuesAboveLimit) {
  for (float bad : {1000.5f, -1000.5f, 2048.f}) {
    std::vector<float> x = RandomFloats(300, 14);
    x[123] = bad;
    std::vector<int64_t> acc(x.size(), 0);
    EXPECT_FALSE(device_->AccumulateFixed(x.data(), x.size(), 0, 1000, acc.data())) << bad;
  }
  // The limit applies after scaling.
  const float x = 0.75f;
  int64_t acc = 0;
  EXPECT_TRUE(device_->AccumulateFixed(&x, 1, 10, 768, &acc));
  EXPECT_FALSE(device_->AccumulateFixed(&x, 1, 10, 767, &acc));
  // Just above 2^51 (the largest limit of the fast path) is an overflow too.
  const float over = 0x1p51f * (1.f + 0x1p-23f);
  EXPECT_FALSE(device_->AccumulateFixed(&over, 1, 0, kLimit51, &acc));
}

TEST_F(CpuDeviceTest, AccumulateFixedFlagsNaNAndInfinity) {
  for (float bad : {kNaN, -kNaN, kInf, -kInf}) {
    std::vector<float> x(17, 0.f);
    x[16] = bad;
    std::vector<int64_t> acc(x.size(), 0);
    EXPECT_FALSE(device_->AccumulateFixed(x.data(), x.size(), 0, kLimit51, acc.data())) << bad;
    EXPECT_FALSE(device_->AccumulateFixed(x.data(), x.size(), 0,
                                          std::numeric_limits<int64_t>::max(), acc.data()))
        << bad;
  }
}

TEST_F(CpuDeviceTest, AccumulateFixedOfNothingSucceeds) {
  EXPECT_TRUE(device_->AccumulateFixed(nullptr, 0, 0, kLimit51, nullptr));
}

// Values of every magnitude that fits the limit at `exponent`, a tenth of them exact ties.
std::vector<float> FixedPointTestValues(size_t n, int exponent, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> mantissa(-1.f, 1.f);
  std::uniform_int_distribution<int> magnitude(-30, 50 - exponent);
  std::uniform_int_distribution<int> small_int(-1000, 1000);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (i % 10 == 0) {
      v[i] = std::ldexp(static_cast<float>(small_int(rng)) + 0.5f, -exponent);
    } else {
      v[i] = std::ldexp(mantissa(rng), magnitude(rng));
    }
  }
  return v;
}

TEST_F(CpuDeviceTest, AccumulateFixedMatchesNearbyintReference) {
  const size_t n = 1'000'000;
  for (int exponent : {-20, 0, 13, 30, 60}) {
    for (int64_t limit : {kLimit51, std::numeric_limits<int64_t>::max()}) {
      const std::vector<float> x = FixedPointTestValues(n, exponent, 200 + exponent);
      std::vector<int64_t> acc(n), want(n);
      std::mt19937_64 rng(300);
      for (size_t i = 0; i < n; ++i)
        acc[i] = want[i] = static_cast<int64_t>(rng() >> 14) - (1ll << 49);
      ASSERT_TRUE(device_->AccumulateFixed(x.data(), n, exponent, limit, acc.data()));
      for (size_t i = 0; i < n; ++i) {
        want[i] +=
            static_cast<int64_t>(std::nearbyint(std::ldexp(static_cast<double>(x[i]), exponent)));
      }
      size_t mismatches = 0;
      for (size_t i = 0; i < n; ++i) {
        if (acc[i] != want[i] && mismatches++ < 5) {
          ADD_FAILURE() << "exponent " << exponent << " limit " << limit << " x=" << x[i] << " got "
                        << acc[i] << " want " << want[i];
        }
      }
      EXPECT_EQ(mismatches, 0u) << "exponent " << exponent << " limit " << limit;
    }
  }
}

// The one-pass form must be the two calls it replaces, bit for bit, flag for flag: clean data
// at several scales and lengths (vector bodies and scalar tails), and every way a value can be
// out of range (above the limit, at it exactly, NaN, infinite), wherever in the array it sits.
TEST_F(CpuDeviceTest, OnePassMaxAndAccumulateEqualsTheTwoCalls) {
  struct Case {
    std::vector<float> x;
    int exponent;
    int64_t limit;
  };
  std::vector<Case> cases;
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{31}, size_t{1000}, size_t{100'003}}) {
    for (int exponent : {-20, 0, 13, 40}) {
      cases.push_back({FixedPointTestValues(n, exponent, 700 + n + exponent), exponent, kLimit51});
    }
  }
  const std::vector<float> base = RandomFloats(1001, 710, -1.f, 1.f);
  for (size_t pos : {size_t{0}, size_t{500}, size_t{1000}}) {
    for (float bad_value : {kNaN, -kNaN, kInf, -kInf, 0x1p12f, -0x1p12f}) {
      std::vector<float> x = base;
      x[pos] = bad_value;
      cases.push_back({x, 38, kLimit51});  // 2^12 * 2^38 = 2^50 < 2^51: only NaN and Inf fail
      cases.push_back({x, 40, kLimit51});  // 2^52 > 2^51
    }
  }
  cases.push_back({{1.f, -4.f, 2.f}, 8, 1024});  // |-4 * 2^8| equals the limit: accepted
  cases.push_back({{1.f, -4.f, 2.f}, 8, 1023});
  cases.push_back({{0.f, -0.f}, 2000, 0});
  cases.push_back({{0.5f}, 0, -1});
  cases.push_back({{0x1p60f, -3.5f}, 0, std::numeric_limits<int64_t>::max()});  // the wide path

  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    const size_t n = k.x.size();
    std::vector<int64_t> fused(n), separate(n);
    std::mt19937_64 rng(800 + c);
    for (size_t i = 0; i < n; ++i) fused[i] = separate[i] = static_cast<int64_t>(rng() >> 20);
    // Maxima start above zero, so that the call keeps the larger of old and new.
    uint32_t fused_max = 5, separate_max = 5, fused_bad = 0, separate_bad = 0;
    device_->MaxAbsAccumulateFixedInto(k.x.data(), n, k.exponent, k.limit, fused.data(), &fused_max,
                                       &fused_bad);
    device_->MaxAbsInto(k.x.data(), n, &separate_max);
    device_->AccumulateFixedInto(k.x.data(), n, k.exponent, k.limit, separate.data(),
                                 &separate_bad);
    EXPECT_EQ(fused_max, separate_max) << "case " << c;
    EXPECT_EQ(fused_bad != 0, separate_bad != 0) << "case " << c;
    // Where a value is out of range the accumulator is unspecified.
    if (separate_bad == 0) {
      EXPECT_EQ(fused, separate) << "case " << c;
    }
  }

  // The flag is never cleared by a later clean call.
  const float one = 1.f;
  int64_t acc = 0;
  uint32_t max_bits = 0, bad = 1;
  device_->MaxAbsAccumulateFixedInto(&one, 1, 0, kLimit51, &acc, &max_bits, &bad);
  EXPECT_EQ(bad, 1u);
  EXPECT_EQ(acc, 1);
}

TEST_F(CpuDeviceTest, FoldBucketsFoldsEachBucketOrOnlyMeasuresAnUnsetOne) {
  const std::vector<float> x = RandomFloats(3000, 720, -2.f, 2.f);
  const std::vector<FoldBucket> plan = {
      {0, 1000, 40, 0}, {1000, 0, 3, 0}, {1000, 1500, kNoExponent, 0}, {2500, 500, -7, 0}};
  std::vector<int64_t> folded(x.size(), 3), expected(x.size(), 3);
  std::vector<uint32_t> folded_max(plan.size(), 0), expected_max(plan.size(), 0);
  uint32_t folded_bad = 0, expected_bad = 0;
  device_->FoldBuckets(x.data(), FoldPlan{plan, plan.data()}, kLimit51, folded.data(),
                       folded_max.data(), &folded_bad);
  device_->MaxAbsAccumulateFixedInto(x.data(), 1000, 40, kLimit51, expected.data(),
                                     &expected_max[0], &expected_bad);
  device_->MaxAbsInto(x.data() + 1000, 1500, &expected_max[2]);
  device_->MaxAbsAccumulateFixedInto(x.data() + 2500, 500, -7, kLimit51, expected.data() + 2500,
                                     &expected_max[3], &expected_bad);
  EXPECT_EQ(folded, expected);
  EXPECT_EQ(folded_max, expected_max);
  EXPECT_EQ(folded_max[1], 0u);
  EXPECT_NE(folded_max[2], 0u);
  EXPECT_EQ(folded_bad, 0u);
  // The unset bucket's sums are untouched.
  EXPECT_EQ(folded[1200], 3);
}

TEST_F(CpuDeviceTest, AccumulateFixedWithWideLimitHandlesValuesBeyondTwoToThe51) {
  const std::vector<float> x = {0x1p60f, -0x1p62f, 2.5f, -3.5f};
  std::vector<int64_t> acc(x.size(), 1);
  ASSERT_TRUE(device_->AccumulateFixed(x.data(), x.size(), 0, std::numeric_limits<int64_t>::max(),
                                       acc.data()));
  EXPECT_EQ(acc, (std::vector<int64_t>{(int64_t{1} << 60) + 1, -(int64_t{1} << 62) + 1, 3, -3}));
  const float too_big = 0x1p63f;
  int64_t one = 0;
  EXPECT_FALSE(device_->AccumulateFixed(&too_big, 1, 0, std::numeric_limits<int64_t>::max(), &one));
  const float above = 0x1p60f;
  EXPECT_FALSE(device_->AccumulateFixed(&above, 1, 0, (int64_t{1} << 60) - 1, &one));
}

TEST_F(CpuDeviceTest, FixedToFloatRoundTripsWithinOneUnit) {
  for (int exponent : {0, 8, 20, 40}) {
    const std::vector<float> x = RandomFloats(10'000, 400 + exponent, -1.f, 1.f);
    std::vector<int64_t> acc(x.size(), 0);
    ASSERT_TRUE(device_->AccumulateFixed(x.data(), x.size(), exponent, kLimit51, acc.data()));
    std::vector<float> back(x.size());
    device_->FixedToFloat(acc.data(), acc.size(), exponent, 1.0, back.data());
    const double unit = std::ldexp(1.0, -exponent);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_LE(std::fabs(static_cast<double>(back[i]) - x[i]), unit) << exponent << " " << x[i];
    }
  }
}

TEST_F(CpuDeviceTest, FixedToFloatAppliesUnitThenScale) {
  const std::vector<int64_t> acc = {3, -8, 0, int64_t{1} << 50};
  std::vector<float> out(acc.size());
  device_->FixedToFloat(acc.data(), acc.size(), 1, 0.25, out.data());
  EXPECT_EQ(out, (std::vector<float>{0.375f, -1.f, 0.f, 0x1p47f}));
  device_->FixedToFloat(acc.data(), acc.size(), -2, 1.0, out.data());
  EXPECT_EQ(out, (std::vector<float>{12.f, -32.f, 0.f, 0x1p52f}));
}

// ---- Helpers and optimizers ----

TEST_F(CpuDeviceTest, AxpyAndScaleUpdateInPlace) {
  const std::vector<float> x = {1.f, -2.f, 4.f};
  std::vector<float> y = {10.f, 10.f, 10.f};
  device_->Axpy(0.5f, x.data(), y.data(), y.size());
  EXPECT_EQ(y, (std::vector<float>{10.5f, 9.f, 12.f}));
  device_->Scale(y.data(), -2.f, y.size());
  EXPECT_EQ(y, (std::vector<float>{-21.f, -18.f, -24.f}));
}

void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, const char* what,
                 int step) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-6 * std::max(std::fabs(want[i]), 1.0))
        << what << "[" << i << "] after step " << step;
  }
}

TEST_F(CpuDeviceTest, SgdMomentumStepMatchesReference) {
  for (bool nesterov : {false, true}) {
    for (float weight_decay : {0.f, 0.01f}) {
      const size_t n = 257;
      std::vector<float> param = RandomFloats(n, 50), velocity(n, 0.f);
      std::vector<double> p_ref(param.begin(), param.end()), v_ref(n, 0.0);
      const SgdUpdate h{.learning_rate = 0.1f,
                        .momentum = 0.9f,
                        .weight_decay = weight_decay,
                        .nesterov = nesterov};
      for (int step = 1; step <= 5; ++step) {
        const std::vector<float> grad = RandomFloats(n, 60 + step);
        device_->SgdMomentumStep(param.data(), grad.data(), velocity.data(), n, h);
        for (size_t i = 0; i < n; ++i) {
          double g = grad[i] + double{h.weight_decay} * p_ref[i];
          v_ref[i] = double{h.momentum} * v_ref[i] + g;
          g = nesterov ? g + double{h.momentum} * v_ref[i] : v_ref[i];
          p_ref[i] -= double{h.learning_rate} * g;
        }
        ExpectClose(param, p_ref, "param", step);
        ExpectClose(velocity, v_ref, "velocity", step);
      }
    }
  }
}

TEST_F(CpuDeviceTest, SgdNesterovDiffersFromPlainMomentum) {
  std::vector<float> p1 = {1.f}, p2 = {1.f}, v1 = {0.f}, v2 = {0.f};
  const float g = 1.f;
  device_->SgdMomentumStep(p1.data(), &g, v1.data(), 1, {.learning_rate = 0.1f, .momentum = 0.9f});
  device_->SgdMomentumStep(p2.data(), &g, v2.data(), 1,
                           {.learning_rate = 0.1f, .momentum = 0.9f, .nesterov = true});
  EXPECT_FLOAT_EQ(p1[0], 0.9f);
  EXPECT_FLOAT_EQ(p2[0], 1.f - 0.1f * 1.9f);
}

TEST_F(CpuDeviceTest, AdamWStepMatchesReference) {
  for (float weight_decay : {0.f, 0.1f}) {
    const size_t n = 129;
    std::vector<float> param = RandomFloats(n, 70), m(n, 0.f), v(n, 0.f);
    std::vector<double> p_ref(param.begin(), param.end()), m_ref(n, 0.0), v_ref(n, 0.0);
    for (int step = 1; step <= 5; ++step) {
      AdamWUpdate h{.learning_rate = 1e-2f,
                    .beta1 = 0.9f,
                    .beta2 = 0.999f,
                    .epsilon = 1e-8f,
                    .weight_decay = weight_decay};
      h.bias_correction1 = static_cast<float>(1.0 - std::pow(double{h.beta1}, step));
      h.bias_correction2 = static_cast<float>(1.0 - std::pow(double{h.beta2}, step));
      const std::vector<float> grad = RandomFloats(n, 80 + step);
      device_->AdamWStep(param.data(), grad.data(), m.data(), v.data(), n, h);
      const double lr = h.learning_rate, b1 = h.beta1, b2 = h.beta2;
      for (size_t i = 0; i < n; ++i) {
        const double g = grad[i];
        p_ref[i] *= 1.0 - lr * double{h.weight_decay};
        m_ref[i] = b1 * m_ref[i] + (1 - b1) * g;
        v_ref[i] = b2 * v_ref[i] + (1 - b2) * g * g;
        const double m_hat = m_ref[i] / h.bias_correction1;
        const double v_hat = v_ref[i] / h.bias_correction2;
        p_ref[i] -= lr * m_hat / (std::sqrt(v_hat) + double{h.epsilon});
      }
      ExpectClose(param, p_ref, "param", step);
      ExpectClose(m, m_ref, "m", step);
      // v is a sum of squares of order 1e-3..1; compare relative to its own scale.
      for (size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(v[i], v_ref[i], 1e-6 * v_ref[i] + 1e-12) << "v[" << i << "] step " << step;
      }
    }
  }
}

TEST_F(CpuDeviceTest, AdamWWeightDecayShrinksParameterWithoutGradient) {
  std::vector<float> p = {2.f}, m = {0.f}, v = {0.f};
  const float g = 0.f;
  device_->AdamWStep(p.data(), &g, m.data(), v.data(), 1,
                     {.learning_rate = 0.1f,
                      .weight_decay = 0.5f,
                      .bias_correction1 = 0.1f,
                      .bias_correction2 = 0.001f});
  EXPECT_FLOAT_EQ(p[0], 2.f * (1.f - 0.05f));
}

}  // namespace
}  // namespace vf
