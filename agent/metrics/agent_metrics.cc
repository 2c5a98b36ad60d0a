#include "agent/metrics/agent_metrics.h"

#include <utility>
#include <vector>

#include "agent/metrics/build_info.h"

namespace vf {
namespace {

// Steps: a small MLP step on a GPU takes about a millisecond; a large model with many virtual
// nodes per device takes tens of seconds; a step that includes waiting on a slow peer can take
// minutes. Roughly 1-2.5-5 per decade from 1 ms to 5 min.
const std::vector<double> kStepBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1,     2.5,    5,     10,   30,    60,   120, 300};
// Communicator rebuilds: Gloo over loopback meets in milliseconds; NCCL across nodes needs
// seconds; a rendezvous waiting on a late joiner runs into its timeout (minutes).
const std::vector<double> kRebuildBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                             5,    10,    30,   60,  120,  300, 600};

}  // namespace

AgentMetrics::AgentMetrics(std::string ns, std::string job) {
  const std::vector<std::string> names = {"job_namespace", "job_name"};
  const prometheus::Labels labels = {{"job_namespace", std::move(ns)},
                                     {"job_name", std::move(job)}};
  metrics::DescribedRegistry& r = families_;
  metrics::AddBuildInfo(r);
  steps_ = &r.AddCounter("vf_agent_steps_total", "Training steps this worker completed.", names)
                .Add(labels);
  step_duration_ =
      &r.AddHistogram("vf_agent_step_duration_seconds",
                      "Wall time of one training step on this worker.", names, kStepBuckets)
           .Add(labels, kStepBuckets);
  samples_per_second_ = &r.AddGauge("vf_agent_samples_per_second",
                                    "Training samples per second of the whole job (global "
                                    "batch per step), as this worker "
                                    "measures it.",
                                    names)
                             .Add(labels);
  loss_ = &r.AddGauge("vf_agent_loss", "Training loss of the last step.", names).Add(labels);
  virtual_nodes_ = &r.AddGauge("vf_agent_virtual_nodes",
                               "Virtual nodes this worker holds in the current plan.", names)
                        .Add(labels);
  membership_epoch_ =
      &r.AddGauge("vf_agent_membership_epoch",
                  "Membership epoch of the current plan (it grows with each resize; not the data "
                  "epoch).",
                  names)
           .Add(labels);
  allreduce_seconds_ =
      &r.AddCounter("vf_agent_allreduce_seconds_total",
                    "Step time outside the local virtual nodes' forward and backward passes: "
                    "the gradient all-reduce (waiting for slower members included) and the "
                    "optimizer update.",
                    names)
           .Add(labels);
  rebuild_seconds_ = &r.AddHistogram("vf_agent_communicator_rebuild_seconds",
                                     "Time to build the communicator for a new membership.", names,
                                     kRebuildBuckets)
                          .Add(labels, kRebuildBuckets);
  state_transfer_bytes_ =
      &r.AddCounter("vf_agent_state_transfer_bytes_total",
                    "Training state bytes sent to or received from joiners.", names)
           .Add(labels);
  state_transfer_seconds_ = &r.AddCounter("vf_agent_state_transfer_seconds_total",
                                          "Time spent sending or receiving training state.", names)
                                 .Add(labels);
  recoveries_ = &r.AddCounter("vf_agent_recoveries_total",
                              "Failed steps redone after the membership recovered.", names)
                     .Add(labels);
  checkpoint_failures_ =
      &r.AddCounter("vf_agent_checkpoint_failures_total",
                    "Checkpoints this worker failed to write (training went on).", names)
           .Add(labels);
}

void AgentMetrics::OnStep(double seconds, double loss, double samples_per_second,
                          int virtual_nodes) {
  steps_->Increment();
  step_duration_->Observe(seconds);
  loss_->Set(loss);
  samples_per_second_->Set(samples_per_second);
  virtual_nodes_->Set(virtual_nodes);
}

void AgentMetrics::OnAllReduce(double seconds) { allreduce_seconds_->Increment(seconds); }

void AgentMetrics::OnRebuild(double seconds, int64_t epoch) {
  rebuild_seconds_->Observe(seconds);
  membership_epoch_->Set(static_cast<double>(epoch));
}

void AgentMetrics::OnStateTransfer(int64_t bytes, double seconds) {
  state_transfer_bytes_->Increment(static_cast<double>(bytes));
  state_transfer_seconds_->Increment(seconds);
}

void AgentMetrics::OnRecovery() { recoveries_->Increment(); }

void AgentMetrics::OnCheckpointFailed() { checkpoint_failures_->Increment(); }

void AgentMetrics::SetVirtualNodes(int virtual_nodes) { virtual_nodes_->Set(virtual_nodes); }

void AgentMetrics::SetMembershipEpoch(int64_t epoch) {
  membership_epoch_->Set(static_cast<double>(epoch));
}

}  // namespace vf
