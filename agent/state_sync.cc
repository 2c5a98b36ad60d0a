#include "agent/state_sync.h"

#include <chrono>
#include <limits>
#include <new>
#include <string>

namespace vf {

Result<SyncOutcome> SyncState(Communicator& comm, agent::TrainingStateHolder& state,
                              const std::function<void()>& before_transfer,
                              uint64_t max_metadata_bytes) {
  const auto start = std::chrono::steady_clock::now();
  SyncOutcome out;
  const bool mine = state.has_state();
  const int64_t step = mine ? state.step() : -1;
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
    VF_RETURN_IF_ERROR(state.Initialize());
    out.initialized = true;
  }
  out.source_rank = source;

  // The small part of the state travels serialized (checksummed, versioned); the large
  // buffers are broadcast straight into every member's own memory, with no copies: integrity
  // on the wire is the transport's job, and a member at the newest step receives bytes equal
  // to its own, so even a transfer cut short leaves its state intact.
  std::string meta;
  if (comm.rank() == source) meta = state.Metadata();
  int64_t size = static_cast<int64_t>(meta.size());
  VF_RETURN_IF_ERROR(comm.Broadcast(&size, sizeof(size), source).WithContext("state size"));
  // The size comes from a peer: checked before anything is allocated for it.
  if (size < 0 || static_cast<uint64_t>(size) > max_metadata_bytes) {
    return DataLoss("state from rank " + std::to_string(source) + " declares " +
                    std::to_string(size) + " bytes of metadata; at most " +
                    std::to_string(max_metadata_bytes) + " are taken");
  }
  try {
    meta.resize(static_cast<size_t>(size));
  } catch (const std::bad_alloc&) {
    return DataLoss("state from rank " + std::to_string(source) + ": no memory for its " +
                    std::to_string(size) + " bytes of metadata");
  }
  VF_RETURN_IF_ERROR(comm.Broadcast(meta.data(), meta.size(), source).WithContext("state"));
  if (comm.rank() != source) {
    // Checked before the buffers arrive, so a foreign state cannot overwrite this one.
    VF_RETURN_IF_ERROR(
        state.CheckMetadata(meta).WithContext("state from rank " + std::to_string(source)));
    if (!state.has_state() || state.step() != newest) state.Invalidate();
  }
  if (before_transfer) before_transfer();
  int64_t bytes = size;
  for (std::span<std::byte> buffer : state.Buffers()) {
    VF_RETURN_IF_ERROR(
        comm.Broadcast(buffer.data(), buffer.size(), source).WithContext("state transfer"));
    bytes += static_cast<int64_t>(buffer.size());
  }
  if (comm.rank() != source) {
    VF_RETURN_IF_ERROR(state.Adopt(meta).WithContext("state from rank " + std::to_string(source)));
  }
  out.transferred = true;
  out.bytes = bytes;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace vf
