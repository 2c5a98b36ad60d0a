#include "runtime/optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace vf {
namespace {

TEST(Optimizer, UnknownNameIsAnError) {
  OptimizerSpec s;
  s.name = "lamb";
  auto o = CreateOptimizer(s);
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("lamb"), std::string::npos);
}

TEST(Optimizer, SgdWithMomentumFollowsTheHeavyBallRecurrence) {
  auto dev = CreateCpuDevice(1);
  OptimizerSpec s;
  s.learning_rate = 0.1;
  s.momentum = 0.9;
  auto o = CreateOptimizer(s).value();
  EXPECT_EQ(o->slot_count(), 1);
  std::vector<float> p = {1.f}, g = {0.5f}, v = {0.f};
  float* slots[] = {v.data()};
  double ref_p = 1.0, ref_v = 0.0;
  for (int t = 1; t <= 5; ++t) {
    o->Apply(*dev, p.data(), g.data(), slots, 1, t);
    ref_v = 0.9 * ref_v + 0.5;
    ref_p -= 0.1 * ref_v;
    EXPECT_NEAR(p[0], ref_p, 1e-6);
  }
}

TEST(Optimizer, AdamWAppliesBiasCorrectionAndDecoupledDecay) {
  auto dev = CreateCpuDevice(1);
  OptimizerSpec s;
  s.name = "adamw";
  s.learning_rate = 0.01;
  s.weight_decay = 0.1;
  auto o = CreateOptimizer(s).value();
  EXPECT_EQ(o->slot_count(), 2);
  std::vector<float> p = {2.f}, g = {0.3f}, m = {0.f}, v = {0.f};
  float* slots[] = {m.data(), v.data()};
  double rp = 2.0, rm = 0.0, rv = 0.0;
  for (int t = 1; t <= 4; ++t) {
    o->Apply(*dev, p.data(), g.data(), slots, 1, t);
    rp *= 1.0 - 0.01 * 0.1;
    rm = 0.9 * rm + 0.1 * 0.3;
    rv = 0.999 * rv + 0.001 * 0.09;
    const double mhat = rm / (1 - std::pow(0.9, t));
    const double vhat = rv / (1 - std::pow(0.999, t));
    rp -= 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
    EXPECT_NEAR(p[0], rp, 1e-5);
  }
}

}  // namespace
}  // namespace vf
