// PodRunner: the kubelet of the fake GPU nodes. Starts each pod bound to a managed node as a
// local process, keeps the pod's status true through pods/status, carries out graceful
// deletion (SIGTERM, grace period, SIGKILL, final status, delete with grace 0), and kills the
// processes of pods that vanish.
//
// With a PodNetwork each pod gets a network namespace and address of its own (network.h), and
// as root each pod's process gets a mount namespace with the pod's volumes bind-mounted
// (volumes.h). Unlike a kubelet it runs every process as its own user, ignoring securityContext
// (runAsUser and the rest): the tests' binaries and Python environment live under root's home.
// Probes (liveness, readiness, startup) are ignored too: a running process is ready.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <stop_token>
#include <string>

#include <nlohmann/json.hpp>

#include "operator/kube/client.h"
#include "tests/e2e/pod_runner/cluster_view.h"
#include "tests/e2e/pod_runner/env.h"
#include "tests/e2e/pod_runner/network.h"
#include "tests/e2e/pod_runner/pod_status.h"
#include "tests/e2e/pod_runner/process.h"
#include "tests/e2e/pod_runner/volumes.h"

namespace vf::podrunner {

// How a PodRunner runs pods. Value type; thread-compatible.
struct RunnerOptions {
  std::string log_dir;      // DIR/<namespace>_<pod>_<container>.log; the default working dir
  std::string path_prefix;  // --path, put first on every container's PATH
  std::string base_path;    // the rest of PATH (the runner's own)
  std::string pod_ip = "127.0.0.1";   // every pod's address without a PodNetwork
  std::string host_ip = "127.0.0.1";  // status.hostIP; the gateway with a PodNetwork
  // Each pod's volumes live in DIR/pods/<uid> while it runs.
  std::string state_dir;
  // Whether processes get a mount namespace with the pod's volumes (needs root). Without, a pod
  // that mounts volumes fails to start.
  bool mount_namespaces = false;
  // How often processes are checked for exits and deadlines when nothing else happens.
  std::chrono::milliseconds poll_interval{100};
  // On shutdown, how long children get between SIGTERM and SIGKILL.
  std::chrono::milliseconds shutdown_grace{5000};
  // The limit on each API call; a failed call is retried with backoff up to max_backoff.
  std::chrono::milliseconds call_timeout{10000};
  std::chrono::milliseconds initial_backoff{500};
  std::chrono::milliseconds max_backoff{10000};
};

// Exponential backoff for one kind of retry of one pod. Value type; not thread-safe.
class Backoff {
 public:
  using Clock = std::chrono::steady_clock;
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max)
      : initial_(initial), max_(max) {}
  bool Ready(Clock::time_point now) const { return now >= next_; }
  // Schedules the next attempt: initial, then twice the last delay, up to max.
  std::chrono::milliseconds Failed(Clock::time_point now);
  void Succeeded() {
    delay_ = std::chrono::milliseconds(0);
    next_ = {};
  }

 private:
  std::chrono::milliseconds initial_;
  std::chrono::milliseconds max_;
  std::chrono::milliseconds delay_{0};
  Clock::time_point next_{};
};

// Plays the kubelet for the pods the view shows bound to managed nodes. Level-triggered: each
// round compares every such pod with what the runner has done about it and does the next step.
// Run() forks every process, so it must be called on a thread that lives as long as they may
// (PR_SET_PDEATHSIG follows the forking thread): the main thread. Not thread-safe: Run is the
// only entry point and is called once.
class PodRunner {
 public:
  // `client` and `view` must outlive the runner. Pods run in the host's network when `network`
  // is null; otherwise the runner owns it and deletes it (the bridge) when Run returns.
  PodRunner(kube::Client& client, ClusterView& view, RunnerOptions options,
            std::unique_ptr<PodNetwork> network = nullptr);
  ~PodRunner();
  PodRunner(const PodRunner&) = delete;
  PodRunner& operator=(const PodRunner&) = delete;

  // Reconciles until `stop` is requested, then SIGTERMs every child, SIGKILLs those still there
  // after shutdown_grace, and returns once all are reaped. Pod statuses are left as they are
  // (a kubelet that stops does not rewrite its pods).
  void Run(std::stop_token stop);

 private:
  struct Pod;
  using Clock = std::chrono::steady_clock;

  void Reconcile(const ClusterView::Snapshot& snapshot);
  void Adopt(const std::string& key, const ClusterView::PodPtr& object);
  void Handle(Pod& pod, Clock::time_point now);
  void Start(Pod& pod);
  void LogFirstAttempt(const Pod& pod);
  void CannotRun(Pod& pod, const std::string& message);
  void Wait(Pod& pod, const std::string& reason, const std::string& message);
  EnvContext Context(const Pod& pod) const;
  Result<LaunchSpec> Command(Pod& pod, const nlohmann::json& container,
                             const std::vector<EnvVar>& env);
  Result<VolumePlan> PlanPodVolumes(const Pod& pod, const nlohmann::json& container);
  Status SetUp(Pod& pod, const VolumePlan& plan, LaunchSpec& spec);
  void Launch(Pod& pod, const LaunchSpec& spec);
  void Release(Pod& pod);
  std::vector<std::string> MountTargetsInUse(const Pod* except) const;
  void Terminate(Pod& pod, Clock::time_point now);
  void Collect(Pod& pod);
  void SetStatus(Pod& pod, nlohmann::json status);
  void WriteStatus(Pod& pod, Clock::time_point now);
  void DeleteObject(Pod& pod, Clock::time_point now);
  void Shutdown();
  Result<nlohmann::json> LookupSource(SourceKind kind, const std::string& ns,
                                      const std::string& name);
  Result<nlohmann::json> LookupObject(const kube::Resource& resource, const std::string& ns,
                                      const std::string& name);

  kube::Client& client_;
  ClusterView& view_;
  const RunnerOptions options_;
  std::unique_ptr<PodNetwork> network_;
  std::map<std::string, std::unique_ptr<Pod>> pods_;  // by PodKey
  // Mount points made for pods that ended while another pod still mounted there: removed once
  // none does.
  std::vector<std::string> leftover_targets_;
};

}  // namespace vf::podrunner
