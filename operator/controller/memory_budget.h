// How much memory the operator's coordinator may hold for all jobs together: from the
// --coordinator-memory-budget flag, else from the memory limit of the operator's own container
// (its cgroup), so that agents filling rendezvous stores cannot get the operator OOM-killed.
// Pure functions, but for CgroupMemoryLimit, which reads files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "runtime/status.h"

namespace vf::controller {

// A byte count as a flag or a Kubernetes resource quantity writes it: plain digits ("1048576"),
// a binary suffix (Ki, Mi, Gi, Ti, Pi, Ei), a decimal one (k, M, G, T, P, E), an exponent
// ("1e9"), with a fraction where a suffix or exponent makes whole bytes of it ("1.5Gi").
// Rounded up to whole bytes. InvalidArgument naming the text for anything else, a negative
// value, or one past 2^63.
Result<uint64_t> ParseByteQuantity(std::string_view text);

// The memory limit of the cgroup the process runs in, read under `root` (the cgroup file
// system's mount, /sys/fs/cgroup): cgroup v2's memory.max, else cgroup v1's
// memory/memory.limit_in_bytes. nullopt when there is no limit ("max", or v1's page-rounded
// 2^63) or neither file can be read.
std::optional<uint64_t> CgroupMemoryLimit(const std::string& root = "/sys/fs/cgroup");

// The coordinator's memory budget: `flag` when given; else half of `container_limit` (the
// other half for the operator's caches, its threads and the requests in flight), at most
// `fallback` (Coordinator::kDefaultMemoryBudget); else `fallback`. Never 0: at least 1 MiB.
uint64_t CoordinatorMemoryBudget(std::optional<uint64_t> flag,
                                 std::optional<uint64_t> container_limit, uint64_t fallback);

}  // namespace vf::controller
