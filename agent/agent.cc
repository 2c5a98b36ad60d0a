#include "agent/agent.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "agent/fault.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/http_exporter.h"
#include "agent/plan_watcher.h"
#include "agent/protocol/client.h"
#include "agent/protocol/json.h"
#include "agent/state_sync.h"
#include "runtime/comm/staged/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/job/worker_env.h"

namespace vf::agent {
namespace {

using Clock = std::chrono::steady_clock;

// Set by RequestLeave (a SIGTERM handler): signals are process-wide, and so is this.
std::atomic<bool> g_leave{false};
// How often a joiner that is in no plan yet looks at g_leave.
constexpr std::chrono::milliseconds kJoinerPoll(200);
// How long to wait between attempts to reach a coordinator that is not serving yet.
constexpr std::chrono::milliseconds kRetryPause(500);
// A worker the coordinator has no room for yet (IsCoordinatorFull) registers again after a pause
// that doubles from the first to the longest, for as long as that lasts, and says every notice
// interval that it still waits.
constexpr std::chrono::milliseconds kFullFirstPause(500);
constexpr std::chrono::milliseconds kFullLongestPause(10000);
constexpr std::chrono::seconds kFullNotice(30);
// A checkpoint error travels in every report: one message, cut to the protocol's limit.
constexpr size_t kMaxCheckpointErrorBytes = protocol::kMaxCheckpointError;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Whether the coordinator's answer means that it does not know this job (401, as for a wrong
// token) or this worker (404): after an operator restart, until the job and the worker are
// added again.
bool Forgotten(const Status& s) {
  return s.code() == StatusCode::kNotFound || s.code() == StatusCode::kUnauthenticated;
}

std::string Seconds(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

// The coordinator protocol this worker speaks: its build's, or in tests the one
// kTestAgentProtocolEnv names (said on stderr, so that no log hides it). kInvalidArgument for a
// value that is not a positive integer.
Result<int64_t> ProtocolToSpeak(const std::string& worker) {
  const char* posed = std::getenv(kTestAgentProtocolEnv);
  if (posed == nullptr || *posed == '\0') return kProtocolVersion;
  char* end = nullptr;
  const long long value = std::strtoll(posed, &end, 10);
  if (*end != '\0' || value <= 0) {
    return InvalidArgument(std::string(kTestAgentProtocolEnv) +
                           " must be a positive integer, not '" + posed + "'");
  }
  std::fprintf(stderr, "virtualflow-agent: %s: testing: speaking coordinator protocol %lld (%s)\n",
               worker.c_str(), value, kTestAgentProtocolEnv);
  return static_cast<int64_t>(value);
}

const Member* FindMember(const Plan& plan, const std::string& worker) {
  for (const auto& m : plan.members) {
    if (m.worker == worker) return &m;
  }
  return nullptr;
}

}  // namespace

void RequestLeave() { g_leave.store(true); }
bool LeaveRequested() { return g_leave.load(); }

// Everything one worker's membership holds. Not thread-safe (the PlanWatcher it owns is).
class Agent::Impl {
 public:
  explicit Impl(const AgentOptions& o)
      : o_(o),
        metrics_(Namespace(o.job_id), Name(o.job_id)),
        client_(o.coordinator_url, o.job_id, o.token, o.worker, std::chrono::milliseconds(10000),
                o.ca_file),
        coordinator_store_(client_),
        faults_(FaultSpec(), o.worker) {}

  Status Start();
  Status Ready() {
    if (watcher_ == nullptr) return Status::Ok();  // left before it ever registered
    ready_ = true;
    Status s =
        Persist("telling the coordinator this worker is ready", Clock::now() + o_.timeout,
                [this] { return client_.Register(o_.fingerprint, o_.build, true, protocol_); });
    // Deleted while warming up: Next says it left.
    return !s.ok() && forgotten_ && g_leave.load() ? Status::Ok() : s;
  }
  Result<std::optional<Membership>> Next(TrainingStateHolder& state);
  Status Completed(int64_t step, const StepOutcome& outcome);
  void Failed(int64_t step, const Status& error);
  void CheckpointWritten(int64_t step, const Status& written);
  Status Finish(Report final);
  int64_t latest_epoch() const { return watcher_ ? watcher_->latest_epoch() : 0; }
  void set_total_steps(int64_t total) { total_steps_ = total; }
  void set_staging(Device* device) { staging_ = device; }
  void set_nccl_device(int cuda_device) { nccl_device_ = cuda_device; }

  const Report& last_report() const { return last_progress_; }
  AgentMetrics& metrics() { return metrics_; }
  const std::string& worker() const { return o_.worker; }
  bool left_untold() const { return forgotten_; }

 private:
  static std::string Namespace(const std::string& id) { return id.substr(0, id.find('/')); }
  static std::string Name(const std::string& id) {
    const size_t slash = id.find('/');
    return slash == std::string::npos ? id : id.substr(slash + 1);
  }
  static std::string FaultSpec() {
    const char* spec = std::getenv(worker_env::kFaultInject.name);
    return spec == nullptr ? "" : spec;
  }
  // VF_COMM_THREAD_NICE: 0 when unset or empty.
  static Result<int> CommThreadNice() {
    const char* text = std::getenv(worker_env::kCommThreadNice.name);
    if (text == nullptr || *text == '\0') return 0;
    char* end = nullptr;
    errno = 0;
    const long nice = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || nice < 0 || nice > 19) {
      return InvalidArgument(std::string(worker_env::kCommThreadNice.name) +
                             " must be a whole number 0..19, got '" + text + "'");
    }
    return static_cast<int>(nice);
  }

  // The first registration (not ready yet), waiting as Agent::Join says; false when the worker
  // was asked to leave before it registered.
  Result<bool> RegisterFirst();
  // Sleeps for `pause`, in short slices so that a leave request (SIGTERM) ends it early.
  static void PauseUnlessLeaving(std::chrono::milliseconds pause);
  // The plan to follow next: the one the members agreed on, or the newest one after ours.
  std::optional<Plan> WaitForPlan();
  // Builds the communicator of `plan` and brings every member to the same state. Transient
  // failures are reported and give nullopt (the caller waits for the next plan).
  Result<bool> Switch(const Plan& plan, const Member& me, TrainingStateHolder& state);
  // Runs `call`; while the coordinator answers that it does not know this job or worker (an
  // operator restart), registers the worker again (readiness and leave request included) and
  // repeats the call, until `deadline`. Past it, kUnavailable naming the possible causes: a
  // worker cannot tell a forgotten job from a token that is no longer valid but by time.
  Status Persist(const std::string& what, Clock::time_point deadline,
                 const std::function<Status()>& call);
  // Reports a failure of this plan to the coordinator, and says so in the worker's log first:
  // the coordinator keeps only the latest message, and a recovery is otherwise silent here.
  void ReportFailure(const char* what, int64_t step, const Status& error);
  // A report, with the checkpoint outcome every report carries. A forgotten worker registers
  // again once (a periodic report must not hold up training; the next one tries again), or
  // until `deadline` when it is later.
  Status Send(const Report& r, Clock::time_point deadline = Clock::time_point::min());
  // Writes the final report to the termination message file, if there is one.
  void LeaveFinalReport(const Report& final) const;
  void Progress(int64_t step, double loss, bool force);
  // A leaving worker (asked to, or excluded by a plan) whose leave request or acknowledgement
  // failed: when the coordinator does not know the job (forgotten_), it leaves anyway, as
  // nobody is there to tell; any other failure is returned.
  Result<std::optional<Membership>> LeaveUntold(const Status& why);

  AgentOptions o_;
  int64_t protocol_ = kProtocolVersion;  // the coordinator protocol it speaks (ProtocolToSpeak)
  AgentMetrics metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  CoordinatorClient client_;
  CoordinatorStore coordinator_store_;
  FaultInjector faults_;
  int comm_thread_nice_ = 0;  // the Gloo communicator's event thread's (VF_COMM_THREAD_NICE)
  std::unique_ptr<PlanWatcher> watcher_;

  std::unique_ptr<PrefixStore> prefixed_;
  std::unique_ptr<Communicator> comm_;
  Device* staging_ = nullptr;  // see Agent::StageCollectivesThrough
  // The CUDA device of the NCCL communicator (AgentOptions::gpu, CollectivesOnNccl); -1: Gloo.
  int nccl_device_ = o_.gpu ? 0 : -1;
  Membership membership_;
  int64_t epoch_ = 0;    // plan this worker trains under (or the last one it looked at)
  int64_t agreed_ = 0;   // epoch all members agreed in-band to switch to
  bool member_ = false;  // has been a member of some plan
  bool need_switch_ = true;
  bool leave_sent_ = false;
  bool ready_ = false;      // told the coordinator it is ready: a registration again says so too
  bool forgotten_ = false;  // the last Persist failed because the coordinator did not know it
  Clock::time_point switch_started_ = Clock::now();
  double last_pause_ = 0.0;
  int64_t total_steps_ = 0;
  int64_t checkpoint_step_ = 0;   // the latest checkpoint write attempted (0: none)
  std::string checkpoint_error_;  // why it failed; empty when it succeeded
  bool report_now_ = false;       // the next progress report goes out whatever the interval

  Report last_progress_;  // the last periodic report; the final one repeats its rates
  Clock::time_point last_report_ = Clock::now();
  int64_t steps_since_report_ = 0;
  int64_t samples_since_report_ = 0;
  double compute_since_report_ = 0.0;
  int64_t vnodes_since_report_ = 0;
};

Status Agent::Impl::Start() {
  if (o_.metrics_port >= 0) {
    VF_ASSIGN_OR_RETURN(metrics_server_,
                        MetricsServer::Start(metrics_.registry(), "0.0.0.0", o_.metrics_port));
    std::fprintf(stderr, "virtualflow-agent: %s: metrics on port %d\n", o_.worker.c_str(),
                 metrics_server_->port());
  }
  VF_ASSIGN_OR_RETURN(protocol_, ProtocolToSpeak(o_.worker));
  VF_ASSIGN_OR_RETURN(comm_thread_nice_, CommThreadNice());
  VF_ASSIGN_OR_RETURN(const bool registered, RegisterFirst());
  if (!registered) return Status::Ok();  // deleted before it ever counted: Next says so
  // A coordinator that restarted while this worker rendezvoused lost the keys it wrote; the
  // watcher writes them again as soon as it meets the new one, even while this worker's own
  // thread is busy connecting to a peer.
  watcher_ = std::make_unique<PlanWatcher>(client_, [this] { coordinator_store_.Reassert(); });
  return Status::Ok();
}

Result<bool> Agent::Impl::RegisterFirst() {
  // Registered but not ready: the controller sees the worker starting and waits for warm-up.
  // A coordinator that is not serving yet (an operator starting or restarting) is waited for,
  // and so is one that does not know the job yet: it answers 401, as for a wrong token, so
  // that nobody learns which jobs exist; a wrong token fails at the timeout. A coordinator
  // that has no room for this worker yet is waited for as long as it says so.
  auto deadline = Clock::now() + o_.timeout;
  std::optional<Clock::time_point> full_since;
  Clock::time_point full_said;
  std::chrono::milliseconds full_pause = kFullFirstPause;
  while (true) {
    Status s = client_.Register(o_.fingerprint, o_.build, false, protocol_);
    if (s.ok()) break;
    if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kNotFound &&
        s.code() != StatusCode::kUnauthenticated) {
      return s;
    }
    if (g_leave.load()) return false;
    const auto now = Clock::now();
    if (IsCoordinatorFull(s)) {
      if (!full_since || now - full_said >= kFullNotice) {
        if (full_since) {
          std::fprintf(stderr,
                       "virtualflow-agent: %s: still waiting for room at the coordinator after "
                       "%.0f s: %s\n",
                       o_.worker.c_str(), Since(*full_since), s.message().c_str());
        } else {
          std::fprintf(stderr,
                       "virtualflow-agent: %s: waiting for room at the coordinator, registering "
                       "again until admitted: %s\n",
                       o_.worker.c_str(), s.message().c_str());
          full_since = now;
        }
        full_said = now;
      }
      // The timeout is for a coordinator that is away or does not know the job, not for one
      // that is full: it counts from the last answer that said so.
      deadline = now + o_.timeout;
      PauseUnlessLeaving(full_pause);
      full_pause = std::min(full_pause * 2, kFullLongestPause);
      continue;
    }
    if (now > deadline) {
      if (s.code() == StatusCode::kUnavailable) return s.WithContext("registering");
      // Never kNotFound, which would fail the whole job: a replacement may be luckier.
      return Unavailable("registering: the coordinator did not accept this worker within " +
                         Seconds(o_.timeout) +
                         " s: a wrong token, or a job it does not know (not added yet, ended, "
                         "or deleted): " +
                         s.message());
    }
    std::this_thread::sleep_for(kRetryPause);
  }
  if (full_since) {
    std::fprintf(stderr, "virtualflow-agent: %s: admitted by the coordinator after %.0f s\n",
                 o_.worker.c_str(), Since(*full_since));
  }
  return true;
}

void Agent::Impl::PauseUnlessLeaving(std::chrono::milliseconds pause) {
  const auto until = Clock::now() + pause;
  while (!g_leave.load()) {
    const auto now = Clock::now();
    if (now >= until) return;
    std::this_thread::sleep_for(std::min<Clock::duration>(until - now, kJoinerPoll));
  }
}

std::optional<Plan> Agent::Impl::WaitForPlan() {
  // A joiner no plan has included yet waits as long as the controller wants it to, but in
  // short slices: the SIGTERM handler can only set g_leave, and a pod deleted before it was
  // ever included must end at once, not after a whole timeout (by then the kubelet's grace
  // period may be over, and the pod lingers as Terminating all that while).
  const auto wait = member_ ? o_.timeout : std::min(o_.timeout, kJoinerPoll);
  return agreed_ > epoch_ ? watcher_->WaitFor(agreed_, wait) : watcher_->WaitNewer(epoch_, wait);
}

Result<bool> Agent::Impl::Switch(const Plan& plan, const Member& me, TrainingStateHolder& state) {
  comm_.reset();
  coordinator_store_.ForgetKeys();
  prefixed_ = std::make_unique<PrefixStore>(plan.store_prefix, coordinator_store_);
  const int world = static_cast<int>(plan.members.size());
  CommOptions copts;
  copts.timeout = o_.timeout;
  copts.hostname = o_.host;
  copts.event_thread_nice = comm_thread_nice_;
  const bool nccl = nccl_device_ >= 0;
  auto c = nccl ? CreateNcclCommunicator(*prefixed_, me.rank, world, copts, nccl_device_)
                : CreateGlooCommunicator(*prefixed_, me.rank, world, copts);
  // Built (every peer has read this worker's keys) or failed: nobody needs them any more.
  coordinator_store_.ForgetKeys();
  if (c.ok() && !nccl && staging_ != nullptr) {
    c = std::unique_ptr<Communicator>(
        std::make_unique<StagedCommunicator>(*staging_, std::move(c).value()));
  }
  if (!c.ok()) {
    ReportFailure("building the communicator", state.step(), c.status());
    // Refused for good (NCCL refuses two ranks on one GPU): the same workers planned again
    // would fail the same way, round after round, and the job would hang without a word.
    if (c.status().code() == StatusCode::kInvalidArgument) return c.status();
    return false;
  }
  auto sync = SyncState(**c, state, [&] { faults_.At("state-transfer"); });
  if (!sync.ok()) {
    if (sync.status().code() == StatusCode::kDataLoss ||
        sync.status().code() == StatusCode::kFailedPrecondition) {
      return sync.status();  // a bad checkpoint or foreign state: the job cannot go on
    }
    ReportFailure("the state transfer", state.step(), sync.status());
    return false;
  }
  if (sync->transferred) metrics_.OnStateTransfer(sync->bytes, sync->seconds);
  comm_ = std::move(c).value();
  std::vector<std::string> members(plan.members.size());
  for (const Member& m : plan.members) members[static_cast<size_t>(m.rank)] = m.worker;
  membership_ =
      Membership{std::move(members), epoch_, me.rank, world, me.virtual_nodes, comm_.get(), true};
  member_ = true;
  need_switch_ = false;
  last_pause_ = Since(switch_started_);
  metrics_.OnRebuild(last_pause_, epoch_);
  metrics_.SetVirtualNodes(static_cast<int>(me.virtual_nodes.size()));
  Report r;
  r.epoch = epoch_;
  r.step = state.step();
  r.loss = std::numeric_limits<double>::quiet_NaN();  // no step trained under this plan yet
  r.pause_seconds = last_pause_;
  r.has_state = true;
  (void)Send(r);
  return true;
}

Result<std::optional<Membership>> Agent::Impl::Next(TrainingStateHolder& state) {
  const std::optional<Membership> kLeft;
  membership_.switched = false;
  while (true) {
    if (g_leave.load() && !member_) return kLeft;  // never counted: nothing to hand over
    if (g_leave.load() && !leave_sent_) {
      // The controller publishes a plan without this worker; it keeps training until then so
      // the job loses no step.
      Status asked = Persist("asking to leave", Clock::now(), [this] { return client_.Leave(); });
      if (!asked.ok()) return LeaveUntold(asked);
      leave_sent_ = true;
    }
    if (!need_switch_) return std::optional<Membership>(membership_);
    std::optional<Plan> plan = WaitForPlan();
    if (!plan) {
      if (!member_) continue;  // a joiner waits as long as the controller wants it to
      return DeadlineExceeded("no new membership plan after epoch " + std::to_string(epoch_) +
                              " within " + Seconds(o_.timeout) + " s");
    }
    epoch_ = plan->epoch;
    const Member* me = FindMember(*plan, o_.worker);
    if (me == nullptr) {
      if (member_ || leave_sent_) {
        // Left the job: acknowledge so the controller may delete this worker's pod.
        comm_.reset();
        Status acked = Persist("acknowledging plan " + std::to_string(epoch_), Clock::now(),
                               [this] { return client_.Ack(epoch_); });
        if (!acked.ok()) return LeaveUntold(acked);
        return kLeft;
      }
      continue;  // not included yet
    }
    VF_ASSIGN_OR_RETURN(const bool switched, Switch(*plan, *me, state));
    if (switched) {
      membership_.switched = true;
      return std::optional<Membership>(membership_);
    }
  }
}

Result<std::optional<Membership>> Agent::Impl::LeaveUntold(const Status& why) {
  if (!forgotten_) return why;
  // Deleted with its job, or asked to go while the operator restarts: the pod goes either way,
  // and waiting for a coordinator that may never know the job again would only keep it
  // Terminating. The members lose it as they lose a killed worker, and redo at most one step.
  comm_.reset();
  std::fprintf(stderr, "virtualflow-agent: %s: leaving without telling the coordinator: %s\n",
               o_.worker.c_str(), why.message().c_str());
  return std::optional<Membership>();
}

Status Agent::Impl::Persist(const std::string& what, Clock::time_point deadline,
                            const std::function<Status()>& call) {
  forgotten_ = false;
  Status s = call();
  const auto since = Clock::now();
  while (Forgotten(s)) {
    Status registered = client_.Register(o_.fingerprint, o_.build, ready_, protocol_);
    if (registered.ok()) {
      if (leave_sent_) (void)client_.Leave();
      s = call();
      if (!Forgotten(s)) return s;
    } else if (Forgotten(registered) || registered.code() == StatusCode::kUnavailable) {
      s = registered;
    } else {
      return registered.WithContext(what + ": registering again");
    }
    // A worker asked to leave before it ever trained has nothing to wait for.
    if (Clock::now() >= deadline || (g_leave.load() && !member_)) {
      forgotten_ = true;
      return Unavailable(
          what + ": the coordinator has not known this worker for " +
          Seconds(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since)) +
          " s (an operator restart that has not restored the job yet, a job that "
          "ended or was deleted, or a token that is no longer valid): " +
          s.message());
    }
    std::this_thread::sleep_for(kRetryPause);
  }
  return s;
}

Status Agent::Impl::Send(const Report& report, Clock::time_point deadline) {
  Report r = report;
  r.total_steps = total_steps_;
  r.checkpoint_step = checkpoint_step_;
  r.checkpoint_error = checkpoint_error_;
  return Persist("reporting step " + std::to_string(r.step), deadline,
                 [&] { return client_.Report(r); });
}

void Agent::Impl::CheckpointWritten(int64_t step, const Status& written) {
  const bool was_failing = !checkpoint_error_.empty();
  checkpoint_step_ = step;
  checkpoint_error_ = written.ok() ? "" : written.message().substr(0, kMaxCheckpointErrorBytes);
  if (!written.ok()) {
    metrics_.OnCheckpointFailed();
    std::fprintf(stderr,
                 "virtualflow-agent: %s: warning: checkpoint at step %lld not written; training "
                 "goes on and the next checkpoint tries again: %s\n",
                 o_.worker.c_str(), static_cast<long long>(step), written.message().c_str());
  } else if (was_failing) {
    std::fprintf(stderr, "virtualflow-agent: %s: checkpoint written again at step %lld\n",
                 o_.worker.c_str(), static_cast<long long>(step));
  }
  // The operator (and `vf run`) learn it from the next report, which goes out at once.
  report_now_ = report_now_ || !written.ok() || was_failing;
}

Status Agent::Impl::Completed(int64_t step, const StepOutcome& outcome) {
  const int nodes = static_cast<int>(membership_.virtual_nodes.size());
  metrics_.OnStep(
      outcome.seconds, outcome.loss,
      outcome.seconds > 0 ? static_cast<double>(outcome.samples) / outcome.seconds : 0.0, nodes);
  metrics_.OnAllReduce(std::max(0.0, outcome.seconds - outcome.compute_seconds));
  ++steps_since_report_;
  samples_since_report_ += outcome.samples;
  compute_since_report_ += outcome.compute_seconds;
  vnodes_since_report_ += nodes;
  if (outcome.agreed_epoch > epoch_) {
    agreed_ = outcome.agreed_epoch;
    need_switch_ = true;
    switch_started_ = Clock::now();
  }
  Progress(step, outcome.loss, outcome.last_step);
  return Status::Ok();
}

void Agent::Impl::Progress(int64_t step, double loss, bool force) {
  const double since = Since(last_report_);
  if (!force && !report_now_ && since < o_.report_interval) return;
  report_now_ = false;
  Report r;
  r.epoch = epoch_;
  r.step = step;
  r.loss = loss;
  r.samples_per_second = since > 0 ? static_cast<double>(samples_since_report_) / since : 0.0;
  r.seconds_per_virtual_node =
      vnodes_since_report_ > 0 ? compute_since_report_ / static_cast<double>(vnodes_since_report_)
                               : 0.0;
  r.pause_seconds = last_pause_;
  r.has_state = true;
  (void)Send(r);  // a report that fails is not fatal: the next one carries newer numbers
  last_progress_ = r;
  last_report_ = Clock::now();
  steps_since_report_ = 0;
  samples_since_report_ = 0;
  compute_since_report_ = 0.0;
  vnodes_since_report_ = 0;
}

void Agent::Impl::ReportFailure(const char* what, int64_t step, const Status& error) {
  std::fprintf(stderr,
               "virtualflow-agent: %s: epoch %lld, step %lld: %s failed: %s; reporting it to the "
               "coordinator\n",
               o_.worker.c_str(), static_cast<long long>(epoch_), static_cast<long long>(step),
               what, error.message().c_str());
  (void)Persist(std::string("reporting a failure of ") + what, Clock::now(),
                [&] { return client_.ReportFailure(epoch_, step, error.message()); });
}

void Agent::Impl::Failed(int64_t step, const Status& error) {
  metrics_.OnRecovery();
  // A member died or stalled: nothing of the step was applied. Report, drop the communicator
  // and redo the step under the next plan.
  ReportFailure("the step", step, error);
  comm_.reset();
  membership_.comm = nullptr;
  need_switch_ = true;
  switch_started_ = Clock::now();
}

void Agent::Impl::LeaveFinalReport(const Report& final) const {
  const std::string& path = o_.termination_message_path;
  if (path.empty()) return;
  Report r = final;
  r.total_steps = total_steps_;
  r.checkpoint_step = checkpoint_step_;
  const std::string message = protocol::FinalReportMessage(o_.worker, r);
  std::FILE* f = std::fopen(path.c_str(), "w");
  bool written = f != nullptr;
  if (f != nullptr) {
    written = std::fwrite(message.data(), 1, message.size(), f) == message.size();
    written = std::fclose(f) == 0 && written;
  }
  if (!written) {
    // Not fatal: the coordinator still gets the report; only an operator restart in between
    // would then lose it.
    std::fprintf(stderr, "virtualflow-agent: %s: warning: final report not left in %s: %s\n",
                 o_.worker.c_str(), path.c_str(), std::strerror(errno));
  }
}

Status Agent::Impl::Finish(Report final) {
  // The controller learns the outcome from this report (a pod has no result file). It repeats
  // the last progress report's rates, so whoever shows progress from the newest report keeps
  // showing them.
  final.epoch = epoch_;
  final.samples_per_second = last_progress_.samples_per_second;
  final.seconds_per_virtual_node = last_progress_.seconds_per_virtual_node;
  final.pause_seconds = last_progress_.pause_seconds;
  final.has_state = true;
  final.finished = true;
  // The outcome must not be lost to a coordinator that is briefly away (an operator restart),
  // nor with one that received it and went before the job's status said so: it is left in the
  // pod first (the termination message, which the kubelet keeps in the pod's status).
  LeaveFinalReport(final);
  const auto deadline = Clock::now() + o_.timeout;
  Status sent = Send(final, deadline);
  while (sent.code() == StatusCode::kUnavailable && Clock::now() < deadline) {
    std::this_thread::sleep_for(kRetryPause);
    sent = Send(final, deadline);
  }
  return sent;
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Agent::~Agent() = default;

Result<std::unique_ptr<Agent>> Agent::Join(const AgentOptions& options) {
  // The client reads the CA file once; one missing at start is waited for, as a token file is.
  if (!options.ca_file.empty()) {
    VF_RETURN_IF_ERROR(ReadCredentialFile(options.ca_file, "the coordinator's CA file",
                                          options.worker, options.timeout)
                           .status());
  }
  auto impl = std::make_unique<Impl>(options);
  VF_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

void Agent::StageCollectivesThrough(Device& device) { impl_->set_staging(&device); }
void Agent::CollectivesOnNccl(int cuda_device) { impl_->set_nccl_device(cuda_device); }
Status Agent::Ready() { return impl_->Ready(); }
Result<std::optional<Membership>> Agent::Next(TrainingStateHolder& state) {
  return impl_->Next(state);
}
int64_t Agent::latest_epoch() const { return impl_->latest_epoch(); }
void Agent::set_total_steps(int64_t total_steps) { impl_->set_total_steps(total_steps); }
Status Agent::Completed(int64_t step, const StepOutcome& outcome) {
  return impl_->Completed(step, outcome);
}
void Agent::Failed(int64_t step, const Status& error) { impl_->Failed(step, error); }
void Agent::CheckpointWritten(int64_t step, const Status& written) {
  impl_->CheckpointWritten(step, written);
}
Status Agent::Finish(Report final) { return impl_->Finish(std::move(final)); }
const Report& Agent::last_report() const { return impl_->last_report(); }
AgentMetrics& Agent::metrics() { return impl_->metrics(); }
const std::string& Agent::worker() const { return impl_->worker(); }
bool Agent::left_untold() const { return impl_->left_untold(); }

}  // namespace vf::agent
