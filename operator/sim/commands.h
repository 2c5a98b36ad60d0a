// The `vf simulate` and `vf trace` commands. argv[0] is "vf" and argv[1] the command name;
// both return the process exit code (0 success, 1 failure, 2 bad usage) and print errors as one
// line "vf: error: ..." on stderr.
#pragma once

namespace vf {

// vf simulate TRACE.json --cluster CLUSTER.yaml --policy NAME[,NAME...] [options]
// vf simulate --predict WORKLOAD --cluster CLUSTER.yaml --workers N[,N...] [options]
int RunSimulateCommand(int argc, char** argv);

// vf trace generate --jobs N --jobs-per-hour R --seed S [--mix resnet=0.4,...] > trace.json
int RunTraceCommand(int argc, char** argv);

}  // namespace vf
