#include "tests/e2e/pod_runner/process.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace vf::podrunner {
namespace {

std::string Errno(int err) { return std::strerror(err); }

// Why an executable candidate cannot be used: 0 when it can.
int CheckExecutable(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return errno;
  if (!S_ISREG(st.st_mode)) return EACCES;  // a directory, as execve would say
  if (access(path.c_str(), X_OK) != 0) return errno;
  return 0;
}

std::string Quote(std::string_view command) { return "exec: \"" + std::string(command) + "\""; }

// What the child reports through the pipe when it fails before its program runs.
struct ChildFailure {
  int stage;
  int err;
  int index;  // kStageMount, kStageReadOnly: which mount
};
enum Stage : int {
  kStageChdir = 1,
  kStageStdio,
  kStageExec,
  kStageNetns,
  kStageMountNamespace,
  kStageMount,
  kStageReadOnly
};

// The pod's namespaces as the child gets them: all prepared before fork. Not thread-safe.
struct ChildNamespaces {
  int netns_fd = -1;  // joined when >= 0
  bool mount_namespace = false;
  const BindMount* mounts = nullptr;
  size_t mount_count = 0;
};

void CloseQuietly(int fd) {
  if (fd >= 0) close(fd);
}

// Everything after fork() in the child: async-signal-safe calls only (the parent has other
// threads, whose locks the child inherits held), then execve.
[[noreturn]] void RunChild(pid_t parent, const char* exe, char* const* argv, char* const* envp,
                           const char* working_dir, int log_fd, int null_fd, int report_fd,
                           const ChildNamespaces& ns) {
  auto fail = [&](int stage, int index = 0) {
    const ChildFailure failure{stage, errno, index};
    ssize_t ignored = write(report_fd, &failure, sizeof(failure));
    (void)ignored;
    _exit(127);
  };
  // The runner blocks SIGTERM/SIGINT for its signal thread and ignores SIGPIPE; a program
  // starts with neither.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);
  }
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the runner died before prctl took effect
  if (ns.netns_fd >= 0 && setns(ns.netns_fd, CLONE_NEWNET) != 0) fail(kStageNetns);
  if (ns.mount_namespace) {
    if (unshare(CLONE_NEWNS) != 0) fail(kStageMountNamespace);
    if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) != 0) fail(kStageMountNamespace);
    for (size_t i = 0; i < ns.mount_count; ++i) {
      const BindMount& m = ns.mounts[i];
      const int index = static_cast<int>(i);
      if (mount(m.source.c_str(), m.target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
        fail(kStageMount, index);
      }
      if (m.read_only && mount(nullptr, m.target.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY,
                               nullptr) != 0) {
        fail(kStageReadOnly, index);
      }
    }
  }
  if (chdir(working_dir) != 0) fail(kStageChdir);
  if (dup2(null_fd, STDIN_FILENO) < 0 || dup2(log_fd, STDOUT_FILENO) < 0 ||
      dup2(log_fd, STDERR_FILENO) < 0) {
    fail(kStageStdio);
  }
  for (int fd = 0; fd <= 2; ++fd) fcntl(fd, F_SETFD, 0);
  // No descriptor of the runner (API connections, other pods' logs) leaks into the program; the
  // report pipe closes on a successful exec, which is how the parent learns of it.
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {  // kernels before 5.11
    for (int fd = 3; fd < 4096; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  execve(exe, argv, envp);
  fail(kStageExec);
  _exit(127);  // not reached
}

}  // namespace

Result<std::string> FindExecutable(std::string_view command, std::string_view path,
                                   std::string_view working_dir) {
  if (command.empty()) return InvalidArgument("exec: the command is empty");
  if (command.find('/') != std::string_view::npos) {
    std::string full(command);
    if (command.front() != '/') full = std::string(working_dir) + "/" + full;
    const int err = CheckExecutable(full);
    if (err == 0) return full;
    if (err == ENOENT || err == ENOTDIR) {
      return NotFound(Quote(command) + ": stat " + full + ": no such file or directory");
    }
    return FailedPrecondition(Quote(command) + ": " + Errno(err));
  }
  bool denied = false;
  std::string_view rest = path;
  while (true) {
    const size_t colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (dir.empty()) dir = std::string(working_dir);
    const std::string candidate = dir + "/" + std::string(command);
    const int err = CheckExecutable(candidate);
    if (err == 0) return candidate;
    if (err == EACCES) denied = true;
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  if (denied) return FailedPrecondition(Quote(command) + ": permission denied");
  return NotFound(Quote(command) +
                  ": executable file not found in $PATH (PATH=" + std::string(path) + ")");
}

std::string ReadLogTail(const std::string& path, int64_t from, size_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st {};
  std::string out;
  if (fstat(fd, &st) == 0 && st.st_size > from) {
    const int64_t start = std::max<int64_t>(from, st.st_size - static_cast<int64_t>(max_bytes));
    out.resize(static_cast<size_t>(st.st_size - start));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t n = pread(fd, out.data() + got, out.size() - got,
                              static_cast<off_t>(start + static_cast<int64_t>(got)));
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    out.resize(got);
  }
  close(fd);
  return out;
}

Result<std::unique_ptr<ChildProcess>> ChildProcess::Start(const LaunchSpec& spec) {
  if (spec.argv.empty()) return InvalidArgument("the container has no command");
  struct stat st {};
  if (stat(spec.working_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return FailedPrecondition("working directory " + spec.working_dir + " of " +
                              Quote(spec.argv[0]) + " does not exist");
  }
  VF_ASSIGN_OR_RETURN(const std::string exe,
                      FindExecutable(spec.argv[0], spec.path, spec.working_dir));

  const int log_fd = open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return FailedPrecondition("cannot open log " + spec.log_path + ": " + Errno(errno));
  }
  const off_t log_offset = lseek(log_fd, 0, SEEK_END);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int report[2] = {-1, -1};
  if (null_fd < 0 || pipe2(report, O_CLOEXEC) != 0) {
    const int err = errno;
    CloseQuietly(log_fd);
    CloseQuietly(null_fd);
    return Internal("cannot set up " + Quote(spec.argv[0]) + ": " + Errno(err));
  }
  ChildNamespaces ns;
  ns.mount_namespace = spec.mount_namespace;
  ns.mounts = spec.mounts.data();
  ns.mount_count = spec.mount_namespace ? spec.mounts.size() : 0;
  if (!spec.netns_path.empty()) {
    ns.netns_fd = open(spec.netns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns.netns_fd < 0) {
      const int err = errno;
      for (int fd : {log_fd, null_fd, report[0], report[1]}) CloseQuietly(fd);
      return FailedPrecondition("network namespace " + spec.netns_path + " for " +
                                Quote(spec.argv[0]) + ": " + Errno(err));
    }
  }

  // Everything the child needs is allocated now: after fork it may not allocate.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid == 0) {
    RunChild(parent, exe.c_str(), argv.data(), envp.data(), spec.working_dir.c_str(), log_fd,
             null_fd, report[1], ns);
  }
  const int fork_errno = errno;
  close(report[1]);
  close(log_fd);
  close(null_fd);
  CloseQuietly(ns.netns_fd);
  if (pid < 0) {
    close(report[0]);
    return Unavailable("fork for " + Quote(spec.argv[0]) + ": " + Errno(fork_errno));
  }
  // Also here, so that the group exists for killpg before the child gets to it.
  setpgid(pid, pid);

  ChildFailure failure{};
  ssize_t n;
  do {
    n = read(report[0], &failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n == static_cast<ssize_t>(sizeof(failure))) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    switch (failure.stage) {
      case kStageChdir:
        return FailedPrecondition("chdir to " + spec.working_dir + " for " + Quote(spec.argv[0]) +
                                  ": " + Errno(failure.err));
      case kStageStdio:
        return Internal("redirecting the output of " + Quote(spec.argv[0]) + ": " +
                        Errno(failure.err));
      case kStageNetns:
        return FailedPrecondition("joining network namespace " + spec.netns_path + " for " +
                                  Quote(spec.argv[0]) + ": " + Errno(failure.err));
      case kStageMountNamespace:
        return FailedPrecondition("a mount namespace for " + Quote(spec.argv[0]) + ": " +
                                  Errno(failure.err));
      case kStageMount:
      case kStageReadOnly: {
        const BindMount& m = spec.mounts.at(static_cast<size_t>(failure.index));
        return FailedPrecondition(
            std::string(failure.stage == kStageMount ? "bind mount of " : "read-only remount of ") +
            m.source + " at " + m.target + " for " + Quote(spec.argv[0]) + ": " +
            Errno(failure.err));
      }
      default:
        return FailedPrecondition(Quote(spec.argv[0]) + ": exec " + exe + ": " +
                                  Errno(failure.err));
    }
  }
  return std::unique_ptr<ChildProcess>(new ChildProcess(pid, static_cast<int64_t>(log_offset)));
}

ChildProcess::~ChildProcess() {
  if (exit_.has_value()) return;
  killpg(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

Status ChildProcess::Signal(int sig) {
  if (exit_.has_value()) return Status::Ok();
  if (killpg(pid_, sig) != 0 && errno != ESRCH) {
    return Internal("kill process group " + std::to_string(pid_) + " with signal " +
                    std::to_string(sig) + ": " + Errno(errno));
  }
  return Status::Ok();
}

std::optional<ProcessExit> ChildProcess::Poll() {
  if (exit_.has_value()) return exit_;
  siginfo_t info{};
  // WNOWAIT leaves the zombie in place: while it exists, its process group id cannot be reused,
  // so the killpg below reaches only what is left of this container.
  if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    if (errno != ECHILD) return std::nullopt;
    exit_ = ProcessExit{255, 0};  // someone else reaped it: the outcome is unknowable
    return exit_;
  }
  if (info.si_pid == 0) return std::nullopt;
  killpg(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  ProcessExit exit;
  if (WIFSIGNALED(status)) {
    exit.signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    exit.exit_code = WEXITSTATUS(status);
  }
  exit_ = exit;
  return exit_;
}

}  // namespace vf::podrunner
