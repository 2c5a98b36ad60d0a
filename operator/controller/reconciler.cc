#include "operator/controller/reconciler.h"

#include <openssl/rand.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iomanip>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "agent/protocol/json.h"
#include "operator/controller/inventory.h"
#include "operator/controller/job_key.h"
#include "operator/controller/job_spec.h"
#include "operator/policy/membership.h"
#include "runtime/job/spec.h"

namespace vf::controller {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kExpectationTimeout = std::chrono::seconds(60);
// How long a worker pod that has not started is taken to have its credential Secret after the
// operator last saw that it had one (RepairCredentials).
constexpr auto kCredentialRecheck = std::chrono::seconds(30);

std::string OwnBuild() { return std::string("virtualflow ") + VF_VERSION; }

std::string RandomSuffix() {
  unsigned char bytes[kWorkerPodSuffixLength];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    for (auto& b : bytes) b = static_cast<unsigned char>(std::rand());
  }
  std::string out;
  for (unsigned char b : bytes) {
    out.push_back(kWorkerPodSuffixAlphabet[b % (sizeof(kWorkerPodSuffixAlphabet) - 1)]);
  }
  return out;
}

// Seconds since the Unix epoch of an RFC 3339 time ("2026-01-02T03:04:05Z"); NaN if unparsable.
double UnixSeconds(const std::string& text) {
  std::tm tm{};
  std::istringstream in(text);
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
  if (in.fail()) return std::nan("");
  return static_cast<double>(timegm(&tm));
}

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string Now() { return kube::FormatTime(std::chrono::system_clock::now()); }

// A requeue for a deadline `seconds` away, capped at a day: the wait is only a hint to look
// again, and a far-off one would overflow.
std::chrono::milliseconds RequeueIn(double seconds) {
  constexpr double kMaxSeconds = 24 * 3600;
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::ceil(std::clamp(seconds, 0.001, kMaxSeconds) * 1000)));
}

const json& Obj(const json& j, const char* key) {
  static const json kEmpty = json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

// Gives the worker in `pod` (just created: the API server's answer to its creation) its own
// credential, in a Secret the pod owns: the kubelet starts the pod's container once the Secret
// is there. A pod whose Secret cannot be created is deleted again, so that none waits for a
// credential that never comes. A Secret of that name that exists already is not the operator's:
// the pod's name was drawn at random a moment ago, so someone else made it (the operator may
// create Secrets but not read them, and cannot tell what it holds). It is not used: the pod,
// which would mount it, is deleted, and kFailedPrecondition says why.
Status CreateWorkerCredential(kube::Client& client, const json& job, const std::string& ns,
                              const std::string& pod_name, const std::string& job_secret,
                              const std::string& coordinator_ca, const json& pod) {
  VF_ASSIGN_OR_RETURN(const std::string credential, WorkerCredential(job_secret, pod_name));
  kube::ApiResult<json> created = client.Create(
      kube::kSecrets, ns, BuildCredentialSecret(job, pod, credential, coordinator_ca));
  if (created.ok()) return Status::Ok();
  kube::DeleteOptions del;
  del.precondition_uid = Obj(pod, "metadata").value("uid", "");
  (void)client.Delete(kube::kPods, ns, pod_name, del);
  if (created.reason() == kube::Reason::kAlreadyExists) {
    return FailedPrecondition("Secret " + ns + "/" + CredentialSecretName(pod_name) +
                              " exists and was not made by the operator for pod " + pod_name +
                              "; it is not used: the pod is deleted and another takes its place");
  }
  return created.status().WithContext("worker credential of " + pod_name);
}

// The condition list with `type` set, keeping lastTransitionTime when its status is unchanged.
void SetCondition(json& conditions, const json& old_conditions, const std::string& type, bool value,
                  const std::string& reason, const std::string& message, int64_t generation) {
  const std::string status = value ? "True" : "False";
  std::string since = Now();
  for (const json& c : old_conditions) {
    if (c.value("type", "") == type && c.value("status", "") == status) {
      since = c.value("lastTransitionTime", since);
    }
  }
  conditions.push_back({{"type", type},
                        {"status", status},
                        {"reason", reason},
                        {"message", message.substr(0, 4096)},
                        {"lastTransitionTime", since},
                        {"observedGeneration", generation}});
}

const json* FindCondition(const json& conditions, const std::string& type) {
  if (!conditions.is_array()) return nullptr;
  for (const json& c : conditions) {
    if (c.is_object() && c.value("type", "") == type) return &c;
  }
  return nullptr;
}

json PlanJson(const std::vector<Member>& members) {
  json out = json::array();
  for (const Member& m : members) {
    out.push_back({{"worker", m.worker}, {"rank", m.rank}, {"virtualNodes", m.virtual_nodes}});
  }
  return out;
}

// The plan's workers in rank order, as the membership decision takes them.
std::vector<std::string> RankOrder(const Plan& plan) {
  std::vector<const Member*> ranked;
  for (const Member& m : plan.members) ranked.push_back(&m);
  std::sort(ranked.begin(), ranked.end(),
            [](const Member* a, const Member* b) { return a->rank < b->rank; });
  std::vector<std::string> names;
  for (const Member* m : ranked) names.push_back(m->worker);
  return names;
}

// The members of the plan a membership decision publishes: ranks are positions.
std::vector<Member> PlanMembers(const std::vector<policy::PlannedMember>& planned) {
  std::vector<Member> members;
  for (size_t i = 0; i < planned.size(); ++i) {
    members.push_back({planned[i].worker, static_cast<int>(i), planned[i].virtual_nodes});
  }
  return members;
}

std::vector<Member> MembersFromJson(const json& assignment) {
  std::vector<Member> out;
  if (!assignment.is_array()) return out;
  for (const json& a : assignment) {
    Member m;
    m.worker = a.value("worker", "");
    m.rank = a.value("rank", 0);
    m.virtual_nodes = a.value("virtualNodes", std::vector<int>{});
    out.push_back(std::move(m));
  }
  return out;
}

// Status without the timestamps that change on every write, to tell whether a write is needed.
json Comparable(json status) {
  if (status.contains("conditions")) {
    for (json& c : status["conditions"]) c.erase("lastTransitionTime");
  }
  return status;
}

}  // namespace

Result<std::unique_ptr<Reconciler>> Reconciler::Create(
    kube::Client& client, const Informer& jobs, const Informer& pods, const Informer& nodes,
    Coordinator& coordinator, ReconcilerOptions options, ReconcilerHooks hooks,
    const Informer* workloads, const Informer* network_policies) {
  if (options.job_key.size() < kMinJobKeyBytes) {
    return InvalidArgument("the job key must be at least " + std::to_string(kMinJobKeyBytes) +
                           " bytes");
  }
  if (options.network_policy && network_policies == nullptr) {
    return InvalidArgument("NetworkPolicies per job need an informer of NetworkPolicies");
  }
  policy::PolicyOptions popts;
  popts.cooldown_seconds = 0;  // each job's own cooldown (spec.elasticity) applies
  VF_ASSIGN_OR_RETURN(auto policy, policy::CreatePolicy(options.policy, popts));
  return std::unique_ptr<Reconciler>(
      new Reconciler(client, jobs, pods, nodes, workloads, network_policies, coordinator,
                     std::move(options), std::move(hooks), std::move(policy)));
}

Reconciler::Reconciler(kube::Client& client, const Informer& jobs, const Informer& pods,
                       const Informer& nodes, const Informer* workloads,
                       const Informer* network_policies, Coordinator& coordinator,
                       ReconcilerOptions options, ReconcilerHooks hooks,
                       std::unique_ptr<policy::Policy> policy)
    : client_(client),
      jobs_(jobs),
      pods_(pods),
      nodes_(nodes),
      workloads_(workloads),
      network_policies_(network_policies),
      coordinator_(coordinator),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      policy_(std::move(policy)) {
  if (options_.fault.armed("state-transfer")) {
    coordinator_.ObserveKeySets([this](const std::string& job, const std::string& key) {
      InjectStateTransferFault(job, key);
    });
  }
}

Reconciler::~Reconciler() {
  // Test-only, and a term ends at most once in a test: a key set at that very moment may still
  // call the observer, which only reads this object's fault settings under its mutex.
  if (options_.fault.armed("state-transfer")) coordinator_.ObserveKeySets(nullptr);
}

Result<std::string> Reconciler::JobSecret(const json& job) const {
  return DeriveJobSecret(options_.job_key, Obj(job, "metadata").value("uid", ""));
}

Status Reconciler::EnsureCoordinatorJob(const std::string& key, const json& job,
                                        const std::string& token, const std::string& fingerprint) {
  const std::string uid = job.at("metadata").value("uid", "");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = registered_.find(key);
    if (it != registered_.end() && it->second == uid) return Status::Ok();
  }
  // A job whose workers train under an earlier operator (a restart, an upgrade) expects their
  // build, as its status recorded it, so that a pod that registers before they do again is not
  // refused; a job that has none yet takes its first worker's (Coordinator::RegisterWorker).
  std::string build = Obj(job, "status").value("workerBuild", "");
  if (build.empty()) build = options_.build.empty() ? OwnBuild() : options_.build;
  Status added = coordinator_.AddJob(key, token, fingerprint, build);
  if (added.code() == StatusCode::kFailedPrecondition) {
    // An earlier job of the same name: its state is of no use to this one.
    (void)coordinator_.RemoveJob(key);
    added = coordinator_.AddJob(key, token, fingerprint, build);
  }
  VF_RETURN_IF_ERROR(added.WithContext("coordinator"));
  // After an operator restart the plan the workers train under is in the status: restore it,
  // epoch included, so that they carry on without a switch.
  const json& status = Obj(job, "status");
  const int64_t epoch = status.value("epoch", int64_t{0});
  const std::string phase = status.value("phase", "");
  VF_ASSIGN_OR_RETURN(Plan current, coordinator_.GetPlan(key));
  if (epoch > current.epoch && phase != "Succeeded" && phase != "Failed") {
    std::vector<Member> members = MembersFromJson(status.value("assignment", json::array()));
    auto restored = coordinator_.PublishPlanWithEpoch(key, epoch, members);
    if (!restored.ok()) {
      std::fprintf(stderr, "virtualflow-operator: %s: cannot restore plan %lld: %s\n", key.c_str(),
                   static_cast<long long>(epoch), restored.status().message().c_str());
    } else {
      std::fprintf(stderr, "virtualflow-operator: %s: restored plan of epoch %lld (%zu workers)\n",
                   key.c_str(), static_cast<long long>(epoch), members.size());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  registered_[key] = uid;
  return Status::Ok();
}

// One reconcile of one job: what it read and what it decided so far. Lives for one call on one
// thread; `by_name` points into `pods`, so a Pass is never copied.
struct Reconciler::Pass {
  Pass(std::string k, json j) : key(std::move(k)), job(std::move(j)) {}
  Pass(const Pass&) = delete;
  Pass& operator=(const Pass&) = delete;

  const std::string key;
  const json job;  // the cache's copy when the pass began
  std::string ns;
  std::string name;
  std::string uid;
  int64_t generation = 0;
  json old_status;
  json old_conditions;
  json status;  // what this pass writes back
  JobSpec spec;

  // The whole cluster as the caches had it (Reconciler::View), and its GPU inventory.
  std::shared_ptr<const ClusterView> cluster;
  const ClusterGpus& gpus() const { return cluster->gpus; }
  std::vector<json> pods;                      // the job's own worker pods
  std::map<std::string, const json*> by_name;  // into `pods`
  JobView view;                                // the coordinator's
  int desired = 0;
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

namespace {

// The job's length once known: from the spec when it counts steps, else from the agents, who
// loaded the training set and know its size (0 until one has reported).
int64_t KnownTotalSteps(const JobSpec& spec, const JobView& view) {
  int64_t total = TotalSteps(spec, /*train_samples=*/0);
  for (const auto& [worker, info] : view.workers) {
    total = std::max(total, info.last_report.total_steps);
  }
  return total;
}

// A pod of the job: it carries the job's label and the job controls it (an owner reference
// with controller true, as every pod the operator makes has).
bool OwnedBy(const json& pod, const std::string& ns, const std::string& name,
             const std::string& uid) {
  const json& meta = Obj(pod, "metadata");
  if (meta.value("namespace", "") != ns || Obj(meta, "labels").value(kJobLabel, "") != name) {
    return false;
  }
  return ControlledBy(pod, uid);
}

std::string PodName(const json& pod) { return Obj(pod, "metadata").value("name", ""); }

// The final report a member sent the coordinator, if one has.
std::optional<Report> FinalReportOfCoordinator(const JobView& view) {
  for (const auto& [worker, info] : view.workers) {
    if (info.last_report.finished) return info.last_report;
  }
  return std::nullopt;
}

// The worker that was rank 0 of the job's last published plan, or "" when that plan has no
// members. Of the coordinator's plan (`coordinator_plan`, null when the coordinator does not know
// the job) unless status.assignment is of a later epoch. Both are this operator's own record:
// a plan is written to the status before the coordinator publishes it (UpdateMembership), and
// an operator that restarted, whose coordinator starts empty, restores the plan of
// status.epoch from status.assignment (EnsureCoordinatorJob). So the coordinator's plan is the
// newest while the cache has not seen this operator's own status write, and the status is the
// newest while the coordinator does not know the job (a drain, before registration); no worker
// writes either.
std::string RankZeroOfLastPlan(const Plan* coordinator_plan, const json& status) {
  std::vector<Member> members;
  const json epoch = status.value("epoch", json());
  const int64_t status_epoch = epoch.is_number_integer() ? epoch.get<int64_t>() : 0;
  if (coordinator_plan != nullptr && coordinator_plan->epoch >= status_epoch) {
    members = coordinator_plan->members;
  } else {
    members = MembersFromJson(status.value("assignment", json::array()));
  }
  for (const Member& m : members) {
    if (m.rank == 0) return m.worker;
  }
  return "";
}

// What the termination messages of a job's pods say of its outcome: the final report of the
// worker that finished the job, if one left it, and the final reports that were not taken, with
// the pod that carried each and why. Value type; `refused` points into the pods it was made of.
struct PodOutcome {
  std::optional<Report> report;
  std::vector<std::pair<const json*, std::string>> refused;
};

// Why the final report for `worker` that `pod` carries is not job `job_name`'s (UID `uid`)
// outcome, rank 0 of its last plan being `rank0`; empty when it is. Anyone who may create pods
// in the job's namespace can give one the job's label and a termination message: only a pod
// the job controls, named as the operator names its worker pods, and rank 0's, may end the job.
std::string WhyNotTheOutcome(const json& pod, const std::string& worker,
                             const std::string& job_name, const std::string& uid,
                             const std::string& rank0) {
  const std::string name = PodName(pod);
  if (!ControlledBy(pod, uid)) {
    return "the job does not control it (no owner reference with controller true to uid " + uid +
           ")";
  }
  if (!IsWorkerPodName(job_name, name)) {
    return "its name is not one the operator gives the job's worker pods";
  }
  if (worker != name) return "its report names another worker (" + worker + ")";
  if (rank0.empty()) return "the job's last plan has no rank 0 that could have finished it";
  if (name != rank0) return "it was not rank 0 of the job's last plan (" + rank0 + " was)";
  return "";
}

// The final report a worker that finished the job left in its pod's termination message
// (protocol::FinalReportMessage), if one did, among `pods` (every pod with the job's label).
// Its container has ended, usually with exit code 0; a worker that crashed after leaving the
// report (a fault while its process shut down) had finished all the same: the report is written
// after the final weights were saved. Only rank 0 of the last plan ends the job (WhyNotTheOutcome);
// any other report is refused, and a malformed one is not taken (said on stderr).
PodOutcome FinalReportOfPods(const std::string& key, const std::string& job_name,
                             const std::string& uid, const std::string& rank0,
                             const std::vector<const json*>& pods) {
  PodOutcome out;
  for (const json* pod : pods) {
    const PodLife life = PodLifeOf(*pod);
    if (life != PodLife::kSucceeded && life != PodLife::kFailed) continue;
    const json& statuses = Obj(*pod, "status").value("containerStatuses", json::array());
    if (!statuses.is_array() || statuses.empty() || !statuses[0].is_object()) continue;
    const json terminated = Obj(Obj(statuses[0], "state"), "terminated");
    const json message = terminated.value("message", json());
    if (!message.is_string()) continue;
    auto found = protocol::FinalReportFromMessage(message.get<std::string>());
    if (!found.ok()) {
      if (found.status().code() != StatusCode::kNotFound) {
        std::fprintf(stderr,
                     "virtualflow-operator: %s: pod %s: termination message not taken: %s\n",
                     key.c_str(), PodName(*pod).c_str(), found.status().message().c_str());
      }
      continue;
    }
    std::string why = WhyNotTheOutcome(*pod, found->first, job_name, uid, rank0);
    if (!why.empty()) {
      out.refused.emplace_back(pod, std::move(why));
      continue;
    }
    if (out.report) continue;
    std::fprintf(stderr,
                 "virtualflow-operator: %s: the outcome is read from pod %s's termination "
                 "message (the coordinator that received it is gone)\n",
                 key.c_str(), PodName(*pod).c_str());
    out.report = std::move(found->second);
  }
  return out;
}

// What the members' latest reports say about the job's progress under plan `epoch`. Value type.
struct Progress {
  int64_t step = 0;
  double loss = std::nan("");
  double samples_per_second = 0;
  bool all_switched = false;  // every member reported from the plan of `epoch`
  double pause_seconds = 0;   // the longest switch pause a member reported
};

Progress ProgressOf(const std::vector<Member>& members, int64_t epoch, const JobView& view) {
  Progress out;
  out.all_switched = !members.empty();
  for (const Member& m : members) {
    auto it = view.workers.find(m.worker);
    if (it == view.workers.end() || it->second.last_report.epoch != epoch) {
      out.all_switched = false;
      continue;
    }
    const Report& r = it->second.last_report;
    out.pause_seconds = std::max(out.pause_seconds, r.pause_seconds);
    if (r.step >= out.step) {
      out.step = r.step;
      if (std::isfinite(r.loss)) out.loss = r.loss;
      out.samples_per_second = std::max(out.samples_per_second, r.samples_per_second);
    }
  }
  return out;
}

}  // namespace

namespace {

const json& TemplateOf(const json& job) { return Obj(Obj(job, "spec"), "template"); }

}  // namespace

std::shared_ptr<const Result<JobSpec>> Reconciler::CachedSpecOf(const json& job) {
  const json& meta = Obj(job, "metadata");
  const std::string key = ObjectKey(job);
  const std::string uid = meta.value("uid", "");
  const std::string version = meta.value("resourceVersion", "");
  if (!uid.empty() && !version.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = specs_.find(key);
    if (it != specs_.end() && it->second.uid == uid && it->second.resource_version == version) {
      return it->second.spec;
    }
  }
  auto parsed = std::make_shared<const Result<JobSpec>>(JobSpecOf(job));
  if (!uid.empty() && !version.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    // Only for a job that still exists: Forget erases the entry of one that is gone.
    if (jobs_.Has(key)) specs_[key] = ParsedSpec{uid, version, parsed};
  }
  return parsed;
}

std::optional<policy::PolicyJob> Reconciler::PolicyJobOf(const json& job, const ClusterGpus& gpus,
                                                         PolicyContext& context) {
  const json& status = Obj(job, "status");
  const std::string phase = status.value("phase", "");
  if (phase == "Succeeded" || phase == "Failed") return std::nullopt;
  if (Obj(job, "metadata").contains("deletionTimestamp")) return std::nullopt;
  // A job whose spec does not parse is failed by its own reconcile; it takes no GPUs.
  const std::shared_ptr<const Result<JobSpec>> spec = CachedSpecOf(job);
  if (!spec->ok()) return std::nullopt;
  const JobSpec& s = spec->value();
  policy::PolicyJob p;
  p.id = ObjectKey(job);
  p.virtual_nodes = s.virtual_nodes;
  p.min_workers = s.replicas_min;
  p.max_workers = s.replicas_max;
  const bool cpu_only = s.gpus_per_worker == 0;
  if (cpu_only) {
    // CPU-only workers are counted in the CPU pool, in millicores.
    p.gpus_per_worker = static_cast<int>(WorkerCpuMillis(job));
    p.allowed_types = {kCpuPool};
    p.unit = "CPU millicores";
  } else {
    p.gpus_per_worker = s.gpus_per_worker;
    const json& pod_template = TemplateOf(job);
    const std::string template_key = pod_template.dump();
    auto known = context.products_by_template.find(template_key);
    if (known == context.products_by_template.end()) {
      known =
          context.products_by_template.emplace(template_key, EligibleProducts(gpus, pod_template))
              .first;
    }
    p.allowed_types = known->second;
    // No eligible node at all: a type no inventory has, so that the job gets nothing (an
    // empty list would mean every type).
    if (p.allowed_types.empty()) p.allowed_types = {"(no eligible node)"};
  }
  if (s.suspend) return std::nullopt;  // holds nothing and wants nothing
  if (std::optional<int> cap = KueueCap(job, s)) {
    // Waiting for Kueue: no GPUs; admitted: no more workers than Kueue admitted.
    if (*cap <= 0) return std::nullopt;
    p.max_workers = std::min(p.max_workers, *cap);
    p.min_workers = std::min(p.min_workers, p.max_workers);
  }
  // The job's own policy when its manifest names one (the API server defaults it only inside a
  // given spec.elasticity); otherwise the operator's --policy decides it.
  if (Obj(Obj(job, "spec"), "elasticity").contains("policy")) p.policy = s.elasticity.policy;
  p.cooldown_seconds = s.elasticity.cooldown_seconds;
  p.arrival_time = UnixSeconds(Obj(job, "metadata").value("creationTimestamp", ""));
  if (std::isnan(p.arrival_time)) p.arrival_time = 0;
  const double last = UnixSeconds(Obj(status, "lastResize").value("time", ""));
  p.last_resize_time = std::isnan(last) ? p.arrival_time : last;
  p.resize_pause_seconds = Obj(status, "lastResize").value("pauseSeconds", 0.0);
  // What it holds: its live pods, by the product of the node they are bound to.
  auto own = context.pods_by_job->find(p.id);
  if (own == context.pods_by_job->end()) return p;
  for (const std::shared_ptr<const json>& pod : own->second) {
    const PodLife life = PodLifeOf(*pod);
    if (life != PodLife::kStarting && life != PodLife::kRunning) continue;
    const std::string node = Obj(*pod, "spec").value("nodeName", "");
    // A pod the scheduler has not bound yet is the job's too: without it, a job whose pods
    // are bound one by one would look smaller than it is and lose its newest pods.
    if (node.empty()) {
      ++p.unbound_workers;
      continue;
    }
    if (cpu_only) {
      if (gpus.nodes.count(node) != 0) p.current[kCpuPool] += 1;
      continue;
    }
    auto it = gpus.node_product.find(node);
    if (it != gpus.node_product.end()) p.current[it->second] += 1;
  }
  return p;
}

std::shared_ptr<const Reconciler::ClusterView> Reconciler::View() {
  std::lock_guard<std::mutex> lock(view_mu_);
  const uint64_t jobs_version = jobs_.version();
  const uint64_t pods_version = pods_.version();
  const uint64_t nodes_version = nodes_.version();
  const uint64_t workloads_version = workloads_ != nullptr ? workloads_->version() : 0;
  if (view_ && view_->jobs_version == jobs_version && view_->pods_version == pods_version &&
      view_->nodes_version == nodes_version && view_->workloads_version == workloads_version &&
      Clock::now() - view_->made < kViewMaxAge) {
    return view_;
  }
  view_ = MakeView(jobs_version, pods_version, nodes_version, workloads_version);
  return view_;
}

std::shared_ptr<const Reconciler::ClusterView> Reconciler::MakeView(uint64_t jobs_version,
                                                                    uint64_t pods_version,
                                                                    uint64_t nodes_version,
                                                                    uint64_t workloads_version) {
  auto view = std::make_shared<ClusterView>();
  view->jobs_version = jobs_version;
  view->pods_version = pods_version;
  view->nodes_version = nodes_version;
  view->workloads_version = workloads_version;
  view->made = Clock::now();
  // Shared with the caches, not copied.
  const std::vector<std::shared_ptr<const json>> all_pods = pods_.Snapshot();
  view->gpus = CountGpus(nodes_.Snapshot(), all_pods);
  for (const std::shared_ptr<const json>& pod : all_pods) {
    const json& meta = Obj(*pod, "metadata");
    const json& labels = Obj(meta, "labels");
    auto label = labels.find(kJobLabel);
    if (label == labels.end() || !label->is_string()) continue;
    view->pods_by_job[meta.value("namespace", "") + "/" + label->get<std::string>()].push_back(pod);
  }
  PolicyContext context{&view->pods_by_job, {}};
  std::vector<policy::PolicyJob> jobs;
  for (const std::shared_ptr<const json>& job : jobs_.Snapshot()) {
    std::optional<policy::PolicyJob> p = PolicyJobOf(*job, view->gpus, context);
    if (p) jobs.push_back(std::move(*p));
  }
  policy::GpuInventory inventory;
  const ClusterGpus& gpus = view->gpus;
  for (const auto& [product, count] : gpus.products) {
    auto held = gpus.held_by_others.find(product);
    inventory.gpus[product] =
        std::max(0, count.total - (held == gpus.held_by_others.end() ? 0 : held->second));
  }
  int64_t cpu = 0;
  for (const auto& [node, millis] : gpus.cpu_allocatable) {
    auto held = gpus.cpu_held_by_others.find(node);
    cpu +=
        std::max<int64_t>(0, millis - (held == gpus.cpu_held_by_others.end() ? 0 : held->second));
  }
  inventory.gpus[kCpuPool] = static_cast<int>(std::min<int64_t>(cpu, 1 << 30));
  view->decision = policy_->Decide(jobs, inventory, NowUnix());
  return view;
}

Reconciler::Desired Reconciler::DesiredWorkers(const Pass& p, const ClusterView& view) {
  if (!view.decision.ok()) return {0, view.decision.status().message(), {}};
  const policy::JobDecision* mine = view.decision->Find(p.key);
  if (mine == nullptr) return {0, "not scheduled", {}};
  Desired out{policy::TotalWorkers(mine->workers), mine->reason, mine->workers};
  // The policy counts GPUs by product across the cluster; the scheduler places a pod only on
  // a node its template allows, with room on that node.
  const int64_t cpu_millis = WorkerCpuMillis(p.job);
  const std::string fit_key = TemplateOf(p.job).dump() + '\n' +
                              std::to_string(p.spec.gpus_per_worker) + '\n' +
                              std::to_string(cpu_millis);
  std::optional<int> known;
  {
    std::lock_guard<std::mutex> lock(view.fit_mu);
    auto it = view.fit.find(fit_key);
    if (it != view.fit.end()) known = it->second;
  }
  const int fit =
      known ? *known
            : EligibleWorkers(view.gpus, TemplateOf(p.job), p.spec.gpus_per_worker, cpu_millis);
  if (!known) {
    std::lock_guard<std::mutex> lock(view.fit_mu);
    view.fit.emplace(fit_key, fit);
  }
  if (out.workers > fit) {
    out.workers = fit;
    out.reason += "; " + std::to_string(fit) +
                  " fit on the nodes its nodeSelector, affinity and tolerations allow";
  }
  return out;
}

Status Reconciler::PatchStatus(const json& job, const json& status) {
  json wanted = Comparable(status);
  if (wanted == Comparable(Obj(job, "status"))) return Status::Ok();
  const json& meta = job.at("metadata");
  const std::string key = ObjectKey(job);
  const std::string uid = meta.value("uid", "");
  const std::string version = meta.value("resourceVersion", "");
  {
    // The cache has not seen this operator's last write yet: the job is still at the version
    // that write was made over, so the API server holds what was written (a change by anyone
    // else would have moved the version). Writing the same status again would only cost a
    // request, for each job, each time its pods change before its own write comes back.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = written_.find(key);
    if (!version.empty() && it != written_.end() && it->second.uid == uid &&
        it->second.over_version == version && it->second.status == wanted) {
      return Status::Ok();
    }
  }
  // The whole status each time, so fields that no longer apply are cleared (null deletes).
  json patch_status = status;
  for (const auto& [k, v] : Obj(job, "status").items()) {
    if (!patch_status.contains(k)) patch_status[k] = nullptr;
  }
  auto r = client_.PatchStatus(kube::kVirtualFlowJobs, meta.value("namespace", ""),
                               meta.value("name", ""), json{{"status", patch_status}});
  if (r.ok() && !version.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    written_[key] = WrittenStatus{uid, version, std::move(wanted)};
  }
  return r.status();
}

void Reconciler::Event(const json& job, bool warning, const std::string& reason,
                       const std::string& message) {
  constexpr size_t kMaxSeries = 4096;  // client-go's event cache holds as many
  const std::string key = Obj(job, "metadata").value("uid", "") + '\n' + (warning ? "W" : "N") +
                          '\n' + reason + '\n' + message;
  auto log = [&](const kube::ApiError& e) {
    std::fprintf(stderr, "virtualflow-operator: event %s for %s not recorded: %s\n", reason.c_str(),
                 ObjectKey(job).c_str(), e.ToString().c_str());
  };
  std::optional<EventSeries> series;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = event_series_.find(key);
    if (it != event_series_.end()) series = it->second;
  }
  if (series) {
    const json patch = {{"count", series->count + 1}, {"lastTimestamp", Now()}};
    auto patched = client_.MergePatch(kube::kEvents, series->ns, series->name, patch);
    if (patched.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = event_series_.find(key);
      if (it != event_series_.end()) it->second.count = series->count + 1;
      return;
    }
    // Gone (the API server keeps Events for an hour by default): a new series begins.
    if (patched.reason() != kube::Reason::kNotFound) return log(patched.error());
  }
  auto r = client_.CreateEvent(kube::kVirtualFlowJobs, job,
                               warning ? kube::EventType::kWarning : kube::EventType::kNormal,
                               reason, message);
  if (!r.ok()) return log(r.error());
  const json& meta = Obj(*r, "metadata");
  if (meta.value("name", "").empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (event_series_.count(key) == 0) {
    event_order_.push_back(key);
    if (event_order_.size() > kMaxSeries) {
      event_series_.erase(event_order_.front());
      event_order_.pop_front();
    }
  }
  event_series_[key] = EventSeries{meta.value("namespace", ""), meta.value("name", ""), 1};
}

Result<ReconcileResult> Reconciler::Reconcile(const std::string& key) {
  std::optional<json> found = jobs_.Get(key);
  if (!found || Obj(*found, "metadata").contains("deletionTimestamp")) return Forget(key);
  Pass p(key, std::move(*found));
  Begin(p);
  Result<JobSpec> spec = *CachedSpecOf(p.job);
  if (spec.ok()) {
    // What the CRD's schema cannot check about the pod template.
    if (Status t = ValidateTemplate(p.job); !t.ok()) spec = t;
  }
  if (!spec.ok()) {
    VF_RETURN_IF_ERROR(FailInvalidSpec(p, spec.status()));
    return ReconcileResult{};
  }
  p.spec = std::move(spec).value();
  const std::string phase_before = p.old_status.value("phase", "");
  if (phase_before == "Succeeded" || phase_before == "Failed") {
    (void)coordinator_.RemoveJob(key);
    if (hooks_.on_job_status) hooks_.on_job_status(key, p.old_status, p.spec);
    if (Status finished = FinishWorkload(p); !finished.ok()) {
      RecordBlocked(p, finished);
      return finished;
    }
    return EnforceTtl(p);
  }
  Result<ReconcileResult> result = Advance(p);
  if (!result.ok()) RecordBlocked(p, result.status());
  return result;
}

Result<ReconcileResult> Reconciler::Advance(Pass& p) {
  // Marks what a failing step was doing; the steps that call the API for a reason of their
  // own (creating and deleting pods) set it themselves.
  auto doing = [&p](const char* action, Status s) {
    if (!s.ok() && p.failed_action.empty()) p.failed_action = action;
    return s;
  };
  ReconcileResult suspended;
  VF_ASSIGN_OR_RETURN(const Next after_suspend, Suspend(p, suspended));
  if (after_suspend == Next::kDone) return suspended;
  ReconcileResult deadline;
  VF_ASSIGN_OR_RETURN(const Next after_deadline, EnforceDeadline(p, deadline));
  if (after_deadline == Next::kDone) return ReconcileResult{};
  ReconcileResult drained;
  VF_ASSIGN_OR_RETURN(const Next after_drain, Drain(p, drained));
  if (after_drain == Next::kDone) return drained;

  Result<std::string> token = JobSecret(p.job);
  VF_RETURN_IF_ERROR(doing("FailedJobSecret", token.status()));
  VF_RETURN_IF_ERROR(doing("CoordinatorRefusedJob",
                           EnsureCoordinatorJob(p.key, p.job, *token, p.spec.Fingerprint())));
  // Before any pod: a worker is never reachable by other pods while its job's policy is due.
  VF_RETURN_IF_ERROR(doing("FailedNetworkPolicy", EnsureNetworkPolicy(p)));
  // Every live worker plus a replacement for each (a dead member stays registered until a plan
  // without it is out); only pods the operator created hold credentials to register with.
  VF_RETURN_IF_ERROR(coordinator_.SetWorkerLimit(
      p.key, std::min(2 * static_cast<size_t>(std::max(p.spec.replicas_max, 1)),
                      Coordinator::kMaxWorkersPerJob)));
  VF_RETURN_IF_ERROR(Observe(p));
  VF_ASSIGN_OR_RETURN(const Next after_kueue, AdmitThroughKueue(p));
  if (after_kueue == Next::kDone) return ReconcileResult{std::chrono::seconds(1)};
  VF_ASSIGN_OR_RETURN(const Next after_success, RecordSuccess(p));
  if (after_success == Next::kDone) return ReconcileResult{};
  VF_ASSIGN_OR_RETURN(const Next after_failures, RecordFailures(p));
  if (after_failures == Next::kDone) return ReconcileResult{};
  VF_RETURN_IF_ERROR(doing("FailedPublishPlan", UpdateMembership(p)));
  VF_RETURN_IF_ERROR(ReconcilePods(p));
  VF_RETURN_IF_ERROR(doing("FailedUpdateStatus", WriteProgress(p)));

  // Membership moves with the workers' reports; look again soon while anything is in motion.
  ReconcileResult result;
  result.requeue_after =
      std::chrono::milliseconds(p.status.value("phase", "") == "Running" ? 2000 : 500);
  if (deadline.requeue_after.count() > 0) {
    result.requeue_after = std::min(result.requeue_after, deadline.requeue_after);
  }
  return result;
}

void Reconciler::RecordBlocked(Pass& p, const Status& error) {
  // A job deleted under the pass: nothing to tell anyone.
  if (error.code() == StatusCode::kNotFound) return;
  const std::string reason = p.failed_action.empty() ? "ReconcileFailed" : p.failed_action;
  std::string message = error.message();
  // New pods get random names: without them, every retry reads the same, and its Event is
  // one Event with a count.
  if (!p.failed_pod.empty()) {
    for (size_t at = message.find(p.failed_pod); at != std::string::npos;
         at = message.find(p.failed_pod, at)) {
      const std::string pattern = p.name + "-worker-*";
      message.replace(at, p.failed_pod.size(), pattern);
      at += pattern.size();
    }
  }
  json status = p.old_status;
  status["observedGeneration"] = p.generation;
  json conditions = json::array();
  for (const json& c : p.old_conditions) {
    if (c.value("type", "") != "ReconcileError") conditions.push_back(c);
  }
  SetCondition(conditions, p.old_conditions, "ReconcileError", true, reason, message, p.generation);
  status["conditions"] = conditions;
  if (Status patched = PatchStatus(p.job, status); !patched.ok()) {
    std::fprintf(stderr, "virtualflow-operator: %s: condition ReconcileError not recorded: %s\n",
                 p.key.c_str(), patched.message().c_str());
  }
  Event(p.job, true, reason, message);
}

Result<ReconcileResult> Reconciler::Forget(const std::string& key) {
  // Gone: its pods and Secret follow through their owner references.
  (void)coordinator_.RemoveJob(key);
  std::lock_guard<std::mutex> lock(mu_);
  registered_.erase(key);
  expected_.erase(key);
  policies_created_.erase(key);
  failures_seen_.erase(key);
  forged_seen_.erase(key);
  credentials_checked_.erase(key);
  checkpoint_failures_seen_.erase(key);
  drain_events_.erase(key);
  times_.erase(key);
  specs_.erase(key);
  written_.erase(key);
  if (hooks_.on_job_gone) hooks_.on_job_gone(key);
  return ReconcileResult{};
}

void Reconciler::Begin(Pass& p) {
  const json& meta = p.job.at("metadata");
  p.ns = meta.value("namespace", "");
  p.name = meta.value("name", "");
  p.uid = meta.value("uid", "");
  p.generation = meta.value("generation", int64_t{0});
  p.old_status = Obj(p.job, "status");
  p.old_conditions = p.old_status.value("conditions", json::array());
  p.status = p.old_status;
  p.status["observedGeneration"] = p.generation;
  StampTimes(p);
}

Status Reconciler::FailInvalidSpec(Pass& p, const Status& why) {
  // The API server's schema has already checked most of it; what it cannot check fails here.
  json conditions = json::array();
  SetCondition(conditions, p.old_conditions, "Failed", true, "InvalidSpec", why.message(),
               p.generation);
  p.status["phase"] = "Failed";
  p.status["message"] = why.message();
  p.status["conditions"] = conditions;
  StampTimes(p);
  if (p.old_status.value("phase", "") != "Failed") Event(p.job, true, "InvalidSpec", why.message());
  return PatchStatus(p.job, p.status);
}

Status Reconciler::EnsureNetworkPolicy(Pass& p) {
  if (!options_.network_policy) return Status::Ok();
  const json want = BuildNetworkPolicy(p.job, options_.pods.metrics_port, *options_.network_policy);
  const std::string name = NetworkPolicyName(p.name);
  const std::string where = "NetworkPolicy " + p.ns + "/" + name;
  std::optional<json> have = network_policies_->Get(p.ns + "/" + name);
  if (!have) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = policies_created_.find(p.key);
      if (it != policies_created_.end() && it->second.first == p.uid &&
          Clock::now() - it->second.second < kExpectationTimeout) {
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
    policies_created_[p.key] = {p.uid, Clock::now()};
    return Status::Ok();
  }
  {
    // Seen: from now on its absence means that it was deleted, and it is made again at once.
    std::lock_guard<std::mutex> lock(mu_);
    policies_created_.erase(p.key);
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

Status Reconciler::Observe(Pass& p) {
  p.cluster = View();
  if (hooks_.on_inventory) hooks_.on_inventory(p.gpus());
  auto labelled = p.cluster->pods_by_job.find(p.key);
  if (labelled != p.cluster->pods_by_job.end()) {
    for (const std::shared_ptr<const json>& pod : labelled->second) {
      if (OwnedBy(*pod, p.ns, p.name, p.uid)) p.pods.push_back(*pod);
    }
  }
  for (const json& pod : p.pods) p.by_name[PodName(pod)] = &pod;

  VF_ASSIGN_OR_RETURN(p.view, coordinator_.GetJob(p.key));
  Desired desired = DesiredWorkers(p, *p.cluster);
  p.desired = desired.workers;
  p.policy_reason = std::move(desired.reason);
  p.allocation = std::move(desired.allocation);
  p.total_steps = KnownTotalSteps(p.spec, p.view);
  p.epoch = p.view.plan.epoch;
  p.members = p.view.plan.members;
  for (const Member& m : p.members) p.in_plan.insert(m.worker);
  p.admitted = AdmittedWorkers(p);
  VF_RETURN_IF_ERROR(coordinator_.RestrictWorkers(p.key, p.admitted));
  p.image = WorkerImage(p.job, p.pods, p.in_plan, options_.pods.default_image);
  for (const auto& [k, v] : Obj(p.old_status, "restarts").items()) {
    if (v.is_number_integer()) p.restarts[k] = v.get<int64_t>();
  }
  return Status::Ok();
}

Result<Reconciler::Next> Reconciler::RecordSuccess(Pass& p) {
  // Rank 0's final report carries the outcome: from the coordinator, or, when the coordinator
  // that received it went before the status said so (an operator killed then), from the
  // termination message rank 0 left in its pod, which outlives any operator.
  std::optional<Report> final = FinalReportOfCoordinator(p.view);
  if (final) {
    options_.fault.At("final-report", p.key);
  } else {
    std::vector<const json*> labelled;
    auto it = p.cluster->pods_by_job.find(p.key);
    if (it != p.cluster->pods_by_job.end()) {
      for (const std::shared_ptr<const json>& pod : it->second) labelled.push_back(pod.get());
    }
    PodOutcome outcome = FinalReportOfPods(
        p.key, p.name, p.uid, RankZeroOfLastPlan(&p.view.plan, p.old_status), labelled);
    IgnoreForgedOutcomes(p, outcome.refused);
    final = std::move(outcome.report);
  }
  if (final) {
    const Report& r = *final;
    json& status = p.status;
    status["phase"] = "Succeeded";
    StampTimes(p);
    status["step"] = r.step;
    if (p.total_steps > 0) status["totalSteps"] = p.total_steps;
    if (!r.weights_sha256.empty()) status["weightsSha256"] = r.weights_sha256;
    if (std::isfinite(r.test_accuracy)) status["testAccuracy"] = r.test_accuracy;
    if (std::isfinite(r.loss)) status["loss"] = r.loss;
    // Where the trained weights are: the final checkpoint, on the volume that holds it.
    if (json where = FinalCheckpointLocation(p.job, p.spec); !where.is_null()) {
      status["finalCheckpoint"] = where;
    }
    json conditions = json::array();
    SetCondition(conditions, p.old_conditions, "Created", true, "PodsCreated",
                 "worker pods were created", p.generation);
    SetCondition(conditions, p.old_conditions, "Running", false, "Finished", "training finished",
                 p.generation);
    SetCondition(
        conditions, p.old_conditions, "Succeeded", true, "TrainingFinished",
        "trained " + std::to_string(r.step) + " steps; weights " + r.weights_sha256.substr(0, 12),
        p.generation);
    SetResumedCondition(p, conditions);
    KeepDrainCondition(p, conditions);
    status["conditions"] = conditions;
    status["message"] = "training finished";
    VF_RETURN_IF_ERROR(PatchStatus(p.job, status));
    Event(p.job, false, "Succeeded",
          "trained " + std::to_string(r.step) + " steps, test accuracy " +
              std::to_string(r.test_accuracy));
    (void)coordinator_.RemoveJob(p.key);
    if (hooks_.on_job_status) hooks_.on_job_status(p.key, status, p.spec);
    return Next::kDone;
  }
  return Next::kGoOn;
}

void Reconciler::IgnoreForgedOutcomes(
    Pass& p, const std::vector<std::pair<const json*, std::string>>& refused) {
  for (const auto& [pod, why] : refused) {
    const std::string name = PodName(*pod);
    bool fresh = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fresh = forged_seen_[p.key].insert(Obj(*pod, "metadata").value("uid", name)).second;
    }
    if (!fresh) continue;
    const std::string message =
        "the final report in the termination message of pod " + name + " is ignored: " + why;
    std::fprintf(stderr, "virtualflow-operator: %s: %s\n", p.key.c_str(), message.c_str());
    Event(p.job, true, "ForgedOutcomeIgnored", message);
  }
}

std::set<std::string> Reconciler::AdmittedWorkers(const Pass& p) {
  std::set<std::string> admitted;
  for (const json& pod : p.pods) {
    const PodLife life = PodLifeOf(pod);
    // Its container has ended: nothing of it talks to the coordinator again.
    if (life == PodLife::kSucceeded || life == PodLife::kFailed) continue;
    const std::string name = PodName(pod);
    // It acknowledged a plan without it and is exiting: it has nothing left to say either.
    auto worker = p.view.workers.find(name);
    if (worker != p.view.workers.end() && worker->second.acked_epoch >= 0 &&
        p.in_plan.count(name) == 0) {
      continue;
    }
    admitted.insert(name);
  }
  // Created, but not in the cache yet: their agents may be starting already.
  std::lock_guard<std::mutex> lock(mu_);
  auto expected = expected_.find(p.key);
  if (expected != expected_.end()) {
    for (const auto& [name, when] : expected->second) admitted.insert(name);
  }
  return admitted;
}

Status Reconciler::RepairCredentials(Pass& p) {
  const auto now = Clock::now();
  std::map<std::string, Clock::time_point> checked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    checked = credentials_checked_[p.key];
  }
  std::map<std::string, Clock::time_point> kept;  // of the pods there still are
  for (const json& pod : p.pods) {
    const std::string name = PodName(pod);
    auto seen = checked.find(name);
    if (seen != checked.end()) kept[name] = seen->second;
    // A container that runs had its credential mounted; one that ended needs none.
    if (PodLifeOf(pod) != PodLife::kStarting) continue;
    if (seen != checked.end() && now - seen->second < kCredentialRecheck) continue;
    // Asked with a Secret that holds no credential at all: the pod's volume names the key
    // kTokenKey, so a pod that mounted this placeholder would not start either.
    json placeholder = BuildCredentialSecret(p.job, pod, "");
    placeholder.erase("stringData");
    kube::ApiResult<json> created = client_.Create(kube::kSecrets, p.ns, placeholder);
    if (created.reason() == kube::Reason::kAlreadyExists) {
      kept[name] = now;
      continue;
    }
    if (!created.ok()) return created.status().WithContext("credential Secret of pod " + name);
    kube::DeleteOptions del;
    del.precondition_uid = Obj(pod, "metadata").value("uid", "");
    kube::ApiResult<json> deleted = client_.Delete(kube::kPods, p.ns, name, del);
    if (!deleted.ok() && deleted.reason() != kube::Reason::kNotFound) {
      p.failed_action = "FailedDeletePod";
      return deleted.status();
    }
    p.replaced.insert(name);
    p.admitted.erase(name);
    kept.erase(name);
    Event(p.job, true, "CredentialSecretMissing",
          "worker pod " + name + " has no credential Secret (" + CredentialSecretName(name) +
              "); the pod is replaced");
  }
  if (!p.replaced.empty()) VF_RETURN_IF_ERROR(coordinator_.RestrictWorkers(p.key, p.admitted));
  std::lock_guard<std::mutex> lock(mu_);
  credentials_checked_[p.key] = std::move(kept);
  return Status::Ok();
}

Status Reconciler::FailJob(Pass& p, const std::string& reason, const std::string& event_reason,
                           const std::string& message) {
  p.status["phase"] = "Failed";
  p.status["message"] = message;
  json conditions = json::array();
  SetCondition(conditions, p.old_conditions, "Failed", true, reason, message, p.generation);
  SetResumedCondition(p, conditions);
  KeepDrainCondition(p, conditions);
  p.status["conditions"] = conditions;
  StampTimes(p);
  VF_RETURN_IF_ERROR(PatchStatus(p.job, p.status));
  Event(p.job, true, event_reason, message);
  (void)coordinator_.RemoveJob(p.key);
  if (hooks_.on_job_status) hooks_.on_job_status(p.key, p.status, p.spec);
  return Status::Ok();
}

Result<Reconciler::Next> Reconciler::RecordFailures(Pass& p) {
  for (const json& pod : p.pods) {
    if (PodLifeOf(pod) != PodLife::kFailed) continue;
    const std::string pod_name = PodName(pod);
    if (PodExitCode(pod) == kExitAnotherBuild) {
      // Its pod ran another build than the job's workers: no failure of the job, nor of a
      // worker. Its pod goes (DeleteEndedPods) and one of the job's image takes its place.
      bool fresh = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        fresh = failures_seen_[p.key].insert(pod_name).second;
      }
      if (fresh) {
        Event(p.job, true, "WorkerRefused",
              "worker " + pod_name + " (image " + PodImage(pod) +
                  ") was refused: it runs another build than the job's workers; it is replaced "
                  "by a pod of the job's image " +
                  p.image + " (" + PodTerminationMessage(pod) + ")");
      }
      continue;
    }
    if (PodExitCode(pod) == 3) {
      // The agent found that the job itself cannot go on (diverged, bad checkpoint).
      VF_RETURN_IF_ERROR(FailJob(p, "JobFailed", "Failed",
                                 "worker " + pod_name + ": " + PodTerminationMessage(pod)));
      return Next::kDone;
    }
    bool fresh = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fresh = failures_seen_[p.key].insert(pod_name).second;
    }
    if (fresh) {
      p.restarts["failure"] += 1;
      Event(p.job, true, "WorkerFailed",
            "worker " + pod_name + " failed (exit code " + std::to_string(PodExitCode(pod)) +
                "): " + PodTerminationMessage(pod));
    }
  }
  // As batch/v1 Job's backoffLimit: the failures counted above (preemptions and leaves are
  // counted apart and do not count here).
  const std::optional<int>& limit = p.spec.run_policy.backoff_limit;
  auto failures = p.restarts.find("failure");
  if (limit && failures != p.restarts.end() && failures->second > *limit) {
    p.status["restarts"] = p.restarts;
    VF_RETURN_IF_ERROR(FailJob(p, "BackoffLimitExceeded", "BackoffLimitExceeded",
                               std::to_string(failures->second) +
                                   " worker failures, more than spec.runPolicy.backoffLimit (" +
                                   std::to_string(*limit) + ") allows"));
    return Next::kDone;
  }
  return Next::kGoOn;
}

namespace {

// The status of a job whose worker pods are all being deleted (suspended, drained): `phase`,
// `message`, no workers, `stopping` of them leaving, no plan.
void MarkWorkersStopping(json& status, const std::string& phase, const std::string& message,
                         int stopping) {
  status["phase"] = phase;
  status["message"] = message;
  status["workers"] = 0;
  status["readyWorkers"] = 0;
  status["workerCounts"] = {
      {"pending", 0}, {"joining", 0}, {"training", 0}, {"leaving", stopping}, {"failed", 0}};
  status["assignment"] = json::array();
}

// `old` less the condition `own` (which the caller sets again) and those that only a job with
// workers has (Running, Resizing, Degraded, ReconcileError, ImageKept).
json ConditionsWithoutWorkers(const json& old, const std::string& own) {
  json conditions = json::array();
  for (const json& c : old) {
    const std::string type = c.value("type", "");
    if (type != own && type != "Running" && type != "Resizing" && type != "Degraded" &&
        type != "ReconcileError" && type != "ImageKept") {
      conditions.push_back(c);
    }
  }
  return conditions;
}

}  // namespace

void Reconciler::ForgetRegistration(const std::string& key) {
  (void)coordinator_.RemoveJob(key);
  std::lock_guard<std::mutex> lock(mu_);
  registered_.erase(key);
  expected_.erase(key);
}

Result<Reconciler::Next> Reconciler::Suspend(Pass& p, ReconcileResult& result) {
  const json* was = FindCondition(p.old_conditions, "Suspended");
  const bool was_suspended = was != nullptr && was->value("status", "") == "True";
  if (!p.spec.suspend) {
    if (was_suspended) Event(p.job, false, "Resumed", "job resumed (spec.suspend is false)");
    return Next::kGoOn;
  }
  // The workers go; a resumed job starts again from its checkpoint, under a fresh
  // registration with the coordinator (restored from the status's epoch, with no members).
  ForgetRegistration(p.key);
  {
    std::lock_guard<std::mutex> lock(mu_);
    times_[p.key].start.clear();
  }
  VF_ASSIGN_OR_RETURN(const int stopping, DeleteAllPods(p));
  const std::string message =
      stopping == 0
          ? "suspended (spec.suspend): no worker pods"
          : "suspended (spec.suspend): " + std::to_string(stopping) + " worker pod(s) stopping";
  json& status = p.status;
  MarkWorkersStopping(status, "Suspended", message, stopping);
  status["desiredWorkers"] = 0;
  status.erase("startTime");  // as batch/v1: the deadline counts again from the resume
  // Resumed, the job starts again from its checkpoint on the image it would start on then.
  status.erase("workerImage");
  status.erase("workerBuild");
  status.erase("workerProtocol");
  json conditions = ConditionsWithoutWorkers(p.old_conditions, "Suspended");
  SetCondition(conditions, p.old_conditions, "Running", false, "Suspended", message, p.generation);
  SetCondition(conditions, p.old_conditions, "Suspended", true, "JobSuspended",
               "job suspended (spec.suspend is true)", p.generation);
  status["conditions"] = conditions;
  VF_RETURN_IF_ERROR(PatchStatus(p.job, status));
  if (!was_suspended) Event(p.job, false, "Suspended", "job suspended; worker pods deleted");
  if (hooks_.on_job_status) hooks_.on_job_status(p.key, status, p.spec);
  // Look again while pods are stopping, so that the status counts them down.
  if (stopping > 0) result.requeue_after = std::chrono::milliseconds(1000);
  return Next::kDone;
}

namespace {

// The coordinator protocol of a job's workers as its status records it. A job whose status
// shows workers but no protocol (an image, a build or a plan with members recorded by an
// operator from before the field) speaks 1, the only protocol there was then; a job without
// workers (new, suspended, or drained) has none.
std::optional<int64_t> WorkerProtocolOf(const json& status) {
  auto it = status.find("workerProtocol");
  if (it != status.end() && it->is_number_integer()) return it->get<int64_t>();
  auto assignment = status.find("assignment");
  const bool members = assignment != status.end() && assignment->is_array() && !assignment->empty();
  if (status.contains("workerImage") || status.contains("workerBuild") || members) return 1;
  return std::nullopt;
}

}  // namespace

Result<Reconciler::Next> Reconciler::Drain(Pass& p, ReconcileResult& result) {
  const int64_t ours = coordinator_.protocol();
  const std::optional<int64_t> theirs = WorkerProtocolOf(p.old_status);
  if (!theirs || *theirs == ours) return Next::kGoOn;
  const std::vector<std::shared_ptr<const json>> labelled = pods_.Snapshot([&p](const json& pod) {
    const json& meta = Obj(pod, "metadata");
    return meta.value("namespace", "") == p.ns &&
           Obj(meta, "labels").value(kJobLabel, "") == p.name;
  });
  std::vector<const json*> pods;
  for (const std::shared_ptr<const json>& shared : labelled) pods.push_back(shared.get());
  // Rank 0 finished the job before the upgrade: the outcome is read from its pod as after any
  // restart (RecordSuccess), and nothing is drained.
  Result<Plan> plan = coordinator_.GetPlan(p.key);
  PodOutcome outcome = FinalReportOfPods(
      p.key, p.name, p.uid, RankZeroOfLastPlan(plan.ok() ? &*plan : nullptr, p.old_status), pods);
  IgnoreForgedOutcomes(p, outcome.refused);
  if (outcome.report) return Next::kGoOn;

  // This coordinator cannot talk to the workers: it forgets the job, so that they meet a
  // coordinator that does not know it, and leave untold when their pods are deleted, rank 0
  // writing a checkpoint of its last step.
  ForgetRegistration(p.key);
  int left = 0;
  VF_ASSIGN_OR_RETURN(const int stopping, DeleteAllPods(p, &left));
  const bool resumes = !p.spec.checkpoint.path.empty();
  const std::string image = StartingImage(p.job, options_.pods.default_image);
  const std::string why = "the job's workers speak coordinator protocol " +
                          std::to_string(*theirs) + " and this operator speaks protocol " +
                          std::to_string(ours) + ", so they cannot go on under it";
  const std::string then =
      resumes ? "on image " + image + " from its last checkpoint (" + p.spec.checkpoint.path + ")"
              : "on image " + image + " from step 0: it has no spec.checkpoint.path";
  const bool drained = left == 0;
  std::string message;
  json& status = p.status;
  if (!drained) {
    message = "draining: " + why + "; " + std::to_string(stopping) +
              " worker pod(s) stopping, then the job starts again " + then;
  } else {
    // None is left: the next pass starts the job again, like a resumed one, with pods of the
    // image a job started now gets, speaking this protocol.
    message = "drained: " + why + "; the job starts again " + then;
    status["workerProtocol"] = ours;
    status.erase("workerImage");
    status.erase("workerBuild");
    if (!resumes) {
      status["step"] = 0;
      status.erase("loss");
    }
  }
  MarkWorkersStopping(status, "Pending", message, stopping);
  json conditions = ConditionsWithoutWorkers(p.old_conditions, "Draining");
  SetCondition(conditions, p.old_conditions, "Running", false, "Draining", message, p.generation);
  SetCondition(conditions, p.old_conditions, "Draining", !drained,
               drained ? (resumes ? "RestartedFromCheckpoint" : "RestartedFromStepZero")
                       : "CoordinatorProtocolChanged",
               message, p.generation);
  status["conditions"] = conditions;
  VF_RETURN_IF_ERROR(PatchStatus(p.job, status));
  // One Event as the drain begins and one as the job starts again, however many passes the
  // cache takes to show this operator's own status write (and not again from an operator
  // restarted mid-drain, whose status already says Draining).
  const json* was = FindCondition(p.old_conditions, "Draining");
  const bool was_draining = was != nullptr && was->value("status", "") == "True";
  auto first = [&](const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& [uid, said] = drain_events_[p.key];
    if (uid != p.uid) said.clear();
    uid = p.uid;
    return said.insert(what).second;
  };
  if (!was_draining && first("Draining")) {
    // A warning when the job loses its progress.
    Event(p.job, !resumes, "Draining",
          why + ": its worker pods are deleted and it starts again " + then);
  }
  if (drained && first("Restarted")) Event(p.job, false, "Restarted", message);
  if (hooks_.on_job_status) hooks_.on_job_status(p.key, status, p.spec);
  result.requeue_after = std::chrono::milliseconds(drained ? 200 : 1000);
  return Next::kDone;
}

void Reconciler::KeepDrainCondition(Pass& p, json& conditions) {
  if (const json* drain = FindCondition(p.old_conditions, "Draining"); drain != nullptr) {
    conditions.push_back(*drain);
  }
}

Result<int> Reconciler::DeleteAllPods(Pass& p, int* left) {
  int stopping = 0;
  int owned = 0;
  for (const std::shared_ptr<const json>& shared : pods_.Snapshot()) {
    const json& pod = *shared;
    if (!OwnedBy(pod, p.ns, p.name, p.uid)) continue;
    ++owned;
    const PodLife life = PodLifeOf(pod);
    if (life == PodLife::kTerminating) {
      ++stopping;
      continue;
    }
    // One that ended already has nothing to stop, and nothing to keep.
    if (life != PodLife::kSucceeded && life != PodLife::kFailed) ++stopping;
    // The pod's own grace period: the kubelet sends SIGTERM, the agent leaves between steps.
    kube::DeleteOptions del;
    del.precondition_uid = Obj(pod, "metadata").value("uid", "");
    auto r = client_.Delete(kube::kPods, p.ns, PodName(pod), del);
    if (!r.ok() && r.reason() != kube::Reason::kNotFound && r.reason() != kube::Reason::kConflict) {
      p.failed_action = "FailedDeletePod";
      return r.status();
    }
  }
  if (left != nullptr) *left = owned;
  return stopping;
}

void Reconciler::SetResumedCondition(Pass& p, json& conditions) {
  const json* was = FindCondition(p.old_conditions, "Suspended");
  if (was == nullptr) return;  // never suspended
  SetCondition(conditions, p.old_conditions, "Suspended", false, "JobResumed",
               "job resumed (spec.suspend is false)", p.generation);
}

Result<Reconciler::Next> Reconciler::EnforceDeadline(Pass& p, ReconcileResult& result) {
  const std::optional<int64_t>& limit = p.spec.run_policy.active_deadline_seconds;
  if (!limit) return Next::kGoOn;
  const double start = UnixSeconds(p.status.value("startTime", ""));
  if (std::isnan(start)) return Next::kGoOn;
  const double ran = NowUnix() - start;
  const double left = static_cast<double>(*limit) - ran;
  if (left > 0) {
    result.requeue_after = RequeueIn(left);
    return Next::kGoOn;
  }
  VF_RETURN_IF_ERROR(FailJob(p, "DeadlineExceeded", "DeadlineExceeded",
                             "the job ran " + std::to_string(static_cast<int64_t>(ran)) +
                                 " s since " + p.status.value("startTime", "") +
                                 ", past spec.runPolicy.activeDeadlineSeconds (" +
                                 std::to_string(*limit) + ")"));
  return Next::kDone;
}

Result<ReconcileResult> Reconciler::EnforceTtl(Pass& p) {
  const std::optional<int>& ttl = p.spec.run_policy.ttl_seconds_after_finished;
  if (!ttl) return ReconcileResult{};
  // A job that finished before completionTime was written counts from now.
  StampTimes(p);
  VF_RETURN_IF_ERROR(PatchStatus(p.job, p.status));
  const double completed = UnixSeconds(p.status.value("completionTime", ""));
  if (std::isnan(completed)) return ReconcileResult{};
  const double left = completed + *ttl - NowUnix();
  if (left > 0) {
    return ReconcileResult{RequeueIn(left)};
  }
  // Its pods and Secret follow through their owner references.
  kube::DeleteOptions del;
  del.propagation_policy = "Background";
  del.precondition_uid = p.uid;  // never a newer job of the same name
  auto r = client_.Delete(kube::kVirtualFlowJobs, p.ns, p.name, del);
  if (!r.ok() && r.reason() != kube::Reason::kNotFound && r.reason() != kube::Reason::kConflict) {
    return r.status();
  }
  std::fprintf(stderr,
               "virtualflow-operator: %s: deleted %d s after it finished "
               "(spec.runPolicy.ttlSecondsAfterFinished)\n",
               p.key.c_str(), *ttl);
  return ReconcileResult{};
}

std::optional<int> Reconciler::KueueCap(const json& job, const JobSpec& spec) const {
  if (QueueNameOf(job).empty() || workloads_ == nullptr || !workloads_->synced()) {
    return std::nullopt;
  }
  const std::string ns = Obj(job, "metadata").value("namespace", "");
  std::optional<json> workload = workloads_->Get(ns + "/" + WorkloadName(job));
  return KueueWorkerLimit(job, workload ? *workload : json(nullptr), spec);
}

Result<json> Reconciler::FindWorkload(const Pass& p) {
  const std::string name = WorkloadName(p.job);
  if (std::optional<json> cached = workloads_->Get(p.ns + "/" + name)) return *cached;
  // Not in the cache: not created yet, or created a moment ago and not yet seen.
  kube::ApiResult<json> got = client_.Get(kube::kWorkloads, p.ns, name);
  if (got.ok()) return *got;
  if (got.reason() == kube::Reason::kNotFound) return json(nullptr);
  return got.status().WithContext("Kueue Workload " + p.ns + "/" + name);
}

Result<Reconciler::Next> Reconciler::AdmitThroughKueue(Pass& p) {
  const std::string queue = QueueNameOf(p.job);
  if (queue.empty()) return Next::kGoOn;
  if (workloads_ == nullptr) {
    p.failed_action = "KueueUnavailable";
    return FailedPrecondition("the job names a Kueue LocalQueue (" + std::string(kQueueNameLabel) +
                              "), but this operator does not watch Kueue's Workloads");
  }
  if (!workloads_->synced()) {
    // Until the Workloads are mirrored, what Kueue admitted is unknown: the job is left as it
    // is. Kueue not installed shows here, as the reason the list fails.
    if (std::optional<std::string> error = workloads_->last_error()) {
      p.failed_action = "KueueUnavailable";
      return FailedPrecondition("cannot read Kueue's Workloads (is Kueue installed?): " + *error);
    }
    return Next::kDone;
  }
  VF_ASSIGN_OR_RETURN(json workload, FindWorkload(p));
  if (workload.is_null()) {
    const json pod = BuildWorkerPod(p.job, p.spec, p.name + "-worker", options_.pods);
    kube::ApiResult<json> created =
        client_.Create(kube::kWorkloads, p.ns, BuildWorkload(p.job, p.spec, pod));
    if (!created.ok() && created.reason() != kube::Reason::kAlreadyExists) {
      p.failed_action = "FailedCreateWorkload";
      if (created.reason() == kube::Reason::kNotFound) {
        return FailedPrecondition("Kueue's Workload API (" + std::string(kWorkloadApiVersion) +
                                  ") is not served: is Kueue installed? " +
                                  created.status().message());
      }
      return created.status().WithContext("Kueue Workload");
    }
    if (created.ok()) {
      workload = *created;
      Event(p.job, false, "WorkloadCreated",
            "created Kueue Workload " + WorkloadName(p.job) + " in LocalQueue " + queue);
    }
  }
  p.kueue = workload.is_null() ? KueueAdmission{} : AdmissionOf(workload, p.spec);
  if (!p.kueue->admitted && p.kueue->message.empty()) {
    p.kueue->reason = kNotSeenByKueue;
    p.kueue->message = "the Workload was just created";
  }
  return Next::kGoOn;
}

void Reconciler::SetAdmittedCondition(Pass& p, json& conditions) {
  if (!p.kueue) return;
  const KueueAdmission& k = *p.kueue;
  const std::string queue = QueueNameOf(p.job);
  if (k.admitted) {
    SetCondition(conditions, p.old_conditions, "Admitted", true, "Admitted",
                 "Kueue admitted " + std::to_string(k.workers) + " worker(s) in ClusterQueue " +
                     k.cluster_queue + " (LocalQueue " + queue + ")",
                 p.generation);
    return;
  }
  const std::string message = "waiting for Kueue to admit Workload " + WorkloadName(p.job) +
                              " in LocalQueue " + queue + ": " + k.message;
  SetCondition(conditions, p.old_conditions, "Admitted", false,
               k.reason.empty() ? kNotSeenByKueue : k.reason, message, p.generation);
  if (p.members.empty()) p.status["message"] = message;
}

Status Reconciler::FinishWorkload(Pass& p) {
  if (QueueNameOf(p.job).empty() || workloads_ == nullptr || !workloads_->synced()) {
    return Status::Ok();
  }
  VF_ASSIGN_OR_RETURN(json workload, FindWorkload(p));
  const bool succeeded = p.old_status.value("phase", "") == "Succeeded";
  const std::string message = "VirtualFlowJob " + p.old_status.value("phase", "") + ": " +
                              p.old_status.value("message", "");
  // A PUT conditional on the version read, so that Kueue's own conditions stay as they are;
  // when Kueue wrote in between (the cache lags), once more from the API server's copy.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (workload.is_null() || AdmissionOf(workload, p.spec).finished) return Status::Ok();
    kube::ApiResult<json> r = client_.ReplaceStatus(
        kube::kWorkloads, p.ns, FinishedWorkload(workload, succeeded, message, Now()));
    if (r.reason() == kube::Reason::kNotFound) return Status::Ok();  // gone with the job
    if (r.ok()) {
      std::fprintf(stderr, "virtualflow-operator: %s: Kueue Workload %s finished\n", p.key.c_str(),
                   WorkloadName(p.job).c_str());
      return Status::Ok();
    }
    if (r.reason() != kube::Reason::kConflict || attempt > 0) {
      p.failed_action = "FailedFinishWorkload";
      return r.status().WithContext("Kueue Workload " + WorkloadName(p.job));
    }
    kube::ApiResult<json> fresh = client_.Get(kube::kWorkloads, p.ns, WorkloadName(p.job));
    if (fresh.reason() == kube::Reason::kNotFound) return Status::Ok();
    if (!fresh.ok()) return fresh.status().WithContext("Kueue Workload " + WorkloadName(p.job));
    workload = *fresh;
  }
  return Status::Ok();
}

void Reconciler::StampTimes(Pass& p) {
  auto ended = [](const json& status) {
    const std::string phase = status.value("phase", "");
    return phase == "Succeeded" || phase == "Failed";
  };
  std::lock_guard<std::mutex> lock(mu_);
  Times& times = times_[p.key];
  if (times.uid != p.uid) times = Times{p.uid, "", ""};
  // What the API server holds wins; then what this operator wrote; then now.
  auto stamp = [&p](const char* field, std::string& remembered) {
    auto it = p.old_status.find(field);
    if (it != p.old_status.end() && it->is_string()) remembered = it->get<std::string>();
    if (remembered.empty()) remembered = Now();
    p.status[field] = remembered;
  };
  // batch/v1 Job's moment: when the controller first takes the job up. A job that ended before
  // startTime existed gets none.
  if (!ended(p.old_status) || p.old_status.contains("startTime")) stamp("startTime", times.start);
  if (ended(p.status)) stamp("completionTime", times.completion);
}

policy::MembershipInput Reconciler::MembershipInputOf(const Pass& p) const {
  policy::MembershipInput in;
  in.members = RankOrder(p.view.plan);
  for (const Member& m : p.view.plan.members) in.held[m.worker] = m.virtual_nodes;
  in.desired = p.desired;
  in.min_workers = p.spec.replicas_min;
  in.virtual_nodes = p.spec.virtual_nodes;
  in.join_batch_seconds = options_.join_batch_seconds;
  for (const auto& [worker, info] : p.view.workers) {
    in.failure_reported =
        in.failure_reported || (p.view.plan.epoch > 0 && info.failure_epoch >= p.view.plan.epoch &&
                                p.in_plan.count(worker) != 0);
  }
  const double now_unix = NowUnix();
  for (const json& pod : p.pods) {
    policy::WorkerState w;
    w.name = PodName(pod);
    w.life = WorkerLifeOf(PodLifeOf(pod));
    auto it = p.view.workers.find(w.name);
    if (it != p.view.workers.end()) {
      w.registered = true;
      w.ready = it->second.ready;
      w.leave_requested = it->second.leave_requested;
      w.responsive = !it->second.silent;
      w.seconds_per_virtual_node = it->second.last_report.seconds_per_virtual_node;
    }
    const std::string node = Obj(pod, "spec").value("nodeName", "");
    // A GPU job's pod needs a schedulable node with GPUs; a CPU-only job's any schedulable one.
    w.on_schedulable_node =
        node.empty() || (p.spec.gpus_per_worker > 0 ? p.gpus().node_product.count(node) != 0
                                                    : p.gpus().nodes.count(node) != 0);
    const double created = UnixSeconds(Obj(pod, "metadata").value("creationTimestamp", ""));
    w.age_seconds = std::isnan(created) ? 0 : now_unix - created;
    in.workers.push_back(w);
  }
  return in;
}

void Reconciler::InjectFault(const Pass& p) {
  const OperatorFault& fault = options_.fault;
  const Plan& plan = p.view.plan;
  for (const auto& [worker, info] : p.view.workers) {
    const bool member = p.in_plan.count(worker) != 0;
    if (!member && !info.ready && plan.epoch > 0) fault.At("joiners-warming", p.key);
    if (!member && info.leave_requested && info.acked_epoch < plan.epoch) {
      fault.At("acks-pending", p.key);
    }
  }
}

void Reconciler::InjectStateTransferFault(const std::string& job, const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto published = published_joiners_.find(job);
  if (published != published_joiners_.end() && !published->second.second.empty() &&
      KeyEpoch(key) == published->second.first) {
    options_.fault.At("state-transfer", job);
  }
}

Status Reconciler::UpdateMembership(Pass& p) {
  // Once the members have trained the last step they exit one by one while rank 0 evaluates;
  // that is the end of the job, not a failure, so membership and pods are left alone.
  for (const auto& [worker, info] : p.view.workers) {
    p.finishing = p.finishing || (p.total_steps > 0 && p.in_plan.count(worker) != 0 &&
                                  info.last_report.step >= p.total_steps);
  }
  InjectFault(p);
  if (p.finishing) return Status::Ok();
  p.decision = policy::DecideMembership(MembershipInputOf(p));
  if (!p.decision.publish) return Status::Ok();

  const std::vector<Member> next = PlanMembers(p.decision.members);
  const int from = static_cast<int>(p.members.size());
  const int to = static_cast<int>(next.size());
  const std::string& kind = p.decision.kind;
  p.epoch = p.view.plan.epoch + 1;
  // Intent first: the status names the plan before any worker can see it, so an operator
  // that restarts in between restores a plan the workers can follow.
  p.status["epoch"] = p.epoch;
  p.status["assignment"] = PlanJson(next);
  p.status["workers"] = to;
  if (kind != "start") {
    p.status["lastResize"] = {{"time", Now()},
                              {"from", from},
                              {"to", to},
                              {"reason", p.decision.reason},
                              {"pauseSeconds", 0.0}};
  }
  if (kind == "leave") p.restarts["preemption"] += 1;
  p.status["restarts"] = p.restarts;
  VF_RETURN_IF_ERROR(PatchStatus(p.job, p.status));
  VF_RETURN_IF_ERROR(coordinator_.PublishPlanWithEpoch(p.key, p.epoch, next).status());
  std::fprintf(stderr, "virtualflow-operator: %s: epoch %lld: %s\n", p.key.c_str(),
               static_cast<long long>(p.epoch), p.decision.reason.c_str());
  // A recovery names what the members reported, so that a failure that recurs (a plan whose
  // communicator cannot be built) shows its cause among the job's events.
  const std::string reported = kind == "failure" ? ReportedFailure(p.view, p.view.plan.epoch) : "";
  Event(p.job, kind == "failure",
        kind == "start" ? "Started" : (kind == "failure" ? "Recovered" : "Resized"),
        p.decision.reason + (reported.empty() ? "" : "; " + reported));
  if (hooks_.on_resize && kind != "start") hooks_.on_resize(p.key, kind, from, to);
  if (kind != "start") options_.fault.At("plan-published", p.key);
  // The members this plan drops are to acknowledge it before they exit (a pod deleted, a
  // node drained: the operator plans without them as soon as it sees that, before they ask).
  if (kind == "leave") options_.fault.At("acks-pending", p.key);
  if (options_.fault.armed("state-transfer")) {
    std::set<std::string> joiners;
    for (const Member& m : next) {
      if (p.in_plan.count(m.worker) == 0) joiners.insert(m.worker);
    }
    std::lock_guard<std::mutex> lock(mu_);
    published_joiners_[p.key] = {p.epoch, std::move(joiners)};
  }
  p.members = next;
  p.in_plan.clear();
  for (const Member& m : p.members) p.in_plan.insert(m.worker);
  return Status::Ok();
}

Status Reconciler::ReconcilePods(Pass& p) {
  int live = 0;
  std::vector<const json*> spare;  // live pods outside the plan
  if (!p.finishing) VF_RETURN_IF_ERROR(RepairCredentials(p));
  if (!p.finishing) VF_RETURN_IF_ERROR(DeleteEndedPods(p, live, spare));
  p.unseen = PendingCreations(p);
  live += p.unseen;
  if (p.finishing) return Status::Ok();
  VF_RETURN_IF_ERROR(DeleteSurplusPods(p, live, spare));
  return CreateMissingPods(p, live);
}

Status Reconciler::DeleteEndedPods(Pass& p, int& live, std::vector<const json*>& spare) {
  for (const json& pod : p.pods) {
    const std::string pod_name = PodName(pod);
    if (p.replaced.count(pod_name) != 0) continue;  // deleted this pass: it will never train
    const PodLife life = PodLifeOf(pod);
    const bool member = p.in_plan.count(pod_name) != 0;
    if (life == PodLife::kSucceeded || life == PodLife::kFailed) {
      // A leaver that acknowledged, or a dead worker the plan no longer holds: its pod goes
      // (a member's pod stays until a plan without it is out).
      if (!member) {
        kube::DeleteOptions del;
        del.precondition_uid = Obj(pod, "metadata").value("uid", "");
        auto r = client_.Delete(kube::kPods, p.ns, pod_name, del);
        if (!r.ok() && r.reason() != kube::Reason::kNotFound) {
          p.failed_action = "FailedDeletePod";
          return r.status();
        }
        (void)coordinator_.ForgetWorker(p.key, pod_name);
      }
      continue;
    }
    if (life == PodLife::kTerminating) continue;
    ++live;
    if (!member) spare.push_back(&pod);
  }
  return Status::Ok();
}

int Reconciler::PendingCreations(const Pass& p) {
  // Pods created but not in the cache yet count as live, so none is created twice.
  int pending = 0;
  std::lock_guard<std::mutex> lock(mu_);
  auto& expected = expected_[p.key];
  for (auto it = expected.begin(); it != expected.end();) {
    if (p.by_name.count(it->first) != 0 || Clock::now() - it->second > kExpectationTimeout) {
      it = expected.erase(it);
    } else {
      ++pending;
      ++it;
    }
  }
  return pending;
}

Status Reconciler::DeleteSurplusPods(Pass& p, int& live, std::vector<const json*>& spare) {
  if (live <= p.desired || spare.empty()) return Status::Ok();
  // Surplus joiners that are not training go first, newest first; members leave through a plan.
  std::sort(spare.begin(), spare.end(), [](const json* a, const json* b) {
    return Obj(*a, "metadata").value("creationTimestamp", "") >
           Obj(*b, "metadata").value("creationTimestamp", "");
  });
  for (const json* pod : spare) {
    if (live <= p.desired) break;
    auto r = client_.Delete(kube::kPods, p.ns, PodName(*pod));
    if (!r.ok() && r.reason() != kube::Reason::kNotFound) {
      p.failed_action = "FailedDeletePod";
      return r.status();
    }
    --live;
  }
  return Status::Ok();
}

namespace {

// The GPU product each new pod should be pinned to: what the policy allocated per product,
// less the live pods already there (bound to a node of that product, or pinned to it).
std::vector<std::string> ProductsToPin(const policy::Allocation& allocation,
                                       const std::vector<json>& pods, const ClusterGpus& gpus) {
  std::map<std::string, int> missing;
  for (const auto& [type, n] : allocation) {
    if (type != kCpuPool && type != kUnknownProduct) missing[type] = n;
  }
  for (const json& pod : pods) {
    const PodLife life = PodLifeOf(pod);
    if (life != PodLife::kStarting && life != PodLife::kRunning) continue;
    const std::string node = Obj(pod, "spec").value("nodeName", "");
    auto bound = gpus.node_product.find(node);
    const std::string product =
        bound != gpus.node_product.end()
            ? bound->second
            : Obj(Obj(pod, "spec"), "nodeSelector").value(kGpuProductLabel, "");
    auto it = missing.find(product);
    if (it != missing.end()) --it->second;
  }
  std::vector<std::string> out;
  for (const auto& [product, n] : missing) {
    for (int i = 0; i < n; ++i) out.push_back(product);
  }
  return out;
}

}  // namespace

Status Reconciler::CreateMissingPods(Pass& p, int live) {
  // A template that names a product itself keeps it.
  const bool own_product = Obj(TemplateOf(p.job), "nodeSelector").contains(kGpuProductLabel);
  std::vector<std::string> pins =
      own_product ? std::vector<std::string>{} : ProductsToPin(p.allocation, p.pods, p.gpus());
  size_t next_pin = 0;
  while (live < p.desired) {
    const std::string pod_name = p.name + "-worker-" + RandomSuffix();
    const std::string product = next_pin < pins.size() ? pins[next_pin++] : "";
    json pod = BuildWorkerPod(p.job, p.spec, pod_name, options_.pods, product);
    // The image the job's workers run, which may no longer be what a new job gets.
    pod["spec"]["containers"][0]["image"] = p.image;
    auto r = client_.Create(kube::kPods, p.ns, pod);
    p.failed_pod = pod_name;
    if (r.reason() == kube::Reason::kAlreadyExists) {
      // Its name was drawn just now, and the client never repeats a create: a pod that has it
      // is not one this operator made. It is not adopted: it gets no credential.
      p.failed_action = "WorkerPodNotOwned";
      return FailedPrecondition("pod " + p.ns + "/" + pod_name +
                                " exists and was not created by the operator; it is not adopted "
                                "(no credential is made for it)");
    }
    if (!r.ok()) {
      // RBAC, a ResourceQuota, a LimitRange or an admission webhook refused it: the job
      // cannot grow until someone acts, so it says why (RecordBlocked).
      p.failed_action = "FailedCreatePod";
      return r.status();
    }
    // Admitted before its credential exists, so that its agent is never refused.
    p.admitted.insert(pod_name);
    VF_RETURN_IF_ERROR(coordinator_.RestrictWorkers(p.key, p.admitted));
    VF_ASSIGN_OR_RETURN(const std::string job_secret, JobSecret(p.job));
    const Status credential = CreateWorkerCredential(client_, p.job, p.ns, pod_name, job_secret,
                                                     options_.pods.coordinator_ca, *r);
    if (credential.code() == StatusCode::kFailedPrecondition) {
      p.failed_action = "CredentialSecretNotOwned";
    }
    VF_RETURN_IF_ERROR(credential);
    p.failed_pod.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      expected_[p.key][pod_name] = Clock::now();
      credentials_checked_[p.key][pod_name] = Clock::now();
    }
    ++live;
    ++p.created;
  }
  // A job's first pods are recorded by its Created condition, which this pass's status turns
  // True (its lastTransitionTime is the moment): an Event would say the same, at the cost of a
  // request for every job. Pods created once it has had some (replacements, growth, a resume)
  // get one.
  const json* had_pods = FindCondition(p.old_conditions, "Created");
  if (p.created > 0 && had_pods != nullptr && had_pods->value("status", "") == "True") {
    Event(p.job, false, "WorkersCreated",
          "created " + std::to_string(p.created) + " worker pod(s); the policy wants " +
              std::to_string(p.desired));
  }
  return Status::Ok();
}

json Reconciler::WorkerCounts(const Pass& p) const {
  int pending = 0;
  int joining = 0;
  int training = 0;
  int leaving = 0;
  int failed = 0;
  for (const json& pod : p.pods) {
    const std::string name = PodName(pod);
    switch (PodLifeOf(pod)) {
      case PodLife::kStarting:
        ++pending;
        break;
      case PodLife::kRunning: {
        auto it = p.view.workers.find(name);
        const bool asked_to_leave = it != p.view.workers.end() && it->second.leave_requested;
        if (p.in_plan.count(name) == 0) {
          ++joining;
        } else if (asked_to_leave) {
          ++leaving;
        } else {
          ++training;
        }
        break;
      }
      case PodLife::kTerminating:
        ++leaving;
        break;
      case PodLife::kFailed:
        ++failed;
        break;
      case PodLife::kSucceeded:
        break;  // finished, or left after acknowledging a plan
    }
  }
  // Created, this pass or an earlier one, and not in the cache yet: a pass that runs before
  // the cache shows them says what the one that created them said.
  pending += p.created + p.unseen;
  return {{"pending", pending},
          {"joining", joining},
          {"training", training},
          {"leaving", leaving},
          {"failed", failed}};
}

Status Reconciler::WriteProgress(Pass& p) {
  const Progress progress = ProgressOf(p.members, p.epoch, p.view);
  int ready = 0;
  for (const auto& [worker, info] : p.view.workers) {
    auto it = p.by_name.find(worker);
    if (info.ready && it != p.by_name.end() && PodLifeOf(*it->second) == PodLife::kRunning) {
      ++ready;
    }
  }
  json& status = p.status;
  status["workers"] = static_cast<int>(p.members.size());
  status["readyWorkers"] = ready;
  status["desiredWorkers"] = p.desired;
  status["workerCounts"] = WorkerCounts(p);
  if (p.total_steps > 0) status["totalSteps"] = p.total_steps;  // once an agent has said
  status["epoch"] = p.epoch;
  status["assignment"] = PlanJson(p.members);
  status["restarts"] = p.restarts;
  // Recorded with the job's first pods (WorkerImage keeps it while the job trains), and with
  // it the coordinator protocol they speak: this coordinator's, which takes no other.
  if (!p.pods.empty() || p.created > 0 || p.unseen > 0) {
    status["workerImage"] = p.image;
    status["workerProtocol"] = coordinator_.protocol();
  }
  // The job's build is its members' once one has registered with this coordinator.
  for (const Member& m : p.members) {
    if (p.view.workers.count(m.worker) != 0) status["workerBuild"] = p.view.build;
  }
  if (progress.step > 0 || !status.contains("step")) {
    status["step"] = std::max<int64_t>(progress.step, p.old_status.value("step", int64_t{0}));
  }
  if (std::isfinite(progress.loss)) status["loss"] = progress.loss;
  if (progress.samples_per_second > 0) status["samplesPerSecond"] = progress.samples_per_second;
  if (progress.all_switched && status.contains("lastResize") &&
      Obj(status, "lastResize").value("pauseSeconds", 0.0) == 0.0 && progress.pause_seconds > 0) {
    status["lastResize"]["pauseSeconds"] = progress.pause_seconds;
    if (hooks_.on_resize_pause) hooks_.on_resize_pause(p.key, progress.pause_seconds);
  }
  SetPhase(p, progress.all_switched);
  VF_RETURN_IF_ERROR(PatchStatus(p.job, status));
  if (hooks_.on_job_status) hooks_.on_job_status(p.key, status, p.spec);
  return Status::Ok();
}

void Reconciler::SetPhase(Pass& p, bool all_switched) {
  const size_t workers = p.members.size();
  std::string phase;
  std::string message;
  if (workers == 0) {
    phase = "Pending";
    // Before the first plan every worker is a joiner: whether the membership decision still
    // waits for them (kJoinBatchSeconds) or has none yet (this pass created them) is the same
    // thing to the job's user, and one message saves a status write for every new job.
    const std::string& why = p.decision.reason;
    message = p.desired == 0 ? "waiting for GPUs: " + p.policy_reason
              : why.empty() || why == policy::kWaitingForJoiners ? "waiting for workers to warm up"
                                                                 : why;
  } else if (!all_switched) {
    phase = "Resizing";
    message = "switching to membership epoch " + std::to_string(p.epoch);
  } else {
    phase = "Running";
    message = "training on " + std::to_string(workers) + " workers";
  }
  p.status["phase"] = phase;
  p.status["message"] = message;
  const bool has_pods = !p.pods.empty() || p.created > 0 || p.unseen > 0;
  const json& old = p.old_conditions;
  json conditions = json::array();
  SetCondition(conditions, old, "Created", has_pods, has_pods ? "PodsCreated" : "WaitingForGPUs",
               has_pods ? "worker pods were created" : message, p.generation);
  SetCondition(
      conditions, old, "Running", workers > 0,
      workers == 0 ? (p.desired == 0 ? "WaitingForGPUs" : "WaitingForWorkers") : "Training",
      message, p.generation);
  SetCondition(conditions, old, "Resizing", phase == "Resizing",
               phase == "Resizing" ? "MembershipChange" : "Stable", message, p.generation);
  const bool degraded = workers > 0 && static_cast<int>(workers) < p.spec.replicas_min;
  SetCondition(
      conditions, old, "Degraded", degraded, degraded ? "BelowMinimum" : "AtLeastMinimum",
      std::to_string(workers) + " of at least " + std::to_string(p.spec.replicas_min) + " workers",
      p.generation);
  // Shown once a pass has failed; this one did not.
  if (FindCondition(old, "ReconcileError") != nullptr) {
    SetCondition(conditions, old, "ReconcileError", false, "Reconciled",
                 "the last reconcile succeeded", p.generation);
  }
  SetCheckpointCondition(p, conditions);
  SetImageCondition(p, conditions);
  SetResumedCondition(p, conditions);
  SetAdmittedCondition(p, conditions);
  KeepDrainCondition(p, conditions);
  p.status["conditions"] = conditions;
}

void Reconciler::SetImageCondition(Pass& p, json& conditions) {
  const std::string starting = StartingImage(p.job, options_.pods.default_image);
  const bool kept = p.status.contains("workerImage") && p.image != starting;
  if (kept) {
    SetCondition(conditions, p.old_conditions, "ImageKept", true, "JobStartedOnIt",
                 "the workers run " + p.image +
                     ", the image the job started on, and so does every new pod of the job; a "
                     "job started now would run " +
                     starting + ". Suspend and resume the job to move it to that image",
                 p.generation);
  } else if (FindCondition(p.old_conditions, "ImageKept") != nullptr) {
    SetCondition(conditions, p.old_conditions, "ImageKept", false, "StartingImage",
                 "the workers run " + p.image + ", the image a job started now would run",
                 p.generation);
  }
}

void Reconciler::SetCheckpointCondition(Pass& p, json& conditions) {
  // Rank 0 writes the checkpoints, and rank 0 changes with the membership: the newest outcome
  // any worker reported is the job's.
  const Report* newest = nullptr;
  for (const auto& [worker, info] : p.view.workers) {
    if (info.last_report.checkpoint_step > 0 &&
        (newest == nullptr || info.last_report.checkpoint_step > newest->checkpoint_step)) {
      newest = &info.last_report;
    }
  }
  const json* old = FindCondition(p.old_conditions, "CheckpointFailing");
  if (newest == nullptr) {
    // Nothing reported since the coordinator (re)started: keep what was shown.
    if (old != nullptr) conditions.push_back(*old);
    return;
  }
  const std::string step = std::to_string(newest->checkpoint_step);
  if (!newest->checkpoint_error.empty()) {
    const std::string what =
        "training goes on and the next checkpoint tries again: " + newest->checkpoint_error;
    const std::string message = "checkpoint at step " + step + " not written; " + what;
    // One Event per failed checkpoint seen (the cache may not show this operator's own status
    // write yet, so it remembers), all in one series (count) while the error stays the same.
    bool fresh = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      int64_t& seen = checkpoint_failures_seen_[p.key];
      fresh = seen != newest->checkpoint_step;
      seen = newest->checkpoint_step;
    }
    if (fresh) {
      Event(p.job, true, "CheckpointFailed", "checkpoint not written; " + what);
      if (hooks_.on_checkpoint_failure) hooks_.on_checkpoint_failure(p.key);
    }
    SetCondition(conditions, p.old_conditions, "CheckpointFailing", true, "CheckpointWriteFailed",
                 message, p.generation);
    return;
  }
  if (old == nullptr) return;  // never failed: no condition to show
  if (old->value("status", "") == "True") {
    Event(p.job, false, "CheckpointWritten", "checkpoint written again at step " + step);
  }
  SetCondition(conditions, p.old_conditions, "CheckpointFailing", false, "CheckpointWritten",
               "checkpoint at step " + step + " written", p.generation);
}

}  // namespace vf::controller
