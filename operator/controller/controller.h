// The VirtualFlowJob controller: informers for jobs, pods, nodes, the operator's NetworkPolicies
// (and Kueue's Workloads once a job names a queue), a rate-limited work queue,
// worker threads running the reconciler, and a watcher that queues a job whenever its agents
// tell the coordinator something. Runs while its stop token allows.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "operator/controller/informer.h"
#include "operator/controller/reconciler.h"
#include "operator/coordinator/coordinator.h"
#include "operator/kube/client.h"
#include "operator/kube/workqueue.h"
#include "runtime/status.h"

namespace vf::controller {

// Value type.
struct ControllerOptions {
  std::string ns;  // "" watches all namespaces
  int workers = 2;
  ReconcilerOptions reconciler;
  ReconcilerHooks hooks;
  // Called after every reconcile with how long it took and whether it failed (for metrics).
  std::function<void(double seconds, bool failed)> on_reconcile;
  std::function<void(size_t depth)> on_queue_depth;
};

// Thread-safe: Run blocks its caller; synced() may be read from any thread.
class Controller {
 public:
  // `client` and `coordinator` must outlive the controller.
  Controller(kube::Client& client, Coordinator& coordinator, ControllerOptions options);
  ~Controller();
  Controller(const Controller&) = delete;
  Controller& operator=(const Controller&) = delete;

  // Starts the informers, waits for their first lists, then reconciles until `stop`; returns
  // after every thread it started has ended.
  Status Run(std::stop_token stop);
  // True once the caches have synced and workers run.
  bool synced() const { return synced_.load(); }

 private:
  void EnqueueAllJobs();
  // Kueue's Workloads are mirrored from the first job with a queue label on, so that an operator
  // in a cluster without Kueue never asks for them.
  void WatchWorkloadsFor(const nlohmann::json& job);
  void OnPodChange(const nlohmann::json& before, const nlohmann::json& after);
  void Work(std::stop_token stop);
  void WatchCoordinator(std::stop_token stop);

  kube::Client& client_;
  Coordinator& coordinator_;
  ControllerOptions options_;
  kube::WorkQueue queue_;
  std::unique_ptr<Informer> jobs_;
  std::unique_ptr<Informer> pods_;
  std::unique_ptr<Informer> nodes_;
  std::unique_ptr<Informer> workloads_;
  // The operator's NetworkPolicies, with options_.reconciler.network_policy; else null.
  std::unique_ptr<Informer> network_policies_;
  std::once_flag workloads_started_;
  std::unique_ptr<Reconciler> reconciler_;
  std::atomic<bool> synced_{false};
};

}  // namespace vf::controller
