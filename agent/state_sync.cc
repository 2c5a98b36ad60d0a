#include "agent/state_sync.h"

#include <chrono>
#include <limits>
#include <string>

namespace vf {

Result<SyncOutcome> SyncState(Communicator& comm, Executor& executor,
                              const std::function<Status()>& initialize,
                              const std::function<void()>& before_transfer) {
  const auto start = std::chrono::steady_clock::now();
  SyncOutcome out;
  const bool mine = executor.has_state();
  const int64_t step = mine ? executor.step() : -1;
  // One MAX collective answers: does anyone have state, the highest step, the lowest step
  // among holders (as a negated maximum), and does anyone lack state.
  int64_t agg[4] = {mine ? 1 : 0, step, mine ? -step : std::numeric_limits<int64_t>::min(),
                    mine ? 0 : 1};
  VF_RETURN_IF_ERROR(comm.AllReduce(agg, 4, ReduceOp::kMax).WithContext("state sync"));
  const bool anyone = agg[0] != 0;
  const int64_t newest = agg[1];
  const int64_t oldest_holder = -agg[2];
  const bool someone_lacks = agg[3] != 0;
  if (anyone && !someone_lacks && oldest_holder == newest) {
    out.source_rank = 0;
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return out;
  }

  int source = 0;
  if (anyone) {
    // Lowest rank at the newest step, found as the MAX of (size - rank).
    int64_t claim = (mine && step == newest) ? comm.size() - comm.rank() : 0;
    VF_RETURN_IF_ERROR(comm.AllReduce(&claim, 1, ReduceOp::kMax).WithContext("state sync"));
    source = comm.size() - static_cast<int>(claim);
  } else if (comm.rank() == 0) {
    VF_RETURN_IF_ERROR(initialize());
    out.initialized = true;
  }
  out.source_rank = source;

  std::string bytes;
  if (comm.rank() == source) bytes = SerializeState(executor.Snapshot());
  int64_t size = static_cast<int64_t>(bytes.size());
  VF_RETURN_IF_ERROR(comm.Broadcast(&size, sizeof(size), source).WithContext("state size"));
  bytes.resize(static_cast<size_t>(size));
  if (before_transfer) before_transfer();
  VF_RETURN_IF_ERROR(
      comm.Broadcast(bytes.data(), bytes.size(), source).WithContext("state transfer"));
  if (comm.rank() != source) {
    VF_ASSIGN_OR_RETURN(TrainingState state,
                        DeserializeState(bytes, "state from rank " + std::to_string(source)));
    VF_RETURN_IF_ERROR(executor.Restore(state));
  }
  out.transferred = true;
  out.bytes = size;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace vf
