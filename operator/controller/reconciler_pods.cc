// The job's worker pods: creating the missing ones with their credentials, deleting ended and
// surplus ones, replacing pods whose credential Secret is missing, and which workers the
// coordinator admits.
#include "operator/controller/reconciler.h"

#include <openssl/rand.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "operator/controller/job_key.h"
#include "operator/controller/reconciler_internal.h"
#include "operator/controller/run_policy.h"

namespace vf::controller {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using reconciler_internal::FindCondition;
using reconciler_internal::NowUnix;
using reconciler_internal::Obj;
using reconciler_internal::PodName;
using reconciler_internal::TemplateOf;
using reconciler_internal::UnixSeconds;

namespace {

// How long a worker pod that has not started is taken to have its credential Secret after the
// operator last saw that it had one (RepairCredentials).
constexpr auto kCredentialRecheck = std::chrono::seconds(30);

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
  for (const std::string& name : MemoryOf(p.key, p.uid).pods.Pending()) admitted.insert(name);
  return admitted;
}

Status Reconciler::RepairCredentials(Pass& p) {
  const auto now = Clock::now();
  std::map<std::string, Clock::time_point> checked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    checked = MemoryOf(p.key, p.uid).credentials_checked;
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
  MemoryOf(p.key, p.uid).credentials_checked = std::move(kept);
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
  std::lock_guard<std::mutex> lock(mu_);
  return MemoryOf(p.key, p.uid)
      .pods.Observe([&p](const std::string& name) { return p.by_name.count(name) != 0; },
                    Clock::now());
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

Status Reconciler::CreateMissingPods(Pass& p, int live) {
  // As the Job controller: after a counted worker failure, new pods wait out a back-off from
  // status.lastFailureTime. No sleep: a later pass (a job is looked at again within 2 s) makes
  // them once it is over.
  const double backoff =
      FailureBackoffLeft(p.status.value("failed", int64_t{0}),
                         UnixSeconds(p.status.value("lastFailureTime", "")), NowUnix());
  if (live < p.desired && backoff > 0) return Status::Ok();
  // A template that names a product itself keeps it.
  const bool own_product =
      Obj(Obj(TemplateOf(p.job), "spec"), "nodeSelector").contains(kGpuProductLabel);
  std::vector<std::string> pins =
      own_product ? std::vector<std::string>{} : ProductsToPin(p.allocation, p.pods, p.gpus());
  size_t next_pin = 0;
  // Under Kueue, the nodes of the admitted flavors (read only when a pod is to be made).
  std::optional<PodSetPlacement> placement;
  if (live < p.desired) {
    VF_ASSIGN_OR_RETURN(placement, KueuePlacement(p));
  }
  while (live < p.desired) {
    const std::string pod_name = p.name + "-worker-" + RandomSuffix();
    const std::string product = next_pin < pins.size() ? pins[next_pin++] : "";
    json pod = BuildWorkerPod(p.job, p.spec, pod_name, options_.pods, product);
    if (placement) {
      if (Status placed = ApplyPlacement(*placement, pod); !placed.ok()) {
        p.failed_action = "FailedKueuePlacement";
        return placed.WithContext("the placement of Kueue's admission on pod " + pod_name);
      }
    }
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
      JobMemory& memory = MemoryOf(p.key, p.uid);
      memory.pods.ExpectCreation(pod_name, Clock::now());
      memory.credentials_checked[pod_name] = Clock::now();
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

}  // namespace vf::controller
