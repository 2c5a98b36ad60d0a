#include "runtime/split.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <queue>
#include <tuple>
#include <utility>
#include <vector>

namespace vf {

std::vector<int> SplitVirtualNodes(int virtual_nodes,
                                   const std::vector<double>& seconds_per_virtual_node) {
  const size_t n = seconds_per_virtual_node.size();
  if (n == 0 || virtual_nodes < static_cast<int>(n)) return {};
  for (double t : seconds_per_virtual_node) {
    if (!(t > 0.0) || !std::isfinite(t)) return {};
  }
  // Every worker starts with its one mandatory node; each further node goes to the worker
  // that would finish it soonest. Node k of worker i finishes at k * t_i, increasing in k, so
  // the chosen finish times are the V smallest a feasible split can use: the result is optimal.
  std::vector<int> counts(n, 1);
  using Entry = std::tuple<double, size_t>;  // finish time after one more node, worker
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  for (size_t i = 0; i < n; ++i) heap.emplace(2.0 * seconds_per_virtual_node[i], i);
  for (int left = virtual_nodes - static_cast<int>(n); left > 0; --left) {
    const auto [finish, i] = heap.top();
    heap.pop();
    ++counts[i];
    heap.emplace((counts[i] + 1) * seconds_per_virtual_node[i], i);
  }
  return counts;
}

std::vector<double> EqualTimes(int workers) {
  return std::vector<double>(static_cast<size_t>(std::max(workers, 0)), 1.0);
}

std::vector<std::vector<int>> KeepVirtualNodes(const std::vector<int>& counts,
                                               const std::vector<std::vector<int>>& held) {
  int total = 0;
  for (int c : counts) total += std::max(c, 0);
  std::vector<bool> taken(static_cast<size_t>(total), false);
  std::vector<std::vector<int>> out(counts.size());
  for (size_t w = 0; w < counts.size() && w < held.size(); ++w) {
    std::vector<int> mine = held[w];
    std::sort(mine.begin(), mine.end());
    for (int v : mine) {
      if (static_cast<int>(out[w].size()) >= counts[w]) break;
      if (v < 0 || v >= total || taken[static_cast<size_t>(v)]) continue;
      taken[static_cast<size_t>(v)] = true;
      out[w].push_back(v);
    }
  }
  int next = 0;
  for (size_t w = 0; w < counts.size(); ++w) {
    while (static_cast<int>(out[w].size()) < counts[w]) {
      while (taken[static_cast<size_t>(next)]) ++next;
      taken[static_cast<size_t>(next)] = true;
      out[w].push_back(next);
    }
    std::sort(out[w].begin(), out[w].end());
  }
  return out;
}

std::vector<std::vector<int>> ContiguousVirtualNodes(const std::vector<int>& counts) {
  std::vector<std::vector<int>> out;
  out.reserve(counts.size());
  int next = 0;
  for (int c : counts) {
    std::vector<int> nodes;
    for (int k = 0; k < c; ++k) nodes.push_back(next++);
    out.push_back(std::move(nodes));
  }
  return out;
}

double SplitStepSeconds(const std::vector<int>& counts,
                        const std::vector<double>& seconds_per_virtual_node) {
  double worst = 0.0;
  for (size_t i = 0; i < counts.size() && i < seconds_per_virtual_node.size(); ++i) {
    worst = std::max(worst, counts[i] * seconds_per_virtual_node[i]);
  }
  return worst;
}

}  // namespace vf
