#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "agent/agent.h"

namespace vf::agent {
namespace {

using Clock = std::chrono::steady_clock;

// How often a file that cannot be read is tried again.
constexpr std::chrono::milliseconds kReadAgain(500);

// The file's contents, or why not (empty when it was read and holds nothing).
std::string TryRead(const std::string& path, std::string* contents) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) return errno != 0 ? std::strerror(errno) : "cannot open it";
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return "read error";
  *contents = text.str();
  return contents->empty() ? "it is empty" : "";
}

}  // namespace

Result<std::string> ReadCredentialFile(const std::string& path, const std::string& what,
                                       const std::string& worker,
                                       std::chrono::milliseconds patience) {
  const auto deadline = Clock::now() + patience;
  std::string contents;
  std::string why = TryRead(path, &contents);
  if (why.empty()) return contents;
  std::fprintf(stderr,
               "virtualflow-agent: %s: cannot read %s %s (%s); trying again for up to %.0f s\n",
               worker.c_str(), what.c_str(), path.c_str(), why.c_str(),
               static_cast<double>(patience.count()) / 1000.0);
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(kReadAgain);
    why = TryRead(path, &contents);
    if (why.empty()) {
      std::fprintf(stderr, "virtualflow-agent: %s: read %s %s\n", worker.c_str(), what.c_str(),
                   path.c_str());
      return contents;
    }
  }
  // Not the job's fault: the pod's volume is missing or was taken from under it, and a new pod
  // gets it mounted afresh. kUnavailable exits 1 (the pod is replaced), never 3.
  return Unavailable("cannot read " + what + " " + path + " (" + why + ") for " +
                     std::to_string(static_cast<int64_t>(patience.count() / 1000)) +
                     " s; this worker gives up, and a new pod gets its volume mounted afresh");
}

}  // namespace vf::agent
