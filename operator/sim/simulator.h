// A discrete-event simulator of a GPU cluster running a job trace under one of the operator's
// own scheduling policies (operator/policy), unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "operator/policy/policy.h"
#include "operator/sim/model.h"
#include "operator/sim/trace.h"
#include "runtime/status.h"

namespace vf::sim {

// A trace job made concrete: its workload profile, length in steps and elasticity bounds.
struct SimJob {
  std::string id;
  const WorkloadProfile* workload = nullptr;
  std::string label;  // e.g. "bert/SST-2"
  int priority = 1;
  double arrival_time = 0.0;
  int min_workers = 1;
  int max_workers = 1;
  int requested_workers = 1;
  int virtual_nodes = 1;
  int64_t global_batch = 1;
  int64_t steps = 1;
  std::string policy;  // its own elasticity policy; empty: the one simulated
};

// How a trace job's elasticity bounds are set.
enum class MaxWorkers {
  kDemand,        // 1..gpu_demand, as the published elastic scheduler did
  kVirtualNodes,  // 1..virtual nodes: may grow past what it asked for
};

// Turns trace entries into SimJobs ("trace/job-07"); epochs become steps with the dataset
// sizes of `profiles` (an epoch's tail that does not fill a batch is skipped).
Result<std::vector<SimJob>> MakeJobs(const std::vector<TraceJob>& trace, const Profiles& profiles,
                                     MaxWorkers max_workers);

struct SimOptions {
  // Seconds between policy decisions while jobs are active (decisions also happen at every
  // arrival and completion), so cooldowns can expire and autoscaling can take its steps.
  double tick_seconds = 30.0;
  SplitMode split = SplitMode::kProportional;
  // Stop (and report unfinished jobs) after this much simulated time.
  double horizon_seconds = 365.0 * 24 * 3600;
  // Keep one line per allocation change with the policy's reason (SimResult::events).
  bool record_events = false;
};

// What happened to one job.
struct JobOutcome {
  std::string id;
  std::string label;
  int priority = 1;
  int requested_workers = 1;
  int virtual_nodes = 1;
  double arrival_time = 0.0;
  double start_time = -1.0;   // first time it got workers
  double finish_time = -1.0;  // < 0: did not finish
  int resizes = 0;            // changes of allocation after the start
  double paused_seconds = 0.0;
  double gpu_seconds = 0.0;  // GPUs held x time
  int max_workers_seen = 0;
  bool finished() const { return finish_time >= 0.0; }
  double jct() const { return finish_time - arrival_time; }
};

struct SimResult {
  std::string policy;
  std::string split;
  std::vector<JobOutcome> jobs;  // trace order
  double makespan = 0.0;         // last completion
  double gpu_utilisation = 0.0;  // GPUs held / GPUs available over the makespan
  double mean_jct = 0.0;
  double median_jct = 0.0;
  double p99_jct = 0.0;
  double mean_resizes = 0.0;
  int decisions = 0;
  int unfinished = 0;
  std::vector<std::string> events;  // with SimOptions::record_events
};

// Runs `jobs` on `cluster` under `policy` and measures the outcome. Deterministic. Each job's
// step time comes from PredictStep on its current allocation; every resize pauses the job for
// ResizePauseSeconds; the policy sees what an operator would: each job's spec, allocation,
// time of last resize, resize pause, remaining work, and the throughput it measured on every
// allocation it has run on.
Result<SimResult> Simulate(const std::vector<SimJob>& jobs, const Cluster& cluster,
                           const policy::Policy& policy, const SimOptions& options);

// Mean, median and nearest-rank 99th percentile of the finished jobs' JCTs into `r`.
void Summarize(SimResult& r, const Cluster& cluster);

}  // namespace vf::sim
