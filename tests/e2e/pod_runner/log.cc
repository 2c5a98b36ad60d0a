#include "tests/e2e/pod_runner/log.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>

namespace vf::podrunner {

void LogLine(std::string_view line) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[48];
  std::snprintf(stamp, sizeof(stamp), "vf-pod-runner %02d:%02d:%02d.%03d ", utc.tm_hour, utc.tm_min,
                utc.tm_sec, static_cast<int>(millis));
  std::string text = stamp;
  text.append(line);
  text.push_back('\n');
  // One write(2) per line: atomic enough for lines of this size, and no stdio lock to share.
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = write(STDERR_FILENO, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace vf::podrunner
