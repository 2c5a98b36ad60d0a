// The operator's job key: one random key, kept in a Secret of the operator's own namespace, from
// which the operator derives every job's secret (and from that every worker's credential,
// WorkerCredential). Deriving rather than storing a secret per job means the operator never
// reads a Secret in a job's namespace: it only creates each worker's credential Secret there,
// and reads one Secret, by name, in its own. Every replica, and the same replica after a
// restart, reads the same key and so derives the same secrets: running workers keep their
// credentials across a restart or a change of leader. docs/security.md says what a new key does.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "operator/kube/client.h"
#include "runtime/status.h"

namespace vf::controller {

inline constexpr char kDefaultJobKeySecret[] = "virtualflow-job-key";
// The key's entry in its Secret: 64 hex digits (32 random bytes).
inline constexpr char kJobKeyEntry[] = "key";
// The shortest key the operator accepts, in bytes of the entry.
inline constexpr size_t kMinJobKeyBytes = 32;

// The key in Secret `ns`/`name`, made (32 random bytes, in hex) when the Secret is missing. Two
// replicas starting together agree: a lost create (409) reads the other's. A Secret whose entry
// is missing or shorter than kMinJobKeyBytes is FailedPrecondition: the operator never replaces
// a key by itself, since every running job's workers hold credentials derived from it.
Result<std::string> EnsureJobKey(kube::Client& client, const std::string& ns,
                                 const std::string& name);

// The secret of the job whose metadata.uid is `job_uid`: the hex HMAC-SHA256 of
// "virtualflow.io/job-secret/" + `job_uid` keyed with `key`. By UID, so that a later job of the
// same name gets another secret, and the workers of an earlier one cannot act in it.
Result<std::string> DeriveJobSecret(std::string_view key, std::string_view job_uid);

}  // namespace vf::controller
