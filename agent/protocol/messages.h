// What agents and the coordinator say to each other: the membership plan of an epoch, a
// member's place in it, and a member's report after a step. The coordinator (operator/) keeps
// these; the agent reads plans and sends reports. This is the whole contract between them, with
// its JSON in json.h and the client in client.h.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/job/worker_env.h"

namespace vf {

// The version of this contract: the paths, the JSON shapes and what each call means. It is not
// the build: a new build that keeps the protocol talks to agents and coordinators of older
// builds, so an operator upgraded under running jobs keeps their workers. It grows only with a
// change an agent or coordinator of the previous version would misread; a coordinator refuses a
// worker of another version at registration, saying which. An agent that sends none speaks 1.
inline constexpr int64_t kProtocolVersion = 1;

// Test-only: the environment variable that makes an agent speak another protocol version than
// its build's (a positive integer), so that a test can have an operator pose as an upgrade that
// changed the protocol (VF_TEST_OPERATOR_PROTOCOL) and start workers of that protocol on the
// same build. The operator sets it on the pods it creates only while it poses so; a job's pod
// template cannot set it (the operator drops it, as every variable it owns).
inline constexpr const char* kTestAgentProtocolEnv = worker_env::kTestAgentProtocol.name;

// What a coordinator's refusal of a worker of another build than the job's workers says, after
// "worker NAME " and before "BUILD, the job runs build BUILD" (HTTP 409). A worker refused so
// exits kExitAnotherBuild: its pod ran the wrong image, which is no failure of the job nor of the
// worker; the operator counts nothing and replaces the pod with one of the job's own image
// (status.workerImage).
inline constexpr char kAnotherBuildRefusal[] = "was refused: it runs build ";
inline constexpr int kExitAnotherBuild = 4;

// What a coordinator's answer to a registration says when it has no room for the worker yet: the
// job has as many registered workers as it may have, or all jobs together hold the coordinator's
// memory budget (HTTP 503). Room comes back as members leave and other jobs end, so the worker
// waits and registers again for as long as the answer lasts, and its job goes on; one tenant
// filling the shared budget never fails another's job.
inline constexpr char kCoordinatorFull[] = "the coordinator is full";

// The header that names the worker a request speaks for (with its credential as the bearer).
inline constexpr char kWorkerHeader[] = "X-VirtualFlow-Worker";

// The header of every successful answer of a coordinator that names its incarnation: an id
// drawn when the coordinator starts, so that a worker learns that the coordinator it talks to
// now is not the one that holds its rendezvous keys (an operator restarted mid-resize), and
// writes them again. Older coordinators send none; an agent then writes nothing again.
inline constexpr char kIncarnationHeader[] = "X-VirtualFlow-Coordinator";

// The longest a coordinator holds a long poll (GET /plan and GET /store/...); a client that
// waits longer splits its wait into several polls, and a larger timeout_ms is cut to these.
inline constexpr int64_t kMaxPlanPollMs = 60000;
inline constexpr int64_t kMaxStorePollMs = 120000;

// One worker's place in a plan.
struct Member {
  std::string worker;
  int rank = 0;
  std::vector<int> virtual_nodes;
};

// The membership of one epoch. Epochs only grow; epoch 0 means "no plan yet".
struct Plan {
  int64_t epoch = 0;
  std::vector<Member> members;
  // Rendezvous keys of this epoch live under "<store_prefix>/"; see PrefixStore.
  std::string store_prefix;
};

// What a training member says after a step.
struct Report {
  int64_t epoch = 0;
  int64_t step = 0;
  double loss = 0;  // NaN when the agent has none to give
  double samples_per_second = 0;
  double seconds_per_virtual_node = 0;
  double pause_seconds = 0;  // time the last membership switch cost this worker
  bool has_state = false;    // holds the full training state (may serve joiners)
  // Set once, by rank 0 of the final plan, when the job has trained all its steps.
  bool finished = false;
  std::string weights_sha256;  // of the final weights; empty unless finished
  double test_accuracy = std::numeric_limits<double>::quiet_NaN();  // NaN: not evaluated
  // The job's length, from the data the worker loaded (only a worker knows its dataset's size,
  // a user's own above all); 0: not known yet.
  int64_t total_steps = 0;
  // The latest periodic checkpoint this worker tried to write: its step (0: none yet) and, when
  // the write failed (a full disk, a read-only volume), why. Training goes on after a failed
  // write; the operator shows it as the job's CheckpointFailing condition until one succeeds.
  int64_t checkpoint_step = 0;
  std::string checkpoint_error;
};

}  // namespace vf
