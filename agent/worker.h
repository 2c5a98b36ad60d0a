// The per-pod worker: trains its share of a job's virtual nodes together with its peers.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/status.h"

namespace vf {

// How a worker is started. Static membership: the world is fixed for the whole run.
struct WorkerOptions {
  std::string job_path;
  int rank = 0;
  int world_size = 1;
  std::string store_dir;           // rendezvous directory shared by the workers (world_size > 1)
  int64_t steps_override = 0;      // > 0 replaces the job's length
  std::string result_path;         // JSON result written at the end
  double progress_interval = 2.0;  // seconds between progress lines (rank 0); 0 = none
  double timeout = 60.0;           // seconds bound on rendezvous and every collective
};

// Runs the worker to completion. Errors carry the context a person needs (which step, which
// file); the caller prints them.
Status RunWorker(const WorkerOptions& options);

}  // namespace vf
