#include "operator/local/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "operator/coordinator/coordinator.h"
#include "operator/coordinator/server.h"
#include "operator/local/capacity.h"
#include "operator/local/decisions.h"
#include "operator/local/log_lines.h"
#include "operator/policy/membership.h"
#include "operator/policy/policy.h"
#include "runtime/device/cuda/plugin.h"
#include "runtime/executor.h"
#include "runtime/job/spec.h"
#include "runtime/job/worker_env.h"
#include "runtime/split.h"
#include "runtime/state/training_state.h"

extern char** environ;

namespace vf {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
std::atomic<bool> g_stop{false};

constexpr int kExitJobFailed = 3;  // virtualflow-agent: the job cannot go on
// Seconds between two rebalances: each one pauses every member.
constexpr double kRebalanceInterval = 5.0;
// policy::kUnresponsiveSeconds as a steady-clock duration, for Coordinator::SweepSilent.
constexpr auto kSilentAfter = std::chrono::duration_cast<Clock::duration>(
    std::chrono::duration<double>(policy::kUnresponsiveSeconds));

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Removes the run directory when the run ends, whatever way it ends.
class TempDir {
 public:
  TempDir() = default;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  Status Create() {
    std::string tmpl = (fs::temp_directory_path() / "vf-run-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return Internal("cannot create a run directory under " + fs::temp_directory_path().string() +
                      ": " + std::strerror(errno));
    }
    path_ = tmpl;
    return Status::Ok();
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string LastLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::string last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

// Agents print "virtualflow-agent: <worker>: error: <message>"; keep the message.
std::string AgentMessage(const std::string& line) {
  const std::string marker = "error: ";
  const size_t at = line.find(marker);
  return at == std::string::npos ? line : line.substr(at + marker.size());
}

// How many workers in a row may fail while the job makes no progress before `vf run` gives up.
constexpr int kFailuresWithoutProgress = 5;

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

// Writes `content` and a newline to a new file `path`, readable by this user only from the
// moment it exists.
Status WritePrivateFile(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Internal("cannot create " + path + ": " + std::strerror(errno));
  const std::string text = content + "\n";
  const ssize_t n = ::write(fd, text.data(), text.size());
  const bool closed = ::close(fd) == 0;
  if (n != static_cast<ssize_t>(text.size()) || !closed) {
    return Internal("cannot write " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

std::string RandomToken() {
  std::random_device rd;
  std::ostringstream s;
  for (int i = 0; i < 4; ++i) s << std::hex << rd() << rd();
  return s.str();
}

std::string FormatNumber(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// The directory holding the virtualflow Python package built with this binary (build/bin/vf ->
// build/python), or empty when there is none (an installed vf, whose package is installed too).
std::string PythonPackageBeside() {
  std::error_code ec;
  const fs::path dir =
      fs::read_symlink("/proc/self/exe", ec).parent_path().parent_path() / "python";
  return fs::exists(dir / "virtualflow" / "__init__.py", ec) ? dir.string() : std::string();
}

std::string FormatDuration(double seconds) {
  const long long s = std::llround(seconds);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld", s / 60, s % 60);
  return buf;
}

// How many of a failed worker's last lines `vf run` shows.
constexpr size_t kFailureLines = 20;

// Shows on stdout the lines one worker's log file gains, each prefixed with the worker's name:
// how `vf run` shows the output of a user program's rank 0 as it comes. Reading the file the
// worker writes (rather than a pipe `vf run` would have to drain) means a busy or stopped
// `vf run` never blocks a worker's print(). Not thread-safe.
class LogFollower {
 public:
  LogFollower() = default;
  LogFollower(const LogFollower&) = delete;
  LogFollower& operator=(const LogFollower&) = delete;
  ~LogFollower() { Close(); }

  // Follows worker `name`'s log at `path` from its start, or from what it writes from now on.
  void Follow(const std::string& name, const std::string& path, bool from_start) {
    Stop();
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) return;
    if (!from_start) ::lseek(fd_, 0, SEEK_END);
    name_ = name;
  }
  // The worker followed, or empty.
  const std::string& name() const { return name_; }
  // Prints the complete lines written since the last call, up to 1 MiB of them (the control
  // loop must go on); false when there is more.
  bool Show() {
    if (fd_ < 0) return true;
    char buf[1 << 16];
    bool printed = false;
    bool drained = false;
    for (int i = 0; i < 16; ++i) {
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n <= 0) {
        drained = true;
        break;
      }
      for (const std::string& line : local::TakeLines(partial_, {buf, size_t(n)}, kMaxLine)) {
        Print(line);
        printed = true;
      }
    }
    if (printed) std::fflush(stdout);
    return drained;
  }
  // Prints the rest (up to 64 MiB: a worker still writing cannot hold it), an unfinished last
  // line too, and follows nobody.
  void Stop() {
    if (fd_ < 0) return;
    for (int i = 0; i < 64 && !Show(); ++i) {
    }
    if (!partial_.empty()) Print(partial_);
    std::fflush(stdout);
    Close();
  }

 private:
  static constexpr size_t kMaxLine = 1 << 16;
  void Print(const std::string& line) const {
    std::printf("[%s] %s\n", name_.c_str(), line.c_str());
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    name_.clear();
    partial_.clear();
  }
  std::string name_;
  std::string partial_;
  int fd_ = -1;
};

// A new directory for a run's logs under the temporary directory, named for the job and the
// local time: vf-logs-JOB-YYYYMMDD-HHMMSS-XXXXXX. Readable by this user only (mkdtemp).
Result<std::string> NewLogsDir(const std::string& job_name) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &local);
  std::string tmpl =
      (fs::temp_directory_path() / ("vf-logs-" + job_name + "-" + stamp + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) {
    return Internal("cannot create a logs directory under " + fs::temp_directory_path().string() +
                    ": " + std::strerror(errno));
  }
  return tmpl;
}

// The directory --logs names, created if missing, without the files of an earlier run into it
// (only the names `vf run` writes: a user's own files there stay).
Status PrepareLogsDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) {
    return InvalidArgument("--logs " + dir + ": cannot create the directory" +
                           (ec ? ": " + ec.message() : std::string()));
  }
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec) && local::IsRunLogName(entry.path().filename().string())) {
      fs::remove(entry.path(), ec);
    }
  }
  if (ec) return InvalidArgument("--logs " + dir + ": " + ec.message());
  return Status::Ok();
}

// One local worker process.
struct Worker {
  std::string name;
  int slot = 0;
  pid_t pid = -1;
  bool alive = true;
  int status = 0;
  bool in_plan = false;  // member of the current plan
  bool asked_to_leave = false;
  Clock::time_point leave_deadline{};
  std::string log_path;       // its standard output and error
  bool output_shown = false;  // its lines were on stdout when it exited
  std::string result_path;
  Clock::time_point started = Clock::now();
  // Smoothed seconds per virtual node under the current plan, from its progress reports.
  local::SpeedEstimate speed;
};

// Runs one job on local processes. Not thread-safe; RequestLocalJobStop is the only entry
// from other threads (a signal handler).
class LocalCluster {
 public:
  LocalCluster(const LocalRunOptions& o, JobSpec job, CapacitySchedule capacity, std::string agent,
               int64_t total_steps)
      : o_(o),
        job_(std::move(job)),
        capacity_(std::move(capacity)),
        agent_(std::move(agent)),
        python_package_(PythonPackageBeside()),
        total_steps_(total_steps) {}

  Result<LocalRunSummary> Run();

 private:
  Result<LocalRunSummary> Train();
  // The end of a run, whichever way: a failed worker's last lines, where the logs are.
  Result<LocalRunSummary> Finish(Result<LocalRunSummary> result);
  Status Start();
  Status CreateLogsDir();
  Status Spawn(int slot);
  void Reap(Status* job_failure);
  // One pass of the control loop: the policy's workers on the slots the schedule gives now, new
  // processes for missing ones, and the next plan when membership changes.
  Status Reconcile(const JobView& view);
  // How a worker is started: its command line and its whole environment.
  struct Launch {
    std::vector<std::string> argv;
    std::vector<std::string> env;
  };
  // Where a worker's own credential is: readable by this user only, as its Secret is in a pod.
  std::string CredentialPath(const std::string& worker) const {
    return (fs::path(run_.path()) / (worker + ".token")).string();
  }
  // The virtualflow-agent binary with flags (the built-in model), or the user's program of
  // spec.template with the job in VF_* variables.
  Launch AgentProgram(const Worker& w, int slot) const;
  Launch UserProgram(const Worker& w, int slot) const;
  // Starts workers on free slots until `desired` are usable or the slots are full.
  Status SpawnMissing(const JobView& view, int desired, int slots);
  local::ProcessView ViewOf(const Worker& w, const JobView& view) const;
  policy::MembershipInput MembershipInputOf(const JobView& view, int desired) const;
  // Publishes what the membership decision chose; members it leaves out are asked to leave.
  Status Adopt(const policy::MembershipDecision& decision, const std::string& reason);
  Status Publish(const std::vector<Worker*>& members,
                 const std::vector<std::vector<int>>& virtual_nodes, const std::string& reason);
  // Moves virtual nodes between the current members when their measured speeds differ enough.
  Status MaybeRebalance(const JobView& view);
  // The plan epoch a member finished the job under (-1: nobody has yet).
  int64_t FinishedEpoch() const;
  // After a member finished the job under plan `finished_epoch`: true once its peers are done
  // (or out of time), stopping workers admitted too late to train.
  bool WindDown(int64_t finished_epoch, Clock::time_point finished_at);
  void PrintProgress(const JobView& view);
  void NoteResizePauses(const JobView& view, bool final = false);
  // The job's length as the workers computed it from the data they loaded, once they report it.
  void NoteTotalSteps(const JobView& view);
  // Says on stderr when a periodic checkpoint could not be written (training goes on), and
  // when one is written again, from the newest checkpoint outcome the workers reported.
  void NoteCheckpoints(const JobView& view);
  void StopAll();
  int64_t CurrentStep(const JobView& view) const;
  Result<LocalRunSummary> Collect();

  const LocalRunOptions& o_;
  JobSpec job_;
  CapacitySchedule capacity_;
  std::string agent_;
  // build/python (the virtualflow package built with this binary) when it exists; else empty.
  std::string python_package_;
  std::string job_id_;
  std::string secret_;  // the job's: each worker's credential is derived from it
  TempDir run_;
  Coordinator coordinator_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<policy::Policy> policy_;
  std::vector<std::unique_ptr<Worker>> workers_;  // every process started, in start order
  std::string logs_dir_;
  LogFollower follower_;
  const Worker* failed_ = nullptr;  // the worker whose failure ended the job
  int next_worker_ = 0;
  int64_t plan_epoch_ = 0;
  int plan_size_ = 0;
  int64_t handled_failure_epoch_ = 0;
  double last_resize_time_ = -1e30;
  Clock::time_point start_ = Clock::now();
  Clock::time_point last_progress_ = Clock::now();
  Clock::time_point last_step_change_ = Clock::now();
  int64_t last_step_ = -1;
  int64_t last_step_epoch_ = 0;  // the plan under which last_step_ was reached
  // Workers that failed (exited non-zero or were killed) since the job last made progress: a
  // worker that cannot start at all (a broken device, a missing library) fails every
  // replacement the same way, and the run ends saying why instead of replacing them until the
  // stall limit.
  int failures_without_progress_ = 0;
  int64_t last_printed_step_ = -1;
  int64_t total_steps_ = 0;
  int64_t checkpoint_step_seen_ = 0;  // the newest checkpoint outcome already said
  bool checkpoint_failing_ = false;
  std::vector<ResizeEvent> resizes_;
  std::map<int64_t, size_t> pending_pause_;  // plan epoch -> index in resizes_
  std::map<int64_t, Clock::time_point> published_at_;
  std::map<int64_t, std::vector<std::string>> plan_members_;  // epoch -> worker names
  int recoveries_ = 0;
  int rebalances_ = 0;
  std::vector<int> plan_counts_;  // virtual nodes per rank in the current plan
  Clock::time_point last_rebalance_ = Clock::now();
  bool done_ = false;
  bool logs_dir_default_ = false;  // made by this run (no --logs)
  // A user program's output is shown, its rank 0's; the built-in agent's lines are kept only.
  bool show_output_ = false;
};

Status LocalCluster::CreateLogsDir() {
  if (o_.logs_dir.empty()) {
    VF_ASSIGN_OR_RETURN(logs_dir_, NewLogsDir(job_.name));
    logs_dir_default_ = true;
  } else {
    VF_RETURN_IF_ERROR(PrepareLogsDir(o_.logs_dir));
    logs_dir_ = fs::absolute(o_.logs_dir).lexically_normal().string();
  }
  return Status::Ok();
}

Status LocalCluster::Start() {
  VF_RETURN_IF_ERROR(run_.Create());
  VF_RETURN_IF_ERROR(CreateLogsDir());
  show_output_ = !o_.quiet && job_.worker_template.user_program();
  job_id_ = job_.namespace_name + "/" + job_.name;
  secret_ = RandomToken();
  VF_RETURN_IF_ERROR(coordinator_.AddJob(job_id_, secret_, job_.Fingerprint(),
                                         std::string("virtualflow ") + VF_VERSION));
  // Every live worker plus a replacement for each, as the operator allows (reconciler.cc).
  const size_t most = static_cast<size_t>(std::max(job_.replicas_max, capacity_.Max()));
  VF_RETURN_IF_ERROR(
      coordinator_.SetWorkerLimit(job_id_, std::min(2 * most, Coordinator::kMaxWorkersPerJob)));
  VF_ASSIGN_OR_RETURN(server_, CoordinatorServer::Start(coordinator_, "127.0.0.1", 0));
  policy::PolicyOptions popts;
  popts.cooldown_seconds = job_.elasticity.cooldown_seconds;
  VF_ASSIGN_OR_RETURN(policy_, policy::CreatePolicy(job_.elasticity.policy, popts));
  // The job's secret, from which a tool (or a test) mints the credential of a worker of its own.
  const std::string secret_file = (fs::path(run_.path()) / "secret").string();
  VF_RETURN_IF_ERROR(WritePrivateFile(secret_file, secret_));
  if (!o_.run_info_path.empty()) {
    nlohmann::json info = {
        {"coordinator", server_->url()}, {"job", job_id_}, {"secret_file", secret_file}};
    std::ofstream out(o_.run_info_path);
    out << info.dump() << "\n";
  }
  // Workers die with this process rather than linger if it is killed.
  setenv(worker_env::kExitWithParent.name, std::to_string(getpid()).c_str(), 1);
  // Local workers share this machine, and NCCL cannot put two ranks of one communicator on the
  // same GPU: they all train on GPU 0 when there is one, reducing with Gloo through host copies
  // (cuda-shared), and on the CPU otherwise, unless the caller set VF_DEVICE (cpu).
  setenv(worker_env::kDevice.name, "cuda-shared", 0);
  // A PyTorch worker that asks for NCCL (VF_TORCH_COLLECTIVES=nccl) loads the CUDA plugin built
  // with this binary: the plugin's loader looks beside the executable, which is the
  // interpreter there.
  std::error_code ec;
  const fs::path plugin = fs::read_symlink("/proc/self/exe", ec).parent_path() / kCudaPluginFile;
  if (!ec && fs::exists(plugin, ec)) setenv(worker_env::kCudaPlugin.name, plugin.c_str(), 0);
  return Status::Ok();
}

Status LocalCluster::Spawn(int slot) {
  auto w = std::make_unique<Worker>();
  w->name = "worker-" + std::to_string(next_worker_++);
  w->slot = slot;
  const fs::path dir = run_.path();
  w->log_path = (fs::path(logs_dir_) / local::WorkerLogName(w->name)).string();
  w->result_path = (dir / (w->name + ".json")).string();
  // Created here, so that it can be followed before the worker writes; a worker of an earlier
  // run of the same name left nothing in it.
  const int log_fd = ::open(w->log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return Internal("cannot create " + w->log_path + ": " + std::strerror(errno));
  ::close(log_fd);
  // Each worker gets its own credential, so that it can act only as itself.
  VF_ASSIGN_OR_RETURN(const std::string credential, WorkerCredential(secret_, w->name));
  VF_RETURN_IF_ERROR(WritePrivateFile(CredentialPath(w->name), credential));
  const Launch launch =
      job_.worker_template.user_program() ? UserProgram(*w, slot) : AgentProgram(*w, slot);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, w->log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, w->log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  // Nothing else of this process: Asio's sockets are not close-on-exec, and a worker holding the
  // coordinator's listening socket would keep its port accepting connections that nobody
  // answers once vf run has gone, so the workers would hang instead of being refused.
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  std::vector<char*> argv;
  for (const auto& a : launch.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : launch.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // A user's program is found on PATH, as a Pod's command is.
  const int rc = posix_spawnp(&w->pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Internal("cannot start " + launch.argv[0] + ": " + std::strerror(rc));
  // Before the first plan names a rank 0, the first worker's output is shown from its start
  // (a script's own lines before it joins, or why it could not).
  if (show_output_ && plan_size_ == 0 && follower_.name().empty()) {
    follower_.Follow(w->name, w->log_path, /*from_start=*/true);
  }
  workers_.push_back(std::move(w));
  return Status::Ok();
}

// This process's environment, which every worker inherits.
std::vector<std::string> InheritedEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

LocalCluster::Launch LocalCluster::AgentProgram(const Worker& w, int slot) const {
  const fs::path dir = run_.path();
  std::ostringstream timeout;
  timeout << o_.timeout;
  Launch l;
  l.env = InheritedEnvironment();
  l.argv = {agent_,
            "--job",
            o_.job_path,
            "--coordinator",
            server_->url(),
            "--job-id",
            job_id_,
            "--worker",
            w.name,
            "--token-file",
            CredentialPath(w.name),
            "--result",
            w.result_path,
            "--timeout",
            timeout.str(),
            "--report-interval",
            "0.5"};
  if (o_.steps_override > 0) {
    l.argv.push_back("--steps");
    l.argv.push_back(std::to_string(o_.steps_override));
  }
  if (!o_.vnode_delays_ms.empty()) {
    std::ostringstream f;
    f << o_.vnode_delays_ms[static_cast<size_t>(slot) % o_.vnode_delays_ms.size()];
    l.argv.push_back("--vnode-delay-ms");
    l.argv.push_back(f.str());
  }
  if (!o_.slowdowns.empty()) {
    std::ostringstream f;
    f << o_.slowdowns[static_cast<size_t>(slot) % o_.slowdowns.size()];
    l.argv.push_back("--slowdown");
    l.argv.push_back(f.str());
  }
  return l;
}

LocalCluster::Launch LocalCluster::UserProgram(const Worker& w, int slot) const {
  const fs::path dir = run_.path();
  Launch l;
  l.argv = job_.worker_template.command;
  l.argv.insert(l.argv.end(), job_.worker_template.args.begin(), job_.worker_template.args.end());
  // The job reaches the program through its environment, as on Kubernetes (virtualflow.torch's
  // init() reads it). The caller's own variables of these names (and a stale VF_JOB_SPEC or
  // VF_JOB_TOKEN) do not reach it; others (VF_THREADS, VF_CHECK_EVERY, ...) do.
  std::map<std::string, std::string> vf = {
      {worker_env::kJob.name, fs::absolute(o_.job_path).string()},
      {worker_env::kCoordinator.name, server_->url()},
      {worker_env::kJobId.name, job_id_},
      {worker_env::kWorker.name, w.name},
      {worker_env::kJobTokenFile.name, CredentialPath(w.name)},
      {worker_env::kResult.name, w.result_path},
      {worker_env::kTimeout.name, FormatNumber(o_.timeout)},
      {worker_env::kReportInterval.name, "0.5"}};
  if (o_.steps_override > 0) vf[worker_env::kSteps.name] = std::to_string(o_.steps_override);
  if (!o_.slowdowns.empty()) {
    vf[worker_env::kSlowdown.name] =
        FormatNumber(o_.slowdowns[static_cast<size_t>(slot) % o_.slowdowns.size()]);
  }
  if (!o_.vnode_delays_ms.empty()) {
    vf[worker_env::kVnodeDelayMs.name] =
        FormatNumber(o_.vnode_delays_ms[static_cast<size_t>(slot) % o_.vnode_delays_ms.size()]);
  }
  std::string python_path = python_package_;
  for (const std::string& e : InheritedEnvironment()) {
    const std::string name = e.substr(0, e.find('='));
    if (name == "PYTHONPATH" && !python_package_.empty()) {
      python_path += ":" + e.substr(name.size() + 1);
    } else if (vf.count(name) == 0 && name != worker_env::kJobToken.name &&
               name != worker_env::kJobSpec.name) {
      l.env.push_back(e);
    }
  }
  // The virtualflow package built next to this vf binary, ahead of any other.
  if (!python_package_.empty()) l.env.push_back("PYTHONPATH=" + python_path);
  // Python buffers a print() to a file by the 8 KiB; unbuffered, the log holds each line when
  // it is printed, and `vf run` shows rank 0's as they come. The caller's own setting wins.
  if (std::getenv("PYTHONUNBUFFERED") == nullptr) l.env.emplace_back("PYTHONUNBUFFERED=1");
  for (const auto& [name, value] : vf) l.env.push_back(name + "=" + value);
  return l;
}

void LocalCluster::Reap(Status* job_failure) {
  for (auto& w : workers_) {
    if (!w->alive) continue;
    const pid_t r = waitpid(w->pid, &w->status, WNOHANG);
    if (r != w->pid) continue;
    w->alive = false;
    (void)coordinator_.ForgetWorker(job_id_, w->name);
    if (follower_.name() == w->name) {
      follower_.Stop();  // all it wrote, a traceback included
      w->output_shown = true;
    }
    const bool clean = WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0;
    if (clean) continue;  // finished, or left after acknowledging a plan without it
    std::string msg = AgentMessage(LastLine(w->log_path));
    if (WIFEXITED(w->status) && WEXITSTATUS(w->status) == kExitJobFailed && job_failure->ok()) {
      failed_ = w.get();
      *job_failure = Status(StatusCode::kFailedPrecondition,
                            msg.empty() ? w->name + " " + DescribeExit(w->status) : msg);
      continue;
    }
    if (++failures_without_progress_ >= kFailuresWithoutProgress && job_failure->ok()) {
      failed_ = w.get();
      *job_failure = FailedPrecondition(
          std::to_string(failures_without_progress_) +
          " workers in a row failed while the job made no progress; the last, " + w->name + ", " +
          DescribeExit(w->status) + (msg.empty() ? "" : ": " + msg));
      continue;
    }
    if (!o_.quiet) {
      std::printf("%s %s%s\n", w->name.c_str(), DescribeExit(w->status).c_str(),
                  w->in_plan ? "; recovering without it" : "");
      std::fflush(stdout);
    }
  }
}

int64_t LocalCluster::CurrentStep(const JobView& view) const {
  int64_t step = 0;
  for (const auto& [name, info] : view.workers) step = std::max(step, info.last_report.step);
  return step;
}

Status LocalCluster::Publish(const std::vector<Worker*>& members,
                             const std::vector<std::vector<int>>& virtual_nodes,
                             const std::string& reason) {
  std::vector<Member> plan_members;
  plan_counts_.clear();
  for (size_t i = 0; i < members.size(); ++i) {
    plan_members.push_back({members[i]->name, static_cast<int>(i), virtual_nodes[i]});
    plan_counts_.push_back(static_cast<int>(virtual_nodes[i].size()));
  }
  VF_ASSIGN_OR_RETURN(Plan plan, coordinator_.PublishPlan(job_id_, plan_members));
  for (auto& w : workers_) w->in_plan = false;
  for (Worker* w : members) w->in_plan = true;
  const int from = plan_size_;
  plan_epoch_ = plan.epoch;
  plan_size_ = static_cast<int>(members.size());
  published_at_[plan.epoch] = Clock::now();
  for (Worker* w : members) plan_members_[plan.epoch].push_back(w->name);
  {
    std::ofstream plans(fs::path(logs_dir_) / local::kPlansLogName, std::ios::app);
    plans << "plan " << plan.epoch << " at step " << (last_step_ < 0 ? 0 : last_step_) << " ("
          << (reason.empty() ? "start" : reason) << "):";
    for (size_t i = 0; i < members.size(); ++i) {
      plans << (i ? "," : "") << " rank " << i << " " << members[i]->name << " ("
            << virtual_nodes[i].size() << " virtual nodes)";
    }
    plans << "\n";
  }
  // The plan's rank 0 is the worker shown from now on (what it prints as rank 0).
  if (show_output_ && !members.empty() && follower_.name() != members[0]->name) {
    follower_.Follow(members[0]->name, members[0]->log_path, /*from_start=*/false);
  }
  if (from != 0 && from != plan_size_) {
    ResizeEvent e;
    e.step = last_step_ < 0 ? 0 : last_step_;
    e.from = from;
    e.to = plan_size_;
    e.reason = reason;
    resizes_.push_back(e);
    pending_pause_[plan.epoch] = resizes_.size() - 1;
    last_resize_time_ = Since(start_);
  }
  return Status::Ok();
}
// A resize's pause is measured by the members that trained before and after it; the line is
// printed once they have reported it (or after a while, with what is known).
void LocalCluster::NoteResizePauses(const JobView& view, bool final) {
  for (auto it = pending_pause_.begin(); it != pending_pause_.end();) {
    const int64_t epoch = it->first;
    ResizeEvent& e = resizes_[it->second];
    double pause = 0.0;
    bool reported = false;
    bool superseded = false;
    for (const auto& [name, info] : view.workers) {
      if (info.last_report.epoch == epoch && info.last_report.pause_seconds > 0) {
        pause = std::max(pause, info.last_report.pause_seconds);
        reported = true;
      }
      superseded = superseded || info.last_report.epoch > epoch;
    }
    // Reports carry the latest epoch only: once members report a newer one, this resize's
    // pause is whatever was seen (a plan replaced before anyone trained under it has none).
    if (!reported && !superseded && !final) {
      ++it;
      continue;
    }
    e.pause_seconds = pause;
    if (!o_.quiet) {
      char pause_text[32] = "not measured";
      if (reported) std::snprintf(pause_text, sizeof(pause_text), "%.2f s", e.pause_seconds);
      std::printf("resize at step %lld: %d -> %d workers, pause %s (%s)\n",
                  static_cast<long long>(e.step), e.from, e.to, pause_text, e.reason.c_str());
      std::fflush(stdout);
    }
    it = pending_pause_.erase(it);
  }
}

void LocalCluster::NoteCheckpoints(const JobView& view) {
  const Report* newest = nullptr;
  for (const auto& [name, info] : view.workers) {
    if (newest == nullptr || info.last_report.checkpoint_step > newest->checkpoint_step) {
      newest = &info.last_report;
    }
  }
  if (newest == nullptr || newest->checkpoint_step <= checkpoint_step_seen_) return;
  checkpoint_step_seen_ = newest->checkpoint_step;
  const long long step = static_cast<long long>(newest->checkpoint_step);
  if (!newest->checkpoint_error.empty()) {
    std::fprintf(stderr,
                 "vf: warning: checkpoint at step %lld not written; training goes on and the "
                 "next checkpoint tries again: %s\n",
                 step, newest->checkpoint_error.c_str());
    checkpoint_failing_ = true;
  } else if (checkpoint_failing_) {
    std::fprintf(stderr, "vf: checkpoint written again at step %lld\n", step);
    checkpoint_failing_ = false;
  }
}

void LocalCluster::NoteTotalSteps(const JobView& view) {
  for (const auto& [name, info] : view.workers) {
    if (info.last_report.total_steps > 0) total_steps_ = info.last_report.total_steps;
  }
}

Status LocalCluster::MaybeRebalance(const JobView& view) {
  for (auto& w : workers_) {
    auto it = view.workers.find(w->name);
    if (it == view.workers.end()) continue;
    const Report& r = it->second.last_report;
    local::FoldSpeed(r.epoch, r.step, r.seconds_per_virtual_node, w->speed);
  }
  if (o_.assignment != "proportional" || plan_size_ < 2 ||
      Since(last_rebalance_) < kRebalanceInterval) {
    return Status::Ok();
  }
  const Plan& plan = view.plan;
  if (plan.epoch != plan_epoch_ || static_cast<int>(plan.members.size()) != plan_size_) {
    return Status::Ok();
  }
  // Speeds measured under the current plan only: a worker's time per virtual node does not
  // depend on how many it holds, but a report from before a switch may predate a change.
  std::vector<double> t;
  std::vector<Worker*> members;
  for (const Member& m : plan.members) {
    for (auto& w : workers_) {
      if (w->name != m.worker) continue;
      if (!local::Settled(w->speed, plan_epoch_)) return Status::Ok();
      members.push_back(w.get());
      t.push_back(w->speed.seconds_per_virtual_node);
    }
  }
  if (members.size() != plan.members.size()) return Status::Ok();
  const std::optional<local::Rebalance> r =
      local::ProposeRebalance(job_.virtual_nodes, plan_counts_, t);
  if (!r) return Status::Ok();
  std::string from;
  std::string to;
  for (size_t i = 0; i < r->counts.size(); ++i) {
    from += (i ? "," : "") + std::to_string(plan_counts_[i]);
    to += (i ? "," : "") + std::to_string(r->counts[i]);
  }
  if (!o_.quiet) {
    std::printf("rebalance at step %lld: virtual nodes %s -> %s (predicted step %.1f -> %.1f ms)\n",
                static_cast<long long>(last_step_), from.c_str(), to.c_str(),
                1e3 * r->step_seconds_before, 1e3 * r->step_seconds_after);
    std::fflush(stdout);
  }
  ++rebalances_;
  last_rebalance_ = Clock::now();
  return Publish(members, ContiguousVirtualNodes(r->counts), "rebalance");
}
void LocalCluster::PrintProgress(const JobView& view) {
  if (o_.quiet || o_.progress_interval <= 0 || Since(last_progress_) < o_.progress_interval) {
    return;
  }
  // The newest step a worker trained: the report a worker sends on joining a plan has no loss
  // and no speed to show.
  const Report* best = nullptr;
  for (const auto& [name, info] : view.workers) {
    const Report& r = info.last_report;
    if (!std::isfinite(r.loss) || r.samples_per_second <= 0) continue;
    if (best == nullptr || r.step > best->step) best = &r;
  }
  if (best == nullptr || best->step <= 0 || best->step == last_printed_step_) return;
  last_progress_ = Clock::now();
  last_printed_step_ = best->step;
  const double rate = best->samples_per_second;
  const double remaining =
      static_cast<double>(total_steps_ - best->step) * static_cast<double>(job_.global_batch_size);
  std::printf("step %6lld/%lld  loss %.4f  %2d workers  %7.0f samples/s  ETA %s\n",
              static_cast<long long>(best->step), static_cast<long long>(total_steps_), best->loss,
              plan_size_, rate, rate > 0 ? FormatDuration(remaining / rate).c_str() : "-");
  std::fflush(stdout);
}

local::ProcessView LocalCluster::ViewOf(const Worker& w, const JobView& view) const {
  local::ProcessView p;
  p.name = w.name;
  p.alive = w.alive;
  p.exited_cleanly = !w.alive && WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0;
  p.asked_to_leave = w.asked_to_leave;
  p.age_seconds = Since(w.started);
  auto it = view.workers.find(w.name);
  if (it != view.workers.end()) {
    p.registered = true;
    p.ready = it->second.ready;
    p.leave_requested = it->second.leave_requested;
    p.responsive = !it->second.silent;
  }
  return p;
}

Status LocalCluster::SpawnMissing(const JobView& view, int desired, int slots) {
  std::vector<int> taken;
  int usable = 0;
  for (const auto& w : workers_) {
    if (!w->alive) continue;
    taken.push_back(w->slot);
    usable += local::Usable(ViewOf(*w, view)) ? 1 : 0;
  }
  for (int slot :
       local::SlotsToFill(taken, static_cast<int>(taken.size()), usable, desired, slots)) {
    VF_RETURN_IF_ERROR(Spawn(slot));
  }
  return Status::Ok();
}

policy::MembershipInput LocalCluster::MembershipInputOf(const JobView& view, int desired) const {
  policy::MembershipInput in;
  if (plan_size_ > 0) in.members = plan_members_.at(plan_epoch_);
  if (view.plan.epoch == plan_epoch_) {
    for (const Member& m : view.plan.members) in.held[m.worker] = m.virtual_nodes;
  }
  in.desired = desired;
  in.min_workers = job_.replicas_min;
  in.virtual_nodes = job_.virtual_nodes;
  std::vector<int64_t> failure_epochs;
  for (const auto& [name, info] : view.workers) failure_epochs.push_back(info.failure_epoch);
  in.failure_reported = local::FailureReported(failure_epochs, plan_epoch_, handled_failure_epoch_);
  for (const auto& w : workers_) in.workers.push_back(local::WorkerStateOf(ViewOf(*w, view)));
  return in;
}

Status LocalCluster::Adopt(const policy::MembershipDecision& decision, const std::string& reason) {
  if (decision.kind == "failure") {
    ++recoveries_;
    handled_failure_epoch_ = plan_epoch_ + 1;
  }
  std::vector<Worker*> members;
  std::vector<std::vector<int>> virtual_nodes;
  for (const policy::PlannedMember& m : decision.members) {
    for (auto& w : workers_) {
      if (w->name == m.worker) members.push_back(w.get());
    }
    virtual_nodes.push_back(m.virtual_nodes);
  }
  // Members not in the new plan acknowledge it and exit; give them a deadline.
  for (auto& w : workers_) {
    const bool kept = std::find(members.begin(), members.end(), w.get()) != members.end();
    if (w->in_plan && w->alive && !kept) {
      w->asked_to_leave = true;
      w->leave_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(o_.timeout));
    }
  }
  return Publish(members, virtual_nodes, reason);
}

Status LocalCluster::Reconcile(const JobView& view) {
  const int64_t step = CurrentStep(view);
  if (step != last_step_) {
    last_step_ = step;
    last_step_change_ = Clock::now();
    last_step_epoch_ = plan_epoch_;
    failures_without_progress_ = 0;
  }
  const int slots = capacity_.At(step, Since(start_));
  // Workers leave when asked (SIGTERM) or die; everything else is the policy's call.
  int members = 0;
  for (const auto& w : workers_) {
    members += w->in_plan && local::Usable(ViewOf(*w, view)) ? 1 : 0;
  }
  VF_ASSIGN_OR_RETURN(const local::Desired desired,
                      local::DesiredWorkers(*policy_, job_, plan_size_ > 0 ? members : 0, slots,
                                            last_resize_time_, Since(start_)));
  VF_RETURN_IF_ERROR(SpawnMissing(view, desired.workers, slots));
  const policy::MembershipDecision decision =
      policy::DecideMembership(MembershipInputOf(view, desired.workers));
  if (!decision.publish) return decision.held ? Status::Ok() : MaybeRebalance(view);
  return Adopt(decision, local::PlanReason(decision.kind, desired.reason, slots, decision.reason));
}
void LocalCluster::StopAll() {
  for (auto& w : workers_) {
    if (w->alive) kill(w->pid, SIGTERM);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  for (auto& w : workers_) {
    while (w->alive) {
      const pid_t r = waitpid(w->pid, &w->status, WNOHANG);
      if (r == w->pid || r < 0) {
        w->alive = false;
        break;
      }
      if (Clock::now() > deadline) {
        kill(w->pid, SIGKILL);
        waitpid(w->pid, &w->status, 0);
        w->alive = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

Result<LocalRunSummary> LocalCluster::Collect() {
  LocalRunSummary s;
  s.virtual_nodes = job_.virtual_nodes;
  s.seconds = Since(start_);
  s.resizes = resizes_;
  s.recoveries = recoveries_;
  s.rebalances = rebalances_;
  bool have = false;
  for (auto& w : workers_) {
    const bool clean = !w->alive && WIFEXITED(w->status) && WEXITSTATUS(w->status) == 0;
    if (!clean || !fs::exists(w->result_path)) continue;
    std::ifstream in(w->result_path);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("weights_sha256")) {
      return Internal(w->name + " finished without a readable result");
    }
    ++s.workers;
    s.worker_results.push_back(j.dump());
    const std::string sha = j["weights_sha256"].get<std::string>();
    if (!have) {
      s.weights_sha256 = sha;
      have = true;
    } else if (sha != s.weights_sha256) {
      return Internal("workers ended with different weights (" + s.weights_sha256 + " and " +
                      w->name + " " + sha + ")");
    }
    // Rank 0 of the final plan evaluates (a user's program may evaluate nothing).
    if (j.value("rank", -1) == 0) {
      s.steps = j["steps"].get<int64_t>();
      s.final_loss = j["final_loss"].is_null() ? 0.0 : j["final_loss"].get<double>();
      if (j.contains("test_accuracy")) s.test_accuracy = j["test_accuracy"].get<double>();
      if (j.contains("test_loss")) s.test_loss = j["test_loss"].get<double>();
    }
  }
  if (!have) return Internal("no worker finished the job");
  s.samples_per_second =
      s.seconds > 0 ? static_cast<double>(s.steps * job_.global_batch_size) / s.seconds : 0.0;
  return s;
}

int64_t LocalCluster::FinishedEpoch() const {
  int64_t finished_epoch = -1;
  for (const auto& w : workers_) {
    if (w->alive || !WIFEXITED(w->status) || WEXITSTATUS(w->status) != 0) continue;
    std::ifstream in(w->result_path);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.contains("epoch")) {
      finished_epoch = std::max(finished_epoch, j["epoch"].get<int64_t>());
    }
  }
  return finished_epoch;
}

bool LocalCluster::WindDown(int64_t finished_epoch, Clock::time_point finished_at) {
  const auto& finishers = plan_members_[finished_epoch];
  bool waiting = false;
  for (auto& w : workers_) {
    if (!w->alive) continue;
    const bool peer = std::find(finishers.begin(), finishers.end(), w->name) != finishers.end();
    if (peer) {
      waiting = true;
    } else {
      kill(w->pid, SIGTERM);  // admitted too late to train; nothing to hand over
    }
  }
  if (waiting && Since(finished_at) <= o_.timeout) return false;
  // Resizes whose plan nobody trained under did not happen.
  for (auto it = pending_pause_.rbegin(); it != pending_pause_.rend(); ++it) {
    if (it->first > finished_epoch) {
      resizes_.erase(resizes_.begin() + static_cast<std::ptrdiff_t>(it->second));
    }
  }
  std::erase_if(pending_pause_, [&](const auto& p) { return p.first > finished_epoch; });
  return true;
}

Result<LocalRunSummary> LocalCluster::Run() { return Finish(Train()); }

Result<LocalRunSummary> LocalCluster::Finish(Result<LocalRunSummary> result) {
  follower_.Stop();
  if (logs_dir_.empty()) return result;
  if (logs_dir_default_ && workers_.empty()) {
    std::error_code ec;
    fs::remove_all(logs_dir_, ec);  // nothing ran: nothing to keep
    return result;
  }
  if (!result.ok() && failed_ != nullptr) {
    if (!o_.quiet && !failed_->output_shown) {
      std::ifstream in(failed_->log_path);
      std::stringstream text;
      text << in.rdbuf();
      const auto lines = local::LastLines(text.str(), kFailureLines);
      if (!lines.empty()) {
        std::printf("%s %s; its last lines:\n", failed_->name.c_str(),
                    DescribeExit(failed_->status).c_str());
        for (const std::string& line : lines) {
          std::printf("[%s] %s\n", failed_->name.c_str(), line.c_str());
        }
      }
    }
    result = Status(result.status().code(), result.status().message() + " (" + failed_->name +
                                                "'s output: " + failed_->log_path + ")");
  }
  if (!o_.quiet) {
    std::printf("worker logs: %s\n", logs_dir_.c_str());
    std::fflush(stdout);
  }
  if (result.ok()) result->logs_dir = logs_dir_;
  return result;
}

Result<LocalRunSummary> LocalCluster::Train() {
  VF_RETURN_IF_ERROR(Start());
  if (!o_.quiet) {
    std::printf("training %s: %d virtual nodes x %lld samples, %lld steps, slots %s\n",
                job_.name.c_str(), job_.virtual_nodes, static_cast<long long>(job_.micro_batch()),
                static_cast<long long>(total_steps_), capacity_.ToString().c_str());
    std::fflush(stdout);
  }
  uint64_t generation = 0;
  Clock::time_point finished_at{};
  const double stall_limit = std::max(3 * o_.timeout, 30.0);
  while (true) {
    if (g_stop.load()) {
      StopAll();
      return Unavailable("interrupted; workers stopped");
    }
    Status job_failure;
    Reap(&job_failure);
    if (!job_failure.ok()) {
      StopAll();
      return job_failure;
    }
    // A member stopped (SIGSTOP), hung or cut off is alive to waitpid; only its silence tells.
    coordinator_.SweepSilent(kSilentAfter);
    VF_ASSIGN_OR_RETURN(JobView view, coordinator_.GetJob(job_id_));
    generation = view.generation;
    NoteResizePauses(view);
    NoteTotalSteps(view);
    NoteCheckpoints(view);

    // The job is complete once a member has finished it: the other members are finishing the
    // same last step. A joiner admitted by a plan published during that step has nobody left
    // to train with, so after a short grace the rest are stopped.
    const int64_t finished_epoch = FinishedEpoch();
    if (finished_epoch >= 0) {
      if (finished_at == Clock::time_point{}) finished_at = Clock::now();
      if (WindDown(finished_epoch, finished_at)) break;
      coordinator_.WaitForChange(job_id_, generation, std::chrono::milliseconds(50));
      continue;
    }

    VF_RETURN_IF_ERROR(Reconcile(view));
    (void)follower_.Show();
    PrintProgress(view);
    for (auto& w : workers_) {
      if (w->alive && w->asked_to_leave && Clock::now() > w->leave_deadline) {
        kill(w->pid, SIGKILL);  // it did not acknowledge the plan without it in time
      }
    }
    if (Since(last_step_change_) > stall_limit) {
      StopAll();
      // What the workers reported since (a plan whose rendezvous keeps failing, say) is the
      // likeliest cause; without it the user has only a step number.
      const std::string reported = ReportedFailure(view, last_step_epoch_);
      return DeadlineExceeded("no training progress for " + std::to_string(int(stall_limit)) +
                              " s at step " + std::to_string(last_step_) +
                              (reported.empty() ? "" : "; last failure: " + reported));
    }
    coordinator_.WaitForChange(job_id_, generation, std::chrono::milliseconds(50));
  }
  StopAll();         // joiners that were still warming up
  follower_.Stop();  // rank 0's last lines (a final evaluation's, say)
  NoteResizePauses(*coordinator_.GetJob(job_id_), /*final=*/true);
  return Collect();
}
// The job as `vf run` trains it: the file, with --steps in place of its length.
Result<JobSpec> LoadLocalJob(const LocalRunOptions& o) {
  VF_ASSIGN_OR_RETURN(JobSpec job, LoadJobFile(o.job_path));
  if (o.steps_override < 0) return InvalidArgument("--steps must be positive");
  if (o.steps_override > 0) {
    job.steps = o.steps_override;
    job.epochs = 0;
  }
  VF_RETURN_IF_ERROR(ValidateJob(job).WithContext(o.job_path));
  VF_RETURN_IF_ERROR(policy::CheckPolicyName("spec.elasticity.policy", job.elasticity.policy)
                         .WithContext(o.job_path));
  if (job.suspend) {
    // As a suspended batch/v1 Job: no workers run. Refused rather than ignored, so that a
    // manifest kept suspended for a queue is never trained by accident.
    return FailedPrecondition(o.job_path +
                              ": spec.suspend is true: a suspended job runs no workers; set it "
                              "to false (or remove it) to train");
  }
  if (o.workers < 0) return InvalidArgument("--workers must be at least 1");
  if (o.workers > job.virtual_nodes) {
    return InvalidArgument("--workers " + std::to_string(o.workers) +
                           " exceeds spec.virtualNodes (" + std::to_string(job.virtual_nodes) +
                           "): every worker needs at least one virtual node");
  }
  return job;
}

// Checks the training data and any checkpoint to resume from as the workers will find them;
// returns the job's length in steps from the training set's real size (the workers report the
// same once they have loaded it).
Result<int64_t> CheckDataAndCheckpoint(const JobSpec& job, const LocalRunOptions& o) {
  // A user's program loads its own data and checks its own checkpoints (they hold its
  // state_dicts); its workers report the job's length once they know it.
  if (job.worker_template.user_program()) return TotalSteps(job, 0);
  VF_ASSIGN_OR_RETURN(DatasetSplits data, LoadJobDataset(job));
  VF_RETURN_IF_ERROR(Sharder::Check(data.train.count, job.global_batch_size, job.virtual_nodes)
                         .WithContext(o.job_path));
  const int64_t total_steps = TotalSteps(job, data.train.count);
  if (!job.checkpoint.path.empty() && fs::exists(job.checkpoint.path)) {
    VF_ASSIGN_OR_RETURN(TrainingState state, ReadCheckpoint(job.checkpoint.path));
    if (state.job_fingerprint != job.Fingerprint()) {
      return FailedPrecondition("checkpoint " + job.checkpoint.path +
                                " belongs to a different job (its virtual nodes, batch size, "
                                "model, dataset, optimizer, reduction or seed differ)");
    }
    if (!o.quiet) {
      std::printf("resuming from checkpoint %s at step %lld\n", job.checkpoint.path.c_str(),
                  static_cast<long long>(state.step));
    }
  }
  return total_steps;
}

// The virtualflow-agent program the workers run.
Result<std::string> AgentBinary(const LocalRunOptions& o) {
  std::string agent = o.agent_path;
  if (agent.empty()) {
    std::error_code ec;
    agent = (fs::read_symlink("/proc/self/exe", ec).parent_path() / "virtualflow-agent").string();
  }
  if (access(agent.c_str(), X_OK) != 0) {
    return NotFound("worker program " + agent + " not found or not executable");
  }
  return agent;
}

}  // namespace

void RequestLocalJobStop() { g_stop.store(true); }

Result<LocalRunSummary> RunLocalJob(const LocalRunOptions& o) {
  g_stop.store(false);
  // Everything a worker would reject is checked here first, so the user sees one error, once.
  VF_ASSIGN_OR_RETURN(JobSpec job, LoadLocalJob(o));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  VF_ASSIGN_OR_RETURN(CapacitySchedule capacity,
                      local::SlotSchedule(o.capacity, o.workers, job, cores));
  VF_ASSIGN_OR_RETURN(const int64_t total_steps, CheckDataAndCheckpoint(job, o));
  std::string agent;
  if (!job.worker_template.user_program()) {
    VF_ASSIGN_OR_RETURN(agent, AgentBinary(o));
  }
  LocalCluster cluster(o, std::move(job), std::move(capacity), std::move(agent), total_steps);
  return cluster.Run();
}

}  // namespace vf
