// vf-pod-runner: plays the kubelet for the fake GPU nodes of the end-to-end tests. Watches the
// nodes carrying --node-label and every pod; runs each pod bound to one of those nodes as a
// local process and keeps the pod's status true. See runner.h.
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include "operator/kube/client.h"
#include "operator/kube/config.h"
#include "operator/kube/reflector.h"
#include "runtime/command_line.h"
#include "tests/e2e/pod_runner/cluster_view.h"
#include "tests/e2e/pod_runner/log.h"
#include "tests/e2e/pod_runner/network.h"
#include "tests/e2e/pod_runner/runner.h"
#include "tests/e2e/pod_runner/volumes.h"

namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;

// mkdir -p.
vf::Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i != path.size() && path[i] != '/') continue;
    const std::string prefix = path.substr(0, i);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return vf::Internal("cannot create " + prefix + ": " + std::strerror(errno));
    }
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return vf::Internal(path + " is not a directory");
  }
  return vf::Status::Ok();
}

std::string Absolute(const std::string& path) {
  if (path.empty() || path.front() == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

// Holds an exclusive lock on DIR/lock for the life of the process: two runners sharing a state
// directory (and so a bridge) would remove each other's pods' namespaces and volumes.
vf::Status LockStateDir(const std::string& dir) {
  const std::string path = dir + "/lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return vf::Internal("cannot open " + path + ": " + std::strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    const ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
    close(fd);
    return vf::FailedPrecondition(
        "another vf-pod-runner (pid " + std::string(pid, n > 0 ? static_cast<size_t>(n) : 0) +
        ") uses " + dir + ": give this one a --bridge and --pod-cidr (or --state-dir) of its own");
  }
  const std::string mine = std::to_string(getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, mine.data(), mine.size(), 0) < 0) {
    vf::podrunner::LogLine("cannot write " + path);
  }
  return vf::Status::Ok();  // the descriptor stays open, and the lock held, until exit
}

// Whether `ip` can be run: iproute2 does the pod network's work.
bool HaveIp() {
  for (const char* dir : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    if (access((std::string(dir) + "/ip").c_str(), X_OK) == 0) return true;
  }
  return false;
}

vf::kube::ReflectorHandlers Handlers(const char* what, vf::podrunner::ClusterView& view,
                                     bool pods) {
  vf::kube::ReflectorHandlers h;
  h.on_sync = [&view, pods](std::vector<nlohmann::json> items, const std::string&) {
    if (pods) {
      view.SyncPods(std::move(items));
    } else {
      view.SyncNodes(items);
    }
  };
  h.on_event = [&view, pods](vf::kube::WatchEvent event) {
    if (pods) {
      view.ApplyPodEvent(std::move(event));
    } else {
      view.ApplyNodeEvent(event);
    }
  };
  h.on_error = [what](const vf::kube::ApiError& error) {
    vf::podrunner::LogLine(std::string("list/watch of ") + what +
                           " failed (retrying): " + error.ToString());
  };
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  // SIGTERM and SIGINT are taken by sigwait on a thread of their own: blocked here, before any
  // thread exists, so that every thread inherits the mask. Children get a clean mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  std::string kubeconfig;
  std::string node_label = "virtualflow.io/pod-runner=true";
  std::string log_dir;
  std::string path;
  int64_t shutdown_grace = 5;
  std::string pod_network = "netns";
  vf::podrunner::NetworkOptions net;
  std::string state_dir;
  CLI::App app(
      "Plays the kubelet for the fake GPU nodes of the end-to-end tests: watches the nodes that\n"
      "carry --node-label and every pod, runs the first container of each pod bound to one of\n"
      "those nodes as a local process (its command and args, with the container's env; Secrets,\n"
      "ConfigMaps and fieldRefs resolved), and keeps the pod's status true through pods/status:\n"
      "Running with its pod IP, then Succeeded (exit 0) or Failed with the exit code and the\n"
      "end of the log. Every restartPolicy is treated as Never. Deleting a pod sends SIGTERM\n"
      "to its process group, SIGKILL after the grace period, then removes the pod object; a pod\n"
      "deleted outright has its processes SIGKILLed at once.\n\n"
      "With --pod-network=netns (the default; needs root and iproute2's `ip`) every pod runs in\n"
      "a network namespace of its own with an address from --pod-cidr, on a bridge that holds\n"
      "the CIDR's first address: the pods reach the host there, so whatever they must reach on\n"
      "the host has to listen on 0.0.0.0 or that address. As root every process also gets a\n"
      "mount namespace with the pod's volumes bind-mounted (emptyDir, hostPath,\n"
      "persistentVolumeClaim of a hostPath or local PersistentVolume, secret, configMap,\n"
      "downwardAPI). --pod-network=host runs every pod in the host's network at 127.0.0.1.\n"
      "securityContext and probes are ignored; processes run as the runner's user.\n\n"
      "Logs one line per action to stderr. SIGTERM or SIGINT stops it: its processes get\n"
      "SIGTERM, then SIGKILL after --shutdown-grace seconds, and the bridge is removed; it\n"
      "exits 0.",
      "vf-pod-runner");
  app.footer(
      "Exit status: 0 stopped by a signal; 1 cannot start (kubeconfig, log dir, not root, the\n"
      "bridge, another runner on the same state dir); 2 usage.");
  app.add_option("--kubeconfig", kubeconfig,
                 "the kubeconfig to reach the API server with (required)")
      ->type_name("PATH");
  app.add_option("--node-label", node_label,
                 "run the pods of nodes carrying this label (default\n" + node_label + ")")
      ->type_name("KEY=VALUE");
  app.add_option("--log-dir", log_dir,
                 "each container's stdout and stderr go to\n"
                 "DIR/<namespace>_<pod>_<container>.log; also the working directory\n"
                 "of containers without workingDir (default $TMPDIR/vf-pod-runner)")
      ->type_name("DIR");
  app.add_option("--path", path,
                 "':'-separated directories put before PATH when resolving and\n"
                 "running commands (e.g. the build's bin directory, for\n"
                 "virtualflow-agent)")
      ->type_name("DIRS");
  app.add_option("--pod-network", pod_network,
                 "netns: a network namespace and address per pod (root);\n"
                 "host: every pod in the host's network at 127.0.0.1")
      ->check(CLI::IsMember({"netns", "host"}))
      ->capture_default_str();
  app.add_option("--pod-cidr", net.cidr,
                 "the pods' addresses; the first one is the bridge's (the pods'\n"
                 "gateway and the host as they see it)")
      ->type_name("CIDR")
      ->capture_default_str();
  app.add_option("--bridge", net.bridge, "the Linux bridge the pods' veths are on")
      ->type_name("NAME")
      ->capture_default_str();
  app.add_option("--state-dir", state_dir,
                 "the pods' volumes and what a killed runner left behind\n"
                 "(default /var/lib/vf-pod-runner/<bridge>; with --pod-network=host,\n"
                 "<log-dir>/state)")
      ->type_name("DIR");
  app.add_option("--shutdown-grace", shutdown_grace,
                 "seconds between SIGTERM and SIGKILL for the processes on shutdown")
      ->transform(vf::Base10Integer())
      ->capture_default_str();
  if (auto exit_code = vf::ParseCommandLine(app, "vf-pod-runner", argc, argv)) return *exit_code;
  auto usage = [](const std::string& message) { return vf::UsageError("vf-pod-runner", message); };
  if (kubeconfig.empty()) return usage("--kubeconfig is required (see --help)");
  const size_t eq = node_label.find('=');
  if (eq == 0 || eq == std::string::npos ||
      node_label.find_first_of(",!() ") != std::string::npos) {
    return usage("--node-label must be KEY=VALUE, not '" + node_label + "'");
  }
  if (shutdown_grace < 0) return usage("--shutdown-grace must not be negative");
  if (log_dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    log_dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/vf-pod-runner";
  }
  log_dir = Absolute(log_dir);
  if (vf::Status s = MakeDirs(log_dir); !s.ok()) {
    std::fprintf(stderr, "vf-pod-runner: error: --log-dir: %s\n", s.message().c_str());
    return kExitError;
  }

  const bool netns = pod_network == "netns";
  auto fail = [](const std::string& message) {
    std::fprintf(stderr, "vf-pod-runner: error: %s\n", message.c_str());
    return kExitError;
  };
  if (netns && geteuid() != 0) {
    return fail(
        "--pod-network=netns needs root (network namespaces, veths, a bridge); run as "
        "root or pass --pod-network=host");
  }
  if (netns && !HaveIp()) {
    return fail(
        "--pod-network=netns needs iproute2's `ip` (apt-get install iproute2), or pass "
        "--pod-network=host");
  }
  if (state_dir.empty()) {
    state_dir = netns ? "/var/lib/vf-pod-runner/" + net.bridge : log_dir + "/state";
  }
  state_dir = Absolute(state_dir);
  if (vf::Status s = MakeDirs(state_dir + "/pods"); !s.ok())
    return fail("--state-dir: " + s.message());
  if (vf::Status s = LockStateDir(state_dir); !s.ok()) return fail(s.message());

  vf::Result<vf::kube::Config> config = vf::kube::LoadKubeconfig(kubeconfig);
  if (!config.ok()) {
    std::fprintf(stderr, "vf-pod-runner: error: %s\n", config.status().message().c_str());
    return kExitError;
  }
  vf::kube::ClientOptions client_options;
  client_options.qps = 50;
  client_options.burst = 100;
  client_options.user_agent = "vf-pod-runner";
  auto client = vf::kube::Client::Create(*config, client_options);
  if (!client.ok()) {
    std::fprintf(stderr, "vf-pod-runner: error: %s\n", client.status().message().c_str());
    return kExitError;
  }

  vf::podrunner::RunnerOptions options;
  options.log_dir = log_dir;
  options.path_prefix = path;
  const char* own_path = std::getenv("PATH");
  options.base_path = own_path != nullptr ? own_path : "/usr/local/bin:/usr/bin:/bin";
  options.shutdown_grace = std::chrono::seconds(shutdown_grace);
  options.state_dir = state_dir;
  options.mount_namespaces = geteuid() == 0;

  vf::podrunner::LogLine("starting: server " + config->server + ", nodes labelled " + node_label +
                         ", logs in " + log_dir + (path.empty() ? "" : ", PATH first " + path) +
                         ", pod network " + (netns ? net.bridge + " " + net.cidr : "host") +
                         ", state in " + state_dir);

  vf::podrunner::ClusterView view;
  vf::kube::ReflectorOptions node_options;
  node_options.label_selector = node_label;
  node_options.max_backoff = std::chrono::seconds(5);
  vf::kube::ReflectorOptions pod_options;
  pod_options.max_backoff = std::chrono::seconds(5);
  vf::kube::Reflector nodes(**client, vf::kube::kNodes, "", node_options,
                            Handlers("nodes", view, false));
  vf::kube::Reflector pods(**client, vf::kube::kPods, "", pod_options,
                           Handlers("pods", view, true));

  std::stop_source stop;
  // sigwait cannot be interrupted, so the thread polls its stop token between waits.
  std::jthread signals([&stop, &view, stop_signals](std::stop_token self) {
    const timespec tick{0, 200L * 1000 * 1000};
    while (!self.stop_requested()) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &tick);
      if (sig < 0) continue;
      vf::podrunner::LogLine(std::string("got ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
                             ": stopping");
      stop.request_stop();
      view.Wake();
      return;
    }
  });
  std::jthread node_thread([&nodes](std::stop_token t) { nodes.Run(t); });
  std::jthread pod_thread([&pods](std::stop_token t) { pods.Run(t); });

  // What a killed runner left; then the bridge. Both before any pod starts.
  vf::podrunner::RemoveStaleStates(state_dir + "/pods");
  std::unique_ptr<vf::podrunner::PodNetwork> network;
  if (netns) {
    auto created = vf::podrunner::PodNetwork::Create(net);
    if (!created.ok()) return fail(created.status().message());
    network = std::move(created).value();
    options.host_ip = network->gateway();
  }

  vf::podrunner::PodRunner runner(**client, view, options, std::move(network));
  runner.Run(stop.get_token());  // on the main thread: it forks the pods' processes

  node_thread.request_stop();
  pod_thread.request_stop();
  signals.request_stop();
  node_thread.join();
  pod_thread.join();
  signals.join();
  vf::podrunner::LogLine("stopped");
  return kExitOk;
}
