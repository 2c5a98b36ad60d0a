// The embedded default "cluster": runs a job as local worker processes with the real
// coordinator, so `vf run job.yaml` needs no Kubernetes at all and resizes like the operator.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace vf {

struct LocalRunOptions {
  std::string job_path;
  int workers = 0;                 // local worker slots; 0: min(replicas.max, CPU cores)
  std::string capacity;            // slot schedule "0:2,150:4" (steps) or "0s:2,30s:4"; overrides
  int64_t steps_override = 0;      // > 0 replaces the job's length
  double progress_interval = 2.0;  // seconds between progress lines (0: none)
  double timeout = 60.0;           // seconds bound on rendezvous, collectives and stalls
  std::string agent_path;          // empty: virtualflow-agent next to this executable
  std::vector<double> slowdowns;   // per worker slot (cycled): artificial slowdown factors
  std::vector<double> vnode_delays_ms;  // per worker slot (cycled): fixed ms per virtual node
  std::string run_info_path;            // write {coordinator, job, secret_file} here once serving
  bool quiet = false;                   // no progress, resize or worker output lines
  // Where each worker's standard output and error are kept (worker-N.log, plus plans.log):
  // empty for a new directory under the temporary directory. Never removed.
  std::string logs_dir;
  // How virtual nodes are split among workers: "proportional" (by each worker's measured time
  // per virtual node, rebalanced when that would cut the step time by more than 15%) or "even".
  std::string assignment = "proportional";
};

// One membership change, as `vf run --summary-json` reports it.
struct ResizeEvent {
  int64_t step = 0;
  int from = 0;
  int to = 0;
  double pause_seconds = 0.0;
  std::string reason;
};

// What a finished local run reports (the fields of `vf run --summary-json`).
struct LocalRunSummary {
  int64_t steps = 0;
  double final_loss = 0.0;
  // NaN when not evaluated (a user's program may report neither).
  double test_accuracy = std::numeric_limits<double>::quiet_NaN();
  double test_loss = std::numeric_limits<double>::quiet_NaN();
  std::string weights_sha256;
  int workers = 0;  // members at the end
  int virtual_nodes = 0;
  double seconds = 0.0;
  double samples_per_second = 0.0;
  std::vector<ResizeEvent> resizes;
  int recoveries = 0;                       // plans published because a member failed
  std::vector<std::string> worker_results;  // each final member's result, as JSON text
  int rebalances = 0;    // plans that only moved virtual nodes between the same workers
  std::string logs_dir;  // where the workers' output was kept
};

// Validates the job, its dataset and any checkpoint up front (one clear error, before any
// process starts), serves the coordinator, starts workers as the policy and the slot schedule
// allow, publishes membership plans, replaces failed workers, prints progress and one line per
// resize, and collects the result. Checks that every final member ended with the same weights.
// Keeps each worker's output in a file of the logs directory, shows the lines of a user
// program's rank 0 as they come (unless quiet), and on a failure the failing worker's last
// lines; prints where the logs are when the run ends, whichever way (unless quiet).
Result<LocalRunSummary> RunLocalJob(const LocalRunOptions& options);

// Asks a running RunLocalJob (from a signal handler) to stop its workers and return.
void RequestLocalJobStop();

}  // namespace vf
