#include "operator/controller/job_key.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <nlohmann/json.hpp>

#include "operator/controller/worker_pod.h"
#include "operator/coordinator/coordinator.h"

namespace vf::controller {

using nlohmann::json;

namespace {

constexpr char kJobSecretContext[] = "virtualflow.io/job-secret/";

Result<std::string> RandomHexKey() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return Internal("no random bytes for the job key");
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char b : bytes) {
    hex.push_back(kDigits[b >> 4]);
    hex.push_back(kDigits[b & 0xf]);
  }
  return hex;
}

// Secret data is base64; OpenSSL decodes it (padding comes back as trailing zero bytes, which a
// hex key never ends with).
Result<std::string> KeyOf(const json& secret, const std::string& where) {
  const json data = secret.value("data", json::object());
  const std::string encoded = data.is_object() ? data.value(kJobKeyEntry, "") : "";
  std::string key(encoded.size(), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(key.data()),
                                reinterpret_cast<const unsigned char*>(encoded.data()),
                                static_cast<int>(encoded.size()));
  if (n < 0) return FailedPrecondition(where + ": '" + kJobKeyEntry + "' is not base64");
  key.resize(static_cast<size_t>(n));
  while (!key.empty() && key.back() == '\0') key.pop_back();
  if (key.size() < kMinJobKeyBytes) {
    return FailedPrecondition(where + ": '" + kJobKeyEntry + "' holds " +
                              std::to_string(key.size()) + " bytes, fewer than " +
                              std::to_string(kMinJobKeyBytes) +
                              "; delete the Secret to have a new key made (running jobs' workers "
                              "then lose their credentials: docs/security.md)");
  }
  return key;
}

}  // namespace

Result<std::string> EnsureJobKey(kube::Client& client, const std::string& ns,
                                 const std::string& name) {
  const std::string where = "job key Secret " + ns + "/" + name;
  kube::ApiResult<json> got = client.Get(kube::kSecrets, ns, name);
  if (got.ok()) return KeyOf(*got, where);
  if (got.reason() != kube::Reason::kNotFound) return got.status().WithContext(where);
  VF_ASSIGN_OR_RETURN(const std::string key, RandomHexKey());
  const json secret = {{"metadata", {{"name", name}, {"labels", {{kManagedByLabel, kManagedBy}}}}},
                       {"type", "Opaque"},
                       {"stringData", {{kJobKeyEntry, key}}}};
  kube::ApiResult<json> created = client.Create(kube::kSecrets, ns, secret);
  if (created.ok()) return KeyOf(*created, where);
  if (created.reason() != kube::Reason::kAlreadyExists) return created.status().WithContext(where);
  // Another replica made it first: its key is the one.
  got = client.Get(kube::kSecrets, ns, name);
  if (!got.ok()) return got.status().WithContext(where);
  return KeyOf(*got, where);
}

Result<std::string> DeriveJobSecret(std::string_view key, std::string_view job_uid) {
  if (key.size() < kMinJobKeyBytes) {
    return FailedPrecondition("the job key is missing or shorter than " +
                              std::to_string(kMinJobKeyBytes) + " bytes");
  }
  if (job_uid.empty()) return InvalidArgument("a job without a uid has no secret");
  // The same HMAC-SHA256, in hex, as a worker's credential; the prefix keeps this use of the
  // key apart from any other.
  return WorkerCredential(key, std::string(kJobSecretContext) + std::string(job_uid));
}

}  // namespace vf::controller
