// How a job's virtual nodes are divided among its workers: the one split every part of the
// product uses (the operator's membership decisions, `vf run`, the simulator, the benchmarks),
// so that a plan means the same thing wherever it is made.
#pragma once

#include <vector>

namespace vf {

// Splits `virtual_nodes` among workers whose seconds per virtual node are
// `seconds_per_virtual_node` (all > 0 and finite): every worker gets at least one, the counts
// sum to V, and max_i(count_i * t_i) is as small as possible. Exact: each node after the first
// of every worker goes to the worker that would finish it soonest (a min-heap of the finish time
// after one more node), which is optimal for this objective. Ties go to the lower index, so the
// result is deterministic, and equal times (EqualTimes) give the even split: V / n each, the
// first V % n workers one more. Requires 1 <= workers <= V; returns {} otherwise.
std::vector<int> SplitVirtualNodes(int virtual_nodes,
                                   const std::vector<double>& seconds_per_virtual_node);

// The same time for each of `workers` workers: SplitVirtualNodes(V, EqualTimes(n)) is the even
// split, for workers whose speeds are unknown or alike.
std::vector<double> EqualTimes(int workers);

// Turns per-worker counts into contiguous virtual-node lists: worker 0 gets 0..c0-1, worker 1
// the next c1, and so on.
std::vector<std::vector<int>> ContiguousVirtualNodes(const std::vector<int>& counts);

// Per-worker counts turned into virtual-node lists that leave each worker as many of the nodes it
// `held` (per worker, in the same order; empty for a joiner) as its count allows, lowest first;
// the nodes nobody keeps go, in ascending order, to the workers short of their count, in worker
// order. For the plan after a lost member: a survivor still holds the nodes it had computed in
// the failed step, so it need not compute them again (virtualflow.torch keeps them). A node
// held twice, or not below the counts' sum, is not kept. With nothing held, the same as
// ContiguousVirtualNodes. Each list ascending.
std::vector<std::vector<int>> KeepVirtualNodes(const std::vector<int>& counts,
                                               const std::vector<std::vector<int>>& held);

// The step time of a split: max_i(count_i * t_i). 0 for an empty split.
double SplitStepSeconds(const std::vector<int>& counts,
                        const std::vector<double>& seconds_per_virtual_node);

}  // namespace vf
