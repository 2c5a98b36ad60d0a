#include "tests/e2e/pod_runner/runner.h"

#include <algorithm>
#include <csignal>
#include <exception>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "tests/e2e/pod_runner/log.h"
#include "tests/e2e/pod_runner/pod_json.h"

namespace vf::podrunner {
namespace {

using nlohmann::json;

constexpr int64_t kDefaultGraceSeconds = 30;
constexpr kube::Resource kClaims{"", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", true};
constexpr kube::Resource kPersistentVolumes{"", "v1", "persistentvolumes", "PersistentVolume",
                                            false};
// Enough log for a 2 KiB message even when the last bytes are multi-byte characters.
constexpr size_t kLogTailBytes = 4096;

// argv as a shell would show it, for log lines.
std::string ShowCommand(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& arg : argv) {
    if (!out.empty()) out.push_back(' ');
    const bool plain =
        !arg.empty() && arg.find_first_of(" \t\n'\"\\$;&|<>()*?") == std::string::npos;
    if (plain) {
      out += arg;
      continue;
    }
    out.push_back('\'');
    for (char c : arg) {
      if (c == '\'') {
        out += "'\\''";
      } else {
        out.push_back(c);
      }
    }
    out.push_back('\'');
  }
  return out;
}

std::string Seconds(std::chrono::milliseconds d) {
  const int64_t ms = d.count();
  return std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 / 100) + "s";
}

bool Deleting(const json& pod) {
  const json* ts = FieldPath(pod, {"metadata", "deletionTimestamp"});
  return ts != nullptr && !ts->is_null();
}

// A pod a kubelet has already started: a previous runner's, whose process died with it.
bool StartedBefore(const json& pod) {
  if (StringAt(pod, {"status", "phase"}) == "Running") return true;
  const json* statuses = FieldPath(pod, {"status", "containerStatuses"});
  if (statuses == nullptr || !statuses->is_array()) return false;
  for (const json& s : *statuses) {
    if (FieldPath(s, {"state", "running"}) != nullptr) return true;
  }
  return false;
}

std::string DescribeExit(const ProcessExit& exit) {
  if (exit.signal != 0) return "was killed by signal " + std::to_string(exit.signal);
  return "exited with code " + std::to_string(exit.exit_code);
}

}  // namespace

std::chrono::milliseconds Backoff::Failed(Clock::time_point now) {
  delay_ = delay_.count() == 0 ? initial_ : std::min(delay_ * 2, max_);
  next_ = now + delay_;
  return delay_;
}

// What the runner has done about one pod (one uid), and what it still has to do. Touched only by
// the reconcile thread.
struct PodRunner::Pod {
  enum class State {
    kWaiting,   // not started yet: its environment could not be resolved; retried
    kRunning,   // its process runs
    kFinished,  // its process is gone, could not start, or was never ours: the status is final
  };

  explicit Pod(const RunnerOptions& options)
      : api(options.initial_backoff, options.max_backoff),
        start(std::chrono::seconds(1), std::chrono::seconds(8)) {}

  PodRef ref;
  ClusterView::PodPtr object;  // as last seen
  PodFacts facts;
  State state = State::kWaiting;
  std::unique_ptr<ChildProcess> process;
  ContainerRun run;
  std::string log_path;
  std::string waiting_message;             // the last reason it could not start
  std::string state_dir;                   // its volumes' directory (RunnerOptions::state_dir)
  VolumeState volumes;                     // what was made on the host for its volumes
  std::vector<std::string> mount_targets;  // where its process has volumes mounted
  std::string termination_message;         // the file its terminationMessagePath shows; "": none

  // The status to write; written when written_gen catches up with desired_gen.
  json desired;
  std::string summary;  // the status in a few words, for the log
  uint64_t desired_gen = 0;
  uint64_t written_gen = 0;
  Backoff api;    // status writes and the final delete
  Backoff start;  // attempts to start

  // Graceful deletion.
  bool terminating = false;
  bool killed = false;
  Clock::time_point term_at;
  Clock::time_point kill_at;
  bool delete_wanted = false;  // delete the object (grace 0) once the final status is written
  bool deleted = false;
  bool vanished = false;  // gone from the view: deleted outright (or by us)
  bool api_gone = false;  // the API says the object (this uid) no longer exists
};

PodRunner::PodRunner(kube::Client& client, ClusterView& view, RunnerOptions options,
                     std::unique_ptr<PodNetwork> network)
    : client_(client), view_(view), options_(std::move(options)), network_(std::move(network)) {}

PodRunner::~PodRunner() = default;

void PodRunner::Run(std::stop_token stop) {
  std::stop_callback wake(stop, [this] { view_.Wake(); });
  bool announced = false;
  std::set<std::string> nodes;
  while (!stop.stop_requested()) {
    const ClusterView::Snapshot snapshot = view_.Get();
    if (snapshot.synced) {
      for (const auto& node : snapshot.nodes) {
        if (!nodes.count(node)) LogLine("playing the kubelet for node " + node);
      }
      for (const auto& node : nodes) {
        if (!snapshot.nodes.count(node)) LogLine("node " + node + " is no longer managed");
      }
      nodes = snapshot.nodes;
      if (!announced) {
        LogLine("synced: " + std::to_string(snapshot.nodes.size()) + " managed nodes, " +
                std::to_string(snapshot.pods.size()) + " pods");
        announced = true;
      }
      try {
        Reconcile(snapshot);
      } catch (const std::exception& e) {
        // Odd data must not take the kubelet of every other pod down with it.
        LogLine(std::string("reconcile failed, will try again: ") + e.what());
      }
    }
    view_.WaitForChange(snapshot.version, Clock::now() + options_.poll_interval);
  }
  Shutdown();
}

void PodRunner::Reconcile(const ClusterView::Snapshot& snapshot) {
  const Clock::time_point now = Clock::now();
  // Exits first, so that this round already acts on them.
  for (auto& [key, pod] : pods_) Collect(*pod);

  for (const auto& [key, object] : snapshot.pods) {
    auto it = pods_.find(key);
    if (it == pods_.end()) {
      const std::string node = StringAt(*object, {"spec", "nodeName"});
      if (node.empty() || !snapshot.nodes.count(node)) continue;  // not ours (yet)
      Adopt(key, object);
      it = pods_.find(key);
    } else {
      it->second->object = object;
    }
    Handle(*it->second, now);
  }

  for (auto it = pods_.begin(); it != pods_.end();) {
    Pod& pod = *it->second;
    if (snapshot.pods.count(it->first)) {
      ++it;
      continue;
    }
    if (!pod.vanished) {
      pod.vanished = true;
      if (pod.state == Pod::State::kRunning) {
        LogLine("pod " + pod.ref.ToString() + " was deleted outright: SIGKILL to pid " +
                std::to_string(pod.process->pid()) + " and its process group");
        if (Status s = pod.process->Signal(SIGKILL); !s.ok()) LogLine(s.message());
      }
    }
    Collect(pod);
    if (pod.state == Pod::State::kRunning) {
      ++it;  // reaped in a later round
    } else {
      Release(pod);
      it = pods_.erase(it);
    }
  }

  for (auto& [key, pod] : pods_) {
    WriteStatus(*pod, now);
    DeleteObject(*pod, now);
  }
}

void PodRunner::Adopt(const std::string& key, const ClusterView::PodPtr& object) {
  auto pod = std::make_unique<Pod>(options_);
  pod->ref = RefOf(*object);
  pod->object = object;
  const json* container = FirstContainer(*object);
  // A pod lost with an earlier runner keeps the address it had; a new one gets one when it
  // starts (when the runner has a pod network).
  pod->facts.pod_ip = StringAt(*object, {"status", "podIP"});
  if (pod->facts.pod_ip.empty() && network_ == nullptr) pod->facts.pod_ip = options_.pod_ip;
  pod->facts.host_ip = network_ != nullptr ? network_->gateway() : options_.host_ip;
  pod->state_dir = options_.state_dir + "/pods/" +
                   (pod->ref.uid.empty() ? pod->ref.ns + "_" + pod->ref.name : pod->ref.uid);
  pod->facts.start_time = std::chrono::system_clock::now();
  if (container != nullptr) {
    pod->facts.container = StringAt(*container, {"name"});
    pod->facts.image = StringAt(*container, {"image"});
  }
  const std::string name = pod->ref.ToString();
  const std::string phase = StringAt(*object, {"status", "phase"});
  if (Deleting(*object)) {
    LogLine("pod " + name + " is being deleted and never started here: deleting it");
    pod->state = Pod::State::kFinished;
    pod->delete_wanted = true;
  } else if (phase == "Succeeded" || phase == "Failed") {
    pod->state = Pod::State::kFinished;  // finished under an earlier runner
  } else if (StartedBefore(*object)) {
    LogLine("pod " + name + " was started by an earlier runner and its process is gone: Failed");
    pod->state = Pod::State::kFinished;
    SetStatus(*pod, LostStatus(pod->facts, std::chrono::system_clock::now()));
    pod->summary = "Failed (ContainerStatusUnknown)";
  }
  pods_[key] = std::move(pod);
}

void PodRunner::Handle(Pod& pod, Clock::time_point now) {
  const bool deleting = Deleting(*pod.object);
  switch (pod.state) {
    case Pod::State::kWaiting:
      if (deleting) {
        LogLine("pod " + pod.ref.ToString() + " is being deleted and never started: deleting it");
        pod.state = Pod::State::kFinished;
        pod.delete_wanted = true;
        pod.written_gen = pod.desired_gen;  // a waiting status is not worth writing now
        Release(pod);
      } else if (pod.start.Ready(now)) {
        Start(pod);
      }
      break;
    case Pod::State::kRunning:
      if (deleting) Terminate(pod, now);
      break;
    case Pod::State::kFinished:
      if (deleting) pod.delete_wanted = true;
      break;
  }
}

void PodRunner::Start(Pod& pod) {
  const json* container = FirstContainer(*pod.object);
  if (container == nullptr) return CannotRun(pod, "the pod has no containers");
  if (pod.waiting_message.empty()) LogFirstAttempt(pod);
  if (pod.facts.container.empty()) return CannotRun(pod, "the first container has no name");

  if (network_ != nullptr) {
    Result<std::string> address = network_->Address(pod.ref.uid);
    if (!address.ok()) return Wait(pod, "ContainerCreating", address.status().message());
    pod.facts.pod_ip = *address;
  }
  Result<std::vector<EnvVar>> env = ResolveEnv(
      *pod.object, *container,
      [this](SourceKind kind, const std::string& ns, const std::string& source) {
        return LookupSource(kind, ns, source);
      },
      Context(pod));
  if (!env.ok()) return Wait(pod, "CreateContainerConfigError", env.status().message());
  Result<VolumePlan> plan = PlanPodVolumes(pod, *container);
  if (!plan.ok()) {
    if (plan.status().code() == StatusCode::kInvalidArgument) {
      return CannotRun(pod, plan.status().message());
    }
    return Wait(pod, "ContainerCreating", plan.status().message());
  }
  if (!plan->mounts.empty() && !options_.mount_namespaces) {
    return CannotRun(pod,
                     "the container mounts volumes, which needs a mount namespace: run "
                     "vf-pod-runner as root");
  }
  if (options_.mount_namespaces) {
    AddTerminationMessage(*plan, *container, pod.state_dir);
    pod.termination_message = plan->termination_message;
  }
  Result<LaunchSpec> spec = Command(pod, *container, *env);
  if (!spec.ok()) return CannotRun(pod, spec.status().message());
  if (Status s = SetUp(pod, *plan, *spec); !s.ok()) {
    Release(pod);
    return Wait(pod, "ContainerCreating", s.message());
  }
  Launch(pod, *spec);
}

void PodRunner::LogFirstAttempt(const Pod& pod) {
  const json& object = *pod.object;
  const std::string name = pod.ref.ToString();
  const std::string policy = StringAt(object, {"spec", "restartPolicy"});
  if (policy != "Never") {
    LogLine("pod " + name + " has restartPolicy " + (policy.empty() ? "Always" : policy) +
            ", treated as Never: its container is not restarted");
  }
  const json* containers = FieldPath(object, {"spec", "containers"});
  if (containers != nullptr && containers->size() > 1) {
    LogLine("pod " + name + ": only the first of its " + std::to_string(containers->size()) +
            " containers is run");
  }
  const json* init = FieldPath(object, {"spec", "initContainers"});
  if (init != nullptr && init->is_array() && !init->empty()) {
    LogLine("pod " + name + ": its init containers are not run");
  }
}

void PodRunner::CannotRun(Pod& pod, const std::string& message) {
  LogLine("pod " + pod.ref.ToString() + " cannot run: " + message);
  Release(pod);
  pod.state = Pod::State::kFinished;
  SetStatus(pod, CannotRunStatus(pod.facts, message, std::chrono::system_clock::now()));
  pod.summary = "Failed (ContainerCannotRun)";
}

void PodRunner::Wait(Pod& pod, const std::string& reason, const std::string& message) {
  const auto delay = pod.start.Failed(Clock::now());
  LogLine("pod " + pod.ref.ToString() + " cannot start yet: " + message + " (trying again in " +
          Seconds(delay) + ")");
  if (message != pod.waiting_message) {
    SetStatus(pod, WaitingStatus(pod.facts, reason, message, std::chrono::system_clock::now()));
    pod.summary = "Pending (" + reason + ")";
    pod.waiting_message = message;
  }
}

EnvContext PodRunner::Context(const Pod& pod) const {
  EnvContext context;
  context.pod_ip = pod.facts.pod_ip;
  context.host_ip = pod.facts.host_ip;
  context.path_prefix = options_.path_prefix;
  context.base_path = options_.base_path;
  return context;
}

Result<LaunchSpec> PodRunner::Command(Pod& pod, const json& container,
                                      const std::vector<EnvVar>& env) {
  LaunchSpec spec;
  spec.argv = ExpandCommand(container, env);
  if (spec.argv.empty()) {
    return InvalidArgument("container " + pod.facts.container +
                           " has no command: vf-pod-runner runs a container's command and args "
                           "as a local process and cannot run an image's entrypoint");
  }
  for (const auto& var : env) spec.env.push_back(var.name + "=" + var.value);
  spec.path = Lookup(env, "PATH").value_or("");
  spec.working_dir = StringAt(container, {"workingDir"});
  if (spec.working_dir.empty()) spec.working_dir = options_.log_dir;
  pod.log_path =
      options_.log_dir + "/" + pod.ref.ns + "_" + pod.ref.name + "_" + pod.facts.container + ".log";
  spec.log_path = pod.log_path;
  return spec;
}

Result<VolumePlan> PodRunner::PlanPodVolumes(const Pod& pod, const json& container) {
  VolumeLookups lookups;
  lookups.objects = [this](SourceKind kind, const std::string& ns, const std::string& name) {
    return LookupSource(kind, ns, name);
  };
  lookups.claim = [this](const std::string& ns, const std::string& name) {
    return LookupObject(kClaims, ns, name);
  };
  lookups.volume = [this](const std::string& name) {
    return LookupObject(kPersistentVolumes, "", name);
  };
  return PlanVolumes(*pod.object, container, lookups, pod.state_dir, Context(pod));
}

// Makes the pod's volumes and mount points and its network namespace; on failure the caller
// releases whatever was made.
Status PodRunner::SetUp(Pod& pod, const VolumePlan& plan, LaunchSpec& spec) {
  if (!plan.mounts.empty()) {
    pod.volumes.pod_dir = pod.state_dir;
    Status prepared = Prepare(plan, pod.volumes);
    SaveState(pod.volumes);
    VF_RETURN_IF_ERROR(prepared);
    for (const BindMount& m : plan.mounts) pod.mount_targets.push_back(m.target);
  }
  spec.mount_namespace = options_.mount_namespaces;
  spec.mounts = plan.mounts;
  if (network_ != nullptr) {
    VF_ASSIGN_OR_RETURN(spec.netns_path, network_->Attach(pod.ref.uid));
  }
  return Status::Ok();
}

void PodRunner::Launch(Pod& pod, const LaunchSpec& spec) {
  const auto wall_now = std::chrono::system_clock::now();
  Result<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(spec);
  if (!child.ok()) return CannotRun(pod, child.status().message());
  pod.process = std::move(child).value();
  pod.state = Pod::State::kRunning;
  pod.run.pid = pod.process->pid();
  pod.run.started_at = wall_now;
  std::string where;
  if (network_ != nullptr) where = " at " + pod.facts.pod_ip;
  if (!spec.mounts.empty()) where += " with " + std::to_string(spec.mounts.size()) + " mounts";
  LogLine("started pod " + pod.ref.ToString() + " on node " +
          StringAt(*pod.object, {"spec", "nodeName"}) + where + ": pid " +
          std::to_string(pod.run.pid) + ": " + ShowCommand(spec.argv) + " (log " + pod.log_path +
          ")");
  SetStatus(pod, RunningStatus(pod.facts, pod.run, wall_now));
  pod.summary = "Running";
}

// Gives back what the pod held on the host: its network namespace and address, its volumes and
// the mount points made for it. Idempotent.
void PodRunner::Release(Pod& pod) {
  if (pod.state == Pod::State::kRunning) return;  // its process may still use them
  if (network_ != nullptr && !pod.ref.uid.empty()) network_->Detach(pod.ref.uid);
  if (pod.volumes.pod_dir.empty() && pod.mount_targets.empty()) return;
  const std::vector<std::string> in_use = MountTargetsInUse(&pod);
  pod.mount_targets.clear();
  for (auto& path : Cleanup(pod.volumes, in_use)) leftover_targets_.push_back(std::move(path));
  leftover_targets_ = RemoveCreated(std::move(leftover_targets_), in_use);
}

std::vector<std::string> PodRunner::MountTargetsInUse(const Pod* except) const {
  std::vector<std::string> out;
  for (const auto& [key, pod] : pods_) {
    if (pod.get() == except) continue;
    out.insert(out.end(), pod->mount_targets.begin(), pod->mount_targets.end());
  }
  return out;
}

void PodRunner::Terminate(Pod& pod, Clock::time_point now) {
  const json& object = *pod.object;
  int64_t grace = kDefaultGraceSeconds;
  if (auto g = IntAt(object, {"metadata", "deletionGracePeriodSeconds"})) {
    grace = *g;
  } else if (auto t = IntAt(object, {"spec", "terminationGracePeriodSeconds"})) {
    grace = *t;
  }
  grace = std::max<int64_t>(grace, 0);
  const std::string name = pod.ref.ToString();
  const std::string pid = std::to_string(pod.process->pid());
  if (!pod.terminating) {
    pod.terminating = true;
    pod.term_at = now;
    pod.kill_at = now + std::chrono::seconds(grace);
    if (grace == 0) {
      pod.killed = true;
      LogLine("pod " + name + " is being deleted with grace period 0: SIGKILL to pid " + pid +
              " and its process group");
      if (Status s = pod.process->Signal(SIGKILL); !s.ok()) LogLine(s.message());
      return;
    }
    LogLine("pod " + name + " is being deleted: SIGTERM to pid " + pid +
            " and its process group, SIGKILL in " + std::to_string(grace) + "s");
    if (Status s = pod.process->Signal(SIGTERM); !s.ok()) LogLine(s.message());
    return;
  }
  // A later delete may shorten the grace period.
  pod.kill_at = std::min(pod.kill_at, pod.term_at + std::chrono::seconds(grace));
  if (!pod.killed && now >= pod.kill_at) {
    pod.killed = true;
    LogLine("pod " + name + ": grace period of " + std::to_string(grace) +
            "s is over: SIGKILL to pid " + pid + " and its process group");
    if (Status s = pod.process->Signal(SIGKILL); !s.ok()) LogLine(s.message());
  }
}

void PodRunner::Collect(Pod& pod) {
  if (pod.state != Pod::State::kRunning) return;
  const std::optional<ProcessExit> exit = pod.process->Poll();
  if (!exit.has_value()) return;
  LogLine("pod " + pod.ref.ToString() + " (pid " + std::to_string(pod.run.pid) + ") " +
          DescribeExit(*exit));
  pod.state = Pod::State::kFinished;
  ContainerExit result;
  result.exit_code = exit->exit_code;
  result.signal = exit->signal;
  result.finished_at = std::chrono::system_clock::now();
  result.log_tail = ReadLogTail(pod.log_path, pod.process->log_offset(), kLogTailBytes);
  if (!pod.termination_message.empty()) {
    result.termination_message = ReadTerminationMessage(pod.termination_message);
  }
  SetStatus(pod, ExitedStatus(pod.facts, pod.run, result));
  Release(pod);
  const int code = ReportedExitCode(result);
  pod.summary = code == 0 ? "Succeeded" : "Failed (exit code " + std::to_string(code) + ")";
}

void PodRunner::SetStatus(Pod& pod, json status) {
  pod.desired = std::move(status);
  ++pod.desired_gen;
}

void PodRunner::WriteStatus(Pod& pod, Clock::time_point now) {
  if (pod.vanished || pod.api_gone || pod.written_gen == pod.desired_gen || !pod.api.Ready(now)) {
    return;
  }
  json patch = {{"status", pod.desired}};
  // The uid makes the API server refuse the patch (Conflict) if the pod was replaced by another
  // of the same name, as the kubelet's status manager does.
  if (!pod.ref.uid.empty()) patch["metadata"]["uid"] = pod.ref.uid;
  const uint64_t gen = pod.desired_gen;
  kube::CallOptions call;
  call.timeout = options_.call_timeout;
  kube::ApiResult<json> result =
      client_.PatchStatus(kube::kPods, pod.ref.ns, pod.ref.name, patch, call);
  if (result.ok()) {
    pod.written_gen = gen;
    pod.api.Succeeded();
    LogLine("status of pod " + pod.ref.ToString() + ": " + pod.summary);
    return;
  }
  if (result.reason() == kube::Reason::kNotFound || result.reason() == kube::Reason::kConflict) {
    LogLine("pod " + pod.ref.ToString() + " (uid " + pod.ref.uid +
            ") no longer exists; its status is not written: " + result.error().ToString());
    pod.api_gone = true;
    return;
  }
  const auto delay = pod.api.Failed(now);
  LogLine("writing the status of pod " + pod.ref.ToString() +
          " failed: " + result.error().ToString() + " (trying again in " + Seconds(delay) + ")");
}

void PodRunner::DeleteObject(Pod& pod, Clock::time_point now) {
  if (!pod.delete_wanted || pod.deleted || pod.vanished || pod.api_gone ||
      pod.state == Pod::State::kRunning || pod.written_gen != pod.desired_gen ||
      !pod.api.Ready(now)) {
    return;
  }
  kube::DeleteOptions options;
  options.grace_period_seconds = 0;
  options.precondition_uid = pod.ref.uid;
  options.timeout = options_.call_timeout;
  kube::ApiResult<json> result = client_.Delete(kube::kPods, pod.ref.ns, pod.ref.name, options);
  if (result.ok()) {
    pod.deleted = true;
    pod.api.Succeeded();
    LogLine("deleted pod " + pod.ref.ToString() + " (grace period 0, uid " + pod.ref.uid + ")");
    return;
  }
  if (result.reason() == kube::Reason::kNotFound || result.reason() == kube::Reason::kConflict) {
    pod.deleted = true;
    LogLine("pod " + pod.ref.ToString() + " was already gone: " + result.error().ToString());
    return;
  }
  const auto delay = pod.api.Failed(now);
  LogLine("deleting pod " + pod.ref.ToString() + " failed: " + result.error().ToString() +
          " (trying again in " + Seconds(delay) + ")");
}

void PodRunner::Shutdown() {
  std::vector<Pod*> running;
  for (auto& [key, pod] : pods_) {
    if (pod->state != Pod::State::kRunning) continue;
    LogLine("shutting down: SIGTERM to pod " + pod->ref.ToString() + " (pid " +
            std::to_string(pod->process->pid()) + ")");
    if (Status s = pod->process->Signal(SIGTERM); !s.ok()) LogLine(s.message());
    running.push_back(pod.get());
  }
  auto wait_all = [&](Clock::time_point deadline) {
    while (true) {
      bool any = false;
      for (Pod* pod : running) {
        Collect(*pod);
        any = any || pod->state == Pod::State::kRunning;
      }
      if (!any || Clock::now() >= deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };
  wait_all(Clock::now() + options_.shutdown_grace);
  for (Pod* pod : running) {
    if (pod->state != Pod::State::kRunning) continue;
    LogLine("shutting down: SIGKILL to pod " + pod->ref.ToString() + " (pid " +
            std::to_string(pod->process->pid()) + ")");
    if (Status s = pod->process->Signal(SIGKILL); !s.ok()) LogLine(s.message());
  }
  wait_all(Clock::now() + std::chrono::seconds(5));
  // Whatever is still there is reaped by ~ChildProcess (after one more SIGKILL).
  for (auto& [key, pod] : pods_) pod->process.reset();
  for (auto& [key, pod] : pods_) {
    if (pod->state == Pod::State::kRunning) pod->state = Pod::State::kFinished;
    Release(*pod);
  }
  pods_.clear();
  leftover_targets_ = RemoveCreated(std::move(leftover_targets_), {});
  network_.reset();  // deletes the bridge
}

Result<json> PodRunner::LookupSource(SourceKind kind, const std::string& ns,
                                     const std::string& name) {
  kube::CallOptions call;
  call.timeout = options_.call_timeout;
  kube::ApiResult<json> got =
      client_.Get(kind == SourceKind::kSecret ? kube::kSecrets : kube::kConfigMaps, ns, name, call);
  if (got.ok()) return std::move(got).value();
  if (got.reason() == kube::Reason::kNotFound) return NotFound(got.error().ToString());
  return got.status();
}

Result<json> PodRunner::LookupObject(const kube::Resource& resource, const std::string& ns,
                                     const std::string& name) {
  kube::CallOptions call;
  call.timeout = options_.call_timeout;
  kube::ApiResult<json> got = client_.Get(resource, ns, name, call);
  if (got.ok()) return std::move(got).value();
  if (got.reason() == kube::Reason::kNotFound) return NotFound(got.error().ToString());
  return got.status();
}

}  // namespace vf::podrunner
