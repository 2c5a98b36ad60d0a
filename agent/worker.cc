#include "agent/worker.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "agent/fault.h"
#include "agent/metrics/agent_metrics.h"
#include "agent/metrics/http_exporter.h"
#include "agent/plan_watcher.h"
#include "agent/state_sync.h"
#include "operator/coordinator/client.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/device.h"
#include "runtime/executor.h"
#include "runtime/job/spec.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
std::atomic<bool> g_leave{false};
// How often a joiner that is in no plan yet looks at g_leave.
constexpr std::chrono::milliseconds kJoinerPoll(200);

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

Status WriteJson(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << j.dump(2) << "\n";
    if (!out) return Internal("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Internal("cannot rename " + tmp + ": " + ec.message());
  return Status::Ok();
}

const Member* FindMember(const Plan& plan, const std::string& worker) {
  for (const auto& m : plan.members) {
    if (m.worker == worker) return &m;
  }
  return nullptr;
}

// Whether this worker trains on the GPU (with NCCL) or the CPU (with Gloo): the GPU when the
// process sees one (a pod given `nvidia.com/gpu: 1` sees it as device 0) unless VF_DEVICE=cpu.
// `why` says why not, when not.
bool UseGpu(std::string* why) {
  const char* forced = std::getenv("VF_DEVICE");
  if (forced != nullptr && std::string_view(forced) == "cpu") {
    *why = "VF_DEVICE=cpu";
    return false;
  }
  return CudaDeviceCount(why) > 0;
}

// The build identity joiners must share with the job: the same binary version and reduction
// arithmetic, or weights would silently diverge. (A job's workers also share the collective
// backend: they all request the same GPUs, or all run on the CPU.)
std::string BuildId() { return std::string("virtualflow ") + VF_VERSION; }

}  // namespace

void RequestLeave() { g_leave.store(true); }

Status RunWorker(const WorkerOptions& o) {
  const std::string source = o.job_path.empty() ? "$VF_JOB_SPEC" : o.job_path;
  VF_ASSIGN_OR_RETURN(
      JobSpec job, o.job_path.empty() ? ParseJobYaml(o.job_text, source) : LoadJobFile(o.job_path));
  if (o.steps_override > 0) {
    job.steps = o.steps_override;
    job.epochs = 0;
  }
  VF_RETURN_IF_ERROR(ValidateJob(job).WithContext(source));
  const std::string job_id = o.job_id.empty() ? job.namespace_name + "/" + job.name : o.job_id;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout * 1000));

  const size_t slash = job_id.find('/');
  AgentMetrics metrics(job_id.substr(0, slash), job_id.substr(slash + 1));
  std::unique_ptr<MetricsServer> metrics_server;
  if (o.metrics_port >= 0) {
    VF_ASSIGN_OR_RETURN(metrics_server,
                        MetricsServer::Start(metrics.registry(), "0.0.0.0", o.metrics_port));
    std::fprintf(stderr, "virtualflow-agent: %s: metrics on port %d\n", o.worker.c_str(),
                 metrics_server->port());
  }

  CoordinatorClient client(o.coordinator_url, job_id, o.token, o.worker,
                           std::chrono::milliseconds(10000));
  // Registered but not ready: the controller sees the worker starting and waits for warm-up.
  // A coordinator that is not serving yet (an operator starting or restarting) is waited for.
  std::string no_gpu;
  const bool gpu = UseGpu(&no_gpu);
  const auto register_deadline = Clock::now() + timeout;
  while (true) {
    Status s = client.Register(job.Fingerprint(), BuildId(), false);
    if (s.ok()) break;
    if (s.code() != StatusCode::kUnavailable && s.code() != StatusCode::kNotFound) return s;
    if (g_leave.load()) return Status::Ok();  // deleted before it ever counted
    if (Clock::now() > register_deadline) return s.WithContext("registering");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }

  // Warm-up: everything slow happens before the worker counts, so members never wait for it.
  VF_ASSIGN_OR_RETURN(DatasetSplits data, LoadJobDataset(job));
  std::unique_ptr<Device> device;
  if (gpu) {
    VF_ASSIGN_OR_RETURN(device, CreateCudaDevice(0));
  } else {
    device = CreateCpuDevice(1);
  }
  // Which device, and why not the GPU: a GPU pod that trains on its CPU (a build without CUDA,
  // a driver that finds no GPU) must say so.
  std::fprintf(stderr, "virtualflow-agent: %s: device %s%s%s\n", o.worker.c_str(),
               device->Name().c_str(), gpu ? "" : "; no GPU: ", gpu ? "" : no_gpu.c_str());
  VF_ASSIGN_OR_RETURN(auto executor, Executor::Create(job, *device, data.train));
  executor->set_slowdown(o.slowdown);
  executor->set_vnode_delay(o.vnode_delay_ms / 1000.0);
  const char* fault_spec = std::getenv("VF_FAULT_INJECT");
  FaultInjector faults(fault_spec == nullptr ? "" : fault_spec, o.worker);
  executor->set_before_reduce([&faults](int64_t step) { faults.At("allreduce", step); });
  VF_RETURN_IF_ERROR(client.Register(job.Fingerprint(), BuildId(), true));

  bool leave_sent = false;
  // Reports keep the controller informed; one that fails is not fatal. A coordinator that has
  // forgotten this worker (the operator restarted) gets it registered again, leave request
  // included, and training never stops for it.
  auto report = [&](const Report& r) -> Status {
    Status s = client.Report(r);
    if (s.code() != StatusCode::kNotFound) return s;
    VF_RETURN_IF_ERROR(client.Register(job.Fingerprint(), BuildId(), true));
    if (leave_sent) (void)client.Leave();
    return client.Report(r);
  };

  PlanWatcher watcher(client);
  CoordinatorStore coordinator_store(client);
  CommOptions copts;
  copts.timeout = timeout;

  const int64_t total = executor->total_steps();
  auto initialize = [&]() -> Status {
    const std::string& ckpt = job.checkpoint.path;
    if (!ckpt.empty() && std::filesystem::exists(ckpt)) {
      VF_ASSIGN_OR_RETURN(TrainingState state, ReadCheckpoint(ckpt));
      return executor->Restore(state).WithContext("checkpoint " + ckpt);
    }
    return executor->InitializeFresh();
  };

  std::unique_ptr<PrefixStore> prefixed;
  std::unique_ptr<Communicator> comm;
  std::vector<int> mine;
  int rank = -1;
  int64_t epoch = 0;    // plan this worker trains under (or last one it looked at)
  int64_t agreed = 0;   // epoch all members agreed in-band to switch to
  bool member = false;  // has been a member of some plan
  bool need_switch = true;
  auto switch_started = Clock::now();
  double last_pause = 0.0;
  Report last_progress;  // the last periodic report; the final one repeats its rates
  auto last_report = Clock::now();
  int64_t steps_since_report = 0;
  double compute_since_report = 0.0;
  int64_t vnodes_since_report = 0;
  StepResult last;
  bool trained = false;
  const auto started = Clock::now();
  double first_step_unix = 0.0;  // wall-clock time the first step this process ran finished
  double last_step_unix = 0.0;
  int64_t steps_trained = 0;

  while (true) {
    if (g_leave.load() && !member) return Status::Ok();  // never counted: nothing to hand over
    if (g_leave.load() && !leave_sent) {
      // The controller publishes a plan without this worker; it keeps training until then so
      // the job loses no step.
      VF_RETURN_IF_ERROR(client.Leave());
      leave_sent = true;
    }
    if (need_switch) {
      // A joiner no plan has included yet waits as long as the controller wants it to, but in
      // short slices: the SIGTERM handler can only set g_leave, and a pod deleted before it was
      // ever included must end at once, not after a whole timeout (by then the kubelet's grace
      // period may be over, and the pod lingers as Terminating all that while).
      const auto wait = member ? timeout : std::min(timeout, kJoinerPoll);
      std::optional<Plan> plan =
          agreed > epoch ? watcher.WaitFor(agreed, wait) : watcher.WaitNewer(epoch, wait);
      if (!plan) {
        if (!member) continue;  // a joiner waits as long as the controller wants it to
        return DeadlineExceeded("no new membership plan after epoch " + std::to_string(epoch) +
                                " within " + std::to_string(o.timeout) + " s");
      }
      epoch = plan->epoch;
      const Member* me = FindMember(*plan, o.worker);
      if (me == nullptr) {
        if (member || leave_sent) {
          // Left the job: acknowledge so the controller may delete this worker's pod.
          comm.reset();
          return client.Ack(epoch);
        }
        continue;  // not included yet
      }
      comm.reset();
      prefixed = std::make_unique<PrefixStore>(plan->store_prefix, coordinator_store);
      const int world = static_cast<int>(plan->members.size());
      auto c = gpu ? CreateNcclCommunicator(*prefixed, me->rank, world, copts)
                   : CreateGlooCommunicator(*prefixed, me->rank, world, copts);
      if (!c.ok()) {
        (void)client.ReportFailure(epoch, executor->step(), c.status().message());
        continue;
      }
      auto sync = SyncState(**c, *executor, initialize, [&] { faults.At("state-transfer"); });
      if (sync.ok() && sync->transferred) metrics.OnStateTransfer(sync->bytes, sync->seconds);
      if (!sync.ok()) {
        if (sync.status().code() == StatusCode::kDataLoss ||
            sync.status().code() == StatusCode::kFailedPrecondition) {
          return sync.status();  // a bad checkpoint or foreign state: the job cannot go on
        }
        (void)client.ReportFailure(epoch, executor->step(), sync.status().message());
        continue;
      }
      comm = std::move(c).value();
      rank = me->rank;
      mine = me->virtual_nodes;
      member = true;
      need_switch = false;
      executor->set_membership_epoch(epoch);
      last_pause = Since(switch_started);
      metrics.OnRebuild(last_pause, epoch);
      metrics.SetVirtualNodes(static_cast<int>(mine.size()));
      Report r;
      r.epoch = epoch;
      r.step = executor->step();
      r.pause_seconds = last_pause;
      r.has_state = true;
      (void)report(r);
    }

    if (executor->step() >= total) break;

    const int64_t header[1] = {watcher.latest_epoch()};
    const auto step_started = Clock::now();
    auto result = executor->Step(*comm, mine, header);
    if (!result.ok()) {
      metrics.OnRecovery();
      if (result.status().code() == StatusCode::kNumerical) return result.status();
      // A member died or stalled: nothing of the step was applied. Report, drop the
      // communicator and redo the step under the next plan.
      (void)client.ReportFailure(epoch, executor->step(), result.status().message());
      comm.reset();
      need_switch = true;
      switch_started = Clock::now();
      continue;
    }
    last = *result;
    {
      const double seconds = Since(step_started);
      metrics.OnStep(seconds, last.loss,
                     seconds > 0 ? static_cast<double>(job.global_batch_size) / seconds : 0.0,
                     static_cast<int>(mine.size()));
      metrics.OnAllReduce(std::max(0.0, seconds - last.compute_seconds));
    }
    if (!trained) {
      first_step_unix =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
    }
    trained = true;
    ++steps_trained;
    last_step_unix =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    ++steps_since_report;
    compute_since_report += last.compute_seconds;
    vnodes_since_report += static_cast<int64_t>(mine.size());
    if (!job.checkpoint.path.empty() && rank == 0 && job.checkpoint.every_steps > 0 &&
        executor->step() % job.checkpoint.every_steps == 0 && executor->step() < total) {
      VF_RETURN_IF_ERROR(WriteCheckpoint(job.checkpoint.path, executor->Snapshot()));
    }
    if (last.header_extra.size() == 1 && last.header_extra[0] > epoch) {
      agreed = last.header_extra[0];
      need_switch = true;
      switch_started = Clock::now();
    }
    const double since = Since(last_report);
    if (since >= o.report_interval || executor->step() >= total) {
      Report r;
      r.epoch = epoch;
      r.step = executor->step();
      r.loss = last.loss;
      r.samples_per_second =
          static_cast<double>(steps_since_report * job.global_batch_size) / since;
      r.seconds_per_virtual_node =
          vnodes_since_report > 0 ? compute_since_report / static_cast<double>(vnodes_since_report)
                                  : 0.0;
      r.pause_seconds = last_pause;
      r.has_state = true;
      (void)report(r);
      last_progress = r;
      last_report = Clock::now();
      steps_since_report = 0;
      compute_since_report = 0.0;
      vnodes_since_report = 0;
    }
  }

  double checkpoint_seconds = 0.0;
  if (!job.checkpoint.path.empty() && rank == 0) {
    const auto t0 = Clock::now();
    VF_RETURN_IF_ERROR(WriteCheckpoint(job.checkpoint.path, executor->Snapshot()));
    checkpoint_seconds = Since(t0);
  }
  nlohmann::json result;
  result["first_step_unix"] = first_step_unix;
  result["last_step_unix"] = last_step_unix;
  result["steps_trained"] = steps_trained;
  result["checkpoint_write_seconds"] = checkpoint_seconds;
  result["worker"] = o.worker;
  result["epoch"] = epoch;
  result["rank"] = rank;
  result["steps"] = executor->step();
  result["seconds"] = Since(started);
  result["final_loss"] = trained ? nlohmann::json(last.loss) : nlohmann::json(nullptr);
  result["weights_sha256"] = executor->WeightsSha256();
  result["virtual_nodes"] = job.virtual_nodes;
  result["virtual_nodes_held"] = mine;
  if (rank == 0) {
    VF_ASSIGN_OR_RETURN(LossStats test, executor->Evaluate(data.test));
    result["test_accuracy"] = static_cast<double>(test.correct) / static_cast<double>(test.samples);
    result["test_loss"] = test.loss_sum / static_cast<double>(test.samples);
    // The controller learns the outcome from this report (a pod has no result file).
    // It repeats the last progress report's rates, so whoever shows progress from the newest
    // report keeps showing them.
    Report r = last_progress;
    r.epoch = epoch;
    r.step = executor->step();
    r.loss = trained ? last.loss : std::numeric_limits<double>::quiet_NaN();
    r.has_state = true;
    r.finished = true;
    r.weights_sha256 = result["weights_sha256"].get<std::string>();
    r.test_accuracy = result["test_accuracy"].get<double>();
    // The outcome must not be lost to a coordinator that is briefly away (an operator restart).
    const auto deadline = Clock::now() + timeout;
    Status sent = report(r);
    while (sent.code() == StatusCode::kUnavailable && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      sent = report(r);
    }
    if (!sent.ok()) {
      std::fprintf(stderr, "virtualflow-agent: %s: warning: final report not delivered: %s\n",
                   o.worker.c_str(), sent.message().c_str());
    }
  }
  if (!o.result_path.empty()) VF_RETURN_IF_ERROR(WriteJson(o.result_path, result));
  return Status::Ok();
}

}  // namespace vf
