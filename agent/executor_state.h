// The built-in executor's training state as the agent library moves it between members.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "agent/agent.h"
#include "runtime/executor.h"

namespace vf {

// Exposes an Executor's state to the agent: the small part serialized in the checkpoint
// format, the parameters and optimizer slots in place. A job with nobody holding state starts
// from its checkpoint when `checkpoint_path` names an existing file, fresh otherwise.
// Thread-compatible (like the executor it wraps, which must outlive it).
class ExecutorState : public agent::TrainingStateHolder {
 public:
  ExecutorState(Executor& executor, std::string checkpoint_path)
      : executor_(executor), checkpoint_path_(std::move(checkpoint_path)) {}

  bool has_state() const override { return executor_.has_state(); }
  int64_t step() const override { return executor_.step(); }
  Status Initialize() override;
  std::string Metadata() const override;
  Status CheckMetadata(std::string_view metadata) const override;
  std::vector<std::span<std::byte>> Buffers() override;
  void Invalidate() override { executor_.InvalidateState(); }
  Status Adopt(std::string_view metadata) override;

 private:
  Executor& executor_;
  std::string checkpoint_path_;
};

}  // namespace vf
