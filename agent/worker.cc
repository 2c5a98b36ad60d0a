#include "agent/worker.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/executor.h"
#include "runtime/job/spec.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;

std::string FormatDuration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return buf;
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

}  // namespace

Status RunWorker(const WorkerOptions& o) {
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " is outside a world of " +
                           std::to_string(o.world_size));
  }
  VF_ASSIGN_OR_RETURN(JobSpec job, LoadJobFile(o.job_path));
  if (o.steps_override > 0) {
    job.steps = o.steps_override;
    job.epochs = 0;
  }
  VF_RETURN_IF_ERROR(ValidateJob(job).WithContext(o.job_path));
  if (o.world_size > job.virtual_nodes) {
    return InvalidArgument(std::to_string(o.world_size) + " workers but only " +
                           std::to_string(job.virtual_nodes) +
                           " virtual nodes: every worker needs at least one");
  }

  VF_ASSIGN_OR_RETURN(DatasetSplits data, LoadJobDataset(job));
  auto device = CreateCpuDevice(1);
  VF_ASSIGN_OR_RETURN(auto executor, Executor::Create(job, *device, data.train));

  const std::string& ckpt = job.checkpoint.path;
  if (!ckpt.empty() && std::filesystem::exists(ckpt)) {
    VF_ASSIGN_OR_RETURN(TrainingState state, ReadCheckpoint(ckpt));
    VF_RETURN_IF_ERROR(executor->Restore(state).WithContext("checkpoint " + ckpt));
    if (o.rank == 0) {
      std::printf("resuming from checkpoint %s at step %lld\n", ckpt.c_str(),
                  static_cast<long long>(state.step));
    }
  } else {
    VF_RETURN_IF_ERROR(executor->InitializeFresh());
  }

  CommOptions copts;
  copts.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout * 1000));
  std::unique_ptr<Store> store;
  std::unique_ptr<Store> prefixed;
  std::unique_ptr<Communicator> comm;
  if (o.world_size == 1) {
    comm = CreateLocalCommunicator();
  } else {
    if (o.store_dir.empty()) return InvalidArgument("--store-dir is required with several workers");
    store = std::make_unique<FileStore>(o.store_dir);
    prefixed = std::make_unique<PrefixStore>("epoch-0", *store);
    VF_ASSIGN_OR_RETURN(comm, CreateGlooCommunicator(*prefixed, o.rank, o.world_size, copts));
  }
  const auto assignment = EvenAssignment(job.virtual_nodes, o.world_size);
  const std::vector<int>& mine = assignment[static_cast<size_t>(o.rank)];

  const int64_t total = executor->total_steps();
  const int64_t spe = executor->steps_per_epoch();
  const bool report = o.rank == 0 && o.progress_interval > 0;
  if (report) {
    std::printf("training %s: %s, %d virtual nodes x %lld samples, %d worker%s, %lld steps\n",
                job.name.c_str(), executor->model().Describe().c_str(), job.virtual_nodes,
                static_cast<long long>(job.micro_batch()), o.world_size,
                o.world_size == 1 ? "" : "s", static_cast<long long>(total));
    std::fflush(stdout);
  }
  const auto start = Clock::now();
  auto last_report = start;
  const int64_t first_step = executor->step();
  StepResult last;
  bool trained = false;
  while (executor->step() < total) {
    VF_ASSIGN_OR_RETURN(last, executor->Step(*comm, mine));
    trained = true;
    const int64_t done = executor->step();
    if (!ckpt.empty() && o.rank == 0 && job.checkpoint.every_steps > 0 &&
        done % job.checkpoint.every_steps == 0 && done < total) {
      VF_RETURN_IF_ERROR(WriteCheckpoint(ckpt, executor->Snapshot()));
    }
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last_report).count();
    if (report && (since >= o.progress_interval || done == total)) {
      const double elapsed = std::chrono::duration<double>(now - start).count();
      const double rate = static_cast<double>(done - first_step) / elapsed;
      const double eta = rate > 0 ? static_cast<double>(total - done) / rate : 0.0;
      std::printf(
          "step %6lld/%lld  epoch %lld  loss %.4f  train-acc %5.1f%%  %7.0f samples/s  "
          "ETA %s\n",
          static_cast<long long>(done), static_cast<long long>(total),
          static_cast<long long>(done == 0 ? 0 : (done - 1) / spe), last.loss,
          100.0 * last.accuracy, rate * static_cast<double>(job.global_batch_size),
          FormatDuration(eta).c_str());
      std::fflush(stdout);
      last_report = now;
    }
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!ckpt.empty() && o.rank == 0) {
    VF_RETURN_IF_ERROR(WriteCheckpoint(ckpt, executor->Snapshot()));
  }

  nlohmann::json result;
  result["rank"] = o.rank;
  result["steps"] = executor->step();
  result["steps_trained"] = executor->step() - first_step;
  result["seconds"] = seconds;
  result["samples_per_second"] =
      seconds > 0
          ? static_cast<double>((executor->step() - first_step) * job.global_batch_size) / seconds
          : 0.0;
  result["final_loss"] = trained ? nlohmann::json(last.loss) : nlohmann::json(nullptr);
  result["weights_sha256"] = executor->WeightsSha256();
  result["virtual_nodes"] = job.virtual_nodes;
  result["virtual_nodes_held"] = mine;
  if (o.rank == 0) {
    VF_ASSIGN_OR_RETURN(LossStats test, executor->Evaluate(data.test));
    result["test_accuracy"] = static_cast<double>(test.correct) / static_cast<double>(test.samples);
    result["test_loss"] = test.loss_sum / static_cast<double>(test.samples);
    result["test_samples"] = test.samples;
  }
  if (!o.result_path.empty()) VF_RETURN_IF_ERROR(WriteJson(o.result_path, result));
  return Status::Ok();
}

}  // namespace vf
