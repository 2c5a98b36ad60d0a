// Job traces in the VirtualFlow paper's published format, and a synthetic generator.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace vf::sim {

// One job of a trace. Plain data.
struct TraceJob {
  double arrival_time = 0.0;  // seconds from the start
  std::string workload;       // resnet | bert | transformer
  int priority = 1;           // 1, 5 or 10; higher is more important
  int gpu_demand = 1;         // GPUs asked for
  int64_t batch_size = 0;     // global batch
  int64_t num_epochs = 0;     // one of num_epochs / num_steps is set
  int64_t num_steps = 0;
  int virtual_nodes_per_device = 1;  // virtual nodes = gpu_demand x this
  std::string dataset;               // `dataset` (imagenet, cifar10) or `glue_task`
  bool glue_task = false;            // which key `dataset` came from
  // The job's own elasticity policy (a registered name), as spec.elasticity.policy;
  // empty: the one simulated (--policy). Not in the published traces.
  std::string policy;

  int VirtualNodes() const { return gpu_demand * virtual_nodes_per_device; }
};

// Parses a trace (a JSON array of job objects); errors name `name` and the job index.
Result<std::vector<TraceJob>> ParseTrace(const std::string& text, const std::string& name);
Result<std::vector<TraceJob>> LoadTrace(const std::string& path);

// The trace as JSON in the published format, one job per line.
std::string TraceToJson(const std::vector<TraceJob>& jobs);

struct TraceGeneratorOptions {
  int jobs = 20;
  double jobs_per_hour = 8.0;
  uint64_t seed = 1;
  // Share of each workload; normalised. Keys: resnet, bert, transformer.
  std::map<std::string, double> mix = {{"resnet", 0.4}, {"bert", 0.3}, {"transformer", 0.3}};
};

// Poisson arrivals at `jobs_per_hour`, workloads drawn from `mix`, priorities uniform over
// {1, 5, 10}, and per-workload shapes (GPUs, batch, length) like those of the published traces.
// A pure function of the options: the same seed gives the same trace on every platform.
Result<std::vector<TraceJob>> GenerateTrace(const TraceGeneratorOptions& options);

// Parses "resnet=0.4,bert=0.3,transformer=0.3".
Result<std::map<std::string, double>> ParseMix(const std::string& text);

}  // namespace vf::sim
