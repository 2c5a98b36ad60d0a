#include "operator/controller/reconciler.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <iomanip>
#include <sstream>

#include "operator/controller/inventory.h"
#include "operator/policy/membership.h"
#include "runtime/job/spec.h"

namespace vf::controller {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kExpectationTimeout = std::chrono::seconds(60);
// Fashion-MNIST's training set; steps per epoch follow from it (see Sharder).
constexpr int64_t kFashionMnistTrain = 60000;

std::string Build() { return std::string("virtualflow ") + VF_VERSION; }

Result<std::string> RandomToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return Internal("no random bytes for a job token");
  std::ostringstream s;
  for (unsigned char b : bytes) s << std::hex << std::setw(2) << std::setfill('0') << int{b};
  return s.str();
}

std::string RandomSuffix() {
  static constexpr char kAlphabet[] = "bcdfghjklmnpqrstvwxz2456789";
  unsigned char bytes[5];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    for (auto& b : bytes) b = static_cast<unsigned char>(std::rand());
  }
  std::string out;
  for (unsigned char b : bytes) out.push_back(kAlphabet[b % (sizeof(kAlphabet) - 1)]);
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

const json& Obj(const json& j, const char* key) {
  static const json kEmpty = json::object();
  auto it = j.find(key);
  return it != j.end() && it->is_object() ? *it : kEmpty;
}

int64_t TotalSteps(const JobSpec& spec) {
  if (spec.steps > 0) return spec.steps;
  const int64_t train =
      spec.dataset.name == "synthetic" ? spec.dataset.train_samples : kFashionMnistTrain;
  return spec.epochs * (train / spec.global_batch_size);
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

Result<std::unique_ptr<Reconciler>> Reconciler::Create(kube::Client& client, const Informer& jobs,
                                                       const Informer& pods, const Informer& nodes,
                                                       Coordinator& coordinator,
                                                       ReconcilerOptions options,
                                                       ReconcilerHooks hooks) {
  policy::PolicyOptions popts;
  popts.cooldown_seconds = 0;  // each job's own cooldown (spec.elasticity) applies
  VF_ASSIGN_OR_RETURN(auto policy, policy::CreatePolicy(options.policy, popts));
  return std::unique_ptr<Reconciler>(new Reconciler(client, jobs, pods, nodes, coordinator,
                                                    std::move(options), std::move(hooks),
                                                    std::move(policy)));
}

Reconciler::Reconciler(kube::Client& client, const Informer& jobs, const Informer& pods,
                       const Informer& nodes, Coordinator& coordinator, ReconcilerOptions options,
                       ReconcilerHooks hooks, std::unique_ptr<policy::Policy> policy)
    : client_(client),
      jobs_(jobs),
      pods_(pods),
      nodes_(nodes),
      coordinator_(coordinator),
      options_(std::move(options)),
      hooks_(std::move(hooks)),
      policy_(std::move(policy)) {}

Result<std::string> Reconciler::EnsureToken(const json& job) {
  const json& meta = job.at("metadata");
  const std::string uid = meta.value("uid", "");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tokens_.find(uid);
    if (it != tokens_.end()) return it->second;
  }
  const std::string ns = meta.value("namespace", "");
  const std::string secret_name = TokenSecretName(meta.value("name", ""));
  auto read = [&](const json& secret) -> Result<std::string> {
    // A Secret left over from an earlier job of the same name belongs to that job.
    bool ours = false;
    for (const json& ref : Obj(secret, "metadata").value("ownerReferences", json::array())) {
      ours = ours || ref.value("uid", "") == uid;
    }
    if (!ours) {
      return FailedPrecondition("Secret " + ns + "/" + secret_name +
                                " exists but is not owned by this job");
    }
    const std::string encoded = Obj(secret, "data").value(kTokenKey, "");
    if (encoded.empty()) return FailedPrecondition("Secret " + secret_name + " has no token");
    return encoded;  // compared and used base64-encoded: see below
  };
  std::string encoded;
  kube::ApiResult<json> got = client_.Get(kube::kSecrets, ns, secret_name);
  if (got.ok()) {
    VF_ASSIGN_OR_RETURN(encoded, read(*got));
  } else if (got.reason() == kube::Reason::kNotFound) {
    VF_ASSIGN_OR_RETURN(const std::string token, RandomToken());
    json secret = {
        {"metadata",
         {{"name", secret_name},
          {"labels", {{kJobLabel, meta.value("name", "")}, {kManagedByLabel, kManagedBy}}},
          {"ownerReferences", {OwnerReference(job)}}}},
        {"type", "Opaque"},
        {"stringData", {{kTokenKey, token}}}};
    kube::ApiResult<json> created = client_.Create(kube::kSecrets, ns, secret);
    if (!created.ok()) return created.status();
    VF_ASSIGN_OR_RETURN(encoded, read(*created));
  } else {
    return got.status();
  }
  // Secret data is base64; OpenSSL decodes it (padding comes back as trailing zero bytes).
  std::string token(encoded.size(), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(token.data()),
                                reinterpret_cast<const unsigned char*>(encoded.data()),
                                static_cast<int>(encoded.size()));
  if (n < 0) return FailedPrecondition("Secret " + secret_name + " holds invalid base64");
  token.resize(static_cast<size_t>(n));
  while (!token.empty() && token.back() == '\0') token.pop_back();
  if (token.empty()) return FailedPrecondition("Secret " + secret_name + " holds an empty token");
  std::lock_guard<std::mutex> lock(mu_);
  tokens_[uid] = token;
  return token;
}

Status Reconciler::EnsureCoordinatorJob(const std::string& key, const json& job,
                                        const std::string& token, const std::string& fingerprint) {
  const std::string uid = job.at("metadata").value("uid", "");
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = registered_.find(key);
    if (it != registered_.end() && it->second == uid) return Status::Ok();
  }
  Status added = coordinator_.AddJob(key, token, fingerprint, Build());
  if (added.code() == StatusCode::kFailedPrecondition) {
    // An earlier job of the same name: its state is of no use to this one.
    (void)coordinator_.RemoveJob(key);
    added = coordinator_.AddJob(key, token, fingerprint, Build());
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

std::pair<int, std::string> Reconciler::DesiredWorkers(const std::string& key,
                                                       const ClusterGpus& gpus) {
  std::vector<policy::PolicyJob> jobs;
  std::map<std::string, std::string> invalid;
  for (const json& job : jobs_.List()) {
    const std::string phase = Obj(job, "status").value("phase", "");
    if (phase == "Succeeded" || phase == "Failed") continue;
    if (Obj(job, "metadata").contains("deletionTimestamp")) continue;
    const std::string id = ObjectKey(job);
    const json& spec = Obj(job, "spec");
    policy::PolicyJob p;
    p.id = id;
    p.virtual_nodes = spec.value("virtualNodes", 1);
    const json& replicas = Obj(spec, "replicas");
    p.min_workers = replicas.value("min", 1);
    p.max_workers = replicas.value("max", p.min_workers);
    p.gpus_per_worker = spec.value("gpusPerWorker", 1);
    const json& elasticity = Obj(spec, "elasticity");
    if (elasticity.value("policy", "elastic") == "static") p.min_workers = p.max_workers;
    p.cooldown_seconds = elasticity.value("cooldownSeconds", 30);
    p.arrival_time = UnixSeconds(Obj(job, "metadata").value("creationTimestamp", ""));
    if (std::isnan(p.arrival_time)) p.arrival_time = 0;
    const json& status = Obj(job, "status");
    const double last = UnixSeconds(Obj(status, "lastResize").value("time", ""));
    p.last_resize_time = std::isnan(last) ? p.arrival_time : last;
    p.resize_pause_seconds = Obj(status, "lastResize").value("pauseSeconds", 0.0);
    // What it holds: its live pods, by the product of the node they are bound to.
    const std::string name = Obj(job, "metadata").value("name", "");
    const std::string ns = Obj(job, "metadata").value("namespace", "");
    for (const json& pod : pods_.List([&](const json& pod) {
           return Obj(pod, "metadata").value("namespace", "") == ns &&
                  Obj(Obj(pod, "metadata"), "labels").value(kJobLabel, "") == name;
         })) {
      const PodLife life = PodLifeOf(pod);
      if (life != PodLife::kStarting && life != PodLife::kRunning) continue;
      const std::string node = Obj(pod, "spec").value("nodeName", "");
      // A pod the scheduler has not bound yet is the job's too: without it, a job whose pods
      // are bound one by one would look smaller than it is and lose its newest pods.
      if (node.empty()) {
        ++p.unbound_workers;
        continue;
      }
      auto it = gpus.node_product.find(node);
      if (it != gpus.node_product.end()) p.current[it->second] += 1;
    }
    jobs.push_back(std::move(p));
  }
  policy::GpuInventory inventory;
  for (const auto& [product, count] : gpus.products) {
    auto held = gpus.held_by_others.find(product);
    inventory.gpus[product] =
        std::max(0, count.total - (held == gpus.held_by_others.end() ? 0 : held->second));
  }
  auto decision = policy_->Decide(jobs, inventory, NowUnix());
  if (!decision.ok()) return {0, decision.status().message()};
  const policy::JobDecision* mine = decision->Find(key);
  if (mine == nullptr) return {0, "not scheduled"};
  return {policy::TotalWorkers(mine->workers), mine->reason};
}

Status Reconciler::PatchStatus(const json& job, const json& status) {
  if (Comparable(status) == Comparable(Obj(job, "status"))) return Status::Ok();
  const json& meta = job.at("metadata");
  // The whole status each time, so fields that no longer apply are cleared (null deletes).
  json patch_status = status;
  for (const auto& [k, v] : Obj(job, "status").items()) {
    if (!patch_status.contains(k)) patch_status[k] = nullptr;
  }
  auto r = client_.PatchStatus(kube::kVirtualFlowJobs, meta.value("namespace", ""),
                               meta.value("name", ""), json{{"status", patch_status}});
  return r.status();
}

void Reconciler::Event(const json& job, bool warning, const std::string& reason,
                       const std::string& message) {
  auto r = client_.CreateEvent(kube::kVirtualFlowJobs, job,
                               warning ? kube::EventType::kWarning : kube::EventType::kNormal,
                               reason, message);
  if (!r.ok()) {
    std::fprintf(stderr, "virtualflow-operator: event %s for %s not recorded: %s\n", reason.c_str(),
                 ObjectKey(job).c_str(), r.error().ToString().c_str());
  }
}

Result<ReconcileResult> Reconciler::Reconcile(const std::string& key) {
  ReconcileResult result;
  std::optional<json> found = jobs_.Get(key);
  if (!found || Obj(*found, "metadata").contains("deletionTimestamp")) {
    // Gone: its pods and Secret follow through their owner references.
    (void)coordinator_.RemoveJob(key);
    std::lock_guard<std::mutex> lock(mu_);
    registered_.erase(key);
    expected_.erase(key);
    failures_seen_.erase(key);
    if (hooks_.on_job_gone) hooks_.on_job_gone(key);
    return result;
  }
  const json job = *found;
  const json& meta = job.at("metadata");
  const std::string ns = meta.value("namespace", "");
  const std::string name = meta.value("name", "");
  const int64_t generation = meta.value("generation", int64_t{0});
  const json& old_status = Obj(job, "status");
  const json old_conditions = old_status.value("conditions", json::array());
  json status = old_status;
  status["observedGeneration"] = generation;

  // The job as the agents read it; the API server's schema has already checked most of it.
  Result<JobSpec> spec = ParseJobYaml(AgentManifest(job).dump(), key);
  if (!spec.ok()) {
    json conditions = json::array();
    SetCondition(conditions, old_conditions, "Failed", true, "InvalidSpec", spec.status().message(),
                 generation);
    status["phase"] = "Failed";
    status["message"] = spec.status().message();
    status["conditions"] = conditions;
    if (old_status.value("phase", "") != "Failed") {
      Event(job, true, "InvalidSpec", spec.status().message());
    }
    VF_RETURN_IF_ERROR(PatchStatus(job, status));
    return result;
  }
  const std::string phase_before = old_status.value("phase", "");
  if (phase_before == "Succeeded" || phase_before == "Failed") {
    (void)coordinator_.RemoveJob(key);
    if (hooks_.on_job_status) hooks_.on_job_status(key, old_status, Obj(job, "spec"));
    return result;
  }

  VF_ASSIGN_OR_RETURN(const std::string token, EnsureToken(job));
  VF_RETURN_IF_ERROR(EnsureCoordinatorJob(key, job, token, spec->Fingerprint()));

  const std::vector<json> nodes = nodes_.List();
  const std::vector<json> all_pods = pods_.List();
  const ClusterGpus gpus = CountGpus(nodes, all_pods);
  if (hooks_.on_inventory) hooks_.on_inventory(gpus);
  std::vector<json> pods;
  for (const json& pod : all_pods) {
    const json& pm = Obj(pod, "metadata");
    if (pm.value("namespace", "") != ns || Obj(pm, "labels").value(kJobLabel, "") != name) {
      continue;
    }
    bool owned = false;
    for (const json& ref : pm.value("ownerReferences", json::array())) {
      owned = owned || ref.value("uid", "") == meta.value("uid", "");
    }
    if (owned) pods.push_back(pod);
  }

  VF_ASSIGN_OR_RETURN(JobView view, coordinator_.GetJob(key));
  const auto [desired, policy_reason] = DesiredWorkers(key, gpus);

  // Finished: rank 0's final report carries the outcome.
  for (const auto& [worker, info] : view.workers) {
    if (!info.last_report.finished) continue;
    status["phase"] = "Succeeded";
    status["step"] = info.last_report.step;
    status["totalSteps"] = TotalSteps(*spec);
    if (!info.last_report.weights_sha256.empty()) {
      status["weightsSha256"] = info.last_report.weights_sha256;
    }
    if (std::isfinite(info.last_report.test_accuracy)) {
      status["testAccuracy"] = info.last_report.test_accuracy;
    }
    if (std::isfinite(info.last_report.loss)) status["loss"] = info.last_report.loss;
    json conditions = json::array();
    SetCondition(conditions, old_conditions, "Created", true, "PodsCreated",
                 "worker pods were created", generation);
    SetCondition(conditions, old_conditions, "Running", false, "Finished", "training finished",
                 generation);
    SetCondition(conditions, old_conditions, "Succeeded", true, "TrainingFinished",
                 "trained " + std::to_string(info.last_report.step) + " steps; weights " +
                     info.last_report.weights_sha256.substr(0, 12),
                 generation);
    status["conditions"] = conditions;
    status["message"] = "training finished";
    VF_RETURN_IF_ERROR(PatchStatus(job, status));
    Event(job, false, "Succeeded",
          "trained " + std::to_string(info.last_report.step) + " steps, test accuracy " +
              std::to_string(info.last_report.test_accuracy));
    (void)coordinator_.RemoveJob(key);
    if (hooks_.on_job_status) hooks_.on_job_status(key, status, Obj(job, "spec"));
    return result;
  }

  // Worker pods: what became of each.
  std::map<std::string, const json*> by_name;
  for (const json& pod : pods) by_name[Obj(pod, "metadata").value("name", "")] = &pod;
  std::set<std::string> in_plan;
  for (const Member& m : view.plan.members) in_plan.insert(m.worker);

  std::map<std::string, int64_t> restarts;
  for (const auto& [k, v] : Obj(old_status, "restarts").items()) {
    if (v.is_number_integer()) restarts[k] = v.get<int64_t>();
  }
  for (const json& pod : pods) {
    const std::string pod_name = Obj(pod, "metadata").value("name", "");
    const PodLife life = PodLifeOf(pod);
    if (life != PodLife::kFailed) continue;
    if (PodExitCode(pod) == 3) {
      // The agent found that the job itself cannot go on (diverged, bad checkpoint).
      const std::string why = PodTerminationMessage(pod);
      status["phase"] = "Failed";
      status["message"] = "worker " + pod_name + ": " + why;
      json conditions = json::array();
      SetCondition(conditions, old_conditions, "Failed", true, "JobFailed",
                   status["message"].get<std::string>(), generation);
      status["conditions"] = conditions;
      VF_RETURN_IF_ERROR(PatchStatus(job, status));
      Event(job, true, "Failed", status["message"].get<std::string>());
      (void)coordinator_.RemoveJob(key);
      return result;
    }
    bool fresh = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fresh = failures_seen_[key].insert(pod_name).second;
    }
    if (fresh) {
      restarts["failure"] += 1;
      Event(job, true, "WorkerFailed",
            "worker " + pod_name + " failed (exit code " + std::to_string(PodExitCode(pod)) +
                "): " + PodTerminationMessage(pod));
    }
  }

  // The membership decision.
  policy::MembershipInput in;
  in.members = RankOrder(view.plan);
  in.desired = desired;
  in.min_workers = spec->replicas_min;
  in.virtual_nodes = spec->virtual_nodes;
  in.join_batch_seconds = options_.join_batch_seconds;
  for (const auto& [worker, info] : view.workers) {
    in.failure_reported =
        in.failure_reported || (view.plan.epoch > 0 && info.failure_epoch >= view.plan.epoch &&
                                in_plan.count(worker) != 0);
  }
  const double now_unix = NowUnix();
  for (const json& pod : pods) {
    policy::WorkerState w;
    w.name = Obj(pod, "metadata").value("name", "");
    w.life = WorkerLifeOf(PodLifeOf(pod));
    auto it = view.workers.find(w.name);
    if (it != view.workers.end()) {
      w.registered = true;
      w.ready = it->second.ready;
      w.leave_requested = it->second.leave_requested;
      w.seconds_per_virtual_node = it->second.last_report.seconds_per_virtual_node;
    }
    const std::string node = Obj(pod, "spec").value("nodeName", "");
    w.on_schedulable_node = node.empty() || gpus.node_product.count(node) != 0;
    const double created = UnixSeconds(Obj(pod, "metadata").value("creationTimestamp", ""));
    w.age_seconds = std::isnan(created) ? 0 : now_unix - created;
    in.workers.push_back(w);
  }
  // Once the members have trained the last step they exit one by one while rank 0 evaluates;
  // that is the end of the job, not a failure, so membership and pods are left alone.
  bool finishing = false;
  for (const auto& [worker, info] : view.workers) {
    finishing =
        finishing || (in_plan.count(worker) != 0 && info.last_report.step >= TotalSteps(*spec));
  }
  const policy::MembershipDecision decision =
      finishing ? policy::MembershipDecision{} : policy::DecideMembership(in);
  const std::vector<Member> next = PlanMembers(decision.members);
  int64_t epoch = view.plan.epoch;
  std::vector<Member> members = view.plan.members;
  if (decision.publish) {
    const int from = static_cast<int>(view.plan.members.size());
    const int to = static_cast<int>(next.size());
    epoch = view.plan.epoch + 1;
    // Intent first: the status names the plan before any worker can see it, so an operator
    // that restarts in between restores a plan the workers can follow.
    status["epoch"] = epoch;
    status["assignment"] = PlanJson(next);
    status["workers"] = to;
    if (decision.kind != "start") {
      status["lastResize"] = {{"time", Now()},
                              {"from", from},
                              {"to", to},
                              {"reason", decision.reason},
                              {"pauseSeconds", 0.0}};
    }
    if (decision.kind == "leave") restarts["preemption"] += 1;
    status["restarts"] = restarts;
    json conditions = old_status.value("conditions", json::array());
    VF_RETURN_IF_ERROR(PatchStatus(job, status));
    VF_RETURN_IF_ERROR(coordinator_.PublishPlanWithEpoch(key, epoch, next).status());
    std::fprintf(stderr, "virtualflow-operator: %s: epoch %lld: %s\n", key.c_str(),
                 static_cast<long long>(epoch), decision.reason.c_str());
    Event(job, decision.kind == "failure",
          decision.kind == "start" ? "Started"
                                   : (decision.kind == "failure" ? "Recovered" : "Resized"),
          decision.reason);
    if (hooks_.on_resize && decision.kind != "start")
      hooks_.on_resize(key, decision.kind, from, to);
    members = next;
    in_plan.clear();
    for (const Member& m : members) in_plan.insert(m.worker);
  }

  // Pods: delete what has served its purpose, create what is missing.
  int live = 0;
  std::vector<const json*> spare;  // live pods outside the plan, newest last
  for (const json& pod : pods) {
    const std::string pod_name = Obj(pod, "metadata").value("name", "");
    const PodLife life = PodLifeOf(pod);
    const bool member = in_plan.count(pod_name) != 0;
    if (finishing) continue;
    if (life == PodLife::kSucceeded || life == PodLife::kFailed) {
      // A leaver that acknowledged, or a dead worker the plan no longer holds: its pod goes
      // (a member's pod stays until a plan without it is out).
      if (!member) {
        kube::DeleteOptions del;
        del.precondition_uid = Obj(pod, "metadata").value("uid", "");
        auto r = client_.Delete(kube::kPods, ns, pod_name, del);
        if (!r.ok() && r.reason() != kube::Reason::kNotFound) return r.status();
        (void)coordinator_.ForgetWorker(key, pod_name);
      }
      continue;
    }
    if (life == PodLife::kTerminating) continue;
    ++live;
    if (!member) spare.push_back(&pod);
  }
  {
    // Pods created but not in the cache yet count as live, so none is created twice.
    std::lock_guard<std::mutex> lock(mu_);
    auto& expected = expected_[key];
    for (auto it = expected.begin(); it != expected.end();) {
      if (by_name.count(it->first) != 0 || Clock::now() - it->second > kExpectationTimeout) {
        it = expected.erase(it);
      } else {
        ++live;
        ++it;
      }
    }
  }
  if (!finishing && live > desired && !spare.empty()) {
    // Surplus joiners that are not training go first; members leave through a plan.
    std::sort(spare.begin(), spare.end(), [](const json* a, const json* b) {
      return Obj(*a, "metadata").value("creationTimestamp", "") >
             Obj(*b, "metadata").value("creationTimestamp", "");
    });
    for (const json* pod : spare) {
      if (live <= desired) break;
      const std::string pod_name = Obj(*pod, "metadata").value("name", "");
      auto r = client_.Delete(kube::kPods, ns, pod_name);
      if (!r.ok() && r.reason() != kube::Reason::kNotFound) return r.status();
      --live;
    }
  }
  int created = 0;
  while (!finishing && live < desired) {
    const std::string pod_name = name + "-worker-" + RandomSuffix();
    json pod = BuildWorkerPod(job, pod_name, options_.pods);
    auto r = client_.Create(kube::kPods, ns, pod);
    if (!r.ok() && r.reason() != kube::Reason::kAlreadyExists) return r.status();
    {
      std::lock_guard<std::mutex> lock(mu_);
      expected_[key][pod_name] = Clock::now();
    }
    ++live;
    ++created;
  }
  if (created > 0) {
    Event(job, false, "WorkersCreated",
          "created " + std::to_string(created) + " worker pod(s); the policy wants " +
              std::to_string(desired));
  }

  // Status: progress from the members' reports.
  int64_t step = 0;
  double loss = std::nan("");
  double samples = 0;
  bool all_switched = !members.empty();
  double pause = 0;
  for (const Member& m : members) {
    auto it = view.workers.find(m.worker);
    if (it == view.workers.end() || it->second.last_report.epoch != epoch) {
      all_switched = false;
      continue;
    }
    const Report& r = it->second.last_report;
    pause = std::max(pause, r.pause_seconds);
    if (r.step >= step) {
      step = r.step;
      if (std::isfinite(r.loss)) loss = r.loss;
      samples = std::max(samples, r.samples_per_second);
    }
  }
  int ready = 0;
  for (const auto& [worker, info] : view.workers) {
    auto it = by_name.find(worker);
    if (info.ready && it != by_name.end() && PodLifeOf(*it->second) == PodLife::kRunning) ++ready;
  }
  status["workers"] = static_cast<int>(members.size());
  status["readyWorkers"] = ready;
  status["desiredWorkers"] = desired;
  status["totalSteps"] = TotalSteps(*spec);
  status["epoch"] = epoch;
  status["assignment"] = PlanJson(members);
  status["restarts"] = restarts;
  if (step > 0 || !status.contains("step")) {
    status["step"] = std::max<int64_t>(step, old_status.value("step", int64_t{0}));
  }
  if (std::isfinite(loss)) status["loss"] = loss;
  if (samples > 0) status["samplesPerSecond"] = samples;
  if (all_switched && status.contains("lastResize") &&
      Obj(status, "lastResize").value("pauseSeconds", 0.0) == 0.0 && pause > 0) {
    status["lastResize"]["pauseSeconds"] = pause;
    if (hooks_.on_resize_pause) hooks_.on_resize_pause(key, pause);
  }

  std::string phase;
  std::string message;
  if (members.empty()) {
    phase = "Pending";
    message = desired == 0
                  ? "waiting for GPUs: " + policy_reason
                  : (decision.reason.empty() ? "waiting for workers to warm up" : decision.reason);
  } else if (!all_switched) {
    phase = "Resizing";
    message = "switching to membership epoch " + std::to_string(epoch);
  } else {
    phase = "Running";
    message = "training on " + std::to_string(members.size()) + " workers";
  }
  status["phase"] = phase;
  status["message"] = message;
  json conditions = json::array();
  SetCondition(conditions, old_conditions, "Created", !pods.empty() || created > 0,
               !pods.empty() || created > 0 ? "PodsCreated" : "WaitingForGPUs",
               !pods.empty() || created > 0 ? "worker pods were created" : message, generation);
  SetCondition(
      conditions, old_conditions, "Running", !members.empty(),
      members.empty() ? (desired == 0 ? "WaitingForGPUs" : "WaitingForWorkers") : "Training",
      message, generation);
  SetCondition(conditions, old_conditions, "Resizing", phase == "Resizing",
               phase == "Resizing" ? "MembershipChange" : "Stable", message, generation);
  const bool degraded = !members.empty() && static_cast<int>(members.size()) < spec->replicas_min;
  SetCondition(conditions, old_conditions, "Degraded", degraded,
               degraded ? "BelowMinimum" : "AtLeastMinimum",
               std::to_string(members.size()) + " of at least " +
                   std::to_string(spec->replicas_min) + " workers",
               generation);
  status["conditions"] = conditions;
  VF_RETURN_IF_ERROR(PatchStatus(job, status));
  if (hooks_.on_job_status) hooks_.on_job_status(key, status, Obj(job, "spec"));

  // Membership moves with the workers' reports; look again soon while anything is in motion.
  result.requeue_after = std::chrono::milliseconds(phase == "Running" ? 2000 : 500);
  return result;
}

}  // namespace vf::controller
