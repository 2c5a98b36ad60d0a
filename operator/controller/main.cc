// virtualflow-operator: watches VirtualFlowJobs, runs their worker pods, serves the coordinator
// the agents talk to, and exports metrics and health probes.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include "agent/metrics/http_exporter.h"
#include "cli/flags.h"
#include "operator/controller/controller.h"
#include "operator/coordinator/server.h"
#include "operator/kube/client.h"
#include "operator/kube/config.h"
#include "operator/kube/leader_election.h"
#include "operator/metrics/operator_metrics.h"

namespace {

// "host:port" -> {host, port}; port must be 0..65535.
vf::Result<std::pair<std::string, int>> SplitAddress(const std::string& flag,
                                                     const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return vf::InvalidArgument("--" + flag + " must be HOST:PORT, got '" + address + "'");
  }
  const std::string host = address.substr(0, colon);
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(address.substr(colon + 1), &used);
    if (used != address.size() - colon - 1) port = -1;
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 0 || port > 65535 || host.empty()) {
    return vf::InvalidArgument("--" + flag + " must be HOST:PORT with a port 0..65535, got '" +
                               address + "'");
  }
  return std::make_pair(host, port);
}

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

vf::ResizeReason ReasonOf(const std::string& kind) {
  if (kind == "grow") return vf::ResizeReason::kGrow;
  if (kind == "shrink") return vf::ResizeReason::kShrink;
  if (kind == "leave") return vf::ResizeReason::kLeave;
  if (kind == "rebalance") return vf::ResizeReason::kRebalance;
  return vf::ResizeReason::kFailure;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kubeconfig;
  std::string ns;
  bool leader_elect = true;
  std::string lease_ns = EnvOr("POD_NAMESPACE", "");
  std::string lease_name = "virtualflow-operator";
  std::string identity;
  std::string coordinator_listen = "0.0.0.0:7070";
  std::string coordinator_url;
  std::string http_listen = "0.0.0.0:8080";
  std::string agent_image = "virtualflow/agent:0.1.0";
  std::string policy = "elastic";
  int64_t agent_metrics_port = 9090;
  int64_t workers = 2;
  double join_batch = 20;
  double lease_duration = 15;
  double renew_deadline = 10;
  double retry_period = 2;
  vf::FlagParser flags(
      "usage: virtualflow-operator [flags]\n\n"
      "Runs VirtualFlowJobs on a Kubernetes cluster: sizes each job to the GPUs available\n"
      "within its replicas.min..max, creates and deletes its worker pods, publishes membership\n"
      "plans through the coordinator the agents talk to, and keeps each job's status current.\n"
      "Serves /metrics, /healthz and /readyz on --http-listen. With leader election (the\n"
      "default) only the replica holding the Lease acts; the others wait, not ready.\n\n"
      "Exit status: 0 stopped by SIGTERM/SIGINT; 1 leadership lost or a fatal error; 2 usage.");
  flags.AddString("kubeconfig", &kubeconfig,
                  "kubeconfig file (default: the pod's service account, in a cluster)");
  flags.AddString("namespace", &ns, "watch only this namespace (default: all)");
  flags.AddBool("leader-elect", &leader_elect,
                "elect one active replica with a Lease (default true)");
  flags.AddString("leader-election-namespace", &lease_ns,
                  "namespace of the Lease (default: $POD_NAMESPACE, else 'default')");
  flags.AddDouble("leader-election-lease-duration", &lease_duration,
                  "seconds a standby waits after the Lease last changed before taking over "
                  "(default 15)");
  flags.AddDouble("leader-election-renew-deadline", &renew_deadline,
                  "seconds the leader keeps trying to renew before it stops acting (default 10)");
  flags.AddDouble("leader-election-retry-period", &retry_period,
                  "seconds between renewals and acquisition attempts (default 2)");
  flags.AddString("leader-election-id", &lease_name,
                  "name of the Lease (default virtualflow-operator)");
  flags.AddString("identity", &identity,
                  "this replica's name in the Lease (default: $POD_NAME, else the host name)");
  flags.AddString("coordinator-listen", &coordinator_listen,
                  "HOST:PORT the coordinator listens on (default 0.0.0.0:7070)");
  flags.AddString(
      "coordinator-url", &coordinator_url,
      "URL worker pods reach the coordinator at (default: http://<coordinator-listen>)");
  flags.AddString("http-listen", &http_listen,
                  "HOST:PORT for /metrics, /healthz and /readyz (default 0.0.0.0:8080)");
  flags.AddString("agent-image", &agent_image,
                  "image of worker pods whose job sets no spec.template.image");
  flags.AddString("policy", &policy, "static, elastic or autoscale (default elastic)");
  flags.AddInt("agent-metrics-port", &agent_metrics_port,
               "port of each agent's /metrics (default 9090; 0 picks a free one; -1 none)");
  flags.AddInt("workers", &workers, "jobs reconciled at once (default 2)");
  flags.AddDouble("join-batch-seconds", &join_batch,
                  "how long a plan waits for joiners still warming up (default 20)");
  auto positional = flags.Parse(argc, argv, 1);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  auto usage = [](const std::string& m) {
    std::fprintf(stderr, "virtualflow-operator: error: %s\n", m.c_str());
    return 2;
  };
  if (!positional.ok()) return usage(positional.status().message());
  if (!positional->empty()) return usage("unexpected argument '" + positional->front() + "'");
  auto coord_addr = SplitAddress("coordinator-listen", coordinator_listen);
  if (!coord_addr.ok()) return usage(coord_addr.status().message());
  auto http_addr = SplitAddress("http-listen", http_listen);
  if (!http_addr.ok()) return usage(http_addr.status().message());
  if (workers < 1 || workers > 64) return usage("--workers must be between 1 and 64");
  if (agent_metrics_port < -1 || agent_metrics_port > 65535) {
    return usage("--agent-metrics-port must be -1..65535");
  }
  if (!(join_batch >= 0)) return usage("--join-batch-seconds must be non-negative");
  if (policy != "static" && policy != "elastic" && policy != "autoscale") {
    return usage("--policy must be static, elastic or autoscale, got '" + policy + "'");
  }
  if (identity.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    identity = EnvOr("POD_NAME", host);
  }
  if (lease_ns.empty()) lease_ns = "default";

  // Signals end the run through a stop token; a thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::stop_source process_stop;
  std::thread([&signals, process_stop]() mutable {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "virtualflow-operator: signal %d: stopping\n", sig);
    process_stop.request_stop();
  }).detach();

  auto config =
      kubeconfig.empty() ? vf::kube::InClusterConfig() : vf::kube::LoadKubeconfig(kubeconfig);
  if (!config.ok()) return usage(config.status().message());
  vf::OperatorMetrics metrics;
  auto client = vf::kube::Client::Create(*config);
  if (!client.ok()) return usage(client.status().message());
  (*client)->set_request_observer([&metrics](std::string_view verb, int code, double seconds) {
    metrics.OnApiRequest(verb, seconds,
                         code >= 200 && code < 300 ? std::string()
                         : code == 0               ? std::string("Transport")
                                                   : std::to_string(code));
  });
  // Renewals get a client of their own, so that reconcile traffic cannot delay them.
  auto election_client = vf::kube::Client::Create(*config);
  if (!election_client.ok()) return usage(election_client.status().message());

  vf::Coordinator coordinator;
  auto coordinator_server =
      vf::CoordinatorServer::Start(coordinator, coord_addr->first, coord_addr->second);
  if (!coordinator_server.ok()) {
    std::fprintf(stderr, "virtualflow-operator: error: coordinator: %s\n",
                 coordinator_server.status().message().c_str());
    return 1;
  }
  if (coordinator_url.empty()) coordinator_url = (*coordinator_server)->url();

  std::atomic<bool> leading{!leader_elect};
  std::atomic<vf::controller::Controller*> running{nullptr};
  auto ready = [&]() -> vf::Status {
    if (!leading.load()) return vf::Unavailable("not the leader");
    vf::controller::Controller* c = running.load();
    if (c == nullptr || !c->synced()) return vf::Unavailable("caches not synced");
    return vf::Status::Ok();
  };
  auto http =
      vf::MetricsServer::Start(metrics.registry(), http_addr->first, http_addr->second, ready);
  if (!http.ok()) {
    std::fprintf(stderr, "virtualflow-operator: error: metrics: %s\n",
                 http.status().message().c_str());
    return 1;
  }
  std::fprintf(stderr,
               "virtualflow-operator: coordinator on %s (workers use %s), metrics on %s, "
               "identity %s\n",
               (*coordinator_server)->url().c_str(), coordinator_url.c_str(),
               (*http)->url().c_str(), identity.c_str());

  vf::controller::ControllerOptions options;
  options.ns = ns;
  options.workers = static_cast<int>(workers);
  options.reconciler.policy = policy;
  options.reconciler.join_batch_seconds = join_batch;
  options.reconciler.pods.coordinator_url = coordinator_url;
  options.reconciler.pods.default_image = agent_image;
  options.reconciler.pods.metrics_port = static_cast<int>(agent_metrics_port);
  options.on_reconcile = [&metrics](double s, bool failed) { metrics.OnReconcile(s, failed); };
  options.on_queue_depth = [&metrics](size_t d) {
    metrics.SetWorkqueueDepth(static_cast<int64_t>(d));
  };
  auto split = [](const std::string& key) {
    const size_t slash = key.find('/');
    return std::make_pair(key.substr(0, slash), key.substr(slash + 1));
  };
  // Phases of every job, kept for the jobs-by-phase gauge.
  auto phases = std::make_shared<std::pair<std::mutex, std::map<std::string, std::string>>>();
  auto publish_phases = [&metrics, phases]() {
    std::map<std::string, int64_t> counts;
    for (const auto& [job, phase] : phases->second) counts[phase] += 1;
    metrics.SetJobsByPhase(counts);
  };
  options.hooks.on_resize = [&metrics, split](const std::string& job, const std::string& kind, int,
                                              int) {
    auto [job_ns, name] = split(job);
    metrics.OnResize(job_ns, name, ReasonOf(kind));
  };
  options.hooks.on_resize_pause = [&metrics, split](const std::string& job, double seconds) {
    auto [job_ns, name] = split(job);
    metrics.ObserveResizePause(job_ns, name, seconds);
  };
  options.hooks.on_job_status = [&metrics, split, phases, publish_phases](
                                    const std::string& job, const nlohmann::json& status,
                                    const nlohmann::json& spec) {
    auto [job_ns, name] = split(job);
    vf::OperatorMetrics::WorkerCounts counts;
    counts.current = status.value("workers", 0);
    counts.desired = status.value("desiredWorkers", 0);
    counts.ready = status.value("readyWorkers", 0);
    const nlohmann::json replicas = spec.value("replicas", nlohmann::json::object());
    counts.min = replicas.value("min", 1);
    counts.max = replicas.value("max", counts.min);
    metrics.SetJobWorkers(job_ns, name, counts);
    metrics.SetJobProgress(job_ns, name, status.value("step", int64_t{0}),
                           status.value("samplesPerSecond", 0.0));
    std::lock_guard<std::mutex> lock(phases->first);
    phases->second[job] = status.value("phase", "Pending");
    publish_phases();
  };
  options.hooks.on_job_gone = [&metrics, split, phases, publish_phases](const std::string& job) {
    auto [job_ns, name] = split(job);
    metrics.RemoveJob(job_ns, name);
    std::lock_guard<std::mutex> lock(phases->first);
    phases->second.erase(job);
    publish_phases();
  };
  options.hooks.on_inventory = [&metrics](const vf::controller::ClusterGpus& gpus) {
    std::map<std::string, vf::OperatorMetrics::GpuCounts> by_product;
    for (const auto& [product, c] : gpus.products) {
      by_product[product] = {c.free(), c.allocated, c.total};
    }
    metrics.SetGpuInventory(by_product);
  };

  // Runs the controller until `stop`; the caller's thread blocks.
  auto run_controller = [&](std::stop_token stop) {
    vf::controller::Controller controller(**client, coordinator, options);
    running.store(&controller);
    vf::Status s = controller.Run(stop);
    running.store(nullptr);
    if (!s.ok()) {
      std::fprintf(stderr, "virtualflow-operator: error: %s\n", s.message().c_str());
    }
  };

  int exit_code = 0;
  if (!leader_elect) {
    metrics.SetLeader(true);
    run_controller(process_stop.get_token());
  } else {
    std::jthread controller_thread;
    vf::kube::LeaderElectionConfig election;
    election.ns = lease_ns;
    election.name = lease_name;
    election.identity = identity;
    auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
    election.lease_duration = ms(lease_duration);
    election.renew_deadline = ms(renew_deadline);
    election.retry_period = ms(retry_period);
    election.on_started_leading = [&](std::stop_token term) {
      std::fprintf(stderr, "virtualflow-operator: %s leads\n", identity.c_str());
      leading.store(true);
      metrics.SetLeader(true);
      controller_thread = std::jthread([&run_controller, term] { run_controller(term); });
    };
    election.on_stopped_leading = [&] {
      // The term's stop token is already stopped: wait until the controller has stopped acting.
      leading.store(false);
      metrics.SetLeader(false);
      if (controller_thread.joinable()) controller_thread.join();
    };
    election.on_new_leader = [&](const std::string& who) {
      std::fprintf(stderr, "virtualflow-operator: leader is %s\n", who.c_str());
    };
    auto elector = vf::kube::LeaderElector::Create(**election_client, election);
    if (!elector.ok()) return usage(elector.status().message());
    vf::Status s = (*elector)->Run(process_stop.get_token());
    if (!s.ok()) {
      // client-go exits here too: a replica that lost its Lease must not act on stale state;
      // the Deployment restarts it as a candidate.
      std::fprintf(stderr, "virtualflow-operator: leadership lost: %s\n", s.message().c_str());
      exit_code = 1;
    }
  }
  (*http)->Stop();
  (*coordinator_server)->Stop();
  std::fprintf(stderr, "virtualflow-operator: stopped\n");
  // Exit without unwinding detached threads (the signal waiter may still block in sigwait).
  std::fflush(stderr);
  std::_Exit(exit_code);
}
