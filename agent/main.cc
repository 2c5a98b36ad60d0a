// virtualflow-agent: the process that runs in every pod (or every local worker slot).
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "agent/worker.h"
#include "cli/flags.h"

namespace {

// A launcher that sets VF_EXIT_WITH_PARENT=<its pid> wants its workers gone when it dies, even
// by SIGKILL, rather than training on alone.
void ExitWithParent() {
  const char* parent = std::getenv("VF_EXIT_WITH_PARENT");
  if (parent == nullptr) return;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (std::to_string(getppid()) != parent) std::_Exit(1);  // the parent died before prctl
}

}  // namespace

int main(int argc, char** argv) {
  ExitWithParent();
  vf::WorkerOptions o;
  int64_t rank = 0;
  int64_t world = 1;
  vf::FlagParser flags(
      "usage: virtualflow-agent --job JOB.yaml [--rank R --world-size N --store-dir DIR]\n\n"
      "Trains the virtual nodes of one worker. Usually started by `vf run` or by the operator,\n"
      "not by hand.");
  flags.AddString("job", &o.job_path, "the VirtualFlowJob manifest");
  flags.AddInt("rank", &rank, "this worker's rank (0-based)");
  flags.AddInt("world-size", &world, "number of workers");
  flags.AddString("store-dir", &o.store_dir, "rendezvous directory shared by the workers");
  flags.AddInt("steps", &o.steps_override, "train this many steps instead of the job's length");
  flags.AddString("result", &o.result_path, "write a JSON result here at the end");
  flags.AddDouble("progress-interval", &o.progress_interval,
                  "seconds between progress lines on rank 0 (0: none; default 2)");
  flags.AddDouble("timeout", &o.timeout,
                  "seconds before a rendezvous or collective gives up (default 60)");
  auto positional = flags.Parse(argc, argv, 1);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (!positional.ok()) {
    std::fprintf(stderr, "virtualflow-agent: error: %s\n", positional.status().message().c_str());
    return 2;
  }
  if (!positional->empty() || o.job_path.empty()) {
    std::fprintf(stderr, "virtualflow-agent: error: --job JOB.yaml is required (see --help)\n");
    return 2;
  }
  o.rank = static_cast<int>(rank);
  o.world_size = static_cast<int>(world);
  vf::Status s = vf::RunWorker(o);
  if (!s.ok()) {
    std::fprintf(stderr, "virtualflow-agent: rank %d: error: %s\n", o.rank, s.message().c_str());
    return 1;
  }
  return 0;
}
