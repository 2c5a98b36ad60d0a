// vf-sim: the simulator's commands on their own (`vf-sim simulate ...`, `vf-sim trace ...`),
// the same entry points `vf simulate` and `vf trace` call.
#include <cstdio>
#include <string>

#include "operator/sim/commands.h"

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "simulate") return vf::RunSimulateCommand(argc, argv);
  if (cmd == "trace") return vf::RunTraceCommand(argc, argv);
  std::fputs("usage: vf-sim simulate|trace ... (see `vf-sim simulate --help`)\n",
             cmd == "--help" ? stdout : stderr);
  return cmd == "--help" ? 0 : 2;
}
