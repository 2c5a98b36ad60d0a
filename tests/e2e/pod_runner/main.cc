// vf-pod-runner: plays the kubelet for the fake GPU nodes of the end-to-end tests. Watches the
// nodes carrying --node-label and every pod; runs each pod bound to one of those nodes as a
// local process and keeps the pod's status true. See runner.h.
#include <pthread.h>
#include <sys/stat.h>

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
#include "tests/e2e/pod_runner/runner.h"

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
  CLI::App app(
      "Plays the kubelet for the fake GPU nodes of the end-to-end tests: watches the nodes that\n"
      "carry --node-label and every pod, runs the first container of each pod bound to one of\n"
      "those nodes as a local process (its command and args, with the container's env; Secrets,\n"
      "ConfigMaps and fieldRefs resolved), and keeps the pod's status true through pods/status:\n"
      "Running with pod IP 127.0.0.1, then Succeeded (exit 0) or Failed with the exit code and\n"
      "the end of the log. Every restartPolicy is treated as Never. Deleting a pod sends SIGTERM\n"
      "to its process group, SIGKILL after the grace period, then removes the pod object; a pod\n"
      "deleted outright has its processes SIGKILLed at once.\n\n"
      "Logs one line per action to stderr. SIGTERM or SIGINT stops it: its processes get\n"
      "SIGTERM, then SIGKILL after --shutdown-grace seconds; it exits 0.",
      "vf-pod-runner");
  app.footer("Exit status: 0 stopped by a signal; 1 cannot start (kubeconfig, log dir); 2 usage.");
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

  vf::podrunner::LogLine("starting: server " + config->server + ", nodes labelled " + node_label +
                         ", logs in " + log_dir + (path.empty() ? "" : ", PATH first " + path));

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

  vf::podrunner::PodRunner runner(**client, view, options);
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
