// virtualflow-agent: the process that runs in every pod (or every local worker slot).
#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/agent.h"
#include "agent/protocol/client.h"
#include "agent/worker.h"
#include "runtime/command_line.h"
#include "runtime/job/worker_env.h"

namespace {

// A launcher that sets VF_EXIT_WITH_PARENT=<its pid> wants its workers gone when it dies, even
// by SIGKILL, rather than training on alone.
void ExitWithParent() {
  const char* parent = std::getenv(vf::worker_env::kExitWithParent.name);
  if (parent == nullptr) return;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (std::to_string(getppid()) != parent) std::_Exit(1);  // the parent died before prctl
}

void OnTerm(int /*sig*/) { vf::RequestLeave(); }

// What the whole job cannot survive, as opposed to what a replacement worker may: the
// coordinator's own refusals never come here as kNotFound (the agent turns a coordinator that
// forgot the job or the worker, after an operator restart, into a registration again and, past
// its timeout, kUnavailable), so kNotFound is a missing dataset or job file.
bool IsJobFailure(vf::StatusCode code) {
  switch (code) {
    case vf::StatusCode::kNumerical:
    case vf::StatusCode::kInvalidArgument:
    case vf::StatusCode::kFailedPrecondition:
    case vf::StatusCode::kDataLoss:
    case vf::StatusCode::kNotFound:
      return true;
    default:
      return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  ExitWithParent();
  vf::WorkerOptions o;
  std::string token_file;
  int64_t metrics_port = -1;
  CLI::App app(
      "Trains the virtual nodes the coordinator's membership plans give this worker, and\n"
      "follows those plans between steps. Started by `vf run` or by the operator, one per pod.\n"
      "This worker's own coordinator credential comes from --token-file or the VF_JOB_TOKEN\n"
      "environment variable; a token or CA file that cannot be read is read again for up to\n"
      "--timeout, then the worker exits 1 (its pod is replaced). Without --job, the manifest "
      "itself (YAML or JSON) is read from the "
      "VF_JOB_SPEC\n"
      "environment variable, which is how the operator hands it to pods. VF_VNODE_DELAY_MS\n"
      "sets --vnode-delay-ms from a pod's environment. Rank 0 of the final plan also writes\n"
      "its final report to $VF_TERMINATION_MESSAGE_PATH when set (the container's\n"
      "terminationMessagePath). SIGTERM makes the worker leave gracefully at the next step\n"
      "boundary.",
      "virtualflow-agent");
  app.footer(
      "Exit status: 0 finished or left; 1 this worker failed; 2 usage; 3 the job cannot go on.");
  app.add_option("--job", o.job_path, "the VirtualFlowJob manifest (default: $VF_JOB_SPEC)")
      ->type_name("JOB.yaml");
  app.add_option("--coordinator", o.coordinator_url,
                 "coordinator URL, e.g. http://10.0.0.1:7070 (required)")
      ->type_name("URL");
  app.add_option("--job-id", o.job_id, "NAMESPACE/NAME (default: from the job's metadata)");
  app.add_option("--worker", o.worker, "this worker's unique name within the job (required)")
      ->type_name("NAME");
  app.add_option("--token-file", token_file, "file holding this worker's coordinator credential")
      ->type_name("PATH");
  app.add_option("--ca-file", o.ca_file,
                 "PEM CA that an https coordinator's certificate must chain to\n"
                 "(default: $VF_COORDINATOR_CA_FILE, else the system's CAs)")
      ->type_name("PATH");
  app.add_option("--steps", o.steps_override,
                 "train this many steps instead of the job's length (default: the job's)")
      ->transform(vf::Base10Integer());
  app.add_option("--result", o.result_path, "write a JSON result here at the end")
      ->type_name("PATH");
  app.add_option("--timeout", o.timeout,
                 "seconds before a rendezvous, collective or plan wait fails")
      ->check(vf::FiniteNumber())
      ->capture_default_str();
  app.add_option("--slowdown", o.slowdown,
                 "make each virtual node take this many times longer (>= 1; experiments)")
      ->check(vf::FiniteNumber())
      ->capture_default_str();
  app.add_option("--vnode-delay-ms", o.vnode_delay_ms,
                 "add this many milliseconds to each virtual node (a slower device;\n"
                 "experiments; default $VF_VNODE_DELAY_MS, else 0)")
      ->check(vf::FiniteNumber());
  app.add_option("--report-interval", o.report_interval, "seconds between progress reports")
      ->check(vf::FiniteNumber())
      ->capture_default_str();
  app.add_option("--host", o.host,
                 "the address this worker's communicator listens on and its peers dial "
                 "(default: $VF_POD_IP, the pod's address on Kubernetes, else 127.0.0.1)");
  app.add_option("--metrics-port", metrics_port,
                 "serve Prometheus /metrics on this port (0: any free port; -1: none)")
      ->transform(vf::Base10Integer())
      ->capture_default_str();
  if (auto exit_code = vf::ParseCommandLine(app, "virtualflow-agent", argc, argv)) {
    return *exit_code;
  }
  auto usage = [](const std::string& m) { return vf::UsageError("virtualflow-agent", m); };
  if (o.job_path.empty()) {
    const char* spec = std::getenv(vf::worker_env::kJobSpec.name);
    if (spec == nullptr || *spec == '\0') {
      return usage("--job is required unless VF_JOB_SPEC holds the manifest (see --help)");
    }
    o.job_text = spec;
  }
  if (o.coordinator_url.empty()) return usage("--coordinator is required (see --help)");
  if (const char* ca = std::getenv(vf::worker_env::kCoordinatorCaFile.name);
      o.ca_file.empty() && ca != nullptr && *ca != '\0') {
    o.ca_file = ca;
  }
  // The container's terminationMessagePath, which the operator names for it.
  if (const char* path = std::getenv(vf::worker_env::kTerminationMessagePath.name);
      path != nullptr) {
    o.termination_message_path = path;
  }
  if (const char* ip = std::getenv(vf::worker_env::kPodIp.name);
      app.count("--host") == 0 && ip != nullptr && *ip != '\0') {
    o.host = ip;
  }
  if (o.worker.empty()) return usage("--worker is required (see --help)");
  if (o.timeout <= 0) return usage("--timeout must be positive");
  if (metrics_port < -1 || metrics_port > 65535) return usage("--metrics-port must be 0..65535");
  o.metrics_port = static_cast<int>(metrics_port);
  if (o.slowdown < 1) return usage("--slowdown must be at least 1");
  // Pods get experiment knobs through their environment (their worker container's env).
  if (const char* delay = std::getenv(vf::worker_env::kVnodeDelayMs.name);
      delay != nullptr && o.vnode_delay_ms == 0) {
    char* end = nullptr;
    o.vnode_delay_ms = std::strtod(delay, &end);
    if (end == delay || *end != '\0') return usage("VF_VNODE_DELAY_MS must be a number");
  }
  if (o.vnode_delay_ms < 0 || o.vnode_delay_ms > vf::kMaxVnodeDelayMs) {
    return usage("--vnode-delay-ms must be between 0 and " +
                 std::to_string(static_cast<int64_t>(vf::kMaxVnodeDelayMs)));
  }
  if (!token_file.empty()) {
    // Mounted from a Secret: missing or empty at start, it is waited for, then the pod replaced.
    vf::Result<std::string> token = vf::agent::ReadCredentialFile(
        token_file, "this worker's token file", o.worker,
        std::chrono::milliseconds(static_cast<int64_t>(o.timeout * 1000)));
    if (!token.ok()) {
      std::fprintf(stderr, "virtualflow-agent: %s: error: %s\n", o.worker.c_str(),
                   token.status().message().c_str());
      return vf::kExitWorkerFailed;
    }
    o.token = *token;
    while (!o.token.empty() && (o.token.back() == '\n' || o.token.back() == '\r')) {
      o.token.pop_back();
    }
  } else if (const char* t = std::getenv(vf::worker_env::kJobToken.name)) {
    o.token = t;
  }
  if (o.token.empty()) return usage("no coordinator credential (--token-file or VF_JOB_TOKEN)");

  std::signal(SIGTERM, OnTerm);
  vf::Status s = vf::RunWorker(o);
  if (!s.ok()) {
    std::fprintf(stderr, "virtualflow-agent: %s: error: %s\n", o.worker.c_str(),
                 s.message().c_str());
    if (vf::IsAnotherBuildRefusal(s)) return vf::kExitAnotherBuild;
    return IsJobFailure(s.code()) ? vf::kExitJobFailed : vf::kExitWorkerFailed;
  }
  return vf::kExitOk;
}
