// The registry of scheduling policies: the one list of their names. --policy, the job's
// spec.elasticity.policy, the help texts and the CRD's enum (checked by policy_test) all follow it.
// A built-in policy is its own file plus one entry in kBuiltIn below; a policy defined elsewhere
// (a test's) adds itself with RegisterPolicy.
#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "operator/policy/policy.h"
#include "operator/policy/policy_internal.h"

namespace vf::policy {
namespace {

// The built-in policies, in the order help texts and messages list them.
std::vector<PolicyInfo> BuiltIn() {
  return {
      {"static", "its requested workers or it waits, by priority; never resized", Sharing::kFixed,
       internal::NewStaticPolicy},
      {"elastic", "a share by priority within min..max; idle GPUs lent, taken back",
       Sharing::kByWeight, internal::NewElasticPolicy},
      {"autoscale", "grows while a new worker adds enough throughput; gives back the rest",
       Sharing::kByThroughput, internal::NewAutoscalePolicy},
  };
}

// The registered policies behind a mutex. Constructed on first use, so a policy registering
// itself during static initialisation finds the built-ins already there. Thread-safe.
class Registry {
 public:
  static Registry& Get() {
    static Registry* const registry = new Registry();  // never destroyed: used until exit
    return *registry;
  }

  Status Add(PolicyInfo info) {
    std::lock_guard<std::mutex> lock(mu_);
    if (Find(info.name) != nullptr) {
      return FailedPrecondition("policy '" + info.name + "' is registered already");
    }
    policies_.push_back(std::move(info));
    return Status::Ok();
  }

  std::vector<PolicyInfo> All() const {
    std::lock_guard<std::mutex> lock(mu_);
    return policies_;
  }

  bool Has(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    return Find(name) != nullptr;
  }

  std::optional<Sharing> SharingOf(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    const PolicyInfo* p = Find(name);
    return p == nullptr ? std::nullopt : std::optional<Sharing>(p->sharing);
  }

 private:
  Registry() : policies_(BuiltIn()) {}

  const PolicyInfo* Find(const std::string& name) const {
    for (const PolicyInfo& p : policies_) {
      if (p.name == name) return &p;
    }
    return nullptr;
  }

  mutable std::mutex mu_;
  std::vector<PolicyInfo> policies_;  // guarded by mu_
};

// A name as the CRD's enum and a command line can carry it: a lower-case word.
bool IsPolicyWord(const std::string& name) {
  if (name.empty() || name.size() > 63 || name.front() == '-' || name.back() == '-') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

std::string KnownList() {
  std::string known;
  for (const std::string& n : KnownPolicyNames()) known += (known.empty() ? "" : ", ") + n;
  return known;
}

}  // namespace

Status RegisterPolicy(PolicyInfo info) {
  if (!IsPolicyWord(info.name)) {
    return InvalidArgument("policy name '" + info.name +
                           "' is not a lower-case word (letters, digits and '-')");
  }
  if (!info.create) return InvalidArgument("policy '" + info.name + "' has no factory");
  if (info.description.empty()) {
    return InvalidArgument("policy '" + info.name + "' has no description for --help");
  }
  return Registry::Get().Add(std::move(info));
}

std::vector<PolicyInfo> RegisteredPolicies() { return Registry::Get().All(); }

std::vector<std::string> KnownPolicyNames() {
  std::vector<std::string> names;
  for (const PolicyInfo& p : RegisteredPolicies()) names.push_back(p.name);
  return names;
}

bool IsKnownPolicy(const std::string& name) { return Registry::Get().Has(name); }

std::optional<Sharing> SharingOf(const std::string& name) {
  return Registry::Get().SharingOf(name);
}

Status CheckPolicyName(const std::string& field, const std::string& name) {
  if (IsKnownPolicy(name)) return Status::Ok();
  return InvalidArgument(field + ": unknown policy '" + name + "' (known: " + KnownList() + ")");
}

std::string PolicyHelp(const std::string& indent) {
  const std::vector<PolicyInfo> all = RegisteredPolicies();
  size_t width = 0;
  for (const PolicyInfo& p : all) width = std::max(width, p.name.size());
  std::string out;
  for (const PolicyInfo& p : all) {
    if (!out.empty()) out += "\n";
    out += indent + p.name + std::string(width + 2 - p.name.size(), ' ') + p.description;
  }
  return out;
}

Result<std::unique_ptr<Policy>> CreatePolicy(const std::string& name,
                                             const PolicyOptions& options) {
  if (!(options.cooldown_seconds >= 0.0) || !std::isfinite(options.cooldown_seconds)) {
    return InvalidArgument("policy cooldown must be a non-negative number of seconds");
  }
  if (!(options.scaling_efficiency_threshold >= 0.0 &&
        options.scaling_efficiency_threshold <= 1.0)) {
    return InvalidArgument("scaling efficiency threshold must be within 0..1");
  }
  if (!IsKnownPolicy(name)) {
    return InvalidArgument("unknown policy '" + name + "' (known: " + KnownList() + ")");
  }
  return internal::NewPerJobPolicy(name, RegisteredPolicies(), options);
}

}  // namespace vf::policy
