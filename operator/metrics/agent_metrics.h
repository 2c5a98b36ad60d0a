// The agent's metrics: training steps, loss, throughput, collectives, membership changes and state
// transfers of the worker in one pod. The names are an interface (dashboards use them);
// docs/metrics.md lists them, and a test keeps that list and these families the same.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/metrics/family.h"
#include "runtime/metrics/metric.h"
#include "runtime/metrics/registry.h"

namespace vf {

// Owns one agent's metric families in their own Registry, which the agent serves on
// GET /metrics. Every series is labelled {namespace, job} only: never a pod name or UID, which
// Prometheus adds from the scrape target, so that a job's series survive its pods being
// replaced. Thread-safe and lock-free on the update path: the agent serves one job, so every
// child is made once, at construction.
class AgentMetrics {
 public:
  AgentMetrics(std::string ns, std::string job);
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  metrics::Registry& registry() { return registry_; }
  const metrics::Registry& registry() const { return registry_; }

  // One training step done: its wall time, the loss, the throughput and the virtual nodes this
  // worker ran.
  void OnStep(double seconds, double loss, double samples_per_second, int virtual_nodes);
  // Step time outside the local nodes' forward and backward passes (the all-reduce, waiting for
  // slower members, the optimizer update) of one step.
  void OnAllReduce(double seconds);
  // A new communicator for membership epoch `epoch`, built in `seconds`.
  void OnRebuild(double seconds, int64_t epoch);
  // Training state sent to or received from a joiner.
  void OnStateTransfer(int64_t bytes, double seconds);
  // A failed step, redone after the membership recovered.
  void OnRecovery();
  // The virtual nodes the current plan gives this worker (also set by OnStep).
  void SetVirtualNodes(int virtual_nodes);
  // The membership epoch of the current plan (also set by OnRebuild).
  void SetEpoch(int64_t epoch);

  // The children, for what the methods above do not cover.
  metrics::Counter& steps_total() { return *steps_; }
  metrics::Histogram& step_duration_seconds() { return *step_duration_; }
  metrics::Gauge& samples_per_second() { return *samples_per_second_; }
  metrics::Gauge& loss() { return *loss_; }
  metrics::Gauge& virtual_nodes() { return *virtual_nodes_; }
  metrics::Gauge& epoch() { return *epoch_; }
  metrics::Counter& allreduce_seconds_total() { return *allreduce_seconds_; }
  metrics::Histogram& communicator_rebuild_seconds() { return *rebuild_seconds_; }
  metrics::Counter& state_transfer_bytes_total() { return *state_transfer_bytes_; }
  metrics::Counter& state_transfer_seconds_total() { return *state_transfer_seconds_; }
  metrics::Counter& recoveries_total() { return *recoveries_; }

 private:
  metrics::Registry registry_;
  metrics::Counter* steps_ = nullptr;
  metrics::Histogram* step_duration_ = nullptr;
  metrics::Gauge* samples_per_second_ = nullptr;
  metrics::Gauge* loss_ = nullptr;
  metrics::Gauge* virtual_nodes_ = nullptr;
  metrics::Gauge* epoch_ = nullptr;
  metrics::Counter* allreduce_seconds_ = nullptr;
  metrics::Histogram* rebuild_seconds_ = nullptr;
  metrics::Counter* state_transfer_bytes_ = nullptr;
  metrics::Counter* state_transfer_seconds_ = nullptr;
  metrics::Counter* recoveries_ = nullptr;
};

}  // namespace vf
