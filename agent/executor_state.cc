#include "agent/executor_state.h"

#include <cstdio>
#include <filesystem>

#include "runtime/state/training_state.h"

namespace vf {

Status ExecutorState::Initialize() {
  if (!checkpoint_path_.empty() && std::filesystem::exists(checkpoint_path_)) {
    VF_ASSIGN_OR_RETURN(TrainingState state, ReadCheckpoint(checkpoint_path_));
    VF_RETURN_IF_ERROR(executor_.Restore(state).WithContext("checkpoint " + checkpoint_path_));
    std::fprintf(stderr, "virtualflow-agent: resuming from checkpoint %s at step %lld\n",
                 checkpoint_path_.c_str(), static_cast<long long>(executor_.step()));
    return Status::Ok();
  }
  return executor_.InitializeFresh();
}

std::string ExecutorState::Metadata() const { return SerializeState(executor_.SnapshotMetadata()); }

Status ExecutorState::CheckMetadata(std::string_view metadata) const {
  VF_ASSIGN_OR_RETURN(TrainingState theirs, DeserializeState(metadata, "state"));
  if (theirs.job_fingerprint != executor_.SnapshotMetadata().job_fingerprint) {
    return FailedPrecondition("it belongs to a different job");
  }
  return Status::Ok();
}

std::vector<std::span<std::byte>> ExecutorState::Buffers() {
  std::vector<std::span<std::byte>> out;
  for (auto [data, count] : executor_.StateBuffers()) {
    out.push_back(std::as_writable_bytes(std::span<float>(data, count)));
  }
  return out;
}

Status ExecutorState::Adopt(std::string_view metadata) {
  VF_ASSIGN_OR_RETURN(TrainingState state, DeserializeState(metadata, "state"));
  return executor_.RestoreMetadata(state);
}

}  // namespace vf
