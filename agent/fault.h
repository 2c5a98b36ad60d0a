// Fault injection for tests: lets a test kill a worker at a point it cannot hit reliably from
// outside (in the middle of a state transfer, between computing and reducing a step). This is a
// fake of a crash at that instant; every other fault in the tests is a real signal.
#pragma once

#include <cstdint>
#include <string>

namespace vf {

// Parsed from VF_FAULT_INJECT="worker-3:state-transfer,worker-1:allreduce@50": the named
// worker SIGKILLs itself at the named point (at the given step, or the first time). Unset in
// production; thread-compatible.
class FaultInjector {
 public:
  FaultInjector(const std::string& spec, const std::string& worker);
  // Kills this process with SIGKILL if a fault is armed for `point` at `step` (-1: any).
  void At(const std::string& point, int64_t step = -1);

 private:
  std::string point_;
  int64_t step_ = -1;
  bool armed_ = false;
};

}  // namespace vf
