#include "runtime/models/mlp.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/data/dataset.h"

namespace vf {
namespace {

struct Fixture {
  std::unique_ptr<Device> device = CreateCpuDevice(1);
};

std::vector<float> Upload(Device& d, DeviceBuffer<float>& buf, const std::vector<float>& host) {
  buf = DeviceBuffer<float>::Create(d, host.size()).value();
  d.CopyFromHost(buf.data(), host.data(), host.size() * sizeof(float));
  return host;
}

TEST(Mlp, ReferenceModelHasTheExpectedParameterLayout) {
  Fixture f;
  auto m = CreateModel(ModelSpec{}, 784, 10, *f.device);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ((*m)->parameter_count(), 784u * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  ASSERT_EQ((*m)->tensors().size(), 6u);
  EXPECT_EQ((*m)->tensors()[2].offset, 784u * 512 + 512);
  EXPECT_EQ((*m)->tensors()[5].size, 10u);
}

TEST(Mlp, UnknownModelIsAnError) {
  Fixture f;
  ModelSpec spec;
  spec.name = "resnet";
  auto m = CreateModel(spec, 784, 10, *f.device);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("resnet"), std::string::npos);
}

TEST(Mlp, InitializationIsDeterministicPerSeedAndBounded) {
  Fixture f;
  Mlp m({20, 16, 5}, *f.device);
  std::vector<float> a(m.parameter_count()), b(a.size()), c(a.size());
  m.InitializeHost(7, a.data());
  m.InitializeHost(7, b.data());
  m.InitializeHost(8, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  const float bound = 1.f / std::sqrt(20.f);
  for (size_t i = 0; i < 20 * 16 + 16; ++i) EXPECT_LE(std::fabs(a[i]), bound);
}

TEST(Mlp, GradientMatchesFiniteDifferences) {
  Fixture f;
  Device& d = *f.device;
  Mlp m({6, 5, 4, 3}, d);
  const int batch = 4;
  std::vector<float> p(m.parameter_count());
  m.InitializeHost(3, p.data());
  CounterRng rng(11);
  std::vector<float> x(size_t{batch} * 6);
  for (auto& v : x) v = 2.f * rng.Uniform() - 1.f;
  std::vector<int32_t> y = {0, 2, 1, 2};
  DeviceBuffer<float> pd, xd;
  Upload(d, pd, p);
  Upload(d, xd, x);
  auto yd = DeviceBuffer<int32_t>::Create(d, y.size()).value();
  d.CopyFromHost(yd.data(), y.data(), y.size() * sizeof(int32_t));
  auto gd = DeviceBuffer<float>::Create(d, p.size()).value();
  LossStats stats;  // the CPU device's memory is the host's
  ASSERT_TRUE(m.ForwardBackward(pd.data(), xd.data(), yd.data(), batch, GradientOutput::kWrite,
                                gd.data(), &stats)
                  .ok());
  EXPECT_EQ(stats.samples, batch);
  EXPECT_GT(stats.loss_sum, 0.0);
  std::vector<float> g(p.size());
  d.CopyToHost(g.data(), gd.data(), g.size() * sizeof(float));

  auto loss_at = [&](const std::vector<float>& params) {
    d.CopyFromHost(pd.data(), params.data(), params.size() * sizeof(float));
    auto s = m.Evaluate(pd.data(), xd.data(), yd.data(), batch);
    return s->loss_sum / batch;
  };
  const float eps = 1e-2f;
  int checked = 0;
  for (size_t i = 0; i < p.size(); i += 3) {
    std::vector<float> plus = p, minus = p;
    plus[i] += eps;
    minus[i] -= eps;
    const double numeric = (loss_at(plus) - loss_at(minus)) / (2 * eps);
    EXPECT_NEAR(g[i], numeric, 2e-3 + 2e-2 * std::fabs(numeric)) << "parameter " << i;
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

// A 784 -> 64 -> 10 MLP on the CPU with the initial parameters of `seed`, and `rows` random
// Fashion-MNIST-shaped samples (pixels in [0, 1), 10 classes), all in the device's memory.
struct SmallMlp {
  SmallMlp(uint64_t seed, int rows) : m({784, 64, 10}, d), p(m.parameter_count()), rng(seed) {
    m.InitializeHost(seed, p.data());
    Upload(d, params, p);
    std::vector<float> x(static_cast<size_t>(rows) * 784);
    for (auto& v : x) v = rng.Uniform();
    std::vector<int32_t> y(static_cast<size_t>(rows));
    for (auto& v : y) v = static_cast<int32_t>(rng.Below(10));
    Upload(d, pixels, x);
    labels = DeviceBuffer<int32_t>::Create(d, y.size()).value();
    d.CopyFromHost(labels.data(), y.data(), y.size() * sizeof(int32_t));
  }
  // A gradient buffer for the model.
  DeviceBuffer<float> Gradient() { return DeviceBuffer<float>::Create(d, p.size()).value(); }
  // ForwardBackward over the first `rows` samples; the CPU device's memory is the host's, so the
  // statistics come back in *stats.
  bool Run(int rows, GradientOutput output, DeviceBuffer<float>& grad, LossStats* stats) {
    return m
        .ForwardBackward(params.data(), pixels.data(), labels.data(), rows, output, grad.data(),
                         stats)
        .ok();
  }

  std::unique_ptr<Device> device = CreateCpuDevice(1);
  Device& d = *device;
  Mlp m;
  std::vector<float> p;
  CounterRng rng;
  DeviceBuffer<float> params, pixels;
  DeviceBuffer<int32_t> labels;
};

TEST(Mlp, ForwardBackwardIsBitwiseRepeatable) {
  SmallMlp s(1, 32);
  auto g1 = s.Gradient();
  auto g2 = s.Gradient();
  LossStats s1, s2, other;
  ASSERT_TRUE(s.Run(32, GradientOutput::kWrite, g1, &s1));
  // A different batch in between must not leak into the next result.
  ASSERT_TRUE(s.Run(7, GradientOutput::kWrite, g2, &other));
  ASSERT_TRUE(s.Run(32, GradientOutput::kWrite, g2, &s2));
  EXPECT_EQ(other.samples, 7);
  EXPECT_EQ(s1.loss_sum, s2.loss_sum);
  EXPECT_EQ(s1.correct, s2.correct);
  EXPECT_EQ(s1.samples, 32);
  EXPECT_EQ(std::memcmp(g1.data(), g2.data(), g1.bytes()), 0);
}

TEST(Mlp, AddedGradientIsTheWrittenOneAddedToWhatWasThere) {
  const int batch = 5;
  SmallMlp s(4, batch);
  std::vector<float> before(s.p.size());
  for (auto& v : before) v = 2.f * s.rng.Uniform() - 1.f;
  DeviceBuffer<float> added;
  Upload(s.d, added, before);
  auto written = s.Gradient();
  LossStats sw, sa;
  ASSERT_TRUE(s.Run(batch, GradientOutput::kWrite, written, &sw));
  ASSERT_TRUE(s.Run(batch, GradientOutput::kAdd, added, &sa));
  EXPECT_EQ(sw.loss_sum, sa.loss_sum);
  // Each part of the gradient is summed over the batch and then added once: with a batch this
  // small the product's inner dimension is one block, so the bits are those of the sum.
  size_t differ = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    const float want = before[i] + written.data()[i];
    differ += std::bit_cast<uint32_t>(added.data()[i]) != std::bit_cast<uint32_t>(want) ? 1 : 0;
  }
  EXPECT_EQ(differ, 0u) << "of " << before.size();
  // And the gradient really was added, not written over what was there.
  size_t moved = 0;
  for (size_t i = 0; i < before.size(); ++i) moved += added.data()[i] != written.data()[i] ? 1 : 0;
  EXPECT_GT(moved, before.size() / 2);
}

}  // namespace
}  // namespace vf
