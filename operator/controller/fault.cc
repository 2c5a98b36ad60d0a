#include "operator/controller/fault.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iterator>

namespace vf::controller {

Result<OperatorFault> OperatorFault::Parse(const std::string& phase) {
  if (phase.empty()) return OperatorFault();
  if (std::find(std::begin(kOperatorFaultPhases), std::end(kOperatorFaultPhases), phase) ==
      std::end(kOperatorFaultPhases)) {
    return InvalidArgument("VF_FAULT_OPERATOR_EXIT_AT: no such phase '" + phase +
                           "' (joiners-warming, plan-published, state-transfer, acks-pending, "
                           "final-report)");
  }
  return OperatorFault(phase);
}

void OperatorFault::At(std::string_view phase, const std::string& job) const {
  if (!armed(phase)) return;
  std::fprintf(stderr, "fault injection: killing the operator at %.*s of %s\n",
               static_cast<int>(phase.size()), phase.data(), job.c_str());
  std::fflush(stderr);
  kill(getpid(), SIGKILL);
}

}  // namespace vf::controller
