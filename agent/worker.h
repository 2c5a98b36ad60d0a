// The per-pod worker: registers with the coordinator, warms up, trains its share of the job's
// virtual nodes, and follows membership plans between steps.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/status.h"

namespace vf {

// The largest --vnode-delay-ms a worker accepts (ten minutes per virtual node): beyond it a
// step would outlast every timeout, so a larger value is a mistake, refused by the agent and
// by `vf run` before it starts any worker.
inline constexpr double kMaxVnodeDelayMs = 600000;

// How a worker is started (flags of virtualflow-agent).
struct WorkerOptions {
  std::string job_path;
  std::string job_text;            // the manifest itself (YAML or JSON), when job_path is empty
  std::string coordinator_url;     // e.g. http://127.0.0.1:7070
  std::string job_id;              // "namespace/name"; default from the job file's metadata
  std::string worker;              // unique name of this worker within the job
  std::string token;               // the job's coordinator token
  std::string ca_file;             // PEM CA of an https coordinator; empty: the system's CAs
  std::string host = "127.0.0.1";  // the address peers reach this worker's communicator at
  int64_t steps_override = 0;      // > 0 replaces the job's length
  std::string result_path;         // JSON result written at the end (local runs)
  double timeout = 60.0;           // seconds bound on rendezvous, collectives and plan waits
  double slowdown = 1.0;           // >= 1: artificially slower device (heterogeneous experiments)
  double vnode_delay_ms = 0.0;     // fixed extra milliseconds per virtual node (the same)
  double report_interval = 1.0;    // seconds between progress reports to the coordinator
  int metrics_port = -1;           // serve /metrics on this port (0: any free one; < 0: none)
  std::string termination_message_path;  // AgentOptions::termination_message_path
};

// Exit codes of virtualflow-agent.
inline constexpr int kExitOk = 0;            // finished, or left gracefully
inline constexpr int kExitWorkerFailed = 1;  // this worker failed; the job can go on without it
inline constexpr int kExitUsage = 2;
inline constexpr int kExitJobFailed = 3;  // the job itself cannot go on (diverged, refused)
// 4, kExitAnotherBuild (agent/protocol/messages.h): refused for running another build than the
// job's workers; the operator replaces the pod with the job's image and counts no failure.

// Runs the worker to the end of the job (or until it leaves). The returned status's code tells
// the exit code: kNumerical, kInvalidArgument and kFailedPrecondition are job failures.
Status RunWorker(const WorkerOptions& options);

// Asks the worker to leave gracefully at the next step boundary (SIGTERM handler).
void RequestLeave();

}  // namespace vf
