// The embedded default "cluster": runs a job as local worker processes, so `vf run job.yaml`
// needs no Kubernetes at all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace vf {

struct LocalRunOptions {
  std::string job_path;
  int workers = 0;                 // 0: min(replicas.max, CPU cores)
  int64_t steps_override = 0;      // > 0 replaces the job's length
  double progress_interval = 2.0;  // seconds between progress lines
  double timeout = 60.0;           // seconds bound on rendezvous and collectives
  std::string agent_path;          // empty: virtualflow-agent next to this executable
};

// What a finished local run reports (the fields of `vf run --summary-json`).
struct LocalRunSummary {
  int64_t steps = 0;
  double final_loss = 0.0;
  double test_accuracy = 0.0;
  double test_loss = 0.0;
  std::string weights_sha256;
  int workers = 0;
  int virtual_nodes = 0;
  double seconds = 0.0;
  double samples_per_second = 0.0;
};

// Validates the job, its dataset and any checkpoint up front (one clear error, before any
// process starts), starts the workers, streams rank 0's progress to stdout, and collects the
// result. If a worker fails, the others are stopped and the failing worker's error is returned.
// Checks that every worker ended with the same weights.
Result<LocalRunSummary> RunLocalJob(const LocalRunOptions& options);

// Asks a running RunLocalJob (from a signal handler) to stop its workers and return.
void RequestLocalJobStop();

}  // namespace vf
