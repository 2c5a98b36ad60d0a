// The agent library across a real coordinator restart: the coordinator's HTTP server is stopped
// and a new one, with an empty memory, serves on the same port (what an operator restart does);
// the worker meets 401 (job unknown) and 404 (worker unknown) on the calls that used to end it,
// registers again and goes on; the members of a grown plan that were meeting through the lost
// coordinator's store meet through the new one. A wrong token still fails, at the timeout,
// without failing the job (kUnavailable, not kNotFound), and a worker of another build than the
// job's knows it was refused for that. A coordinator that is full has a worker wait for room.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/protocol/client.h"
#include "operator/coordinator/coordinator.h"
#include "operator/coordinator/server.h"
#include "operator/coordinator/test_util.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/device.h"

// As in server_test.cc: cpprest's own continuations can outlive a closed listener.
// NOLINTNEXTLINE(bugprone-reserved-identifier): the name LeakSanitizer looks up.
extern "C" const char* __lsan_default_suppressions() { return "leak:libcpprest.so\n"; }

namespace vf {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr char kJob[] = "team/mnist";
constexpr char kToken[] = "token-a";
constexpr char kFingerprint[] = "fp-1";
constexpr char kBuild[] = "build-1";

int FreeLowPort() { return coordinator_test::FreeLowPort(21000); }

// State a single worker holds: nothing but a flag (a world of one never transfers any).
class TinyState : public agent::TrainingStateHolder {
 public:
  bool has_state() const override { return initialized_; }
  int64_t step() const override { return 0; }
  Status Initialize() override {
    initialized_ = true;
    return Status::Ok();
  }
  std::string Metadata() const override { return "tiny"; }
  Status CheckMetadata(std::string_view) const override { return Status::Ok(); }
  std::vector<std::span<std::byte>> Buffers() override { return {}; }
  void Invalidate() override { initialized_ = false; }
  Status Adopt(std::string_view) override {
    initialized_ = true;
    return Status::Ok();
  }

 private:
  bool initialized_ = false;
};

// A worker's own credential for the job whose secret is kToken.
std::string Credential(const std::string& worker) {
  Result<std::string> credential = WorkerCredential(kToken, worker);
  return credential.ok() ? *credential : std::string();
}

std::string W0Credential() { return Credential("w0"); }

agent::AgentOptions Options(int port, const std::string& token, milliseconds timeout) {
  agent::AgentOptions o;
  o.coordinator_url = "http://127.0.0.1:" + std::to_string(port);
  o.job_id = kJob;
  o.worker = "w0";
  o.token = token;
  o.fingerprint = kFingerprint;
  o.build = kBuild;
  o.timeout = timeout;
  o.report_interval = 0;
  return o;
}

// `coordinator` knowing the job, served on `port`: what an operator brings up when it starts
// (or restarts and restores the job at once).
Result<std::unique_ptr<CoordinatorServer>> ServeJob(Coordinator& coordinator, int port) {
  VF_RETURN_IF_ERROR(coordinator.AddJob(kJob, kToken, kFingerprint, kBuild));
  return CoordinatorServer::Start(coordinator, "127.0.0.1", port);
}

// Waits (boundedly) until `done` holds.
template <typename F>
bool Eventually(F done) {
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

// The members of a grown plan meet through the coordinator's store (each writes its address
// and waits for the others'); the operator dies as the first member has written its key, and
// the new coordinator's store is empty. That member writes its key again once it meets the new
// coordinator (another incarnation), so the joiner finds it: the plan is built at once, the
// same plan, with no failure reported and no member waiting out its timeout. Without it, the
// joiner waits for the key until its timeout and the rendezvous fails.
TEST(AgentAcrossCoordinatorRestart, AGrownPlansMembersMeetAgainThroughTheNewCoordinator) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  auto first = std::make_unique<Coordinator>();
  std::promise<void> key_written;
  std::atomic<bool> written{false};
  first->ObserveKeySets([&](const std::string&, const std::string& key) {
    if (key.rfind("epoch-2/", 0) == 0 && !written.exchange(true)) key_written.set_value();
  });
  auto server = ServeJob(*first, port);
  ASSERT_TRUE(server.ok()) << server.status().message();

  // Far longer than the rendezvous takes when it works; a rendezvous that waits it out fails.
  const milliseconds timeout = seconds(20);
  auto options = [&](const std::string& worker) {
    agent::AgentOptions o = Options(port, Credential(worker), timeout);
    o.worker = worker;
    return o;
  };
  auto joined0 = agent::Agent::Join(options("w0"));
  auto joined1 = agent::Agent::Join(options("w1"));
  ASSERT_TRUE(joined0.ok()) << joined0.status().message();
  ASSERT_TRUE(joined1.ok()) << joined1.status().message();
  std::unique_ptr<agent::Agent> w0 = std::move(joined0).value();
  std::unique_ptr<agent::Agent> w1 = std::move(joined1).value();
  ASSERT_TRUE(w0->Ready().ok());
  ASSERT_TRUE(w1->Ready().ok());
  ASSERT_TRUE(first->PublishPlan(kJob, {{"w0", 0, {0, 1}}}).ok());
  TinyState state0;
  TinyState state1;
  auto m = w0->Next(state0);
  ASSERT_TRUE(m.ok() && m->has_value()) << m.status().message();

  // The plan that takes w1 in; w0 switches to it after its step, and writes its key first.
  const std::vector<Member> grown = {{"w0", 0, {0}}, {"w1", 1, {1}}};
  ASSERT_TRUE(first->PublishPlan(kJob, grown).ok());
  ASSERT_TRUE(Eventually([&] { return w0->latest_epoch() == 2; }));
  agent::StepOutcome outcome;
  outcome.agreed_epoch = 2;
  ASSERT_TRUE(w0->Completed(1, outcome).ok());
  auto next0 = std::async(std::launch::async, [&] { return w0->Next(state0); });
  ASSERT_EQ(key_written.get_future().wait_for(seconds(60)), std::future_status::ready);

  // The operator dies with its coordinator and store; the next one restores the job and the
  // plan from the job's status (EnsureCoordinatorJob).
  server->reset();
  first.reset();
  Coordinator second;
  auto restarted = CoordinatorServer::Start(second, "127.0.0.1", port);
  ASSERT_TRUE(restarted.ok()) << restarted.status().message();
  ASSERT_TRUE(second.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  ASSERT_TRUE(second.PublishPlanWithEpoch(kJob, 2, grown).ok());
  auto next1 = std::async(std::launch::async, [&] { return w1->Next(state1); });

  const bool done = next0.wait_for(seconds(60)) == std::future_status::ready &&
                    next1.wait_for(seconds(60)) == std::future_status::ready;
  if (!done) agent::RequestLeave();  // a joiner no plan took in would wait forever
  ASSERT_TRUE(done);
  auto m0 = next0.get();
  auto m1 = next1.get();
  ASSERT_TRUE(m0.ok() && m0->has_value()) << m0.status().message();
  ASSERT_TRUE(m1.ok() && m1->has_value()) << m1.status().message();
  EXPECT_EQ(std::make_tuple((*m0)->epoch, (*m0)->rank, (*m0)->world), std::make_tuple(2, 0, 2));
  EXPECT_EQ(std::make_tuple((*m1)->epoch, (*m1)->rank, (*m1)->world), std::make_tuple(2, 1, 2));
  EXPECT_TRUE(state1.has_state());  // w0 sent it its state over the new communicator
  auto view = second.GetJob(kJob);
  ASSERT_TRUE(view.ok());
  for (const std::string worker : {"w0", "w1"}) {
    ASSERT_EQ(view->workers.count(worker), 1u) << worker;
    EXPECT_EQ(view->workers.at(worker).failure_epoch, -1)
        << worker << ": " << view->workers.at(worker).failure_message;
  }
}

// The store under that rendezvous, call by call: a key set while no coordinator serves is kept
// (the Set succeeds) and written once one does; the keys a lost coordinator took are written
// again once a call is answered by another incarnation (a plan poll here, as the agent's plan
// watcher makes one each second before it calls Reassert).
TEST(AgentAcrossCoordinatorRestart, AStoreWritesItsKeysAgainToTheNextCoordinator) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  const std::vector<Member> plan = {{"w0", 0, {0}}, {"w1", 1, {1}}};
  auto first = std::make_unique<Coordinator>();
  auto server = ServeJob(*first, port);
  ASSERT_TRUE(server.ok()) << server.status().message();
  ASSERT_TRUE(first->PublishPlan(kJob, plan).ok());
  CoordinatorClient client("http://127.0.0.1:" + std::to_string(port), kJob, Credential("w0"), "w0",
                           seconds(1));
  CoordinatorStore store(client);
  ASSERT_TRUE(store.Set("epoch-1/rank_0", "address-0").ok());
  auto taken = first->GetKey(kJob, "epoch-1/rank_0", milliseconds(0));
  ASSERT_TRUE(taken.ok()) << taken.status().message();

  server->reset();
  first.reset();
  ASSERT_TRUE(store.Set("epoch-1/extra", "set-while-away").ok());
  Coordinator second;
  auto restarted = CoordinatorServer::Start(second, "127.0.0.1", port);
  ASSERT_TRUE(restarted.ok()) << restarted.status().message();
  ASSERT_TRUE(second.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  ASSERT_TRUE(second.PublishPlanWithEpoch(kJob, 1, plan).ok());
  auto polled = client.WaitForPlan(0, milliseconds(100));
  ASSERT_TRUE(polled.ok()) << polled.status().message();
  EXPECT_EQ(client.incarnation(), second.incarnation());
  store.Reassert();
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"epoch-1/rank_0", "address-0"},
        {"epoch-1/extra", "set-while-away"}}) {
    auto now = second.GetKey(kJob, key, milliseconds(0));
    ASSERT_TRUE(now.ok()) << key << ": " << now.status().message();
    EXPECT_EQ(*now, value);
  }
  // Once the rendezvous is over, nothing is written again.
  store.ForgetKeys();
  restarted->reset();
  Coordinator third;
  auto again = CoordinatorServer::Start(third, "127.0.0.1", port);
  ASSERT_TRUE(again.ok()) << again.status().message();
  ASSERT_TRUE(third.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  ASSERT_TRUE(third.PublishPlanWithEpoch(kJob, 1, plan).ok());
  ASSERT_TRUE(client.WaitForPlan(0, milliseconds(100)).ok());
  EXPECT_EQ(client.incarnation(), third.incarnation());
  store.Reassert();
  EXPECT_FALSE(third.GetKey(kJob, "epoch-1/rank_0", milliseconds(0)).ok());
}

// Another tenant's job holds the memory budget all jobs share: the coordinator answers this
// worker's registration 503 (full) for as long as that lasts, past the worker's own timeout,
// which bounds the wait for a coordinator that is away, not for room. The worker registers again
// and again, says that it waits, and joins once the other job ends; nothing fails. In a child
// process of its own: RequestLeave, which ends the wait, is process-wide and other tests call it.
void WaitForRoomThenJoin() {
  const int port = FreeLowPort();
  constexpr size_t kBudget = 64 << 10;
  Coordinator coordinator(kBudget);
  auto server = ServeJob(coordinator, port);
  if (!server.ok()) std::exit(11);
  if (!coordinator.AddJob("team/other", kToken, kFingerprint, kBuild).ok() ||
      !coordinator.SetKey("team/other", "k", std::string(kBudget - 200, 'x')).ok()) {
    std::exit(12);
  }
  // Past this point a failure ends the process at once (_Exit): exit handlers would wait for
  // the agent's call in flight.
  auto joining = std::async(std::launch::async, [&] {
    return agent::Agent::Join(Options(port, W0Credential(), milliseconds(1000)));
  });
  if (joining.wait_for(seconds(3)) != std::future_status::timeout) std::_Exit(13);
  if (!coordinator.GetJob(kJob)->workers.empty()) std::_Exit(14);
  if (!coordinator.RemoveJob("team/other").ok()) std::_Exit(15);
  if (joining.wait_for(seconds(30)) != std::future_status::ready) std::_Exit(16);
  auto joined = joining.get();
  if (!joined.ok() || !(*joined)->Ready().ok()) std::_Exit(17);
  const bool registered = coordinator.GetJob(kJob)->workers.count("w0") == 1;
  // Its plan watcher stopped first: exit handlers would wait for the call it has in flight.
  joined->reset();
  std::exit(registered ? 0 : 18);
}

TEST(AgentAtAFullCoordinator, AWorkerWaitsForRoomPastItsTimeoutAndJoinsOnceAdmitted) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(WaitForRoomThenJoin(), testing::ExitedWithCode(0),
              "w0: waiting for room at the coordinator, registering again until admitted: .*worker "
              "w0 is not admitted yet: the coordinator is full \\(the coordinator's memory "
              "budget .*; the worker will retry until there is room \\(HTTP 503\\).*w0: admitted "
              "by the coordinator after");
}

TEST(AgentAcrossCoordinatorRestart, AWrongTokenFailsAtTheTimeoutWithoutFailingTheJob) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  Coordinator coordinator;
  auto server = ServeJob(coordinator, port);
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto joined = agent::Agent::Join(Options(port, "not-the-token", milliseconds(1500)));
  ASSERT_FALSE(joined.ok());
  // kUnavailable: the worker exits 1 and is replaced; kNotFound would fail the whole job.
  EXPECT_EQ(joined.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(joined.status().message().find("a wrong token"), std::string::npos)
      << joined.status().message();
}

// A pod of another image than the job's workers' (after an operator upgrade, a new default
// image): the coordinator refuses it in words the worker tells from a refusal of another job
// spec, so that it exits kExitAnotherBuild (its pod replaced, the job going on) rather than
// kExitJobFailed.
TEST(AgentAcrossCoordinatorRestart, AWorkerOfAnotherBuildKnowsItWasRefusedForItsBuild) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  Coordinator coordinator;
  auto server = ServeJob(coordinator, port);
  ASSERT_TRUE(server.ok()) << server.status().message();
  // The job's first worker brought its build.
  ASSERT_TRUE(coordinator.RegisterWorker(kJob, "w1", kFingerprint, kBuild, true).ok());
  agent::AgentOptions other_build = Options(port, W0Credential(), seconds(30));
  other_build.build = "build-2";
  auto refused = agent::Agent::Join(other_build);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsAnotherBuildRefusal(refused.status())) << refused.status().message();
  EXPECT_NE(refused.status().message().find("the job runs build build-1"), std::string::npos)
      << refused.status().message();

  agent::AgentOptions other_spec = Options(port, W0Credential(), seconds(30));
  other_spec.fingerprint = "fp-2";
  auto mismatched = agent::Agent::Join(other_spec);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_EQ(mismatched.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(IsAnotherBuildRefusal(mismatched.status())) << mismatched.status().message();
}

// The test-only protocol (kTestAgentProtocolEnv) an operator that poses as another protocol
// hands its workers: a worker speaks it at registration, so that a coordinator of that protocol
// takes it and one of its build's refuses it, naming both. A value that is no protocol fails.
TEST(AgentAcrossCoordinatorRestart, AWorkerSpeaksTheTestProtocolItsPodNames) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  const int64_t next = kProtocolVersion + 1;
  Coordinator ours;
  auto server = ServeJob(ours, port);
  ASSERT_TRUE(server.ok()) << server.status().message();
  ASSERT_EQ(setenv(kTestAgentProtocolEnv, std::to_string(next).c_str(), 1), 0);
  auto refused = agent::Agent::Join(Options(port, W0Credential(), seconds(30)));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(
                "it speaks coordinator protocol " + std::to_string(next) +
                ", this coordinator speaks protocol " + std::to_string(kProtocolVersion)),
            std::string::npos)
      << refused.status().message();
  server->reset();

  Coordinator posing(Coordinator::kDefaultMemoryBudget, next);
  auto posing_server = ServeJob(posing, port);
  ASSERT_TRUE(posing_server.ok()) << posing_server.status().message();
  auto joined = agent::Agent::Join(Options(port, W0Credential(), seconds(30)));
  ASSERT_TRUE(joined.ok()) << joined.status().message();
  EXPECT_TRUE((*joined)->Ready().ok());
  EXPECT_EQ(posing.GetJob(kJob)->workers.count("w0"), 1u);

  ASSERT_EQ(setenv(kTestAgentProtocolEnv, "two", 1), 0);
  auto bad = agent::Agent::Join(Options(port, W0Credential(), seconds(30)));
  ASSERT_EQ(unsetenv(kTestAgentProtocolEnv), 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("must be a positive integer, not 'two'"), std::string::npos)
      << bad.status().message();
}

// A periodic checkpoint that could not be written counts on the worker's metrics
// (vf_agent_checkpoint_failures_total) and travels in its next report; one written again
// counts nothing.
TEST(AgentAcrossCoordinatorRestart, AFailedCheckpointIsCountedAndReported) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  Coordinator coordinator;
  auto server = ServeJob(coordinator, port);
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto joined = agent::Agent::Join(Options(port, W0Credential(), seconds(30)));
  ASSERT_TRUE(joined.ok()) << joined.status().message();
  std::unique_ptr<agent::Agent> worker = std::move(joined).value();
  ASSERT_TRUE(worker->Ready().ok());
  ASSERT_TRUE(coordinator.PublishPlan(kJob, {{"w0", 0, {0, 1}}}).ok());
  TinyState state;
  auto m = worker->Next(state);
  ASSERT_TRUE(m.ok() && m->has_value()) << m.status().message();

  worker->CheckpointWritten(5, Unavailable("checkpoint /ckpt/job.state: No space left on device"));
  agent::StepOutcome outcome;
  ASSERT_TRUE(worker->Completed(5, outcome).ok());
  EXPECT_EQ(worker->metrics().checkpoint_failures_total().Value(), 1);
  const Report reported = coordinator.GetJob(kJob)->workers.at("w0").last_report;
  EXPECT_EQ(reported.checkpoint_step, 5);
  EXPECT_NE(reported.checkpoint_error.find("No space left on device"), std::string::npos);

  worker->CheckpointWritten(10, Status::Ok());
  EXPECT_EQ(worker->metrics().checkpoint_failures_total().Value(), 1);
}

// A worker that trains while the operator restarts: its reports meet 401 (job unknown), then
// 404 (worker unknown) once the job is back, and it registers again; its leave request and
// acknowledgement go through after the coordinator forgot it once more.
TEST(AgentAcrossCoordinatorRestart, AForgottenWorkerRegistersAgainAndLeavesCleanly) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  auto first = std::make_unique<Coordinator>();
  auto server = ServeJob(*first, port);
  ASSERT_TRUE(server.ok()) << server.status().message();

  auto joined = agent::Agent::Join(Options(port, W0Credential(), seconds(30)));
  ASSERT_TRUE(joined.ok()) << joined.status().message();
  std::unique_ptr<agent::Agent> worker = std::move(joined).value();
  ASSERT_TRUE(worker->Ready().ok());
  const std::vector<Member> plan = {{"w0", 0, {0, 1}}};
  ASSERT_TRUE(first->PublishPlan(kJob, plan).ok());
  TinyState state;
  auto m = worker->Next(state);
  ASSERT_TRUE(m.ok()) << m.status().message();
  ASSERT_TRUE(m->has_value());
  EXPECT_EQ((*m)->epoch, 1);

  // The operator dies, and its coordinator with it; the new one knows nothing yet.
  server->reset();
  first.reset();
  Coordinator second;
  auto restarted = CoordinatorServer::Start(second, "127.0.0.1", port);
  ASSERT_TRUE(restarted.ok()) << restarted.status().message();
  agent::StepOutcome outcome;
  EXPECT_TRUE(worker->Completed(1, outcome).ok());  // 401: training goes on regardless

  // The operator restores the job and its plan from the job's status (EnsureCoordinatorJob);
  // the next report finds the worker unknown (404) and registers it again, ready.
  ASSERT_TRUE(second.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  ASSERT_TRUE(second.PublishPlanWithEpoch(kJob, 1, plan).ok());
  EXPECT_TRUE(worker->Completed(2, outcome).ok());
  auto view = second.GetJob(kJob);
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->workers.count("w0"), 1u);
  EXPECT_TRUE(view->workers.at("w0").ready);
  EXPECT_EQ(view->workers.at("w0").last_report.step, 2);

  // Forgotten again (404) when asked to leave (SIGTERM): it registers again to say so.
  ASSERT_TRUE(second.ForgetWorker(kJob, "w0").ok());
  agent::RequestLeave();
  auto still = worker->Next(state);
  ASSERT_TRUE(still.ok()) << still.status().message();
  ASSERT_TRUE(still->has_value());  // it trains on until a plan without it
  view = second.GetJob(kJob);
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->workers.count("w0"), 1u);
  EXPECT_TRUE(view->workers.at("w0").leave_requested);

  // And once more (404) just as the plan without it comes out: the acknowledgement registers
  // it again too (leave request included), and the worker leaves cleanly.
  outcome.agreed_epoch = 2;  // what the members' collective would agree on
  ASSERT_TRUE(worker->Completed(3, outcome).ok());
  ASSERT_TRUE(second.ForgetWorker(kJob, "w0").ok());
  ASSERT_TRUE(second.PublishPlan(kJob, {}).ok());
  auto left = worker->Next(state);
  ASSERT_TRUE(left.ok()) << left.status().message();
  EXPECT_FALSE(left->has_value());
  view = second.GetJob(kJob);
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->workers.count("w0"), 1u);
  EXPECT_EQ(view->workers.at("w0").acked_epoch, 2);
}

// A worker told to reduce through NCCL (CollectivesOnNccl, a PyTorch worker's choice) where this
// process cannot: the plan's rendezvous builds NCCL's communicator, not Gloo's, fails, and is
// reported with the reason NCCL gives here. In a child process of its own: a joiner whose
// rendezvous failed waits for the controller's next plan as long as it takes, and the child ends
// that by exiting.
void ReportNcclThatCannotStart() {
  const int port = FreeLowPort();
  Coordinator coordinator;
  auto server = ServeJob(coordinator, port);
  if (!server.ok()) std::_Exit(11);
  auto joined = agent::Agent::Join(Options(port, W0Credential(), seconds(30)));
  if (!joined.ok()) std::_Exit(12);
  agent::Agent& worker = **joined;
  worker.CollectivesOnNccl(0);
  if (!worker.Ready().ok() || !coordinator.PublishPlan(kJob, {{"w0", 0, {0, 1}}}).ok()) {
    std::_Exit(13);
  }
  TinyState state;
  std::thread([&] { (void)worker.Next(state); }).detach();
  std::string reported;
  const bool seen = Eventually([&] {
    auto view = coordinator.GetJob(kJob);
    reported = view.ok() ? view->workers.at("w0").failure_message : "";
    return !reported.empty();
  });
  std::fprintf(stderr, "reported: %s\n", reported.c_str());
  // What NCCL's communicator says on this machine when asked directly (no CUDA device here, or
  // no CUDA library in a build without CUDA): the worker's report must carry it.
  MemoryStore scratch;
  auto direct = CreateNcclCommunicator(scratch, 0, 1, CommOptions{}, 0);
  if (direct.ok()) std::_Exit(15);
  std::fprintf(stderr, "direct: %s\n", direct.status().message().c_str());
  std::_Exit(seen && reported.find(direct.status().message()) != std::string::npos ? 0 : 14);
}

// Only where there is no GPU: a GPU would give NCCL a world of one that works.
TEST(AgentCollectives, NcclThatCannotStartIsReportedWithTheReason) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is here: NCCL would start";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ReportNcclThatCannotStart(), testing::ExitedWithCode(0), "reported: ");
}

// A plan whose communicator cannot be built on this worker by any number of tries (here Gloo
// asked to listen on an address that is not this machine's; on a GPU, NCCL refusing two ranks
// on one GPU) ends the worker with the reason, after reporting it. Before, it reported the
// failure and waited for the next plan, which the controller made of the same workers: the job
// went round in failed rendezvous with nothing said. In a child process of its own, which gives
// Next 30 s: a worker that waits for another plan instead waits as long as it takes.
void EndOnACommunicatorRefusedForGood() {
  const int port = FreeLowPort();
  Coordinator coordinator;
  auto server = ServeJob(coordinator, port);
  if (!server.ok()) std::_Exit(11);
  agent::AgentOptions options = Options(port, W0Credential(), seconds(10));
  options.host = "192.0.2.1";  // TEST-NET-1 (RFC 5737): never an address of this machine
  auto joined = agent::Agent::Join(options);
  if (!joined.ok()) std::_Exit(12);
  agent::Agent& worker = **joined;
  if (!worker.Ready().ok() || !coordinator.PublishPlan(kJob, {{"w0", 0, {0, 1}}}).ok()) {
    std::_Exit(13);
  }
  TinyState state;
  std::promise<Status> ended;
  std::future<Status> next = ended.get_future();
  std::thread([&] {
    auto m = worker.Next(state);
    ended.set_value(m.ok() ? Internal("Next returned a membership") : m.status());
  }).detach();
  if (next.wait_for(seconds(30)) != std::future_status::ready) {
    std::fprintf(stderr, "Next still waits after 30 s\n");
    std::_Exit(14);
  }
  const Status s = next.get();
  auto view = coordinator.GetJob(kJob);
  const std::string reported = view.ok() ? view->workers.at("w0").failure_message : "";
  std::fprintf(stderr, "ended: %s: %s\nreported: %s\n",
               std::string(StatusCodeName(s.code())).c_str(), s.message().c_str(),
               reported.c_str());
  const bool ok = s.code() == StatusCode::kInvalidArgument &&
                  s.message().find("cannot listen on '192.0.2.1'") != std::string::npos &&
                  reported.find("cannot listen on '192.0.2.1'") != std::string::npos;
  std::_Exit(ok ? 0 : 15);
}

TEST(AgentCollectives, ACommunicatorRefusedForGoodEndsTheWorkerWithTheReason) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(EndOnACommunicatorRefusedForGood(), testing::ExitedWithCode(0), "ended: ");
}

// A worker asked to leave (its pod deleted) whose job the coordinator no longer knows (the job
// was deleted, or the operator restarts) goes at once, cleanly, rather than keeping its pod
// Terminating while it waits for a coordinator that may never know the job again. In a child
// process of its own: RequestLeave is process-wide.
void LeaveWithTheJobGone() {
  const int port = FreeLowPort();
  Coordinator coordinator;
  auto server = ServeJob(coordinator, port);
  if (!server.ok()) std::exit(11);
  auto joined = agent::Agent::Join(Options(port, W0Credential(), seconds(30)));
  if (!joined.ok() || !(*joined)->Ready().ok()) std::exit(12);
  if (!coordinator.PublishPlan(kJob, {{"w0", 0, {0, 1}}}).ok()) std::exit(13);
  TinyState state;
  auto m = (*joined)->Next(state);
  if (!m.ok() || !m->has_value()) std::exit(14);
  if (!coordinator.RemoveJob(kJob).ok()) std::exit(15);
  agent::RequestLeave();
  auto left = (*joined)->Next(state);
  std::exit(left.ok() && !left->has_value() ? 0 : 16);
}

TEST(AgentAcrossCoordinatorRestart, AWorkerAskedToLeaveAJobTheCoordinatorForgotGoesAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(LeaveWithTheJobGone(), testing::ExitedWithCode(0), "leaving without telling");
}

}  // namespace
}  // namespace vf
