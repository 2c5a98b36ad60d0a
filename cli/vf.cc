// vf: the VirtualFlow command line. `vf run job.yaml` trains a VirtualFlowJob on this machine.
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "agent/worker.h"
#include "operator/local/capacity.h"
#include "operator/local/launcher.h"
#include "operator/sim/commands.h"
#include "runtime/command_line.h"
#include "runtime/status.h"

namespace {

constexpr const char* kUsage =
    "usage: vf COMMAND [ARGS]\n\n"
    "Elastic deep-learning training on virtual nodes.\n\n"
    "Commands:\n"
    "  run JOB.yaml      train a VirtualFlowJob on this machine with local worker processes\n"
    "  simulate TRACE    replay a job trace on a simulated GPU cluster under several policies\n"
    "  trace generate    write a synthetic job trace (Poisson arrivals, a workload mix)\n"
    "  version           print the version\n\n"
    "Run `vf COMMAND --help` for a command's options.\n";

void OnSignal(int /*sig*/) { vf::RequestLocalJobStop(); }

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "vf: error: %s\n", message.c_str());
  return code;
}

int Run(int argc, char** argv) {
  vf::LocalRunOptions o;
  int64_t workers = 0;
  std::string summary_path;
  std::string slowdown;
  std::string delays;
  CLI::App app(
      "Trains the job on this machine: a local coordinator and worker processes, sized by the\n"
      "job's elasticity policy within spec.replicas and the free local slots. Workers join and\n"
      "leave between two steps without restarting; a worker that dies is replaced and its step\n"
      "redone. With `reduction: exact` the final weights are bitwise identical whatever the\n"
      "number of workers and resizes. Prints progress, one line per resize, then the test-set\n"
      "accuracy and the SHA-256 of the final weights. The built-in model's workers all share\n"
      "the machine's GPU when it has one (VF_DEVICE=cpu keeps them on the CPU); a job's own\n"
      "program chooses its device itself.\n\n"
      "Each worker process's stdout and stderr are kept, never deleted, in the logs directory\n"
      "(--logs, else a new vf-logs-JOB-DATE-TIME-XXXXXX in the temporary directory), whose path\n"
      "is printed at the end: worker-N.log per process, N in start order (a replacement or a\n"
      "joiner gets the next N), and plans.log, which worker held which rank in each plan. A job's\n"
      "own program's lines are shown as they come from the current plan's rank 0 only, prefixed\n"
      "[worker-N]; when a worker fails the job, its last lines are shown.",
      "vf run");
  app.add_option("JOB.yaml", o.job_path, "the VirtualFlowJob manifest to train");
  app.add_option("--workers", workers,
                 "local worker slots, 1..virtualNodes (default: min(replicas.max,\n"
                 "CPU cores))")
      ->transform(vf::Base10Integer());
  app.add_option("--capacity", o.capacity,
                 "slots over time, instead of --workers: AT:SLOTS,... by step\n"
                 "(0:2,150:4,300:1) or seconds (0s:2,30s:4)")
      ->type_name("SCHEDULE");
  app.add_option("--steps", o.steps_override,
                 "train this many steps instead of the job's length (default: the job's)")
      ->transform(vf::Base10Integer());
  app.add_option("--summary-json", summary_path, "write the run's summary as JSON to PATH")
      ->type_name("PATH");
  app.add_option("--progress-interval", o.progress_interval,
                 "seconds between progress lines (0: none)")
      ->check(vf::FiniteNumber())
      ->capture_default_str();
  app.add_option("--timeout", o.timeout,
                 "seconds before a stuck rendezvous, collective or worker fails")
      ->check(vf::FiniteNumber())
      ->capture_default_str();
  app.add_option("--slowdown", slowdown,
                 "per-slot slowdown factors, cycled (e.g. 1,1,3,3): emulates\n"
                 "slower devices")
      ->type_name("F1,F2,...");
  app.add_option("--vnode-delay-ms", delays,
                 "per-slot fixed milliseconds added to each virtual node, cycled\n"
                 "(e.g. 10,10,60): emulates devices of known speed")
      ->type_name("D1,D2,...");
  app.add_option("--assignment", o.assignment,
                 "virtual nodes per worker: proportional (to measured speed) or even")
      ->capture_default_str();
  app.add_option("--logs", o.logs_dir,
                 "keep the workers' output in DIR, not a new temporary directory\n"
                 "(created if missing; an earlier run's worker-N.log and plans.log\n"
                 "replaced)")
      ->type_name("DIR");
  app.add_flag("--quiet", o.quiet,
               "print only the result: no progress, resize or worker lines, nor\n"
               "where the logs are (--summary-json has it)");
  app.add_option("--run-info", o.run_info_path,
                 "write the coordinator's URL, job id and job secret file to PATH (for tools)")
      ->type_name("PATH");
  if (auto exit_code = vf::ParseCommandLine(app, "vf", argc - 1, argv + 1)) return *exit_code;
  if (o.job_path.empty()) return Fail("vf run needs exactly one job file (see --help)", 2);
  if (workers < 0 || workers > 1 << 20) return Fail("--workers must be at least 1", 2);
  if (workers > 0 && !o.capacity.empty()) return Fail("use --workers or --capacity, not both", 2);
  if (o.timeout <= 0) return Fail("--timeout must be positive", 2);
  if (o.assignment != "proportional" && o.assignment != "even") {
    return Fail("--assignment must be proportional or even", 2);
  }
  if (!slowdown.empty()) {
    auto f = vf::ParseNumberList("--slowdown", slowdown, 1, 1000);
    if (!f.ok()) return Fail(f.status().message(), 2);
    o.slowdowns = *f;
  }
  if (!o.capacity.empty()) {
    auto schedule = vf::CapacitySchedule::Parse(o.capacity);
    if (!schedule.ok()) return Fail(schedule.status().message(), 2);
  }
  if (!delays.empty()) {
    auto d = vf::ParseNumberList("--vnode-delay-ms", delays, 0, vf::kMaxVnodeDelayMs);
    if (!d.ok()) return Fail(d.status().message(), 2);
    o.vnode_delays_ms = *d;
  }
  o.workers = static_cast<int>(workers);

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  auto summary = vf::RunLocalJob(o);
  if (!summary.ok()) return Fail(summary.status().message());
  const auto& s = *summary;
  std::printf(
      "finished %lld steps in %.1f s on %d worker%s (%.0f samples/s), %zu resize%s, "
      "%d recover%s\n",
      static_cast<long long>(s.steps), s.seconds, s.workers, s.workers == 1 ? "" : "s",
      s.samples_per_second, s.resizes.size(), s.resizes.size() == 1 ? "" : "s", s.recoveries,
      s.recoveries == 1 ? "y" : "ies");
  // Only what rank 0 evaluated: a user's program may report no test accuracy, or nothing.
  std::string evaluated;
  char buf[96];
  if (!std::isnan(s.test_accuracy)) {
    std::snprintf(buf, sizeof(buf), "test accuracy %.2f%%, ", 100.0 * s.test_accuracy);
    evaluated += buf;
  }
  if (!std::isnan(s.test_loss)) {
    std::snprintf(buf, sizeof(buf), "test loss %.4f, ", s.test_loss);
    evaluated += buf;
  }
  std::printf("%sfinal training loss %.4f\n", evaluated.c_str(), s.final_loss);
  std::printf("weights sha256 %s\n", s.weights_sha256.c_str());
  if (!summary_path.empty()) {
    nlohmann::json j;
    j["steps"] = s.steps;
    j["final_loss"] = s.final_loss;
    j["test_accuracy"] =
        std::isnan(s.test_accuracy) ? nlohmann::json() : nlohmann::json(s.test_accuracy);
    j["test_loss"] = std::isnan(s.test_loss) ? nlohmann::json() : nlohmann::json(s.test_loss);
    j["weights_sha256"] = s.weights_sha256;
    j["workers"] = s.workers;
    j["virtual_nodes"] = s.virtual_nodes;
    j["seconds"] = s.seconds;
    j["samples_per_second"] = s.samples_per_second;
    j["resizes"] = nlohmann::json::array();
    for (const auto& r : s.resizes) {
      j["resizes"].push_back({{"step", r.step},
                              {"from", r.from},
                              {"to", r.to},
                              {"pause_seconds", r.pause_seconds},
                              {"reason", r.reason}});
    }
    j["recoveries"] = s.recoveries;
    j["rebalances"] = s.rebalances;
    j["logs"] = s.logs_dir;
    j["worker_results"] = nlohmann::json::array();
    for (const auto& r : s.worker_results) j["worker_results"].push_back(nlohmann::json::parse(r));
    std::ofstream out(summary_path);
    out << j.dump(2) << "\n";
    if (!out) return Fail("cannot write " + summary_path);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "version" || cmd == "--version") {
    std::printf("vf %s\n", VF_VERSION);
    return 0;
  }
  if (cmd == "run") return Run(argc, argv);
  if (cmd == "simulate") return vf::RunSimulateCommand(argc, argv);
  if (cmd == "trace") return vf::RunTraceCommand(argc, argv);
  return Fail("unknown command '" + cmd + "' (see vf --help)", 2);
}
