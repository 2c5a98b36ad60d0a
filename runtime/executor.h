// The virtual-node executor: one training step over the virtual nodes a rank holds.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/data/dataset.h"
#include "runtime/device.h"
#include "runtime/job/spec.h"
#include "runtime/models/model.h"
#include "runtime/optim/optimizer.h"
#include "runtime/reduce/reducer.h"
#include "runtime/state/training_state.h"
#include "runtime/status.h"

namespace vf {

// The train and test splits a job names: Fashion-MNIST from its directory, or the synthetic
// dataset drawn from the job's seed.
Result<DatasetSplits> LoadJobDataset(const JobSpec& job);

// What one completed step reports.
struct StepResult {
  int64_t step = 0;                   // the step just completed (0-based)
  double loss = 0.0;                  // mean loss over the global batch
  double accuracy = 0.0;              // fraction of the global batch predicted correctly
  int redos = 0;                      // exact mode: recomputations to choose a scale
  double compute_seconds = 0.0;       // forward/backward time of the local virtual nodes
  std::vector<int64_t> header_extra;  // caller fields, MAX over ranks
};

// Holds the full training state of a job on one device (every rank holds all of it) and runs
// its steps: for each local virtual node, in the order given, load the node's micro-batch,
// compute its gradient and add it to the reducer; reduce across ranks; apply the optimizer.
// A device with lanes (Device::Fork) computes several nodes at once. In exact mode node k runs on
// lane k mod lanes and the fixed-point sum makes the result the same bits; in fast mode node k
// adds into float partial sum k mod Device::FastPartialSums(), which one lane owns, and the
// partials are added in order, so the weights do not depend on the lanes either. Memory is sized by
// the micro-batch and the lanes, never by the global batch. Not thread-safe.
class Executor {
 public:
  // `train` must outlive the executor.
  static Result<std::unique_ptr<Executor>> Create(const JobSpec& job, Device& device,
                                                  const Dataset& train);

  // Fresh state: parameters from the seed, zero optimizer slots, step 0.
  Status InitializeFresh();
  // Adopts a state taken from a checkpoint or another rank; it must belong to this job.
  Status Restore(const TrainingState& state);
  // A host copy of the full state.
  TrainingState Snapshot() const;

  // For state transfer between ranks without copying the large buffers: the state's small
  // part (everything but parameters and optimizer slots), the large buffers themselves in device
  // memory (parameters, then each optimizer slot), and the matching restore, which expects the
  // buffers to have been filled already.
  TrainingState SnapshotMetadata() const;
  std::vector<std::pair<float*, size_t>> StateBuffers();
  Status RestoreMetadata(const TrainingState& metadata);
  // Marks the state as gone (its buffers are about to be overwritten).
  void InvalidateState() { has_state_ = false; }

  // Runs the next step with the virtual nodes `local_vnodes` of this rank. Every rank of
  // `comm` calls Step together, and together their local_vnodes cover 0..V-1 exactly once.
  // On error nothing of the step is applied (the step can be redone with another
  // communicator); kNumerical errors mean the job diverged.
  Result<StepResult> Step(Communicator& comm, std::span<const int> local_vnodes,
                          std::span<const int64_t> header_extra = {});

  // Loss and accuracy over a whole dataset (the test split), in chunks of `chunk` samples.
  Result<LossStats> Evaluate(const Dataset& data, int chunk = 1000);

  // SHA-256 of the parameters' bytes: equal on every rank, and across any mapping in exact mode.
  std::string WeightsSha256() const;

  int64_t step() const { return step_; }
  // False until InitializeFresh or Restore succeeds: a joiner has no state of its own.
  bool has_state() const { return has_state_; }
  // Makes every virtual node take `factor` times as long (factor >= 1) by sleeping after the
  // step's forward/backward passes: stands in for a slower device in heterogeneous experiments.
  void set_slowdown(double factor) { slowdown_ = factor < 1.0 ? 1.0 : factor; }
  // Adds a fixed `seconds` to every virtual node (sleeping): a slower device of known speed,
  // independent of how busy the host is.
  void set_vnode_delay(double seconds) { vnode_delay_ = seconds < 0 ? 0 : seconds; }
  // Runs with the step number after the local gradients are computed and before they are
  // reduced: the fault-injection point for "a worker dies in the middle of an all-reduce".
  void set_before_reduce(std::function<void(int64_t)> hook) { before_reduce_ = std::move(hook); }
  int64_t steps_per_epoch() const { return sharder_.steps_per_epoch(); }
  int64_t total_steps() const { return TotalSteps(job_, train_.count); }
  const Model& model() const { return *model_; }
  const JobSpec& job() const { return job_; }
  // The membership epoch recorded in snapshots (the agent's business; kept with the state).
  void set_membership_epoch(int64_t epoch) { membership_epoch_ = epoch; }

 private:
  Executor(const JobSpec& job, Device& device, const Dataset& train);
  Status Init();
  // What the virtual nodes of one device lane compute in: lane 0 is the executor's own model
  // and gradient; the others have their own, so nodes on different lanes write no memory in
  // common (the reducer's sums excepted, see Device::Fork).
  struct Lane {
    std::unique_ptr<Model> model;  // null on lane 0: model_ serves it
    DeviceBuffer<float> grad;      // exact mode's node gradient; empty on lane 0: grad_
    DeviceBuffer<float> x;         // the staged batch as the model's input
    DeviceBuffer<int32_t> y;       // its labels
    DeviceBuffer<uint8_t> pixels;  // its raw pixels, converted into x
  };

  // Copies samples `indices` of `data` to the device as normalized floats and int32 labels:
  // gathers the samples at `indices` into staging slot `slot` and queues their copy and
  // conversion into `lane`'s x and y. A slot is rewritten only after the device has waited, so
  // the step's nodes each get one and evaluation reuses slot 0.
  Status Stage(const Dataset& data, std::span<const int64_t> indices, size_t slot, size_t lane = 0);
  // Makes `slots` staging slots of `batch` samples each, and x, y and pixels for `batch` on
  // each of the first `lanes` lanes, available.
  Status ReserveStaging(const Dataset& data, int batch, size_t slots, size_t lanes = 1);
  // Makes the first `count` lanes exist (models and gradient buffers).
  Status ReserveLanes(size_t count);
  // Queues the forward and backward passes of the local virtual nodes (the step's first part),
  // each node's gradient into `sum` when fast mode takes it in place (null: exact mode, through
  // the reducer's Add), and its statistics into node_stats_.
  Status ComputeNodes(std::span<const int> local_vnodes, float* sum);
  // One node, already staged on lane `lane`, into stats slot `k`.
  Status ComputeNode(size_t lane, size_t k, float* sum);
  // Fast mode: makes partial sums 1..used-1 exist and queues their zeroing.
  Status ReserveFastPartials(size_t used);
  // Fast mode: adds partial sums 1..used-1 into `sum` (partial 0), in order, after the lanes join.
  void FoldFastPartials(size_t used, float* sum);

  JobSpec job_;
  std::string fingerprint_;
  Device& device_;
  const Dataset& train_;
  Sharder sharder_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<Reducer> reducer_;
  DeviceBuffer<float> params_;
  DeviceBuffer<float> grad_;  // lane 0's node gradient, then the mean gradient
  // The loss statistics of the step's local virtual nodes (then one scratch slot per lane), in
  // the device's memory until the step's one wait for the device, then on the host.
  DeviceBuffer<LossStats> node_stats_;
  std::vector<LossStats> host_node_stats_;
  std::vector<DeviceBuffer<float>> slots_;
  std::vector<Lane> lanes_;  // lanes_[0] always exists
  // Fast mode's partial sums 1..Device::FastPartialSums()-1 (partial 0 is the reducer's sum).
  std::vector<DeviceBuffer<float>> fast_partials_;
  int staged_capacity_ = 0;
  // Per slot: `staged_capacity_` samples' pixels, then their labels as int32 (see Stage).
  std::vector<StagingBuffer<uint8_t>> staging_;
  std::vector<int64_t> indices_;
  int64_t step_ = 0;
  int64_t optimizer_steps_ = 0;
  int64_t membership_epoch_ = 0;
  bool has_state_ = false;
  double slowdown_ = 1.0;
  double vnode_delay_ = 0.0;
  std::function<void(int64_t)> before_reduce_;
};

}  // namespace vf
