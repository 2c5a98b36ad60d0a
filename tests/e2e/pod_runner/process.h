// A container played by a local process: fork/exec in a new process group with
// PR_SET_PDEATHSIG, the environment given and nothing else, stdout and stderr appended to a log
// file; signals go to the whole group; the exit is collected without blocking. When asked (root
// only), the child joins the pod's network namespace and gets a mount namespace of its own with
// the pod's bind mounts before it runs the program.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace vf::podrunner {

// A bind mount in the process's mount namespace. Value type; thread-compatible.
struct BindMount {
  std::string source;  // on the host
  std::string target;  // must exist on the host (the runner does not chroot)
  bool read_only = false;
  friend bool operator==(const BindMount&, const BindMount&) = default;
};

// What to run. Value type; thread-compatible.
struct LaunchSpec {
  std::vector<std::string> argv;  // argv[0] is resolved through `path` unless it holds a '/'
  std::vector<std::string> env;   // "NAME=value", the whole environment
  std::string path;               // the PATH argv[0] is looked up in
  std::string working_dir;        // must exist
  std::string log_path;           // created if missing, appended to
  // The network namespace to run in (/var/run/netns/NAME); "" keeps the runner's.
  std::string netns_path;
  // A mount namespace of its own, `/` made rslave so that nothing mounted in it reaches the
  // host, with `mounts` made in order (parents first) before the working directory is entered.
  bool mount_namespace = false;
  std::vector<BindMount> mounts;
};

// How a process ended. Value type; thread-compatible.
struct ProcessExit {
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal killed it (exit_code is then 0)
};

// Where `command` is: itself when it holds a '/' (relative to `working_dir` when relative),
// else the first executable regular file of that name in the ':'-separated `path` (an empty
// entry is the working directory). Errors name the command as the container runtime does:
// kNotFound `exec: "x": executable file not found in $PATH`, kFailedPrecondition for one that
// exists but is not executable.
Result<std::string> FindExecutable(std::string_view command, std::string_view path,
                                   std::string_view working_dir);

// The bytes of the file at `path` from offset `from` on, at most the last `max_bytes` of them;
// "" when it cannot be read.
std::string ReadLogTail(const std::string& path, int64_t from, size_t max_bytes);

// One started process, the leader of its own process group. The thread that calls Start must
// stay alive as long as the process should (PR_SET_PDEATHSIG follows that thread), so the
// runner starts every process from its one reconcile thread. Not thread-safe: one owner.
class ChildProcess {
 public:
  // Starts spec.argv. Fails, starting nothing that lingers, when the command cannot be found or
  // run, the working directory does not exist, the log cannot be opened, or the namespaces or a
  // mount cannot be set up; the message says which and names the command.
  static Result<std::unique_ptr<ChildProcess>> Start(const LaunchSpec& spec);

  // SIGKILLs the group and reaps the process if it is still there.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The size the log had before this process wrote to it: its own output starts there.
  int64_t log_offset() const { return log_offset_; }
  bool exited() const { return exit_.has_value(); }

  // Sends `sig` to every process of the group; a no-op once the process has been reaped.
  Status Signal(int sig);

  // Never blocks: nothing while the process runs; once it has exited, SIGKILLs whatever else is
  // left in its group (as a container's processes die with it), reaps it and returns how it
  // ended (again on every later call).
  std::optional<ProcessExit> Poll();

 private:
  ChildProcess(pid_t pid, int64_t log_offset) : pid_(pid), log_offset_(log_offset) {}

  pid_t pid_;
  int64_t log_offset_;
  std::optional<ProcessExit> exit_;
};

}  // namespace vf::podrunner
