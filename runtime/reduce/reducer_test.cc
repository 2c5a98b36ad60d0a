#include "runtime/reduce/reducer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "runtime/data/dataset.h"

namespace vf {
namespace {

constexpr size_t kParams = 1000;
constexpr int kV = 6;

// Gradient of virtual node v: a few magnitudes per bucket so rounding matters.
std::vector<float> Gradient(int v, float scale = 1.f) {
  CounterRng rng(MixKey(99, static_cast<uint64_t>(v)));
  std::vector<float> g(kParams);
  for (size_t i = 0; i < kParams; ++i) {
    const float mag = i < 700 ? 1e-3f : 10.f;
    g[i] = scale * mag * (2.f * rng.Uniform() - 1.f);
  }
  return g;
}

std::vector<GradientBucket> Buckets() {
  const size_t sizes[] = {700, 300};
  return MakeBuckets(sizes, 256);
}

// Runs one reduction step on `ranks` threads with the given vnode mapping; returns rank 0's
// mean gradient (every rank's is compared to it).
struct StepOutcome {
  std::vector<float> mean;
  std::vector<Status> errors;
  int redos = 0;
  std::vector<int64_t> extra;
};

StepOutcome Reduce(Reduction mode, const std::vector<std::vector<int>>& mapping,
                   std::function<std::vector<float>(int)> grad_of,
                   std::vector<int64_t> extras = {}) {
  const int ranks = static_cast<int>(mapping.size());
  MemoryStore store;
  std::vector<std::vector<float>> means(static_cast<size_t>(ranks));
  std::vector<Status> errors(static_cast<size_t>(ranks));
  std::vector<int> redos(static_cast<size_t>(ranks), 0);
  std::vector<std::vector<int64_t>> got_extra(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto dev = CreateCpuDevice(1);
      std::unique_ptr<Communicator> comm;
      if (ranks == 1) {
        comm = CreateLocalCommunicator();
      } else {
        auto c = CreateGlooCommunicator(store, r, ranks, CommOptions{});
        if (!c.ok()) {
          errors[static_cast<size_t>(r)] = c.status();
          return;
        }
        comm = std::move(c).value();
      }
      auto red = CreateReducer(mode, *dev, Buckets(), kV).value();
      std::vector<float> out(kParams);
      const int64_t mine[] = {extras.empty() ? 0 : extras[static_cast<size_t>(r)]};
      for (int attempt = 0; attempt < 3; ++attempt) {
        red->Begin();
        for (int v : mapping[static_cast<size_t>(r)]) {
          auto g = grad_of(v);
          LossStats s{1.0 + v, v, 10};
          ASSERT_TRUE(red->Add(g.data()).ok());
          red->AddLoss(s);
        }
        auto res = red->Finish(*comm, mine, out.data());
        if (!res.ok()) {
          errors[static_cast<size_t>(r)] = res.status();
          return;
        }
        if (res->redo) {
          ++redos[static_cast<size_t>(r)];
          continue;
        }
        EXPECT_EQ(res->totals.samples, 10 * kV);
        EXPECT_EQ(res->totals.correct, kV * (kV - 1) / 2);
        EXPECT_EQ(res->totals.loss_sum, kV + kV * (kV - 1) / 2.0);  // sum of 1 + v
        got_extra[static_cast<size_t>(r)] = res->header_extra;
        break;
      }
      means[static_cast<size_t>(r)] = out;
    });
  }
  for (auto& t : threads) t.join();
  StepOutcome o;
  o.errors = errors;
  o.redos = redos[0];
  o.mean = means[0];
  o.extra = got_extra[0];
  for (int r = 1; r < ranks; ++r) {
    if (errors[static_cast<size_t>(r)].ok()) {
      EXPECT_EQ(means[static_cast<size_t>(r)], o.mean) << "rank " << r << " disagrees";
    }
  }
  return o;
}

TEST(Buckets, SplitAtTensorBoundariesAndMaxSize) {
  const size_t sizes[] = {5, 12, 3};
  auto b = MakeBuckets(sizes, 4);
  ASSERT_EQ(b.size(), 6u);
  EXPECT_EQ(b[0].offset, 0u);
  EXPECT_EQ(b[0].size, 4u);
  EXPECT_EQ(b[1].size, 1u);
  EXPECT_EQ(b[2].offset, 5u);
  EXPECT_EQ(b[5].offset, 17u);
  EXPECT_EQ(b[5].size, 3u);
}

TEST(Buckets, ExponentPlacesTheMaximumBelow2To44) {
  for (float m : {1e-8f, 0.3f, 1.f, 7.5f, 1e6f}) {
    const double scaled = std::ldexp(static_cast<double>(m), ExponentFor(m));
    EXPECT_LT(scaled, std::ldexp(1.0, 44));
    EXPECT_GE(scaled, std::ldexp(1.0, 43));
  }
}

TEST(ExactReducer, MeanIsBitwiseIdenticalForEveryMapping) {
  const std::vector<std::vector<std::vector<int>>> mappings = {
      {{0, 1, 2, 3, 4, 5}},     {{5, 4, 3, 2, 1, 0}},           {{0, 1, 2}, {3, 4, 5}},
      {{0}, {1, 2}, {3, 4, 5}}, {{4}, {0}, {2}, {5}, {1}, {3}},
  };
  auto reference = Reduce(Reduction::kExact, mappings[0], [](int v) { return Gradient(v); });
  ASSERT_TRUE(reference.errors[0].ok()) << reference.errors[0].message();
  EXPECT_EQ(reference.redos, 1) << "the first step has no scale yet and must be recomputed";
  for (size_t m = 1; m < mappings.size(); ++m) {
    auto got = Reduce(Reduction::kExact, mappings[m], [](int v) { return Gradient(v); });
    ASSERT_TRUE(got.errors[0].ok()) << got.errors[0].message();
    // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): the bits are what must agree.
    EXPECT_EQ(std::memcmp(got.mean.data(), reference.mean.data(), kParams * sizeof(float)), 0)
        << "mapping " << m;
  }
  // And it is the mean, to far better than float32 summation error.
  for (size_t i = 0; i < kParams; ++i) {
    double sum = 0;
    for (int v = 0; v < kV; ++v) sum += Gradient(v)[i];
    EXPECT_NEAR(reference.mean[i], sum / kV, 1e-6 * std::fabs(sum / kV) + 1e-12);
  }
}

TEST(FastReducer, MeanMatchesToFloatTolerance) {
  auto a = Reduce(Reduction::kFast, {{0, 1, 2, 3, 4, 5}}, [](int v) { return Gradient(v); });
  auto b = Reduce(Reduction::kFast, {{0}, {1, 2}, {3, 4, 5}}, [](int v) { return Gradient(v); });
  ASSERT_TRUE(a.errors[0].ok() && b.errors[0].ok());
  EXPECT_EQ(a.redos, 0);
  for (size_t i = 0; i < kParams; ++i) {
    EXPECT_NEAR(a.mean[i], b.mean[i], 1e-6f * (i < 700 ? 1e-3f : 10.f));
  }
}

TEST(ExactReducer, NaNInAnyVirtualNodeFailsEveryRank) {
  auto out = Reduce(Reduction::kExact, {{0, 1}, {2, 3}, {4, 5}}, [](int v) {
    auto g = Gradient(v);
    if (v == 3) g[10] = std::nanf("");
    return g;
  });
  for (const auto& e : out.errors) {
    EXPECT_EQ(e.code(), StatusCode::kNumerical);
    EXPECT_NE(e.message().find("NaN"), std::string::npos);
  }
}

TEST(FastReducer, InfInAnyVirtualNodeFailsEveryRank) {
  auto out = Reduce(Reduction::kFast, {{0, 1, 2}, {3, 4, 5}}, [](int v) {
    auto g = Gradient(v);
    if (v == 1) g[900] = INFINITY;
    return g;
  });
  for (const auto& e : out.errors) EXPECT_EQ(e.code(), StatusCode::kNumerical);
}

TEST(ExactReducer, GrowthBeyondHeadroomIsRecomputedNotWrapped) {
  // Run two steps in one thread: the second step's gradients are 10^4 times larger than the
  // scale chosen from the first, so it must report a redo and then give the right mean.
  auto dev = CreateCpuDevice(1);
  auto comm = CreateLocalCommunicator();
  auto red = CreateReducer(Reduction::kExact, *dev, Buckets(), kV).value();
  std::vector<float> out(kParams);
  auto run = [&](float scale) {
    int redos = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      red->Begin();
      for (int v = 0; v < kV; ++v) {
        auto g = Gradient(v, scale);
        EXPECT_TRUE(red->Add(g.data()).ok());
        red->AddLoss(LossStats{});
      }
      auto res = red->Finish(*comm, {}, out.data());
      EXPECT_TRUE(res.ok());
      if (!res->redo) return redos;
      ++redos;
    }
    return -1;
  };
  EXPECT_EQ(run(1.f), 1);
  EXPECT_EQ(run(1.f), 0) << "same magnitudes reuse the scale";
  EXPECT_EQ(run(1e4f), 1) << "10^4 growth exceeds the 64x headroom";
  for (size_t i = 0; i < kParams; ++i) {
    double sum = 0;
    for (int v = 0; v < kV; ++v) sum += Gradient(v, 1e4f)[i];
    EXPECT_NEAR(out[i], sum / kV, 1e-6 * std::fabs(sum / kV) + 1e-9);
  }
}

TEST(ExactReducer, ALossTooLargeForFixedPointIsANumericalError) {
  // Finite, but its fixed-point form would overflow the int64 sum: the loss has diverged.
  auto dev = CreateCpuDevice(1);
  auto comm = CreateLocalCommunicator();
  auto red = CreateReducer(Reduction::kExact, *dev, Buckets(), kV).value();
  std::vector<float> out(kParams);
  for (double loss : {1e300, -1e30, 1e18}) {
    red->Begin();
    for (int v = 0; v < kV; ++v) {
      auto g = Gradient(v);
      ASSERT_TRUE(red->Add(g.data()).ok());
      red->AddLoss(LossStats{v == 2 ? loss : 1.0, 0, 10});
    }
    auto res = red->Finish(*comm, {}, out.data());
    ASSERT_FALSE(res.ok()) << loss;
    EXPECT_EQ(res.status().code(), StatusCode::kNumerical) << loss;
  }
}

TEST(Reducer, HeaderFieldsAreAgreedByMax) {
  auto out = Reduce(Reduction::kExact, {{0, 1}, {2, 3}, {4, 5}}, [](int v) { return Gradient(v); },
                    {3, 9, 4});
  ASSERT_TRUE(out.errors[0].ok());
  ASSERT_EQ(out.extra.size(), 1u);
  EXPECT_EQ(out.extra[0], 9);
}

// One step's nodes folded outside the reducer, as a caller of AddFolded would (here with the
// CPU device's own fold, which Add uses too): sums, per-bucket maxima and the overflow flag.
struct Folded {
  std::vector<int64_t> sums;
  std::vector<uint32_t> max_bits;
  bool bad = false;
};

Folded FoldOutside(const std::vector<int32_t>& exponents,
                   const std::vector<std::vector<float>>& nodes) {
  auto dev = CreateCpuDevice(1);
  const std::vector<GradientBucket> buckets = Buckets();
  std::vector<FoldBucket> plan(buckets.size());
  for (size_t i = 0; i < buckets.size(); ++i) {
    plan[i] = {buckets[i].offset, buckets[i].size, exponents[i], 0};
  }
  Folded f;
  f.sums.assign(kParams, 0);
  f.max_bits.assign(buckets.size(), 0);
  uint32_t bad = 0;
  for (const auto& g : nodes) {
    dev->FoldBuckets(g.data(), FoldPlan{plan, plan.data()}, kFixedPointLimit, f.sums.data(),
                     f.max_bits.data(), &bad);
  }
  f.bad = bad != 0;
  return f;
}

TEST(ExactReducer, FoldedSumsGiveTheMeanOfAddedNodesBitForBit) {
  // Two reducers step by step, one fed node by node and one by AddFolded, through a first step
  // (no scale yet), a step that reuses the scale, a 10^4 growth (overflow) and a NaN.
  auto dev = CreateCpuDevice(1);
  auto comm = CreateLocalCommunicator();
  auto added = CreateReducer(Reduction::kExact, *dev, Buckets(), kV).value();
  auto folded = CreateReducer(Reduction::kExact, *dev, Buckets(), kV).value();
  std::vector<float> out_added(kParams), out_folded(kParams);
  for (float scale : {1.f, 1.f, 1e4f, NAN}) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::vector<std::vector<float>> nodes;
      for (int v = 0; v < kV; ++v) nodes.push_back(Gradient(v, v == 3 ? scale : 1.f));
      added->Begin();
      folded->Begin();
      ASSERT_EQ(added->exponents(), folded->exponents());
      for (const auto& g : nodes) {
        ASSERT_TRUE(added->Add(g.data()).ok());
        added->AddLoss(LossStats{1.0, 0, 10});
        folded->AddLoss(LossStats{1.0, 0, 10});
      }
      const Folded f = FoldOutside(folded->exponents(), nodes);
      ASSERT_TRUE(folded->AddFolded(f.sums.data(), f.max_bits, f.bad).ok());
      auto a = added->Finish(*comm, {}, out_added.data());
      auto b = folded->Finish(*comm, {}, out_folded.data());
      ASSERT_EQ(a.ok(), b.ok()) << scale;
      if (!a.ok()) {
        EXPECT_TRUE(std::isnan(scale));
        EXPECT_EQ(b.status().code(), StatusCode::kNumerical);
        return;
      }
      EXPECT_EQ(a->redo, b->redo) << scale;
      EXPECT_EQ(a->totals.loss_sum, b->totals.loss_sum);
      if (a->redo) continue;
      // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): the bits are what must agree.
      EXPECT_EQ(0, std::memcmp(out_added.data(), out_folded.data(), kParams * sizeof(float)));
      break;
    }
  }
  FAIL() << "the NaN step did not fail";
}

TEST(ExactReducer, FoldedSumsComeOncePerStepInsteadOfAdd) {
  auto dev = CreateCpuDevice(1);
  auto red = CreateReducer(Reduction::kExact, *dev, Buckets(), kV).value();
  const std::vector<int64_t> sums(kParams, 0);
  const std::vector<uint32_t> max_bits(Buckets().size(), 0);
  const auto g = Gradient(0);
  red->Begin();
  EXPECT_EQ(red->AddFolded(sums.data(), std::span(max_bits).first(1), false).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(red->AddFolded(sums.data(), max_bits, false).ok());
  EXPECT_EQ(red->AddFolded(sums.data(), max_bits, false).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(red->Add(g.data()).code(), StatusCode::kFailedPrecondition);
  red->Begin();
  ASSERT_TRUE(red->Add(g.data()).ok());
  EXPECT_EQ(red->AddFolded(sums.data(), max_bits, false).code(), StatusCode::kFailedPrecondition);
  auto fast = CreateReducer(Reduction::kFast, *dev, Buckets(), kV).value();
  fast->Begin();
  EXPECT_EQ(fast->AddFolded(sums.data(), max_bits, false).code(), StatusCode::kFailedPrecondition);
}

// A fake for a fault no real peer can be timed to produce: a member of a world of two that dies
// after the reduce-scatter has already added part of its data into this rank's buffer.
class DiesMidReduceScatter : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "dies-mid-reduce-scatter"; }
  Status AllReduce(int64_t*, size_t, ReduceOp) override { return Lost(); }
  Status AllReduce(float*, size_t, ReduceOp) override { return Lost(); }
  Status ReduceScatter(int64_t* data, size_t shard, ReduceOp) override {
    for (size_t i = 0; i < 2 * shard; i += 3) data[i] += 12345;
    return Lost();
  }
  Status AllGather(void*, size_t) override { return Lost(); }
  Status Broadcast(void*, size_t, int) override { return Lost(); }
  Status Barrier() override { return Lost(); }

 private:
  static Status Lost() { return Unavailable("peer 1 closed the connection"); }
};

// A survivor keeps the nodes it had summed when a collective failed and adds the lost member's
// on top: the mean is the one of a run that never failed, bit for bit.
TEST(ExactReducer, AFailedFinishKeepsTheSumsForTheNodesOfTheNextPlan) {
  auto dev = CreateCpuDevice(1);
  auto comm = CreateLocalCommunicator();
  auto add = [](Reducer& red, int first, int last) {
    for (int v = first; v < last; ++v) {
      const auto g = Gradient(v);
      ASSERT_TRUE(red.Add(g.data()).ok());
      red.AddLoss(LossStats{1.0 + v, v, 10});
    }
  };
  auto reference = CreateReducer(Reduction::kExact, *dev, Buckets(), kV).value();
  std::vector<float> expected(kParams);
  reference->Begin();
  add(*reference, 0, kV);
  ASSERT_TRUE(reference->Finish(*comm, {}, expected.data())->redo);  // no scale yet
  const std::vector<int32_t> exponents = reference->exponents();
  reference->Begin();
  add(*reference, 0, kV);
  auto want = reference->Finish(*comm, {}, expected.data());
  ASSERT_TRUE(want.ok() && !want->redo);

  auto survivor = CreateReducer(Reduction::kExact, *dev, Buckets(), kV).value();
  ASSERT_TRUE(survivor->set_exponents(exponents).ok());
  survivor->Begin();
  add(*survivor, 0, kV / 2);  // its own nodes under the old plan
  DiesMidReduceScatter dying;
  std::vector<float> got(kParams);
  EXPECT_EQ(survivor->Finish(dying, {}, got.data()).status().code(), StatusCode::kUnavailable);
  add(*survivor, kV / 2, kV);  // the lost member's, under the new plan: no Begin
  auto after = survivor->Finish(*comm, {}, got.data());
  ASSERT_TRUE(after.ok()) << after.status().message();
  EXPECT_FALSE(after->redo);
  EXPECT_EQ(after->totals.samples, want->totals.samples);
  EXPECT_EQ(after->totals.loss_sum, want->totals.loss_sum);
  // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): the bits are what must agree.
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), kParams * sizeof(float)), 0);
}

TEST(Reducer, RestoredExponentsMustMatchTheBuckets) {
  auto dev = CreateCpuDevice(1);
  auto red = CreateReducer(Reduction::kExact, *dev, Buckets(), kV).value();
  const int32_t wrong[] = {1, 2};
  EXPECT_EQ(red->set_exponents(wrong).code(), StatusCode::kInvalidArgument);
  auto fast = CreateReducer(Reduction::kFast, *dev, Buckets(), kV).value();
  EXPECT_TRUE(fast->exponents().empty());
  EXPECT_FALSE(fast->set_exponents(wrong).ok());
}

}  // namespace
}  // namespace vf
