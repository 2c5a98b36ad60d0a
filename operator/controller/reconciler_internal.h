// What the files of the Reconciler share and nothing else uses: one reconcile's state (Pass)
// and the small functions over the job's JSON that several steps call. Include it only from
// operator/controller/reconciler*.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/controller/reconciler.h"

namespace vf::controller {

namespace reconciler_internal {

// How long a pod or NetworkPolicy this operator created is taken to be on its way to the cache.
inline constexpr auto kExpectationTimeout = Expectations::kDefaultTimeout;

// j[key] when it is an object, else an empty object.
const nlohmann::json& Obj(const nlohmann::json& j, const char* key);
// Now, as Kubernetes writes times (RFC 3339, seconds).
std::string Now();
// Seconds since the Unix epoch, now.
double NowUnix();
// Seconds since the Unix epoch of an RFC 3339 time ("2026-01-02T03:04:05Z"); NaN if unparsable.
double UnixSeconds(const std::string& text);
// Appends the condition `type` to `conditions`, keeping its lastTransitionTime from
// `old_conditions` when its status is unchanged.
void SetCondition(nlohmann::json& conditions, const nlohmann::json& old_conditions,
                  const std::string& type, bool value, const std::string& reason,
                  const std::string& message, int64_t generation);
// The condition `type` of `conditions`, or null.
const nlohmann::json* FindCondition(const nlohmann::json& conditions, const std::string& type);
// A plan's members as status.assignment holds them, and back.
nlohmann::json PlanJson(const std::vector<Member>& members);
std::vector<Member> MembersFromJson(const nlohmann::json& assignment);
// A pod of the job: it carries the job's label and the job controls it (an owner reference
// with controller true, as every pod the operator makes has).
bool OwnedBy(const nlohmann::json& pod, const std::string& ns, const std::string& name,
             const std::string& uid);
std::string PodName(const nlohmann::json& pod);
// spec.template of a job.
const nlohmann::json& TemplateOf(const nlohmann::json& job);

// The status of a job whose worker pods are all being deleted (suspended, drained, evicted by
// Kueue): `phase`, `message`, no workers, `stopping` of them leaving, no plan.
void MarkWorkersStopping(nlohmann::json& status, const std::string& phase,
                         const std::string& message, int stopping);
// `old` less the condition `own` (which the caller sets again) and those that only a job with
// workers has (Running, Resizing, Degraded, ReconcileError, ImageKept).
nlohmann::json ConditionsWithoutWorkers(const nlohmann::json& old, const std::string& own);

// Whether this operator runs `job`: its spec.managedBy is empty or kVirtualFlowManager. A job
// another controller manages (MultiKueue's) gets no pods, status or Workload from it.
bool ManagedHere(const nlohmann::json& job);

}  // namespace reconciler_internal

// One reconcile of one job: what it read and what it decided so far. Lives for one call on one
// thread; `by_name` points into `pods`, so a Pass is never copied.
struct Reconciler::Pass {
  Pass(std::string k, nlohmann::json j) : key(std::move(k)), job(std::move(j)) {}
  Pass(const Pass&) = delete;
  Pass& operator=(const Pass&) = delete;

  const std::string key;
  const nlohmann::json job;  // the cache's copy when the pass began
  std::string ns;
  std::string name;
  std::string uid;
  int64_t generation = 0;
  nlohmann::json old_status;
  nlohmann::json old_conditions;
  nlohmann::json status;  // what this pass writes back
  JobSpec spec;

  // The whole cluster as the caches had it (Reconciler::View), and its GPU inventory.
  std::shared_ptr<const ClusterView> cluster;
  const ClusterGpus& gpus() const { return cluster->gpus; }
  std::vector<nlohmann::json> pods;                      // the job's own worker pods
  std::map<std::string, const nlohmann::json*> by_name;  // into `pods`
  JobView view;                                          // the coordinator's
  int desired = 0;
  int fit = 0;  // Desired::fit
  std::string policy_reason;
  policy::Allocation allocation;  // the policy's workers by type (GPU product or CPU pool)
  std::string image;              // the image of the job's workers and new pods (WorkerImage)
  int64_t total_steps = 0;        // 0: no agent has reported it yet
  std::map<std::string, int64_t> restarts;

  // The plan the workers train under once this pass is done.
  int64_t epoch = 0;
  std::vector<Member> members;
  std::set<std::string> in_plan;
  bool finishing = false;  // the members trained the last step: the job is ending
  policy::MembershipDecision decision;
  int created = 0;  // pods this pass created
  int unseen = 0;   // pods earlier passes created that the cache does not show yet
  // What the step that failed was doing, as a condition and Event reason ("FailedCreatePod"),
  // and the pod it was about, if any.
  std::string failed_action;
  std::string failed_pod;
  // Kueue's decision for a job with a queue label (AdmitThroughKueue); unset without one.
  std::optional<KueueAdmission> kueue;
  // The workers whose credentials the coordinator accepts (AdmittedWorkers), and the pods this
  // pass deleted for want of their credential Secret (RepairCredentials), which count for
  // nothing.
  std::set<std::string> admitted;
  std::set<std::string> replaced;
};

}  // namespace vf::controller
