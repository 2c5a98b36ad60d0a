#include "runtime/deadline.h"

#include <algorithm>

namespace vf {

std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  if (timeout <= std::chrono::milliseconds::zero()) return now;
  return now + std::min(timeout, kLongestWait);
}

}  // namespace vf
