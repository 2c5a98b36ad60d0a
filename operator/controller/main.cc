// virtualflow-operator: watches VirtualFlowJobs, runs their worker pods, serves the coordinator
// the agents talk to, and exports metrics and health probes.
//
// main() reads as the steps the operator goes through: read the flags, take over SIGTERM and
// SIGINT, connect to the API server, start the coordinator and the metrics server, then run the
// controller (alone, or while this replica holds the Lease) until a signal or lost leadership,
// and stop.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "agent/http/listener.h"
#include "agent/metrics/http_exporter.h"
#include "operator/controller/controller.h"
#include "operator/controller/coordinator_tls.h"
#include "operator/controller/job_key.h"
#include "operator/controller/leader_label.h"
#include "operator/controller/memory_budget.h"
#include "operator/coordinator/server.h"
#include "operator/kube/client.h"
#include "operator/kube/config.h"
#include "operator/kube/leader_election.h"
#include "operator/metrics/controller_metrics.h"
#include "operator/metrics/operator_metrics.h"
#include "operator/policy/membership.h"
#include "operator/policy/policy.h"
#include "runtime/command_line.h"

namespace {

constexpr const char* kProgram = "virtualflow-operator";
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // leadership lost, or a server could not start

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// VF_TEST_OPERATOR_PROTOCOL: a positive integer, or empty for none (0).
vf::Result<int64_t> ParseTestProtocol(const std::string& text) {
  if (text.empty()) return int64_t{0};
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0' || value <= 0) {
    return vf::InvalidArgument("VF_TEST_OPERATOR_PROTOCOL must be a positive integer, not '" +
                               text + "'");
  }
  return static_cast<int64_t>(value);
}

// What the command line sets, checked, with the defaults that depend on the environment filled
// in.
struct OperatorFlags {
  std::string kubeconfig;
  std::string ns;
  bool leader_elect = true;
  std::string lease_ns;
  std::string lease_name = "virtualflow-operator";
  std::string identity;
  std::string coordinator_listen = "0.0.0.0:7070";
  std::string coordinator_url;
  bool coordinator_tls = true;
  std::string tls_secret = vf::controller::kDefaultTlsSecret;
  std::string job_key_secret = vf::controller::kDefaultJobKeySecret;
  std::string http_listen = "0.0.0.0:8080";
  std::string agent_image = "virtualflow/agent:0.1.0";
  std::string policy = "elastic";
  int64_t agent_metrics_port = 9090;
  bool network_policy = true;
  bool require_queue = false;
  // NetworkPolicy peers admitted to the workers' metrics port, as JSON; the chart's default.
  std::string network_policy_metrics_from =
      R"([{"namespaceSelector": {}, "podSelector": {"matchLabels": )"
      R"({"app.kubernetes.io/name": "prometheus"}}}])";
  nlohmann::json metrics_from;  // parsed
  // Jobs reconciled at once. A new job's reconcile is 6 API round trips one after the other
  // (its NetworkPolicy, each pod and its credential Secret, the status), so it is the latency
  // of the API server, not the operator's CPU, that one worker waits on: 16 keep a budget of
  // 150 requests a second busy at ~100 ms a round trip. Threads that mostly wait.
  int64_t workers = 16;
  double join_batch = vf::policy::kJoinBatchSeconds;
  double lease_duration = 15;
  double renew_deadline = 10;
  double retry_period = 2;
  // The main client's request budget (docs/operations.md, "The operator's API budget"). A new
  // job of two workers costs 6 requests, 3 a pod: at 150 a second the operator creates pods as
  // fast as kube-scheduler, at its default budget of 50 a second, binds them, and the 6,000
  // requests of 1000 jobs submitted at once take ~38 s. client-go's 20/30 would take ~300 s.
  // controller-runtime leaves client-side limits off and relies on the API server's priority
  // and fairness, which guards the server whatever this budget allows.
  double kube_api_qps = 150;
  int64_t kube_api_burst = 300;
  // --coordinator-memory-budget as given (empty: from the container's memory limit), and what
  // the coordinator gets (CoordinatorMemoryBudget).
  std::string coordinator_memory_budget;
  uint64_t memory_budget = 0;
  // --coordinator-listen and --http-listen split into host and port.
  std::pair<std::string, int> coordinator_address;
  std::pair<std::string, int> http_address;
  // This replica's pod (POD_NAMESPACE, POD_NAME), which the leader labels; empty outside one.
  vf::controller::OwnPod own_pod;
};

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

// The flags. std::nullopt to go on, else the exit status (--help, or bad usage already
// reported).
std::optional<int> ParseFlags(int argc, char** argv, OperatorFlags& f) {
  f.lease_ns = EnvOr("POD_NAMESPACE", "");
  f.own_pod = {EnvOr("POD_NAMESPACE", ""), EnvOr("POD_NAME", "")};
  CLI::App app(
      "Runs VirtualFlowJobs on a Kubernetes cluster: sizes each job to the GPUs available\n"
      "within its replicas.min..max, creates and deletes its worker pods, publishes membership\n"
      "plans through the coordinator the agents talk to, and keeps each job's status current.\n"
      "Serves /metrics, /healthz and /readyz on --http-listen. With leader election (the\n"
      "default) only the replica holding the Lease acts; the others stand by, ready to take\n"
      "over. In a pod ($POD_NAMESPACE, $POD_NAME), the acting replica labels it\n"
      "virtualflow.io/leader=true, which the coordinator's Service selects.",
      kProgram);
  app.footer(
      "Exit status: 0 stopped by SIGTERM/SIGINT; 1 leadership lost or a fatal error; 2 usage.");
  app.add_option("--kubeconfig", f.kubeconfig,
                 "kubeconfig file (default: the pod's service account, in a cluster)")
      ->type_name("PATH");
  app.add_option("--namespace", f.ns, "watch only this namespace (default: all)");
  app.add_flag("--leader-elect", f.leader_elect,
               "elect one active replica with a Lease (default true;\n"
               "--leader-elect=false runs without)");
  app.add_option("--leader-election-namespace", f.lease_ns,
                 "namespace of the Lease (default: $POD_NAMESPACE, else 'default')");
  app.add_option("--leader-election-lease-duration", f.lease_duration,
                 "seconds a standby waits after the Lease last changed before\n"
                 "taking over")
      ->check(vf::FiniteNumber())
      ->capture_default_str();
  app.add_option("--leader-election-renew-deadline", f.renew_deadline,
                 "seconds the leader keeps trying to renew before it stops acting")
      ->check(vf::FiniteNumber())
      ->capture_default_str();
  app.add_option("--leader-election-retry-period", f.retry_period,
                 "seconds between renewals and acquisition attempts")
      ->check(vf::FiniteNumber())
      ->capture_default_str();
  app.add_option("--leader-election-id", f.lease_name, "name of the Lease")->capture_default_str();
  app.add_option("--identity", f.identity,
                 "this replica's name in the Lease (default: $POD_NAME, else the\n"
                 "host name)");
  app.add_option("--coordinator-listen", f.coordinator_listen,
                 "HOST:PORT the coordinator listens on")
      ->capture_default_str();
  app.add_option("--coordinator-url", f.coordinator_url,
                 "URL worker pods reach the coordinator at (default:\n"
                 "https://<coordinator-listen>, http:// without TLS)");
  app.add_flag("--coordinator-tls", f.coordinator_tls,
               "serve the coordinator over HTTPS only, with a certificate from\n"
               "--coordinator-tls-secret (default true; --coordinator-tls=false: plain HTTP)");
  app.add_option("--coordinator-tls-secret", f.tls_secret,
                 "Secret in the operator's namespace ($POD_NAMESPACE, else\n"
                 "--leader-election-namespace) holding the coordinator's CA and\n"
                 "certificate; created when missing, renewed before expiry")
      ->capture_default_str();
  app.add_option("--job-key-secret", f.job_key_secret,
                 "Secret in the operator's namespace holding the key every job's\n"
                 "secret (and so every worker's credential) is derived from;\n"
                 "created when missing, never replaced")
      ->capture_default_str();
  app.add_option("--http-listen", f.http_listen, "HOST:PORT for /metrics, /healthz and /readyz")
      ->capture_default_str();
  app.add_option("--agent-image", f.agent_image,
                 "image of worker pods whose job's worker container names none (a job that\n"
                 "trains keeps the image it started on: status.workerImage)")
      ->capture_default_str();
  app.add_option("--policy", f.policy,
                 "for jobs whose manifest names no spec.elasticity.policy (a job that\n"
                 "names one is sized by its own), one of:\n" +
                     vf::policy::PolicyHelp("  "))
      ->capture_default_str();
  app.add_option("--agent-metrics-port", f.agent_metrics_port,
                 "port of each agent's /metrics (0 picks a free one; -1 none)")
      ->transform(vf::Base10Integer())
      ->capture_default_str();
  app.add_flag("--network-policy", f.network_policy,
               "give each job a NetworkPolicy that admits only the job's own pods\n"
               "to its workers (default true; --network-policy=false: none, for a\n"
               "cluster whose CNI ignores NetworkPolicies)");
  app.add_option("--network-policy-metrics-from", f.network_policy_metrics_from,
                 "JSON array of NetworkPolicy peers admitted to the workers'\n"
                 "--agent-metrics-port")
      ->capture_default_str();
  app.add_flag("--require-kueue-queue", f.require_queue,
               "run every job through Kueue: a job without the label\n"
               "kueue.x-k8s.io/queue-name gets no workers and waits, its condition\n"
               "Admitted saying so (default false: such a job is scheduled by the\n"
               "operator alone)");
  app.add_option("--workers", f.workers, "jobs reconciled at once")
      ->transform(vf::Base10Integer())
      ->capture_default_str();
  app.add_option("--join-batch-seconds", f.join_batch,
                 "how long a plan waits for joiners still warming up")
      ->check(vf::FiniteNumber())
      ->capture_default_str();
  const auto Positive = [](const std::string& value) -> std::string {
    return std::strtod(value.c_str(), nullptr) > 0 ? "" : "must be greater than 0, got " + value;
  };
  app.add_option("--kube-api-qps", f.kube_api_qps,
                 "requests per second to the API server, sustained (the Lease's client apart)")
      ->check(vf::FiniteNumber())
      ->check(Positive)
      ->capture_default_str();
  app.add_option("--coordinator-memory-budget", f.coordinator_memory_budget,
                 "bytes (or a quantity: 256Mi, 1Gi) the coordinator may hold for all\n"
                 "jobs' rendezvous stores and workers together, refusing what would\n"
                 "grow past it (default: half the container's cgroup memory limit, at\n"
                 "most 1Gi)")
      ->type_name("BYTES");
  app.add_option("--kube-api-burst", f.kube_api_burst,
                 "requests to the API server allowed at once above --kube-api-qps")
      ->transform(vf::Base10Integer())
      ->check(Positive)
      ->capture_default_str();
  if (auto exit_code = vf::ParseCommandLine(app, kProgram, argc, argv)) return exit_code;

  auto usage = [](const std::string& m) { return vf::UsageError(kProgram, m); };
  auto coord_addr = SplitAddress("coordinator-listen", f.coordinator_listen);
  if (!coord_addr.ok()) return usage(coord_addr.status().message());
  f.coordinator_address = *coord_addr;
  auto http_addr = SplitAddress("http-listen", f.http_listen);
  if (!http_addr.ok()) return usage(http_addr.status().message());
  f.http_address = *http_addr;
  if (f.workers < 1 || f.workers > 64) return usage("--workers must be between 1 and 64");
  if (f.agent_metrics_port < -1 || f.agent_metrics_port > 65535) {
    return usage("--agent-metrics-port must be -1..65535");
  }
  if (!(f.join_batch >= 0)) return usage("--join-batch-seconds must be non-negative");
  if (vf::Status known = vf::policy::CheckPolicyName("--policy", f.policy); !known.ok()) {
    return usage(known.message());
  }
  if (!f.coordinator_url.empty() &&
      f.coordinator_url.rfind(f.coordinator_tls ? "https://" : "http://", 0) != 0) {
    return usage(
        std::string("--coordinator-url must start with ") +
        (f.coordinator_tls ? "https:// (TLS is on)" : "http:// (--coordinator-tls=false)") +
        ", got '" + f.coordinator_url + "'");
  }
  f.metrics_from = nlohmann::json::parse(f.network_policy_metrics_from, nullptr, false);
  if (!f.metrics_from.is_array() ||
      !std::all_of(f.metrics_from.begin(), f.metrics_from.end(),
                   [](const nlohmann::json& peer) { return peer.is_object(); })) {
    return usage(
        "--network-policy-metrics-from must be a JSON array of NetworkPolicy peers, got '" +
        f.network_policy_metrics_from + "'");
  }
  std::optional<uint64_t> budget_flag;
  if (!f.coordinator_memory_budget.empty()) {
    auto parsed = vf::controller::ParseByteQuantity(f.coordinator_memory_budget);
    if (!parsed.ok()) return usage("--coordinator-memory-budget: " + parsed.status().message());
    budget_flag = *parsed;
  }
  f.memory_budget = vf::controller::CoordinatorMemoryBudget(
      budget_flag, budget_flag ? std::nullopt : vf::controller::CgroupMemoryLimit(),
      vf::Coordinator::kDefaultMemoryBudget);
  if (f.identity.empty()) {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    f.identity = EnvOr("POD_NAME", host);
  }
  if (f.lease_ns.empty()) f.lease_ns = "default";
  return std::nullopt;
}

// SIGTERM and SIGINT end the run through the returned stop source; a detached thread
// waits for them. Called before any other thread starts, so that every thread inherits the mask.
std::stop_source StopOnSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::stop_source process_stop;
  std::thread([signals, process_stop]() mutable {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "virtualflow-operator: signal %d: stopping\n", sig);
    process_stop.request_stop();
  }).detach();
  return process_stop;
}

// The operator's two connections to the API server.
struct ApiClients {
  std::unique_ptr<vf::kube::Client> main;  // informers, reconciles, status writes
  // Lease renewals get a client of their own, so that reconcile traffic cannot delay them.
  std::unique_ptr<vf::kube::Client> election;
};

// Clients for the API server of --kubeconfig, or of the pod's service account; every
// request of the main client is counted in `metrics`.
vf::Result<ApiClients> ConnectToApiServer(const OperatorFlags& f, vf::OperatorMetrics& metrics) {
  auto config =
      f.kubeconfig.empty() ? vf::kube::InClusterConfig() : vf::kube::LoadKubeconfig(f.kubeconfig);
  if (!config.ok()) return config.status();
  vf::kube::ClientOptions options;
  options.qps = f.kube_api_qps;
  options.burst = static_cast<int>(f.kube_api_burst);
  auto client = vf::kube::Client::Create(*config, options);
  if (!client.ok()) return client.status();
  (*client)->set_request_observer([&metrics](std::string_view verb, int code, double seconds) {
    metrics.OnApiRequest(verb, seconds,
                         code >= 200 && code < 300 ? std::string()
                         : code == 0               ? std::string("Transport")
                                                   : std::to_string(code));
  });
  auto election_client = vf::kube::Client::Create(*config);
  if (!election_client.ok()) return election_client.status();
  return ApiClients{std::move(client).value(), std::move(election_client).value()};
}

// The coordinator's TLS material from its Secret (made or renewed there when due), and a thread
// that checks it every kCheckEvery until `stop`, serving a renewed server certificate from the
// next handshake on. The CA is the one worker pods get; it is renewed only here, at a start.
// Value type (the credentials it points to are thread-safe).
struct CoordinatorTlsState {
  std::shared_ptr<vf::http::ServerCredentials> credentials;
  std::string ca;
};

vf::Result<CoordinatorTlsState> StartCoordinatorTls(const OperatorFlags& f,
                                                    vf::kube::Client& client,
                                                    std::stop_token stop) {
  vf::controller::CoordinatorTlsOptions options;
  options.ns = f.lease_ns;
  options.secret = f.tls_secret;
  options.names = vf::controller::CoordinatorNames(
      f.coordinator_url.empty() ? "https://" + vf::http::HostForUri(f.coordinator_address.first)
                                : f.coordinator_url);
  VF_ASSIGN_OR_RETURN(const vf::controller::CoordinatorTls tls,
                      vf::controller::EnsureCoordinatorTls(client, options, /*renew_ca=*/true));
  VF_ASSIGN_OR_RETURN(auto credentials, vf::http::ServerCredentials::Create(tls.server));
  std::thread([&client, options, credentials, served = tls, stop]() mutable {
    std::mutex mu;
    std::condition_variable_any wake;
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      wake.wait_for(lock, stop, vf::controller::kCheckEvery, [] { return false; });
      if (stop.stop_requested()) return;
      auto stored = vf::controller::EnsureCoordinatorTls(client, options, /*renew_ca=*/false);
      auto next = stored.ok() ? vf::controller::NextServed(served, *stored, options.names,
                                                           std::chrono::system_clock::now())
                              : stored.status();
      if (!next.ok()) {
        std::fprintf(stderr, "virtualflow-operator: warning: %s\n",
                     next.status().message().c_str());
      } else if (next->has_value()) {
        vf::Status replaced = credentials->Replace((*next)->server);
        if (replaced.ok()) served = **next;
        std::fprintf(stderr, "virtualflow-operator: coordinator certificate renewed: %s\n",
                     replaced.ToString().c_str());
      }
    }
  }).detach();
  return CoordinatorTlsState{std::move(credentials), tls.ca.certificate_pem};
}

// What /readyz reports: whether this replica can do its part now. The leader (or the one
// operator without leader election) once its controller's caches have synced; a standby once it
// campaigns for the Lease, so that it can take over. Every healthy replica is ready, so that a
// Deployment of two is Available and a PodDisruptionBudget can let one go; the leader label
// (leader_label.h), not readiness, sends agents to the leader's coordinator. Shared by the
// metrics server's threads, the election and the controller's thread. Thread-safe (atomics).
class Leadership {
 public:
  explicit Leadership(bool leading) : leading_(leading) {}

  void SetLeading(bool leading) { leading_.store(leading); }
  // Whether the elector runs (its stale leader label cleared), standing by or leading.
  void SetCampaigning(bool campaigning) { campaigning_.store(campaigning); }
  // The controller that runs now, or nullptr; it must stay alive until replaced by nullptr.
  void SetRunning(vf::controller::Controller* controller) { running_.store(controller); }

  vf::Status Ready() const {
    if (leading_.load()) {
      vf::controller::Controller* c = running_.load();
      if (c == nullptr || !c->synced()) return vf::Unavailable("leading; caches not synced yet");
      return vf::Status::Ok();
    }
    if (!campaigning_.load()) return vf::Unavailable("not campaigning for the Lease yet");
    return vf::Status::Ok();
  }

 private:
  std::atomic<bool> leading_;
  std::atomic<bool> campaigning_{false};
  std::atomic<vf::controller::Controller*> running_{nullptr};
};

// The leader label's calls: how long one may take, and how often a failed one is tried again.
constexpr std::chrono::milliseconds kLabelTimeout{2000};

void LogWarning(std::string_view line) {
  std::fprintf(stderr, "virtualflow-operator: warning: %.*s\n", static_cast<int>(line.size()),
               line.data());
}

// Serves /metrics, /healthz and /readyz on --http-listen, or the error, already reported.
auto StartMetricsServer(vf::OperatorMetrics& metrics, const OperatorFlags& f,
                        const Leadership& leadership) {
  auto ready = [&leadership]() -> vf::Status { return leadership.Ready(); };
  auto http = vf::MetricsServer::Start(metrics.registry(), f.http_address.first,
                                       f.http_address.second, ready);
  if (!http.ok()) {
    std::fprintf(stderr, "virtualflow-operator: error: metrics: %s\n",
                 http.status().message().c_str());
  }
  return http;
}

// What the controller does, from the flags; worker pods reach the coordinator at
// `coordinator_url`.
vf::controller::ControllerOptions MakeControllerOptions(const OperatorFlags& f,
                                                        const std::string& coordinator_url,
                                                        const std::string& coordinator_ca,
                                                        const std::string& job_key,
                                                        vf::OperatorMetrics& metrics) {
  vf::controller::ControllerOptions options;
  options.ns = f.ns;
  options.workers = static_cast<int>(f.workers);
  options.reconciler.policy = f.policy;
  options.reconciler.join_batch_seconds = f.join_batch;
  options.reconciler.pods.coordinator_url = coordinator_url;
  options.reconciler.pods.coordinator_ca = coordinator_ca;
  options.reconciler.job_key = job_key;
  options.reconciler.pods.default_image = f.agent_image;
  options.reconciler.pods.metrics_port = static_cast<int>(f.agent_metrics_port);
  options.reconciler.require_queue = f.require_queue;
  if (f.network_policy) {
    options.reconciler.network_policy = vf::controller::NetworkPolicySettings{f.metrics_from};
  }
  vf::ReportControllerMetrics(options, metrics);
  return options;
}

// Puts the leader label on `pod` once `controller` has synced its caches (agents sent to it
// before would wait on a coordinator that publishes no plans), trying until `stop`.
void LabelOnceSynced(std::stop_token stop, vf::kube::Client& client,
                     const vf::controller::OwnPod& pod,
                     const vf::controller::Controller& controller) {
  if (!pod.known()) return;
  std::mutex mu;
  std::condition_variable_any wake;
  std::unique_lock<std::mutex> lock(mu);
  while (!controller.synced()) {
    wake.wait_for(lock, stop, std::chrono::milliseconds(100), [] { return false; });
    if (stop.stop_requested()) return;
  }
  if (vf::controller::MarkLeaderUntilDone(client, pod, /*leading=*/true, kLabelTimeout, stop,
                                          LogWarning)
          .ok()) {
    std::fprintf(stderr, "virtualflow-operator: pod %s/%s labelled %s=%s\n", pod.ns.c_str(),
                 pod.name.c_str(), vf::controller::kLeaderLabel, vf::controller::kLeaderLabelValue);
  }
}

// Runs one controller until `stop`, published in `leadership` while it runs, and labels `pod` the
// leader's once it has synced; the caller's thread blocks. Errors are reported here: the caller
// decides from leadership what happens next. The label is never set after this returns.
void RunController(std::stop_token stop, vf::kube::Client& client, vf::kube::Client& label_client,
                   const vf::controller::OwnPod& pod, vf::Coordinator& coordinator,
                   const vf::controller::ControllerOptions& options, Leadership& leadership) {
  vf::controller::Controller controller(client, coordinator, options);
  leadership.SetRunning(&controller);
  std::stop_source label_stop;  // the term's end, or a controller that returned early
  std::stop_callback term_ended(stop, [&label_stop] { label_stop.request_stop(); });
  std::jthread label([&label_client, &pod, &controller, token = label_stop.get_token()] {
    LabelOnceSynced(token, label_client, pod, controller);
  });
  vf::Status s = controller.Run(stop);
  label_stop.request_stop();
  label.join();
  leadership.SetRunning(nullptr);
  if (!s.ok()) {
    std::fprintf(stderr, "virtualflow-operator: error: %s\n", s.message().c_str());
  }
}

// Runs the controller while this replica holds the Lease, until `stop`. The exit
// status: 0 when stopped, 1 when leadership was lost, 2 for a bad election configuration.
int RunWhileLeading(std::stop_token stop, const OperatorFlags& f, vf::kube::Client& election_client,
                    vf::OperatorMetrics& metrics, Leadership& leadership,
                    const std::function<void(std::stop_token)>& run_controller) {
  std::jthread controller_thread;
  vf::kube::LeaderElectionConfig election;
  election.ns = f.lease_ns;
  election.name = f.lease_name;
  election.identity = f.identity;
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
  election.lease_duration = ms(f.lease_duration);
  election.renew_deadline = ms(f.renew_deadline);
  election.retry_period = ms(f.retry_period);
  election.on_started_leading = [&](std::stop_token term) {
    std::fprintf(stderr, "virtualflow-operator: %s leads\n", f.identity.c_str());
    leadership.SetLeading(true);
    metrics.SetLeader(true);
    controller_thread = std::jthread([&run_controller, term] { run_controller(term); });
  };
  election.on_stopped_leading = [&] {
    // The term's stop token is already stopped: wait until the controller has stopped acting.
    // A replica whose term ended is done (Run returns, and the process exits): not ready.
    leadership.SetCampaigning(false);
    leadership.SetLeading(false);
    metrics.SetLeader(false);
    if (controller_thread.joinable()) controller_thread.join();
    // Off before the Lease is released, so that the Service stops sending agents here. One
    // short try: a leader that lost its Lease may not reach the API server, and then a label
    // left behind does not matter, since this process exits and is not ready again until it
    // has cleared the label at its restart.
    vf::Status off =
        vf::controller::MarkLeader(election_client, f.own_pod, /*leading=*/false, kLabelTimeout);
    if (!off.ok()) LogWarning(off.message());
  };
  election.on_new_leader = [&](const std::string& who) {
    std::fprintf(stderr, "virtualflow-operator: leader is %s\n", who.c_str());
  };
  auto elector = vf::kube::LeaderElector::Create(election_client, election);
  if (!elector.ok()) return vf::UsageError(kProgram, elector.status().message());
  // A container restarted in the pod of a leader that died may find the label still on: clear
  // it before standing by (ready), so that the Service never reaches a standby.
  if (!vf::controller::MarkLeaderUntilDone(election_client, f.own_pod, /*leading=*/false,
                                           kLabelTimeout, stop, LogWarning)
           .ok()) {
    return kExitOk;  // stopped first
  }
  leadership.SetCampaigning(true);
  vf::Status s = (*elector)->Run(stop);
  if (!s.ok()) {
    // client-go exits here too: a replica that lost its Lease must not act on stale state;
    // the Deployment restarts it as a candidate.
    std::fprintf(stderr, "virtualflow-operator: leadership lost: %s\n", s.message().c_str());
    return kExitFailed;
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  OperatorFlags flags;
  if (auto exit_code = ParseFlags(argc, argv, flags)) return *exit_code;
  // Test-only settings, read once: a phase to kill the operator at (fault.h), and a build to
  // pose as (an operator upgraded under running jobs).
  auto fault = vf::controller::OperatorFault::Parse(EnvOr("VF_FAULT_OPERATOR_EXIT_AT", ""));
  if (!fault.ok()) return vf::UsageError(kProgram, fault.status().message());
  const std::string test_build = EnvOr("VF_TEST_OPERATOR_BUILD", "");
  // And a coordinator protocol to pose as (an upgrade that changed it): its coordinator speaks
  // that protocol, and so do the workers it starts (kTestAgentProtocolEnv). Neither the chart
  // (whose values cannot set the operator's environment) nor a job (whose template cannot set
  // the workers' variable) can set it.
  auto test_protocol = ParseTestProtocol(EnvOr("VF_TEST_OPERATOR_PROTOCOL", ""));
  if (!test_protocol.ok()) return vf::UsageError(kProgram, test_protocol.status().message());
  std::stop_source process_stop = StopOnSignals();

  vf::OperatorMetrics metrics;
  auto clients = ConnectToApiServer(flags, metrics);
  if (!clients.ok()) return vf::UsageError(kProgram, clients.status().message());

  // Every replica reads the same key, so a restart or a new leader derives the same job secrets.
  auto job_key = vf::controller::EnsureJobKey(*clients->main, flags.lease_ns, flags.job_key_secret);
  if (!job_key.ok()) {
    std::fprintf(stderr, "virtualflow-operator: error: %s\n", job_key.status().message().c_str());
    return kExitFailed;
  }
  CoordinatorTlsState tls;
  if (flags.coordinator_tls) {
    auto started = StartCoordinatorTls(flags, *clients->main, process_stop.get_token());
    if (!started.ok()) {
      std::fprintf(stderr, "virtualflow-operator: error: coordinator TLS: %s\n",
                   started.status().message().c_str());
      return kExitFailed;
    }
    tls = std::move(started).value();
  }
  vf::Coordinator coordinator(static_cast<size_t>(flags.memory_budget),
                              *test_protocol > 0 ? *test_protocol : vf::kProtocolVersion);
  auto coordinator_server =
      vf::CoordinatorServer::Start(coordinator, flags.coordinator_address.first,
                                   flags.coordinator_address.second, tls.credentials);
  if (!coordinator_server.ok()) {
    std::fprintf(stderr, "virtualflow-operator: error: coordinator: %s\n",
                 coordinator_server.status().message().c_str());
    return kExitFailed;
  }
  const std::string coordinator_url =
      flags.coordinator_url.empty() ? (*coordinator_server)->url() : flags.coordinator_url;

  Leadership leadership(/*leading=*/!flags.leader_elect);
  auto http = StartMetricsServer(metrics, flags, leadership);
  if (!http.ok()) return kExitFailed;
  std::fprintf(stderr,
               "virtualflow-operator: coordinator on %s (workers use %s, memory budget %llu "
               "bytes), metrics on %s, identity %s\n",
               (*coordinator_server)->url().c_str(), coordinator_url.c_str(),
               static_cast<unsigned long long>(flags.memory_budget), (*http)->url().c_str(),
               flags.identity.c_str());

  // The controller, alone or while leading, until a signal or lost leadership.
  vf::controller::ControllerOptions options =
      MakeControllerOptions(flags, coordinator_url, tls.ca, *job_key, metrics);
  options.reconciler.fault = *fault;
  options.reconciler.build = test_build;
  if (!test_build.empty()) {
    std::fprintf(stderr, "virtualflow-operator: testing: posing as build %s\n", test_build.c_str());
  }
  options.reconciler.pods.test_agent_protocol = *test_protocol;
  if (*test_protocol > 0) {
    std::fprintf(stderr,
                 "virtualflow-operator: testing: posing as coordinator protocol %lld (this build "
                 "speaks %lld)\n",
                 static_cast<long long>(*test_protocol),
                 static_cast<long long>(vf::kProtocolVersion));
  }
  const std::function<void(std::stop_token)> run_controller = [&](std::stop_token stop) {
    RunController(stop, *clients->main, *clients->election, flags.own_pod, coordinator, options,
                  leadership);
  };
  int exit_code = kExitOk;
  if (!flags.leader_elect) {
    metrics.SetLeader(true);
    run_controller(process_stop.get_token());
  } else {
    exit_code = RunWhileLeading(process_stop.get_token(), flags, *clients->election, metrics,
                                leadership, run_controller);
  }

  // Stop serving, and exit without unwinding detached threads (the signal waiter may
  // still block in sigwait).
  (*http)->Stop();
  (*coordinator_server)->Stop();
  std::fprintf(stderr, "virtualflow-operator: stopped\n");
  std::fflush(stderr);
  std::_Exit(exit_code);
}
