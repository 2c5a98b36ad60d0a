// The full training state every rank holds (invariant 6), its wire/disk serialization and
// atomic, checksummed checkpoints.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace vf {

// Everything needed to continue a job bit-for-bit: parameters, optimizer slots, the step (which
// is also the data cursor: the data order is a function of it), the reducer's fixed-point
// exponents and the job's fingerprint. Randomness is counter-based (seed, step, vnode), so the
// seed is the whole RNG state. Value type; thread-compatible.
struct TrainingState {
  std::string job_fingerprint;             // JobSpec::Fingerprint() of the job that wrote it
  uint64_t seed = 0;                       // RNG state (counter-based generators)
  int64_t step = 0;                        // global steps completed == data cursor
  int64_t data_epoch = 0;                  // epoch of the data order at `step` (derived, checked)
  int64_t membership_epoch = 0;            // last membership epoch this state trained under
  int64_t optimizer_steps = 0;             // updates applied (AdamW bias correction)
  std::vector<int32_t> reducer_exponents;  // exact reducer: one per bucket
  std::vector<float> parameters;
  std::vector<std::vector<float>> optimizer_slots;  // momentum, or Adam m and v

  bool operator==(const TrainingState&) const = default;
};

// Binary encoding: magic "VFSTATE1", little-endian fields, and a SHA-256 of everything before it
// as the last 32 bytes.
std::string SerializeState(const TrainingState& state);
// Decodes and verifies. `source` names the origin ("checkpoint /x/y.ckpt", "rank 0") in errors.
// Truncated, corrupt or foreign data is kDataLoss with a message that says which.
Result<TrainingState> DeserializeState(std::string_view bytes, std::string_view source);

// Writes the state to `path` atomically: a temporary file in the same directory, fsync, rename,
// fsync of the directory. A crash leaves either the old checkpoint or the new one, never a mix.
// The temporary file has a random name and is created new (O_EXCL, O_NOFOLLOW), so that a
// symbolic link planted in the directory is never written through.
Status WriteCheckpoint(const std::string& path, const TrainingState& state);
// kNotFound if there is no file at `path`; kDataLoss if it is truncated or corrupt (the digest
// detects corruption, not tampering: whoever can write the file can write a matching one).
Result<TrainingState> ReadCheckpoint(const std::string& path);

// A sealed blob: opaque state of another trainer (a PyTorch worker's serialized state) with
// the same protection as a checkpoint: magic "VFBLOB01", the payload's size (little-endian
// uint64), the payload, and a SHA-256 of everything before it as the last 32 bytes.
std::string SealBlob(std::string_view payload);
// The same for a payload given as pieces, one after the other (a PyTorch state is its header
// and each tensor's bytes where the tensor lies), without joining them first.
std::string SealBlob(std::span<const std::string_view> payload);
// The payload; kDataLoss naming `source` for truncated, corrupt or foreign bytes.
Result<std::string> UnsealBlob(std::string_view bytes, std::string_view source);
// Atomically, as WriteCheckpoint; and the reading side, as ReadCheckpoint. The file holds
// SealBlob's bytes; the digest is taken piece by piece as the pieces are written, so the payload
// is read from memory once and never copied.
Status WriteSealedFile(const std::string& path, std::string_view payload);
Status WriteSealedFile(const std::string& path, std::span<const std::string_view> payload);
Result<std::string> ReadSealedFile(const std::string& path);

// Lower-case hex SHA-256 (OpenSSL).
std::string Sha256Hex(const void* data, size_t size);

}  // namespace vf
