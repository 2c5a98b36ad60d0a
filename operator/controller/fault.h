// Fault injection for tests: lets a test kill the operator at a phase of a resize (or of the end
// of a job) it cannot hit reliably from outside, as the agent's VF_FAULT_INJECT (agent/fault.h)
// does for workers. A fake of `kill -9` at that instant: the process SIGKILLs itself, so nothing
// is flushed or released (its Lease runs out as after a crash). Unset in production.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "runtime/status.h"

namespace vf::controller {

// The phases, in the order a resize meets them:
//   joiners-warming  a new worker is registered but not ready (loading its data) while the job
//                    trains under a plan without it;
//   plan-published   a plan that changes the membership was just published (and its intent
//                    written to the job's status);
//   state-transfer   the first rendezvous key of a plan this operator published with joiners
//                    reached its coordinator: the members are meeting to send them the state;
//   acks-pending     a plan without a worker that is leaving (its pod deleted, its node
//                    drained) was just published: its acknowledgement is pending; or a pass
//                    sees a worker that asked to leave and has not acknowledged such a plan;
// and at the end of a job:
//   final-report     rank 0's final report reached the coordinator (rank 0 may have exited)
//                    and the job's status does not say Succeeded yet.
inline constexpr std::string_view kOperatorFaultPhases[] = {
    "joiners-warming", "plan-published", "state-transfer", "acks-pending", "final-report"};

// Parsed once from VF_FAULT_OPERATOR_EXIT_AT=<phase>. Thread-safe (immutable).
class OperatorFault {
 public:
  // kInvalidArgument for a phase that is not one of kOperatorFaultPhases; "" arms nothing.
  static Result<OperatorFault> Parse(const std::string& phase);
  OperatorFault() = default;

  bool armed(std::string_view phase) const { return !phase_.empty() && phase == phase_; }
  // Kills this process with SIGKILL, saying so on stderr, if armed for `phase`.
  void At(std::string_view phase, const std::string& job) const;

 private:
  explicit OperatorFault(std::string phase) : phase_(std::move(phase)) {}
  std::string phase_;
};

}  // namespace vf::controller
