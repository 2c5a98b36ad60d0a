#include "agent/worker.h"

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
#include <vector>

#include "agent/agent.h"
#include "agent/executor_state.h"
#include "agent/fault.h"
#include "runtime/device.h"
#include "runtime/executor.h"
#include "runtime/job/spec.h"
#include "runtime/job/worker_env.h"
#include "runtime/state/training_state.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
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

// Where a worker trains and how its collectives run.
enum class DeviceChoice {
  kCpu,        // the CPU, Gloo
  kGpu,        // CUDA device 0, NCCL (a GPU of its own)
  kSharedGpu,  // CUDA device 0, Gloo staged through host copies (workers sharing one GPU)
};

// The GPU when the process sees one (a pod given `nvidia.com/gpu: 1` sees it as device 0),
// unless VF_DEVICE says otherwise: `cpu` forces the CPU, `cuda-shared` shares GPU 0 with other
// workers of one machine (`vf run`'s, when asked). `why` says why not the GPU, when not.
Result<DeviceChoice> ChooseDevice(std::string* why) {
  const char* forced = std::getenv(worker_env::kDevice.name);
  const std::string_view want = forced == nullptr ? "" : forced;
  if (want == "cpu") {
    *why = "VF_DEVICE=cpu";
    return DeviceChoice::kCpu;
  }
  if (!want.empty() && want != "cuda-shared") {
    return InvalidArgument("VF_DEVICE is '" + std::string(want) +
                           "': use cpu, cuda-shared, or leave it unset (the GPU if there is one)");
  }
  if (CudaDeviceCount(why) == 0) return DeviceChoice::kCpu;
  return want.empty() ? DeviceChoice::kGpu : DeviceChoice::kSharedGpu;
}

// The build identity joiners must share with the job: the same binary version and reduction
// arithmetic, or weights would silently diverge. (A job's workers also share the collective
// backend: they all request the same GPUs, or all run on the CPU.)
std::string BuildId() { return std::string("virtualflow ") + VF_VERSION; }

Result<JobSpec> LoadJob(const WorkerOptions& o) {
  const std::string source = o.job_path.empty() ? "$VF_JOB_SPEC" : o.job_path;
  VF_ASSIGN_OR_RETURN(
      JobSpec job, o.job_path.empty() ? ParseJobYaml(o.job_text, source) : LoadJobFile(o.job_path));
  if (o.steps_override > 0) {
    job.steps = o.steps_override;
    job.epochs = 0;
  }
  VF_RETURN_IF_ERROR(ValidateJob(job).WithContext(source));
  return job;
}

// The error that ends a job whose final checkpoint could not be written: the trained weights
// exist nowhere else once the workers exit. kFailedPrecondition: a job that cannot go on.
Status FinalCheckpointFailed(const Status& written) {
  return FailedPrecondition("the final weights could not be saved, so the job fails: " +
                            written.message());
}

// What the built-in trainer keeps for the result file, besides the executor's own state.
struct RunRecord {
  StepResult last;
  bool trained = false;
  int64_t steps_trained = 0;
  double first_step_unix = 0.0;  // wall-clock time the first step this process ran finished
  double last_step_unix = 0.0;
  int64_t epoch = 0;
  int rank = -1;
  std::vector<int> virtual_nodes;
};

// The built-in trainer of one worker: the executor on this worker's device, trained through
// the agent library. Not thread-safe.
class BuiltinWorker {
 public:
  BuiltinWorker(const WorkerOptions& o, JobSpec job) : o_(o), job_(std::move(job)) {}

  // Joins the job, warms up (data, device, model), and tells the coordinator it is ready.
  Status Start();
  // Trains until the job is done (true) or this worker has left it (false).
  Result<bool> Train();
  // Rank 0's checkpoint, evaluation and final report, and the result file.
  Status Finish();

 private:
  // One step under `m`: Completed or Failed told to the agent. Errors are the job's end.
  Status RunStep(const agent::Membership& m);
  // Rank 0 of the last plan, leaving on SIGTERM from a job its coordinator no longer knows
  // (suspended, deleted), writes the state of the last step it trained, so that a resumed job
  // redoes none. Every member holds the same state after a step; rank 0 alone writes it. A
  // worker that leaves a job that goes on (a drain, a scale-in) writes nothing: the members
  // that stay checkpoint as usual, and an older state must not replace their newer one.
  void CheckpointOnLeave();

  const WorkerOptions& o_;
  JobSpec job_;
  std::unique_ptr<agent::Agent> agent_;
  DatasetSplits data_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<ExecutorState> state_;
  std::unique_ptr<FaultInjector> faults_;
  int64_t total_ = 0;
  RunRecord record_;
  const Clock::time_point started_ = Clock::now();
};

Status BuiltinWorker::Start() {
  std::string no_gpu;
  agent::AgentOptions ao;
  ao.coordinator_url = o_.coordinator_url;
  ao.job_id = o_.job_id.empty() ? job_.namespace_name + "/" + job_.name : o_.job_id;
  ao.worker = o_.worker;
  ao.token = o_.token;
  ao.ca_file = o_.ca_file;
  ao.fingerprint = job_.Fingerprint();
  ao.build = BuildId();
  ao.timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.timeout * 1000));
  ao.report_interval = o_.report_interval;
  ao.termination_message_path = o_.termination_message_path;
  ao.metrics_port = o_.metrics_port;
  ao.host = o_.host;
  VF_ASSIGN_OR_RETURN(const DeviceChoice choice, ChooseDevice(&no_gpu));
  ao.gpu = choice == DeviceChoice::kGpu;
  VF_ASSIGN_OR_RETURN(agent_, agent::Agent::Join(ao));

  // Warm-up: everything slow happens before the worker counts, so members never wait for it.
  VF_ASSIGN_OR_RETURN(data_, LoadJobDataset(job_));
  if (choice == DeviceChoice::kCpu) {
    device_ = CreateCpuDevice(1);
  } else {
    VF_ASSIGN_OR_RETURN(device_, CreateCudaDevice(0));
  }
  if (choice == DeviceChoice::kSharedGpu) agent_->StageCollectivesThrough(*device_);
  // Which device, and why not the GPU: a GPU pod that trains on its CPU (a build without CUDA,
  // a driver that finds no GPU) must say so.
  const char* how = choice == DeviceChoice::kSharedGpu ? " (shared: Gloo through host copies)"
                    : choice == DeviceChoice::kCpu     ? "; no GPU: "
                                                       : "";
  std::fprintf(stderr, "virtualflow-agent: %s: device %s%s%s\n", o_.worker.c_str(),
               device_->Name().c_str(), how, choice == DeviceChoice::kCpu ? no_gpu.c_str() : "");
  VF_ASSIGN_OR_RETURN(executor_, Executor::Create(job_, *device_, data_.train));
  executor_->set_slowdown(o_.slowdown);
  executor_->set_vnode_delay(o_.vnode_delay_ms / 1000.0);
  const char* fault_spec = std::getenv(worker_env::kFaultInject.name);
  faults_ = std::make_unique<FaultInjector>(fault_spec == nullptr ? "" : fault_spec, o_.worker);
  executor_->set_before_reduce([this](int64_t step) { faults_->At("allreduce", step); });
  state_ = std::make_unique<ExecutorState>(*executor_, job_.checkpoint.path);
  total_ = executor_->total_steps();
  agent_->set_total_steps(total_);
  return agent_->Ready();
}

Result<bool> BuiltinWorker::Train() {
  while (true) {
    VF_ASSIGN_OR_RETURN(std::optional<agent::Membership> m, agent_->Next(*state_));
    if (!m) {
      CheckpointOnLeave();
      return false;
    }
    if (m->switched) executor_->set_membership_epoch(m->epoch);
    record_.epoch = m->epoch;
    record_.rank = m->rank;
    record_.virtual_nodes = m->virtual_nodes;
    if (executor_->step() >= total_) return true;
    VF_RETURN_IF_ERROR(RunStep(*m));
  }
}

Status BuiltinWorker::RunStep(const agent::Membership& m) {
  const int64_t header[1] = {agent_->latest_epoch()};
  const auto step_started = Clock::now();
  Result<StepResult> result = executor_->Step(*m.comm, m.virtual_nodes, header);
  if (!result.ok()) {
    if (result.status().code() == StatusCode::kNumerical) return result.status();
    agent_->Failed(executor_->step(), result.status());
    return Status::Ok();
  }
  RunRecord& r = record_;
  r.last = *result;
  if (!r.trained) r.first_step_unix = UnixNow();
  r.trained = true;
  ++r.steps_trained;
  r.last_step_unix = UnixNow();
  agent::StepOutcome outcome;
  outcome.loss = r.last.loss;
  outcome.seconds = Since(step_started);
  outcome.compute_seconds = r.last.compute_seconds;
  outcome.samples = job_.global_batch_size;
  outcome.agreed_epoch = r.last.header_extra.size() == 1 ? r.last.header_extra[0] : 0;
  outcome.last_step = executor_->step() >= total_;
  VF_RETURN_IF_ERROR(agent_->Completed(executor_->step(), outcome));
  if (!job_.checkpoint.path.empty() && m.rank == 0 && job_.checkpoint.every_steps > 0 &&
      executor_->step() % job_.checkpoint.every_steps == 0 && executor_->step() < total_) {
    // A periodic checkpoint that cannot be written (a full disk, a read-only volume) costs
    // only the steps since the last good one if the job is lost: training goes on, the agent
    // tells the operator, and the next interval tries again. Only the final one must succeed.
    agent_->CheckpointWritten(executor_->step(),
                              WriteCheckpoint(job_.checkpoint.path, executor_->Snapshot()));
  }
  return Status::Ok();
}

void BuiltinWorker::CheckpointOnLeave() {
  if (job_.checkpoint.path.empty() || !agent::LeaveRequested() || !agent_->left_untold() ||
      record_.rank != 0 || !record_.trained || executor_->step() >= total_) {
    return;
  }
  const Status written = WriteCheckpoint(job_.checkpoint.path, executor_->Snapshot());
  std::fprintf(stderr, "virtualflow-agent: %s: leaving; checkpoint at step %lld %s%s\n",
               o_.worker.c_str(), static_cast<long long>(executor_->step()),
               written.ok() ? "written" : "not written: ", written.message().c_str());
}

Status BuiltinWorker::Finish() {
  const RunRecord& r = record_;
  double checkpoint_seconds = 0.0;
  if (!job_.checkpoint.path.empty() && r.rank == 0) {
    const auto t0 = Clock::now();
    const Status written = WriteCheckpoint(job_.checkpoint.path, executor_->Snapshot());
    agent_->CheckpointWritten(executor_->step(), written);
    // The trained weights exist nowhere else once the workers exit: the job fails, saying so
    // (kFailedPrecondition: the exit code of a job that cannot go on).
    if (!written.ok()) return FinalCheckpointFailed(written);
    checkpoint_seconds = Since(t0);
  }
  nlohmann::json result;
  result["first_step_unix"] = r.first_step_unix;
  result["last_step_unix"] = r.last_step_unix;
  result["steps_trained"] = r.steps_trained;
  result["checkpoint_write_seconds"] = checkpoint_seconds;
  result["worker"] = o_.worker;
  result["epoch"] = r.epoch;
  result["rank"] = r.rank;
  result["steps"] = executor_->step();
  result["seconds"] = Since(started_);
  result["final_loss"] = r.trained ? nlohmann::json(r.last.loss) : nlohmann::json(nullptr);
  result["weights_sha256"] = executor_->WeightsSha256();
  result["virtual_nodes"] = job_.virtual_nodes;
  result["virtual_nodes_held"] = r.virtual_nodes;
  result["device"] = device_->Name();
  if (r.rank == 0) {
    VF_ASSIGN_OR_RETURN(LossStats test, executor_->Evaluate(data_.test));
    result["test_accuracy"] = static_cast<double>(test.correct) / static_cast<double>(test.samples);
    result["test_loss"] = test.loss_sum / static_cast<double>(test.samples);
    Report final;
    final.step = executor_->step();
    final.loss = r.trained ? r.last.loss : std::numeric_limits<double>::quiet_NaN();
    final.weights_sha256 = result["weights_sha256"].get<std::string>();
    final.test_accuracy = result["test_accuracy"].get<double>();
    Status sent = agent_->Finish(final);
    if (!sent.ok()) {
      std::fprintf(stderr, "virtualflow-agent: %s: warning: final report not delivered: %s\n",
                   o_.worker.c_str(), sent.message().c_str());
    }
  }
  if (!o_.result_path.empty()) VF_RETURN_IF_ERROR(WriteJson(o_.result_path, result));
  return Status::Ok();
}

}  // namespace

void RequestLeave() { agent::RequestLeave(); }

Status RunWorker(const WorkerOptions& o) {
  VF_ASSIGN_OR_RETURN(JobSpec job, LoadJob(o));
  BuiltinWorker worker(o, std::move(job));
  VF_RETURN_IF_ERROR(worker.Start());
  VF_ASSIGN_OR_RETURN(const bool done, worker.Train());
  if (!done) return Status::Ok();  // left the job, or never joined it
  return worker.Finish();
}

}  // namespace vf
