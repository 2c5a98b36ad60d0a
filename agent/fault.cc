#include "agent/fault.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace vf {

FaultInjector::FaultInjector(const std::string& spec, const std::string& worker) {
  std::stringstream in(spec);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos || item.substr(0, colon) != worker) continue;
    std::string point = item.substr(colon + 1);
    const size_t at = point.find('@');
    if (at != std::string::npos) {
      step_ = std::strtoll(point.c_str() + at + 1, nullptr, 10);
      point = point.substr(0, at);
    }
    point_ = point;
    armed_ = true;
  }
}

void FaultInjector::At(const std::string& point, int64_t step) {
  if (!armed_ || point != point_ || (step_ >= 0 && step != step_)) return;
  std::fprintf(stderr, "fault injection: killing this worker at %s\n", point.c_str());
  std::fflush(stderr);
  kill(getpid(), SIGKILL);
}

}  // namespace vf
