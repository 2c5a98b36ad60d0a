#include "runtime/split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace vf {
namespace {

// The best max(count_i * t_i) over all splits with every count >= 1, by enumeration.
double BruteForceBest(int v, const std::vector<double>& t) {
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> counts(t.size(), 1);
  std::function<void(size_t, int)> rec = [&](size_t i, int left) {
    if (i + 1 == t.size()) {
      counts[i] = left;
      best = std::min(best, SplitStepSeconds(counts, t));
      return;
    }
    const int rest = static_cast<int>(t.size() - i - 1);
    for (int c = 1; c <= left - rest; ++c) {
      counts[i] = c;
      rec(i + 1, left - c);
    }
  };
  rec(0, v);
  return best;
}

TEST(SplitVirtualNodes, EqualSpeedsSplitEvenly) {
  EXPECT_EQ(SplitVirtualNodes(8, {1.0, 1.0, 1.0, 1.0}), (std::vector<int>{2, 2, 2, 2}));
}

TEST(SplitVirtualNodes, RemainderGoesToLowerIndicesOnTies) {
  EXPECT_EQ(SplitVirtualNodes(10, {1.0, 1.0, 1.0, 1.0}), (std::vector<int>{3, 3, 2, 2}));
}

TEST(SplitVirtualNodes, FasterWorkersGetMoreNodes) {
  // Two workers twice as fast as the other two: 2:2:1:1 of 12.
  EXPECT_EQ(SplitVirtualNodes(12, {0.5, 0.5, 1.0, 1.0}), (std::vector<int>{4, 4, 2, 2}));
}

TEST(SplitVirtualNodes, EveryWorkerGetsAtLeastOneNode) {
  const auto c = SplitVirtualNodes(3, {1.0, 100.0});
  EXPECT_EQ(c, (std::vector<int>{2, 1}));
}

TEST(SplitVirtualNodes, SumsToVirtualNodes) {
  const auto c = SplitVirtualNodes(37, {0.3, 0.7, 0.7, 1.1, 0.2});
  EXPECT_EQ(std::accumulate(c.begin(), c.end(), 0), 37);
}

TEST(SplitVirtualNodes, OptimalAgainstExhaustiveSearch) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> speed(0.1, 3.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int workers = 1 + static_cast<int>(rng() % 4);
    const int v = workers + static_cast<int>(rng() % 9);
    std::vector<double> t(static_cast<size_t>(workers));
    for (auto& x : t) x = speed(rng);
    const auto c = SplitVirtualNodes(v, t);
    ASSERT_EQ(c.size(), t.size());
    EXPECT_DOUBLE_EQ(SplitStepSeconds(c, t), BruteForceBest(v, t)) << "trial " << trial;
  }
}

TEST(SplitVirtualNodes, BeatsTheEvenSplitOnMixedSpeeds) {
  // 2 fast (1.0) + 8 slow (1.6) workers, 64 nodes.
  std::vector<double> t = {1.0, 1.0};
  t.insert(t.end(), 8, 1.6);
  const auto c = SplitVirtualNodes(64, t);
  const std::vector<int> even = {7, 7, 7, 7, 6, 6, 6, 6, 6, 6};
  EXPECT_LT(SplitStepSeconds(c, t), SplitStepSeconds(even, t));
}

TEST(SplitVirtualNodes, SameInputSameOutput) {
  const std::vector<double> t = {0.9, 0.4, 0.9, 0.4, 1.3};
  EXPECT_EQ(SplitVirtualNodes(29, t), SplitVirtualNodes(29, t));
}

TEST(SplitVirtualNodes, RejectsImpossibleInput) {
  EXPECT_TRUE(SplitVirtualNodes(2, {1.0, 1.0, 1.0}).empty());
  EXPECT_TRUE(SplitVirtualNodes(4, {}).empty());
  EXPECT_TRUE(SplitVirtualNodes(4, {1.0, 0.0}).empty());
  EXPECT_TRUE(SplitVirtualNodes(4, {1.0, -1.0}).empty());
  EXPECT_TRUE(SplitVirtualNodes(4, {1.0, std::numeric_limits<double>::infinity()}).empty());
}

// The even split as the executor's EvenAssignment defined it before the split had one home:
// contiguous ranges, the first V % n ranks holding one more.
std::vector<std::vector<int>> FormerEvenAssignment(int virtual_nodes, int ranks) {
  std::vector<std::vector<int>> out(static_cast<size_t>(ranks));
  int next = 0;
  for (int r = 0; r < ranks; ++r) {
    const int count = virtual_nodes / ranks + (r < virtual_nodes % ranks ? 1 : 0);
    for (int i = 0; i < count; ++i) out[static_cast<size_t>(r)].push_back(next++);
  }
  return out;
}

TEST(SplitVirtualNodes, EqualTimesGiveExactlyTheFormerEvenAssignment) {
  for (int v = 1; v <= 70; ++v) {
    for (int n = 1; n <= v; ++n) {
      ASSERT_EQ(ContiguousVirtualNodes(SplitVirtualNodes(v, EqualTimes(n))),
                FormerEvenAssignment(v, n))
          << v << " virtual nodes on " << n << " workers";
    }
  }
  // The largest job: 4096 virtual nodes.
  EXPECT_EQ(ContiguousVirtualNodes(SplitVirtualNodes(4096, EqualTimes(7))),
            FormerEvenAssignment(4096, 7));
}

TEST(SplitVirtualNodes, EvenSplitCoversEveryVirtualNodeOnce) {
  for (int v : {1, 5, 8, 12}) {
    for (int n = 1; n <= v; ++n) {
      const auto a = ContiguousVirtualNodes(SplitVirtualNodes(v, EqualTimes(n)));
      ASSERT_EQ(static_cast<int>(a.size()), n);
      int next = 0;
      size_t most = 0;
      size_t least = SIZE_MAX;
      for (const auto& r : a) {
        for (int x : r) EXPECT_EQ(x, next++);
        most = std::max(most, r.size());
        least = std::min(least, r.size());
      }
      EXPECT_EQ(next, v);
      EXPECT_LE(most - least, 1u);
    }
  }
}

TEST(EqualTimes, OneEqualTimePerWorker) {
  EXPECT_EQ(EqualTimes(3), (std::vector<double>{1.0, 1.0, 1.0}));
  EXPECT_TRUE(EqualTimes(0).empty());
  EXPECT_TRUE(EqualTimes(-2).empty());
}

TEST(ContiguousVirtualNodes, NumbersNodesInWorkerOrder) {
  const auto lists = ContiguousVirtualNodes({3, 1, 2});
  ASSERT_EQ(lists.size(), 3u);
  EXPECT_EQ(lists[0], (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(lists[1], (std::vector<int>{3}));
  EXPECT_EQ(lists[2], (std::vector<int>{4, 5}));
}

TEST(KeepVirtualNodes, SurvivorsKeepTheirNodesAndShareOutTheLostOnes) {
  // 3 workers on 8 nodes, the middle one lost: the two left keep theirs and split its 3.
  EXPECT_EQ(KeepVirtualNodes({4, 4}, {{0, 1, 2}, {6, 7}}),
            (std::vector<std::vector<int>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(KeepVirtualNodes({4, 4}, {{3, 4, 5}, {6, 7}}),
            (std::vector<std::vector<int>>{{0, 3, 4, 5}, {1, 2, 6, 7}}));
  // A survivor's count below what it held: it keeps its lowest; a joiner holds nothing.
  EXPECT_EQ(KeepVirtualNodes({2, 3, 3}, {{4, 5, 6, 7}, {}, {0}}),
            (std::vector<std::vector<int>>{{4, 5}, {1, 2, 3}, {0, 6, 7}}));
  // Nothing held: the contiguous lists.
  EXPECT_EQ(KeepVirtualNodes({3, 1, 2}, {}), ContiguousVirtualNodes({3, 1, 2}));
  // A node held twice or out of range is kept once at most.
  EXPECT_EQ(KeepVirtualNodes({2, 2}, {{1, 9}, {1, 2}}),
            (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
}

TEST(KeepVirtualNodes, EveryNodeOnceWithTheCounts) {
  for (int v : {1, 5, 8, 12}) {
    for (int n = 1; n <= v; ++n) {
      const auto counts = SplitVirtualNodes(v, EqualTimes(n));
      // What n + 1 workers held, the last of them lost.
      auto before = ContiguousVirtualNodes(SplitVirtualNodes(v, EqualTimes(std::min(n + 1, v))));
      before.resize(static_cast<size_t>(n));
      const auto lists = KeepVirtualNodes(counts, before);
      std::vector<int> seen(static_cast<size_t>(v), 0);
      for (size_t w = 0; w < lists.size(); ++w) {
        EXPECT_EQ(static_cast<int>(lists[w].size()), counts[w]);
        for (int x : lists[w]) ++seen[static_cast<size_t>(x)];
      }
      EXPECT_EQ(seen, std::vector<int>(static_cast<size_t>(v), 1)) << v << " on " << n;
    }
  }
}

TEST(SplitStepSeconds, IsTheSlowestWorker) {
  EXPECT_DOUBLE_EQ(SplitStepSeconds({3, 1}, {1.0, 2.5}), 3.0);
  EXPECT_DOUBLE_EQ(SplitStepSeconds({}, {}), 0.0);
}

}  // namespace
}  // namespace vf
