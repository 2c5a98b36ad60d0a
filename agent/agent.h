// The agent library: what a training process needs to be one worker of an elastic VirtualFlow
// job. It joins the job at the coordinator, follows the membership plans, rebuilds the
// communicator between two steps, brings joiners to the members' training state, reports
// progress and serves the worker's metrics. The training itself stays with the caller (the
// built-in executor in worker.h, or a user's own training code), which drives it like this:
//
//   VF_ASSIGN_OR_RETURN(auto agent, agent::Agent::Join(options));
//   ... load data, build the model (warm-up: the job does not wait for it) ...
//   VF_RETURN_IF_ERROR(agent->Ready());
//   while (true) {
//     VF_ASSIGN_OR_RETURN(std::optional<agent::Membership> m, agent->Next(state));
//     if (!m) break;                                 // this worker left the job
//     if (state.step() >= total_steps) break;        // the job is done
//     header = {agent->latest_epoch()};              // folded into the step's collective (MAX)
//     step = train one step over m->virtual_nodes with m->comm, reducing header too;
//     step.ok() ? agent->Completed(outcome) : agent->Failed(state.step(), step.status());
//   }
//
// Nothing here spawns or restarts processes: a resize happens inside Next, between two steps.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/protocol/messages.h"
#include "runtime/comm/communicator.h"
#include "runtime/device.h"
#include "runtime/status.h"

namespace vf {
class AgentMetrics;
}  // namespace vf

namespace vf::agent {

// The full training state of a worker, as the training code exposes it to the agent so that a
// joiner can receive it from a member (design invariant 6). Implemented by the caller; called
// only from the thread that calls Agent::Next.
class TrainingStateHolder {
 public:
  virtual ~TrainingStateHolder() = default;
  // False until the state is initialized or received: a joiner has none of its own.
  virtual bool has_state() const = 0;
  // Steps completed.
  virtual int64_t step() const = 0;
  // No member holds state (the job's first plan, or every member was lost): start it fresh,
  // or from the job's checkpoint. Called on the new plan's rank 0 only.
  virtual Status Initialize() = 0;
  // The small part of the state, serialized; the source of a transfer sends it first.
  virtual std::string Metadata() const = 0;
  // A receiver checks the source's metadata before any buffer arrives, so that a foreign job's
  // state can never overwrite its own: kFailedPrecondition for another job, kDataLoss for bytes
  // that do not parse.
  virtual Status CheckMetadata(std::string_view metadata) const = 0;
  // The large buffers (parameters, optimizer slots, ...), broadcast in place with no copies:
  // the same count and sizes on every member that passed CheckMetadata.
  virtual std::vector<std::span<std::byte>> Buffers() = 0;
  // The state is about to be overwritten by a transfer.
  virtual void Invalidate() = 0;
  // The buffers have arrived: take over the metadata too.
  virtual Status Adopt(std::string_view metadata) = 0;
};

// How a worker joins a job. Value type.
struct AgentOptions {
  std::string coordinator_url;  // e.g. http://127.0.0.1:7070
  std::string job_id;           // "namespace/name"
  std::string worker;           // unique name of this worker within the job
  std::string token;            // the job's coordinator token
  std::string ca_file;          // PEM CA of an https coordinator (CoordinatorClient); may be empty
  // Joiners must share the job's fingerprint (the training math: JobSpec::Fingerprint) and the
  // build (binary version and reduction arithmetic), or weights would silently diverge.
  std::string fingerprint;
  std::string build;
  std::chrono::milliseconds timeout{60000};  // rendezvous, collectives and plan waits
  double report_interval = 1.0;              // seconds between progress reports
  int metrics_port = -1;  // serve /metrics on this port (0: any free one; < 0: none)
  bool gpu = false;       // NCCL on CUDA device 0; otherwise Gloo on the CPU
  // The address this worker's communicator listens on, which its peers dial: the pod's own
  // address on Kubernetes (VF_POD_IP), loopback when every worker runs on one machine.
  std::string host = "127.0.0.1";
  // Where the final report is also written before it is sent: the container's
  // terminationMessagePath on Kubernetes (VF_TERMINATION_MESSAGE_PATH), so that the outcome
  // outlives the coordinator that received it (an operator killed before it wrote the job's
  // status reads it back from the Succeeded pod). Empty: nowhere (local runs).
  std::string termination_message_path;
};

// This worker's part in the next step. Valid until the next call of Next or Failed.
struct Membership {
  std::vector<std::string> members;  // every member's worker name, by rank
  int64_t epoch = 0;
  int rank = 0;
  int world = 0;
  std::vector<int> virtual_nodes;  // this worker's, in the order it runs them
  Communicator* comm = nullptr;    // the members' communicator of this epoch
  bool switched = false;           // the first step under this plan (a resize just happened)
};

// What the caller says of a completed step. Value type.
struct StepOutcome {
  double loss = 0.0;
  double seconds = 0.0;          // the whole step, wall clock
  double compute_seconds = 0.0;  // of it, the local virtual nodes' forward and backward passes
  int64_t samples = 0;           // the global batch
  // The MAX over the members of latest_epoch(), as folded into the step's collective: when it
  // is newer than the current plan, every member switches after this step, together.
  int64_t agreed_epoch = 0;
  bool last_step = false;  // the job's last step: report at once, whatever the interval
};

// One worker's membership in one job. Not thread-safe, except RequestLeave; one per process.
class Agent {
 public:
  // Registers the worker (not ready yet), waiting up to the timeout for a coordinator that is
  // not serving yet (an operator starting or restarting), and starts following plans. A
  // worker asked to leave before it ever registered joins nothing: its Next says it left.
  // A coordinator that has no room for the worker yet (IsCoordinatorFull: the job's worker
  // limit, or the memory budget all jobs share) is waited for as long as it says so, registering
  // again after 0.5 s, then twice as long each time up to 10 s, and saying on stderr once that it
  // waits, every 30 s that it still does, and once when it is admitted.
  //
  // A coordinator that restarted has forgotten the job until the operator adds it again (it
  // answers 401, as it does for a wrong token, so that nobody learns which jobs exist) and
  // then the worker (404). A worker cannot tell that from a token that is no longer valid by
  // the answer alone, so it tells them apart by time: a call refused with 401 or 404 makes it
  // register again and repeat the call. Registering, readiness and the final report keep at it
  // for up to the timeout, then fail with kUnavailable (the worker exits 1 and is replaced,
  // never failing the job) and a message naming both causes; a periodic report or a failure
  // report tries once (training goes on, and the next report tries again); a worker that is
  // leaving anyway (asked to, or excluded by a plan) tries once, then leaves without telling.
  static Result<std::unique_ptr<Agent>> Join(const AgentOptions& options);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // From the next plan on, the Gloo communicator (without `gpu`) takes its buffers in `device`'s
  // memory and reduces host copies of them (runtime/comm/staged): for workers that share one
  // GPU, which NCCL cannot join. `device` must outlive the agent. Call before Ready.
  void StageCollectivesThrough(Device& device);

  // From the next plan on, collectives run through NCCL on CUDA device `cuda_device` (host
  // buffers staged through it), as with `gpu` but on a device the caller chose after Join: a
  // PyTorch worker's, once it knows where its model is. Call before Ready.
  void CollectivesOnNccl(int cuda_device);

  // Warm-up is over: from now on a plan may include this worker.
  Status Ready();

  // Call before every step. Follows the plan the members agreed on (or, for a joiner, waits
  // for the first plan that includes it): rebuilds the communicator and brings every member to
  // the newest state. Returns nullopt when this worker has left the job (asked to leave and
  // excluded by a plan, which it acknowledges), or left before it ever counted. Errors:
  // kDeadlineExceeded when no plan comes within the timeout; the state holder's
  // kFailedPrecondition or kDataLoss, which mean the job cannot go on; kInvalidArgument when
  // the plan's communicator is refused for good here (NCCL refusing two ranks on one GPU, Gloo
  // unable to listen on `host`), after reporting it: no new plan would fare better.
  Result<std::optional<Membership>> Next(TrainingStateHolder& state);

  // The job's length in steps, from the data this worker loaded (only a worker knows its
  // dataset's size): every report carries it, so the controller can show progress.
  void set_total_steps(int64_t total_steps);

  // The newest plan epoch this worker has seen; fold it into the step's collective as a MAX.
  int64_t latest_epoch() const;

  // After a completed step: records metrics, reports progress every report_interval and
  // schedules a switch when the members agreed on a newer plan.
  Status Completed(int64_t step, const StepOutcome& outcome);
  // After a step that failed (a member died or stalled; nothing of it was applied): reports
  // the failure and drops the communicator, so that the next Next waits for the plan without
  // the lost member and the step is redone.
  void Failed(int64_t step, const Status& error);
  // After a checkpoint write at `step`: a failure (a full disk, a read-only volume) is printed
  // on stderr and carried in every report from now on, until a later write succeeds, so that
  // the operator shows it as the job's CheckpointFailing condition and `vf run` prints it.
  // Training goes on either way: the caller retries at the next interval.
  void CheckpointWritten(int64_t step, const Status& written);
  // The job is done; rank 0 of the final plan sends `final` (finished = true), retrying while
  // the coordinator is briefly away or has forgotten the job (an operator restart). Returns
  // kUnavailable if it could not be delivered.
  Status Finish(Report final);

  // The latest periodic progress report (its rates are repeated in the final one).
  const Report& last_report() const;
  AgentMetrics& metrics();
  const std::string& worker() const;
  // After Next returned nullopt: this worker left without the coordinator's answer, because
  // the coordinator no longer knows the job (suspended, deleted, or an operator restarting),
  // so the job may not go on without it.
  bool left_untold() const;

 private:
  class Impl;
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The contents of a file a worker's pod is given for the coordinator (`what`: its token, the
// operator's CA). A kubelet mounts such a volume for the pod's life, so a file missing or empty
// at start is a fault of that pod, not of the job: it is read again every half second for up to
// `patience`, stderr saying so once, and past it the result is kUnavailable (the worker exits
// 1 and is replaced, never failing the job) with a message naming the file and why.
Result<std::string> ReadCredentialFile(const std::string& path, const std::string& what,
                                       const std::string& worker,
                                       std::chrono::milliseconds patience);

// Asks every Agent of this process to leave gracefully at the next step boundary. Safe to
// call from a signal handler (SIGTERM).
void RequestLeave();
// Whether RequestLeave was called (the pod is being deleted: suspended, drained, scaled in).
bool LeaveRequested();

}  // namespace vf::agent
