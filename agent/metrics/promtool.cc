#include "agent/metrics/promtool.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace vf::metrics {
namespace {

std::string ShellQuote(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

bool IsExecutable(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
         ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::optional<std::string> FindPromtool() {
  if (const char* explicit_path = std::getenv("PROMTOOL"); explicit_path != nullptr) {
    if (IsExecutable(explicit_path)) return std::string(explicit_path);
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = dirs.substr(start, end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/promtool";
    if (IsExecutable(candidate)) return candidate;
    start = end + 1;
  }
  return std::nullopt;
}

Result<PromtoolReport> PromtoolCheckMetrics(const std::string& promtool,
                                            const std::string& exposition) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string file =
      std::string(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") + "/vf-metrics-XXXXXX";
  const int fd = ::mkstemp(file.data());
  if (fd < 0)
    return Unavailable("cannot create a file for promtool: " + std::string(strerror(errno)));
  size_t written = 0;
  while (written < exposition.size()) {
    const ssize_t n = ::write(fd, exposition.data() + written, exposition.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string error = strerror(errno);
      ::close(fd);
      ::unlink(file.c_str());
      return Unavailable("cannot write " + file + ": " + error);
    }
    written += static_cast<size_t>(n);
  }
  ::close(fd);

  // Through a file rather than a pipe in both directions: no deadlock to reason about however
  // much either side writes.
  const std::string command =
      ShellQuote(promtool) + " check metrics < " + ShellQuote(file) + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ::unlink(file.c_str());
    return Unavailable("cannot run " + command + ": " + strerror(errno));
  }
  PromtoolReport report;
  std::vector<char> buffer(4096);
  size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    report.output.append(buffer.data(), n);
  }
  const int status = ::pclose(pipe);
  ::unlink(file.c_str());
  if (status == -1 || !WIFEXITED(status)) {
    return Unavailable("'" + command + "' did not exit normally");
  }
  report.exit_code = WEXITSTATUS(status);
  if (report.exit_code == 127) return Unavailable("cannot run " + promtool + ": " + report.output);
  return report;
}

}  // namespace vf::metrics
