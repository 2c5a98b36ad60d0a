// The agent library across a real coordinator restart: the coordinator's HTTP server is stopped
// and a new one, with an empty memory, serves on the same port (what an operator restart does);
// the worker meets 401 (job unknown) and 404 (worker unknown) on the calls that used to end it,
// registers again and goes on. A wrong token still fails, at the timeout, without failing the
// job (kUnavailable, not kNotFound), and a worker of another build than the job's knows it was
// refused for that.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/protocol/client.h"
#include "operator/coordinator/coordinator.h"
#include "operator/coordinator/server.h"
#include "operator/coordinator/test_util.h"

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

// Worker w0's own credential for the job whose secret is kToken.
std::string W0Credential() {
  Result<std::string> credential = WorkerCredential(kToken, "w0");
  return credential.ok() ? *credential : std::string();
}

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

TEST(AgentAcrossCoordinatorRestart, AWrongTokenFailsAtTheTimeoutWithoutFailingTheJob) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  Coordinator coordinator;
  ASSERT_TRUE(coordinator.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  auto server = CoordinatorServer::Start(coordinator, "127.0.0.1", port);
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
  ASSERT_TRUE(coordinator.AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  auto server = CoordinatorServer::Start(coordinator, "127.0.0.1", port);
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

// A worker that trains while the operator restarts: its reports meet 401 (job unknown), then
// 404 (worker unknown) once the job is back, and it registers again; its leave request and
// acknowledgement go through after the coordinator forgot it once more.
TEST(AgentAcrossCoordinatorRestart, AForgottenWorkerRegistersAgainAndLeavesCleanly) {
  const int port = FreeLowPort();
  ASSERT_GT(port, 0);
  auto first = std::make_unique<Coordinator>();
  ASSERT_TRUE(first->AddJob(kJob, kToken, kFingerprint, kBuild).ok());
  auto server = CoordinatorServer::Start(*first, "127.0.0.1", port);
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

// A worker asked to leave (its pod deleted) whose job the coordinator no longer knows (the job
// was deleted, or the operator restarts) goes at once, cleanly, rather than keeping its pod
// Terminating while it waits for a coordinator that may never know the job again. In a child
// process of its own: RequestLeave is process-wide.
void LeaveWithTheJobGone() {
  const int port = FreeLowPort();
  Coordinator coordinator;
  if (!coordinator.AddJob(kJob, kToken, kFingerprint, kBuild).ok()) std::exit(10);
  auto server = CoordinatorServer::Start(coordinator, "127.0.0.1", port);
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
