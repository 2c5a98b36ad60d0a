// What the simulator knows about hardware and workloads: throughput profiles per workload and
// GPU type, cluster descriptions, and the step-time model built from them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "operator/policy/policy.h"
#include "runtime/status.h"

namespace vf::sim {

// How fast one workload runs on one device type. Plain data.
struct DeviceProfile {
  // Measured (micro-batch, seconds per micro-batch) points, sorted by micro-batch; when
  // present they win over the two-parameter form below.
  std::vector<std::pair<double, double>> batch_seconds;
  // Two-parameter form: seconds = fixed_seconds + micro_batch / samples_per_second.
  double fixed_seconds = 0.0;
  double samples_per_second = 0.0;
  // Work a worker does once per step whatever its virtual nodes (optimizer update).
  double per_step_seconds = 0.0;
  std::string source;
};

// One workload of the traces (e.g. ResNet-50 on ImageNet). Plain data.
struct WorkloadProfile {
  std::string name;
  std::string description;
  std::string trace_workload;         // the trace's `workload` value it serves
  std::vector<std::string> datasets;  // trace datasets / GLUE tasks it serves
  double parameters = 0.0;            // model parameters
  double gradient_bytes_per_parameter = 4.0;
  int optimizer_slots = 1;  // state per parameter besides the weights
  std::map<std::string, DeviceProfile> devices;

  // Seconds one worker of `device` spends on one virtual node of `micro_batch` samples.
  Result<double> SecondsPerVirtualNode(const std::string& device, double micro_batch) const;
  // Per-step fixed seconds of a worker on `device` (0 if unknown).
  double PerStepSeconds(const std::string& device) const;
  // Bytes a resize sends to joiners: weights plus optimizer state, float32.
  double StateBytes() const { return parameters * 4.0 * (1.0 + optimizer_slots); }
};

// The throughput data file. Plain data.
struct Profiles {
  std::map<std::string, WorkloadProfile> workloads;
  std::map<std::string, int64_t> dataset_samples;  // training-set size by dataset / GLUE task
  std::string path;

  // The workload serving a trace entry's (workload, dataset) pair.
  Result<const WorkloadProfile*> ForTrace(const std::string& workload,
                                          const std::string& dataset) const;
};

Result<Profiles> LoadProfiles(const std::string& path);
// Profiles from YAML text; `path` names it in error messages.
Result<Profiles> ParseProfiles(const std::string& yaml, const std::string& path);
// The profiles `vf simulate` uses unless told otherwise: operator/sim/data/throughput.yaml as it
// was when the binary was built, compiled into it, so that an installed or copied binary needs
// no file beside it.
Result<Profiles> BuiltInProfiles();
// What BuiltInProfiles() is called in messages and --help.
extern const char* const kBuiltInProfilesName;

// A cluster: GPUs per type, the all-reduce cost model and the resize cost. Plain data.
struct Cluster {
  std::string name;
  std::string description;
  std::map<std::string, int> gpus;
  // Ring all-reduce: 2(n-1) steps of `latency_seconds` plus 2(n-1)/n of the bytes at
  // `bandwidth_bytes_per_second`.
  double latency_seconds = 0.0;
  double bandwidth_bytes_per_second = 1e10;
  // Measured instead: seconds of a step's collectives with n workers, for a gradient of
  // `measured_allreduce_bytes` bytes (scaled linearly to other sizes). Where a host's
  // collectives are not bandwidth-bound (local workers on loopback, dominated by kernel copies
  // and wake-ups) this replaces the ring model, and the shared-core stretch, for those n.
  double measured_allreduce_bytes = 0.0;
  std::map<int, double> measured_allreduce_seconds;
  // Resize pause: a fixed switch cost plus the state broadcast to joiners.
  double resize_fixed_seconds = 2.0;
  double state_bandwidth_bytes_per_second = 1e10;
  // Seconds from a job's start to its first step (both policies pay it).
  double start_seconds = 0.0;
  // Types whose workers share a pool of cores (local CPU "devices"): cores per type.
  std::map<std::string, int> shared_cores;
  // Shared-core types only: how much slower each worker computes while two or more of them run
  // at once (0.15: 15% slower), because the cores share caches, memory bandwidth or a physical
  // core. Measured by running two single-worker jobs side by side.
  std::map<std::string, double> core_contention;
  // Relative speed hints per type for the policies (higher is faster).
  std::map<std::string, double> speed_hints;

  int TotalGpus() const;
};

Result<Cluster> LoadCluster(const std::string& path);

// The same cluster restricted to `types` (others removed).
Cluster RestrictTypes(const Cluster& cluster, const std::vector<std::string>& types);

enum class SplitMode { kProportional, kEven };
const char* SplitModeName(SplitMode mode);

// One predicted step of a job on an allocation.
struct StepPrediction {
  std::vector<std::string> worker_types;  // fastest first
  std::vector<double> seconds_per_virtual_node;
  std::vector<int> virtual_nodes;  // per worker
  double compute_seconds = 0.0;    // slowest worker (or the shared-core bound)
  double allreduce_seconds = 0.0;
  double step_seconds = 0.0;
};

// Seconds of one ring all-reduce of `bytes` among `workers`.
double RingAllReduceSeconds(const Cluster& cluster, int workers, double bytes);

// Step time of `workload` with `virtual_nodes` virtual nodes and global batch `global_batch`
// on `workers`: the slowest worker's virtual nodes x its seconds per virtual node (plus its
// per-step work), where workers of a shared-core type cannot together exceed their cores and
// slow each other by the type's core contention when two or more run, plus one ring all-reduce of
// the gradients (stretched by workers / cores on shared cores).
Result<StepPrediction> PredictStep(const WorkloadProfile& workload, const Cluster& cluster,
                                   const policy::Allocation& workers, int virtual_nodes,
                                   int64_t global_batch, SplitMode split);

// Seconds a job is paused by one resize on `cluster`.
double ResizePauseSeconds(const WorkloadProfile& workload, const Cluster& cluster);

}  // namespace vf::sim
