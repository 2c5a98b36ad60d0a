// Fuzz target: the decoders of what a worker reads from outside itself: a checkpoint file, and
// the state metadata a peer sends in a state transfer (both SerializeState's format), and a
// sealed blob (the Python library's checkpoints). Any bytes give a state or kDataLoss.
//
// The format ends with a SHA-256 of the rest, so random bytes would almost never get past the
// check. The first input byte chooses: 0, the bytes as they are; otherwise the bytes with a
// correct digest appended, which reaches the field decoding behind the check (a peer or a
// disk can produce such bytes only through a bug, which is what a fuzzer is for).
#include <openssl/sha.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/state/training_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool with_digest = data[0] != 0;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (with_digest) {
    unsigned char digest[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), digest);
    bytes.append(reinterpret_cast<const char*>(digest), sizeof(digest));
  }
  vf::Result<vf::TrainingState> state = vf::DeserializeState(bytes, "fuzz");
  if (state.ok()) {
    // What decodes must encode back to a state that decodes to the same thing (compared as
    // bytes: a NaN in the parameters is a legal value that is not equal to itself).
    const std::string encoded = vf::SerializeState(*state);
    vf::Result<vf::TrainingState> again = vf::DeserializeState(encoded, "again");
    if (!again.ok() || vf::SerializeState(*again) != encoded) __builtin_trap();
  }
  vf::Result<std::string> payload = vf::UnsealBlob(bytes, "fuzz");
  if (payload.ok()) {
    vf::Result<std::string> again = vf::UnsealBlob(vf::SealBlob(*payload), "again");
    if (!again.ok() || *again != *payload) __builtin_trap();
  }
  return 0;
}
