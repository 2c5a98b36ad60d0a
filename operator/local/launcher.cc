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
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "runtime/executor.h"
#include "runtime/job/spec.h"
#include "runtime/state/training_state.h"

extern char** environ;

namespace vf {
namespace {

namespace fs = std::filesystem;
std::atomic<bool> g_stop{false};

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

// Agents print "virtualflow-agent: rank R: error: <message>"; keep the message.
std::string AgentMessage(const std::string& line) {
  const std::string marker = "error: ";
  const size_t at = line.find(marker);
  return at == std::string::npos ? line : line.substr(at + marker.size());
}

struct Child {
  pid_t pid = -1;
  int rank = 0;
  bool done = false;
  int status = 0;
};

Result<pid_t> Spawn(const std::vector<std::string>& args, const std::string& out_path,
                    const std::string& err_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!out_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return Internal("cannot start " + args[0] + ": " + std::strerror(rc));
  return pid;
}

void StopAll(std::vector<Child>& children) {
  for (auto& c : children) {
    if (!c.done) kill(c.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (auto& c : children) {
    while (!c.done) {
      const pid_t r = waitpid(c.pid, &c.status, WNOHANG);
      if (r == c.pid || r < 0) {
        c.done = true;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &c.status, 0);
        c.done = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

}  // namespace

void RequestLocalJobStop() { g_stop.store(true); }

Result<LocalRunSummary> RunLocalJob(const LocalRunOptions& o) {
  g_stop.store(false);
  // Everything a worker would reject is checked here first, so the user sees one error, once.
  VF_ASSIGN_OR_RETURN(JobSpec job, LoadJobFile(o.job_path));
  if (o.steps_override < 0) return InvalidArgument("--steps must be positive");
  if (o.steps_override > 0) {
    job.steps = o.steps_override;
    job.epochs = 0;
  }
  VF_RETURN_IF_ERROR(ValidateJob(job).WithContext(o.job_path));
  int workers = o.workers;
  if (workers < 0) return InvalidArgument("--workers must be at least 1");
  if (workers == 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    workers = std::min(job.replicas_max, cores);
  }
  if (workers > job.virtual_nodes) {
    return InvalidArgument("--workers " + std::to_string(workers) + " exceeds spec.virtualNodes (" +
                           std::to_string(job.virtual_nodes) +
                           "): every worker needs at least one virtual node");
  }
  VF_ASSIGN_OR_RETURN(DatasetSplits data, LoadJobDataset(job));
  VF_RETURN_IF_ERROR(Sharder::Check(data.train.count, job.global_batch_size, job.virtual_nodes)
                         .WithContext(o.job_path));
  if (!job.checkpoint.path.empty() && fs::exists(job.checkpoint.path)) {
    VF_ASSIGN_OR_RETURN(TrainingState state, ReadCheckpoint(job.checkpoint.path));
    if (state.job_fingerprint != job.Fingerprint()) {
      return FailedPrecondition("checkpoint " + job.checkpoint.path +
                                " belongs to a different job (its virtual nodes, batch size, "
                                "model, dataset, optimizer, reduction or seed differ)");
    }
  }
  data = {};  // the workers load their own copy

  std::string agent = o.agent_path;
  if (agent.empty()) {
    std::error_code ec;
    agent = (fs::read_symlink("/proc/self/exe", ec).parent_path() / "virtualflow-agent").string();
  }
  if (access(agent.c_str(), X_OK) != 0) {
    return NotFound("worker program " + agent + " not found or not executable");
  }

  TempDir run;
  VF_RETURN_IF_ERROR(run.Create());
  const fs::path dir = run.path();
  fs::create_directory(dir / "store");
  // Workers die with this process rather than linger if it is killed.
  setenv("VF_EXIT_WITH_PARENT", std::to_string(getpid()).c_str(), 1);

  std::vector<Child> children;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < workers; ++r) {
    std::ostringstream interval;
    interval << (r == 0 ? o.progress_interval : 0.0);
    std::ostringstream timeout;
    timeout << o.timeout;
    std::vector<std::string> args = {agent,
                                     "--job",
                                     o.job_path,
                                     "--rank",
                                     std::to_string(r),
                                     "--world-size",
                                     std::to_string(workers),
                                     "--store-dir",
                                     (dir / "store").string(),
                                     "--result",
                                     (dir / ("rank-" + std::to_string(r) + ".json")).string(),
                                     "--progress-interval",
                                     interval.str(),
                                     "--timeout",
                                     timeout.str()};
    if (o.steps_override > 0) {
      args.push_back("--steps");
      args.push_back(std::to_string(o.steps_override));
    }
    const std::string out =
        r == 0 ? std::string() : (dir / ("rank-" + std::to_string(r) + ".out")).string();
    auto pid = Spawn(args, out, (dir / ("rank-" + std::to_string(r) + ".err")).string());
    if (!pid.ok()) {
      StopAll(children);
      return pid.status();
    }
    children.push_back({*pid, r, false, 0});
  }

  // Wait for all; the first failure stops the rest and is what the user sees.
  Status failure;
  size_t remaining = children.size();
  while (remaining > 0) {
    if (g_stop.load()) {
      StopAll(children);
      return Unavailable("interrupted; workers stopped");
    }
    bool progressed = false;
    for (auto& c : children) {
      if (c.done) continue;
      const pid_t r = waitpid(c.pid, &c.status, WNOHANG);
      if (r != c.pid) continue;
      c.done = true;
      --remaining;
      progressed = true;
      if (WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) continue;
      std::string msg =
          AgentMessage(LastLine((dir / ("rank-" + std::to_string(c.rank) + ".err")).string()));
      if (msg.empty()) msg = "worker " + std::to_string(c.rank) + " " + DescribeExit(c.status);
      failure = Status(StatusCode::kUnavailable, msg);
      StopAll(children);
      return failure;
    }
    if (!progressed) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  LocalRunSummary summary;
  summary.workers = workers;
  summary.virtual_nodes = job.virtual_nodes;
  summary.seconds = seconds;
  for (int r = 0; r < workers; ++r) {
    const fs::path p = dir / ("rank-" + std::to_string(r) + ".json");
    std::ifstream in(p);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("weights_sha256")) {
      return Internal("worker " + std::to_string(r) + " finished without a readable result");
    }
    const std::string sha = j["weights_sha256"].get<std::string>();
    if (r == 0) {
      summary.weights_sha256 = sha;
      summary.steps = j["steps"].get<int64_t>();
      summary.final_loss = j["final_loss"].is_null() ? 0.0 : j["final_loss"].get<double>();
      summary.test_accuracy = j["test_accuracy"].get<double>();
      summary.test_loss = j["test_loss"].get<double>();
      summary.samples_per_second = j["samples_per_second"].get<double>();
    } else if (sha != summary.weights_sha256) {
      return Internal("workers ended with different weights (rank 0 " + summary.weights_sha256 +
                      ", rank " + std::to_string(r) + " " + sha + ")");
    }
  }
  return summary;
}

}  // namespace vf
