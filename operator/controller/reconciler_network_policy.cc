// The job's NetworkPolicy, which admits only its own pods to its workers.
#include "operator/controller/reconciler.h"

#include <cstdio>
#include <mutex>
#include <optional>
#include <string>

#include "operator/controller/reconciler_internal.h"

namespace vf::controller {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using reconciler_internal::kExpectationTimeout;
using reconciler_internal::Obj;

Status Reconciler::EnsureNetworkPolicy(Pass& p) {
  if (!options_.network_policy) return Status::Ok();
  const json want = BuildNetworkPolicy(p.job, options_.pods.metrics_port, *options_.network_policy);
  const std::string name = NetworkPolicyName(p.name);
  const std::string where = "NetworkPolicy " + p.ns + "/" + name;
  std::optional<json> have = network_policies_->Get(p.ns + "/" + name);
  if (!have) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      const std::optional<Clock::time_point>& created = MemoryOf(p.key, p.uid).policy_created;
      if (created && Clock::now() - *created < kExpectationTimeout) {
        return Status::Ok();  // created; the cache has not seen it yet
      }
    }
    kube::ApiResult<json> created = client_.Create(kube::kNetworkPolicies, p.ns, want);
    if (created.reason() == kube::Reason::kAlreadyExists) {
      // The cache holds every policy with the operator's label: this one is someone else's.
      return FailedPrecondition(where + " exists and is not the operator's (no label " +
                                kManagedByLabel + "=" + kManagedBy +
                                "); rename or delete it so that the job's pods can be isolated");
    }
    if (!created.ok()) return created.status().WithContext(where);
    std::lock_guard<std::mutex> lock(mu_);
    MemoryOf(p.key, p.uid).policy_created = Clock::now();
    return Status::Ok();
  }
  {
    // Seen: from now on its absence means that it was deleted, and it is made again at once.
    std::lock_guard<std::mutex> lock(mu_);
    MemoryOf(p.key, p.uid).policy_created.reset();
  }
  const json& meta = Obj(*have, "metadata");
  // An earlier job's of the same name, being collected: made again once it is gone.
  if (meta.contains("deletionTimestamp")) return Status::Ok();
  json labels = Obj(meta, "labels");
  const json& want_meta = want.at("metadata");
  bool same = Obj(*have, "spec") == want.at("spec") &&
              meta.value("ownerReferences", json::array()) == want_meta.at("ownerReferences");
  for (const auto& [k, v] : want_meta.at("labels").items()) {
    same = same && labels.value(k, "") == v;
    labels[k] = v;
  }
  if (same) return Status::Ok();
  // Changed by someone, or an earlier job's: written back whole, at the version read (a
  // conflict retries the job with a fresher cache).
  json updated = *have;
  updated["spec"] = want.at("spec");
  updated["metadata"]["labels"] = labels;
  updated["metadata"]["ownerReferences"] = want_meta.at("ownerReferences");
  kube::ApiResult<json> replaced = client_.Replace(kube::kNetworkPolicies, p.ns, updated);
  if (!replaced.ok()) return replaced.status().WithContext(where);
  std::fprintf(stderr, "virtualflow-operator: %s: %s restored\n", p.key.c_str(), where.c_str());
  return Status::Ok();
}

}  // namespace vf::controller
