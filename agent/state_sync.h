// Bringing every member of a new membership epoch to the same training state (invariant 6).
#pragma once

#include <cstdint>
#include <functional>

#include "agent/agent.h"
#include "runtime/comm/communicator.h"
#include "runtime/status.h"

namespace vf {

// What SyncState did, for reports and benchmarks.
struct SyncOutcome {
  int source_rank = -1;      // the rank whose state everyone now has
  bool transferred = false;  // false when every member already held the same state
  bool initialized = false;  // no member had state: the source started it
  int64_t bytes = 0;         // size of the broadcast state
  double seconds = 0.0;
};

// Collective over `comm`: every member calls it right after building the communicator of a new
// plan. The members agree in-band who holds the newest state (the lowest rank among those at
// the highest step), and that rank broadcasts its full state to all. Survivors of a failed step
// may differ by one step; both states lie on the same deterministic trajectory, so adopting the
// newest is exact. When all members already hold the same step, nothing is sent. When no member
// has state (a job's first plan, or after every member was lost), rank 0 initializes it (fresh
// start or checkpoint) and broadcasts that.
// `before_transfer` runs on every member between agreeing on the source and sending the state
// (fault injection uses it). A receiver refuses (kDataLoss, before allocating) metadata that
// the source declares larger than `max_metadata_bytes` or negative; the buffers' sizes are the
// receiver's own, never the source's.
inline constexpr uint64_t kMaxStateMetadataBytes = uint64_t{16} << 30;
Result<SyncOutcome> SyncState(Communicator& comm, agent::TrainingStateHolder& state,
                              const std::function<void()>& before_transfer = {},
                              uint64_t max_metadata_bytes = kMaxStateMetadataBytes);

}  // namespace vf
