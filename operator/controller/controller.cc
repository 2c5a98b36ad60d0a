#include "operator/controller/controller.h"

#include <chrono>
#include <cstdio>
#include <map>

#include "operator/controller/inventory.h"
#include "operator/controller/kueue.h"
#include "operator/controller/worker_pod.h"
#include "operator/policy/membership.h"

namespace vf::controller {

using nlohmann::json;

Controller::Controller(kube::Client& client, Coordinator& coordinator, ControllerOptions options)
    : client_(client), coordinator_(coordinator), options_(std::move(options)) {
  jobs_ = std::make_unique<Informer>(client_, kube::kVirtualFlowJobs, options_.ns,
                                     kube::ReflectorOptions{},
                                     [this](const json& before, const json& after) {
                                       const json& o = after.is_null() ? before : after;
                                       WatchWorkloadsFor(o);
                                       queue_.Add(ObjectKey(o));
                                       // Another job's arrival or end moves GPUs around.
                                       if (before.is_null() || after.is_null()) EnqueueAllJobs();
                                     });
  // All pods: the GPU inventory subtracts what other workloads hold. Each is kept trimmed to
  // what the operator reads of it (TrimPodForCache), so that the cache of a large cluster's
  // pods stays small.
  pods_ = std::make_unique<Informer>(
      client_, kube::kPods, "", kube::ReflectorOptions{},
      [this](const json& before, const json& after) { OnPodChange(before, after); },
      TrimPodForCache);
  // A node's heartbeats (conditions' times, images, resourceVersion) change nothing a job
  // gets; with hundreds of nodes they would have every job reconciled all the time.
  nodes_ =
      std::make_unique<Informer>(client_, kube::kNodes, "", kube::ReflectorOptions{},
                                 [this](const json& before, const json& after) {
                                   if (NodeSchedulingFacts(before) != NodeSchedulingFacts(after)) {
                                     EnqueueAllJobs();
                                   }
                                 });
  // Only the Workloads this operator creates; a change to one queues its job, and an admission
  // or a release of quota may change what every job gets.
  kube::ReflectorOptions ours;
  ours.label_selector = std::string(kManagedByLabel) + "=" + kManagedBy;
  workloads_ = std::make_unique<Informer>(
      client_, kube::kWorkloads, options_.ns, ours, [this](const json& before, const json& after) {
        const json& o = after.is_null() ? before : after;
        const json meta = o.value("metadata", json::object());
        const std::string job = meta.value("labels", json::object()).value(kJobLabel, "");
        if (!job.empty()) queue_.Add(meta.value("namespace", "") + "/" + job);
        EnqueueAllJobs();
      });
  if (options_.reconciler.network_policy) {
    // A job's policy deleted or changed by someone queues the job, which puts it back.
    network_policies_ = std::make_unique<Informer>(
        client_, kube::kNetworkPolicies, options_.ns, ours,
        [this](const json& before, const json& after) {
          const json& o = after.is_null() ? before : after;
          const json meta = o.value("metadata", json::object());
          const std::string job = meta.value("labels", json::object()).value(kJobLabel, "");
          if (!job.empty()) queue_.Add(meta.value("namespace", "") + "/" + job);
        });
  }
}

void Controller::WatchWorkloadsFor(const json& job) {
  if (QueueNameOf(job).empty()) return;
  std::call_once(workloads_started_, [this] {
    std::fprintf(stderr, "virtualflow-operator: a job names a Kueue queue; watching Workloads\n");
    workloads_->Start();
  });
}

Controller::~Controller() { queue_.ShutDown(); }

void Controller::EnqueueAllJobs() {
  if (!jobs_) return;
  for (const std::string& key : jobs_->Keys()) queue_.Add(key);
}

void Controller::OnPodChange(const json& before, const json& after) {
  const json& pod = after.is_null() ? before : after;
  const json meta = pod.value("metadata", json::object());
  const std::string job = meta.value("labels", json::object()).value(kJobLabel, "");
  if (!job.empty()) queue_.Add(meta.value("namespace", "") + "/" + job);
  // A pod that frees GPUs, or another workload's pod that takes some, changes what every job
  // may get. A worker pod that takes its GPUs (bound by the scheduler) changes only its own
  // job, queued above: the policy counted it already, unbound, when it decided to create it.
  // Sweeping every job on each binding would reconcile a thousand jobs two thousand times
  // while a thousand jobs start.
  const bool held_before = !before.is_null() && PodHoldsResources(before) && PodGpus(before) > 0;
  const bool held_after = !after.is_null() && PodHoldsResources(after) && PodGpus(after) > 0;
  if (held_before && !held_after) EnqueueAllJobs();
  if (!held_before && held_after && job.empty()) EnqueueAllJobs();
}

void Controller::Work(std::stop_token stop) {
  while (std::optional<std::string> key = queue_.Get()) {
    if (stop.stop_requested()) {
      // Stopped (shutting down, or leadership lost): what is still queued is not acted on.
      queue_.Done(*key);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    Result<ReconcileResult> r = reconciler_->Reconcile(*key);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (options_.on_reconcile) options_.on_reconcile(seconds, !r.ok());
    if (r.ok()) {
      queue_.Forget(*key);
      if (r->requeue_after.count() > 0) queue_.AddAfter(*key, r->requeue_after);
    } else {
      std::fprintf(stderr, "virtualflow-operator: reconcile %s: %s (retry %d)\n", key->c_str(),
                   r.status().message().c_str(), queue_.NumRequeues(*key) + 1);
      queue_.AddRateLimited(*key);
    }
    queue_.Done(*key);
    if (options_.on_queue_depth) options_.on_queue_depth(queue_.Len());
  }
}

void Controller::WatchCoordinator(std::stop_token stop) {
  // Agents' registrations, reports, leave requests and failures change what a job needs;
  // the coordinator's per-job generation says when.
  std::map<std::string, uint64_t> seen;
  // A member whose pod runs but that stopped answering (hung, stopped, cut off) is noticed by
  // its silence, which this marks (and which bumps the generation).
  const auto silent_after = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(policy::kUnresponsiveSeconds));
  while (!stop.stop_requested()) {
    coordinator_.SweepSilent(silent_after);
    for (const std::string& job : coordinator_.ListJobs()) {
      auto view = coordinator_.GetJob(job);
      if (!view.ok()) continue;
      uint64_t& last = seen[job];
      if (view->generation != last) {
        last = view->generation;
        queue_.Add(job);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Status Controller::Run(std::stop_token stop) {
  VF_ASSIGN_OR_RETURN(
      reconciler_,
      Reconciler::Create(client_, *jobs_, *pods_, *nodes_, coordinator_, options_.reconciler,
                         options_.hooks, workloads_.get(), network_policies_.get()));
  jobs_->Start();
  pods_->Start();
  nodes_->Start();
  if (network_policies_) network_policies_->Start();
  std::stop_callback shutdown(stop, [this] { queue_.ShutDown(); });
  const bool ready = jobs_->WaitForSync(stop) && pods_->WaitForSync(stop) &&
                     nodes_->WaitForSync(stop) &&
                     (!network_policies_ || network_policies_->WaitForSync(stop));
  std::vector<std::jthread> threads;
  if (ready) {
    std::fprintf(stderr, "virtualflow-operator: caches synced; reconciling\n");
    synced_.store(true);
    EnqueueAllJobs();
    for (int i = 0; i < std::max(1, options_.workers); ++i) {
      threads.emplace_back([this, stop] { Work(stop); });
    }
    threads.emplace_back([this, stop] { WatchCoordinator(stop); });
  }
  {
    std::mutex m;
    std::unique_lock<std::mutex> lock(m);
    std::condition_variable_any cv;
    cv.wait(lock, stop, [] { return false; });
  }
  queue_.ShutDown();
  threads.clear();  // joins
  synced_.store(false);
  jobs_->Stop();
  pods_->Stop();
  nodes_->Stop();
  workloads_->Stop();
  if (network_policies_) network_policies_->Stop();
  return Status::Ok();
}

}  // namespace vf::controller
