// The agent's metrics: training steps, loss, throughput, collectives, membership changes, state
// transfers and failed checkpoint writes of the worker in one pod. The names are an interface
// (dashboards use them); docs/metrics.md lists them, and a test keeps that list and these
// families the same.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <string>
#include <vector>

#include "agent/metrics/described_registry.h"

namespace vf {

// Owns one agent's metric families in their own Registry, which the agent serves on
// GET /metrics. Every series (vf_build_info's aside) is labelled {job_namespace, job_name} only:
// never a pod name or UID, which Prometheus adds from the scrape target, so that a job's series
// survive its pods being replaced; and not `namespace` or `job`, which Prometheus sets from the
// scrape target (the pod's namespace, the scrape job) and would rename ours to exported_*.
// Thread-safe and lock-free on the update path but for the histograms (prometheus-cpp guards each
// with a mutex): the agent serves one job, so every child is made once, at construction, and none
// is ever removed.
class AgentMetrics {
 public:
  AgentMetrics(std::string ns, std::string job);
  AgentMetrics(const AgentMetrics&) = delete;
  AgentMetrics& operator=(const AgentMetrics&) = delete;

  prometheus::Registry& registry() { return families_.registry(); }
  const prometheus::Registry& registry() const { return families_.registry(); }
  // Every family, sorted by name: what docs/metrics.md lists.
  std::vector<metrics::FamilyInfo> Describe() const { return families_.Describe(); }

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
  // A checkpoint this worker failed to write (training went on; the next interval tries again).
  void OnCheckpointFailed();
  // The virtual nodes the current plan gives this worker (also set by OnStep).
  void SetVirtualNodes(int virtual_nodes);
  // The membership epoch of the current plan (also set by OnRebuild). Not the data epoch: it
  // counts plans (resizes), not passes over the training set.
  void SetMembershipEpoch(int64_t epoch);

  // The children, for what the methods above do not cover.
  prometheus::Counter& steps_total() { return *steps_; }
  prometheus::Histogram& step_duration_seconds() { return *step_duration_; }
  prometheus::Gauge& samples_per_second() { return *samples_per_second_; }
  prometheus::Gauge& loss() { return *loss_; }
  prometheus::Gauge& virtual_nodes() { return *virtual_nodes_; }
  prometheus::Gauge& membership_epoch() { return *membership_epoch_; }
  prometheus::Counter& allreduce_seconds_total() { return *allreduce_seconds_; }
  prometheus::Histogram& communicator_rebuild_seconds() { return *rebuild_seconds_; }
  prometheus::Counter& state_transfer_bytes_total() { return *state_transfer_bytes_; }
  prometheus::Counter& state_transfer_seconds_total() { return *state_transfer_seconds_; }
  prometheus::Counter& recoveries_total() { return *recoveries_; }
  prometheus::Counter& checkpoint_failures_total() { return *checkpoint_failures_; }

 private:
  metrics::DescribedRegistry families_;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Histogram* step_duration_ = nullptr;
  prometheus::Gauge* samples_per_second_ = nullptr;
  prometheus::Gauge* loss_ = nullptr;
  prometheus::Gauge* virtual_nodes_ = nullptr;
  prometheus::Gauge* membership_epoch_ = nullptr;
  prometheus::Counter* allreduce_seconds_ = nullptr;
  prometheus::Histogram* rebuild_seconds_ = nullptr;
  prometheus::Counter* state_transfer_bytes_ = nullptr;
  prometheus::Counter* state_transfer_seconds_ = nullptr;
  prometheus::Counter* recoveries_ = nullptr;
  prometheus::Counter* checkpoint_failures_ = nullptr;
};

}  // namespace vf
