#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

namespace vf {
namespace {

// Fashion-MNIST's pixel mean and standard deviation (of value / 255).
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;
// Largest gradient bucket: one fixed-point scale per this many values at most.
constexpr size_t kMaxBucket = size_t{1} << 20;

}  // namespace

Result<DatasetSplits> LoadJobDataset(const JobSpec& job) {
  if (job.dataset.name == "fashion-mnist") return LoadFashionMnist(job.dataset.path);
  if (job.dataset.name == "synthetic") {
    return MakeSyntheticDataset(job.dataset.train_samples, job.dataset.test_samples, 28, 28, 10,
                                job.seed);
  }
  return InvalidArgument("unknown dataset '" + job.dataset.name +
                         "' (known: fashion-mnist, synthetic)");
}

Executor::Executor(const JobSpec& job, Device& device, const Dataset& train)
    : job_(job),
      fingerprint_(job.Fingerprint()),
      device_(device),
      train_(train),
      sharder_(job.seed, train.count, job.global_batch_size, job.virtual_nodes) {}

Result<std::unique_ptr<Executor>> Executor::Create(const JobSpec& job, Device& device,
                                                   const Dataset& train) {
  VF_RETURN_IF_ERROR(ValidateJob(job));
  VF_RETURN_IF_ERROR(Sharder::Check(train.count, job.global_batch_size, job.virtual_nodes));
  std::unique_ptr<Executor> e(new Executor(job, device, train));
  VF_RETURN_IF_ERROR(e->Init());
  return e;
}

Status Executor::Init() {
  VF_ASSIGN_OR_RETURN(model_, CreateModel(job_.model, static_cast<int>(train_.sample_size()),
                                          train_.num_classes, device_));
  VF_ASSIGN_OR_RETURN(optimizer_, CreateOptimizer(job_.optimizer));
  std::vector<size_t> sizes;
  for (const auto& t : model_->tensors()) sizes.push_back(t.size);
  VF_ASSIGN_OR_RETURN(reducer_, CreateReducer(job_.reduction, device_,
                                              MakeBuckets(sizes, kMaxBucket), job_.virtual_nodes));
  const size_t n = model_->parameter_count();
  VF_ASSIGN_OR_RETURN(params_, DeviceBuffer<float>::Create(device_, n));
  VF_ASSIGN_OR_RETURN(grad_, DeviceBuffer<float>::Create(device_, n));
  // One slot per virtual node, then one per lane that every node's recorded work on the lane
  // writes to.
  VF_ASSIGN_OR_RETURN(node_stats_,
                      DeviceBuffer<LossStats>::Create(
                          device_, static_cast<size_t>(job_.virtual_nodes + kMaxLanes)));
  lanes_.resize(1);
  host_node_stats_.resize(static_cast<size_t>(job_.virtual_nodes));
  slots_.clear();
  for (int i = 0; i < optimizer_->slot_count(); ++i) {
    VF_ASSIGN_OR_RETURN(auto slot, DeviceBuffer<float>::Create(device_, n));
    slots_.push_back(std::move(slot));
  }
  return Status::Ok();
}

Status Executor::InitializeFresh() {
  std::vector<float> host(model_->parameter_count());
  model_->InitializeHost(job_.seed, host.data());
  device_.CopyFromHost(params_.data(), host.data(), host.size() * sizeof(float));
  for (auto& s : slots_) device_.Fill(s.data(), 0.f, s.size());
  VF_RETURN_IF_ERROR(
      reducer_->set_exponents(std::vector<int32_t>(reducer_->exponents().size(), kUnsetExponent)));
  step_ = 0;
  optimizer_steps_ = 0;
  has_state_ = true;
  return Status::Ok();
}

Status Executor::RestoreMetadata(const TrainingState& state) {
  if (state.job_fingerprint != fingerprint_) {
    return FailedPrecondition(
        "the state belongs to a different job (its virtual nodes, batch size, model, dataset, "
        "optimizer, reduction or seed differ)");
  }
  if (state.step < 0 || state.data_epoch != sharder_.EpochOf(state.step)) {
    return DataLoss("the state's step and data epoch do not agree");
  }
  VF_RETURN_IF_ERROR(reducer_->set_exponents(state.reducer_exponents));
  step_ = state.step;
  optimizer_steps_ = state.optimizer_steps;
  membership_epoch_ = state.membership_epoch;
  has_state_ = true;
  return Status::Ok();
}

Status Executor::Restore(const TrainingState& state) {
  const size_t n = model_->parameter_count();
  if (state.job_fingerprint == fingerprint_) {
    if (state.parameters.size() != n) {
      return DataLoss("the state has " + std::to_string(state.parameters.size()) +
                      " parameters, the model has " + std::to_string(n));
    }
    if (state.optimizer_slots.size() != slots_.size()) {
      return DataLoss("the state has " + std::to_string(state.optimizer_slots.size()) +
                      " optimizer slots, " + optimizer_->name() + " needs " +
                      std::to_string(slots_.size()));
    }
    for (const auto& slot : state.optimizer_slots) {
      if (slot.size() != n) return DataLoss("an optimizer slot has the wrong size");
    }
  }
  VF_RETURN_IF_ERROR(RestoreMetadata(state));
  device_.CopyFromHost(params_.data(), state.parameters.data(), n * sizeof(float));
  for (size_t i = 0; i < slots_.size(); ++i) {
    device_.CopyFromHost(slots_[i].data(), state.optimizer_slots[i].data(), n * sizeof(float));
  }
  return Status::Ok();
}

TrainingState Executor::SnapshotMetadata() const {
  TrainingState s;
  s.job_fingerprint = fingerprint_;
  s.seed = job_.seed;
  s.step = step_;
  s.data_epoch = sharder_.EpochOf(step_);
  s.membership_epoch = membership_epoch_;
  s.optimizer_steps = optimizer_steps_;
  s.reducer_exponents = reducer_->exponents();
  return s;
}

std::vector<std::pair<float*, size_t>> Executor::StateBuffers() {
  std::vector<std::pair<float*, size_t>> out;
  out.emplace_back(params_.data(), params_.size());
  for (auto& s : slots_) out.emplace_back(s.data(), s.size());
  return out;
}

TrainingState Executor::Snapshot() const {
  TrainingState s = SnapshotMetadata();
  const size_t n = model_->parameter_count();
  s.parameters.resize(n);
  device_.CopyToHost(s.parameters.data(), params_.data(), n * sizeof(float));
  for (const auto& slot : slots_) {
    std::vector<float> host(n);
    device_.CopyToHost(host.data(), slot.data(), n * sizeof(float));
    s.optimizer_slots.push_back(std::move(host));
  }
  return s;
}

Status Executor::ReserveLanes(size_t count) {
  while (lanes_.size() < count) {
    Lane lane;
    VF_ASSIGN_OR_RETURN(lane.model, CreateModel(job_.model, static_cast<int>(train_.sample_size()),
                                                train_.num_classes, device_));
    VF_ASSIGN_OR_RETURN(lane.grad, DeviceBuffer<float>::Create(device_, grad_.size()));
    lanes_.push_back(std::move(lane));
  }
  return Status::Ok();
}

Status Executor::ReserveStaging(const Dataset& data, int batch, size_t slots, size_t lanes) {
  const size_t per = data.sample_size();
  if (batch > staged_capacity_) {
    // Sized by the largest batch staged (the micro-batch, or an evaluation chunk). Freeing
    // staging memory waits for the copies that read it.
    for (Lane& lane : lanes_) {
      lane.x.Reset();
      lane.pixels.Reset();
      lane.y.Reset();
    }
    staging_.clear();
    staged_capacity_ = batch;
  }
  const size_t values = static_cast<size_t>(staged_capacity_) * per;
  for (size_t l = 0; l < lanes && l < lanes_.size(); ++l) {
    Lane& lane = lanes_[l];
    if (lane.x.size() == values && lane.y.size() == static_cast<size_t>(staged_capacity_)) continue;
    VF_ASSIGN_OR_RETURN(lane.x, DeviceBuffer<float>::Create(device_, values));
    VF_ASSIGN_OR_RETURN(lane.pixels, DeviceBuffer<uint8_t>::Create(device_, values));
    VF_ASSIGN_OR_RETURN(
        lane.y, DeviceBuffer<int32_t>::Create(device_, static_cast<size_t>(staged_capacity_)));
  }
  const size_t pixel_bytes = (values + 3) / 4 * 4;
  const size_t bytes = pixel_bytes + static_cast<size_t>(staged_capacity_) * sizeof(int32_t);
  while (staging_.size() < slots) {
    VF_ASSIGN_OR_RETURN(auto slot, StagingBuffer<uint8_t>::Create(device_, bytes));
    staging_.push_back(std::move(slot));
  }
  return Status::Ok();
}

Status Executor::Stage(const Dataset& data, std::span<const int64_t> indices, size_t slot,
                       size_t lane) {
  const size_t per = data.sample_size();
  const int batch = static_cast<int>(indices.size());
  VF_RETURN_IF_ERROR(ReserveStaging(data, batch, slot + 1, lane + 1));
  Lane& to = lanes_[lane];
  // The host only gathers the rows into the slot; the device converts them.
  uint8_t* pixels = staging_[slot].data();
  const size_t pixel_bytes = (static_cast<size_t>(staged_capacity_) * per + 3) / 4 * 4;
  auto* labels = reinterpret_cast<int32_t*>(pixels + pixel_bytes);
  for (int i = 0; i < batch; ++i) {
    const uint8_t* src = data.images.data() + static_cast<size_t>(indices[i]) * per;
    std::memcpy(pixels + static_cast<size_t>(i) * per, src, per);
    labels[i] = data.labels[static_cast<size_t>(indices[i])];
  }
  const size_t values = static_cast<size_t>(batch) * per;
  device_.CopyFromHost(to.pixels.data(), pixels, values);
  device_.CopyFromHost(to.y.data(), labels, static_cast<size_t>(batch) * sizeof(int32_t));
  device_.NormalizePixels(to.pixels.data(), values, 1.f / (255.f * kPixelStd),
                          kPixelMean / kPixelStd, to.x.data());
  return Status::Ok();
}

Status Executor::ComputeNode(size_t lane, size_t k, float* sum) {
  Lane& on = lanes_[lane];
  Model& model = lane == 0 ? *model_ : *on.model;
  const int b = static_cast<int>(job_.micro_batch());
  // Fast mode's sum takes each node's gradient in place; exact mode gets each through Add.
  const GradientOutput output = sum != nullptr ? GradientOutput::kAdd : GradientOutput::kWrite;
  float* const grad = sum != nullptr ? sum : (lane == 0 ? grad_.data() : on.grad.data());
  // The node's whole computation reads and writes fixed device buffers (the exact fold takes its
  // exponents from the device, the statistics go to the lane's scratch slot), so a GPU records
  // it once per lane and replays it for every node; only the statistics' copy names the node.
  LossStats* const stats = node_stats_.data() + job_.virtual_nodes + lane;
  const uint64_t key[] = {reinterpret_cast<uintptr_t>(stats),
                          reinterpret_cast<uintptr_t>(grad),
                          reinterpret_cast<uintptr_t>(params_.data()),
                          reinterpret_cast<uintptr_t>(on.x.data()),
                          reinterpret_cast<uintptr_t>(on.y.data()),
                          reinterpret_cast<uintptr_t>(reducer_.get()),
                          static_cast<uint64_t>(b)};
  const Status node = device_.Record(key, [&]() -> Status {
    VF_RETURN_IF_ERROR(
        model.ForwardBackward(params_.data(), on.x.data(), on.y.data(), b, output, grad, stats));
    return sum == nullptr ? reducer_->Add(grad) : Status::Ok();
  });
  VF_RETURN_IF_ERROR(node);
  device_.Copy(node_stats_.data() + k, stats, sizeof(LossStats));
  return Status::Ok();
}

Status Executor::ComputeNodes(std::span<const int> local_vnodes, float* sum) {
  // Exact mode's nodes share nothing but the reducer's integer sums, so a device with lanes runs
  // several at once, node k on lane k mod lanes. Fast mode's float sums depend on the order of
  // their additions, so its grouping is the device kind's, whatever its lanes: node k adds into
  // partial sum k mod FastPartialSums() (partial 0 is the reducer's own), each partial belongs
  // to one lane, and the partials are added in order at the end (FoldFastPartials).
  const size_t nodes = local_vnodes.size();
  const size_t groups = static_cast<size_t>(std::clamp(device_.FastPartialSums(), 1, kMaxLanes));
  const size_t most = sum != nullptr ? std::min(nodes, groups) : nodes;
  const size_t lanes =
      std::clamp<size_t>(static_cast<size_t>(device_.Lanes()), 1, std::max<size_t>(most, 1));
  VF_RETURN_IF_ERROR(ReserveLanes(lanes));
  if (sum != nullptr) VF_RETURN_IF_ERROR(ReserveFastPartials(most));
  // Staging first: a slot per node, allocated before any node's work is recorded.
  VF_RETURN_IF_ERROR(ReserveStaging(train_, static_cast<int>(job_.micro_batch()), nodes, lanes));
  if (lanes > 1) device_.Fork(static_cast<int>(lanes));
  Status status = Status::Ok();
  for (size_t k = 0; k < nodes && status.ok(); ++k) {
    const size_t group = sum != nullptr ? k % groups : k;
    const size_t lane = group % lanes;
    if (lanes > 1) device_.UseLane(static_cast<int>(lane));
    sharder_.MicroBatch(step_, local_vnodes[k], &indices_);
    status = Stage(train_, indices_, k, lane);
    float* const into = sum == nullptr || group == 0 ? sum : fast_partials_[group - 1].data();
    if (status.ok()) status = ComputeNode(lane, k, into);
  }
  if (lanes > 1) device_.Join();
  if (status.ok() && sum != nullptr) FoldFastPartials(most, sum);
  return status;
}

Status Executor::ReserveFastPartials(size_t used) {
  const size_t n = model_->parameter_count();
  while (fast_partials_.size() + 1 < used) {
    VF_ASSIGN_OR_RETURN(auto partial, DeviceBuffer<float>::Create(device_, n));
    fast_partials_.push_back(std::move(partial));
  }
  // Zeroed before the lanes fork, so each starts after its partials are clear.
  for (size_t p = 1; p < used; ++p) device_.Fill(fast_partials_[p - 1].data(), 0.f, n);
  return Status::Ok();
}

void Executor::FoldFastPartials(size_t used, float* sum) {
  for (size_t p = 1; p < used; ++p) {
    device_.Axpy(1.f, fast_partials_[p - 1].data(), sum, model_->parameter_count());
  }
}

Result<StepResult> Executor::Step(Communicator& comm, std::span<const int> local_vnodes,
                                  std::span<const int64_t> header_extra) {
  if (local_vnodes.size() > static_cast<size_t>(job_.virtual_nodes)) {
    return InvalidArgument(std::to_string(local_vnodes.size()) +
                           " local virtual nodes, more than the job's " +
                           std::to_string(job_.virtual_nodes));
  }
  for (int v : local_vnodes) {
    if (v < 0 || v >= job_.virtual_nodes) {
      return InvalidArgument("virtual node " + std::to_string(v) + " is out of range 0.." +
                             std::to_string(job_.virtual_nodes - 1));
    }
  }
  if (!has_state_) return FailedPrecondition("the executor has no training state yet");
  StepResult out;
  out.step = step_;
  // At most one redo: after it the scale comes from this very step's maxima.
  for (int attempt = 0; attempt < 3; ++attempt) {
    reducer_->Begin();
    // One wait for the device per step, not per node: a GPU then runs the nodes back to back.
    const auto t0 = std::chrono::steady_clock::now();
    VF_RETURN_IF_ERROR(ComputeNodes(local_vnodes, reducer_->sum_in_place()));
    // Waits for the device (the copy comes after all the queued work).
    device_.CopyToHost(host_node_stats_.data(), node_stats_.data(),
                       local_vnodes.size() * sizeof(LossStats));
    for (size_t k = 0; k < local_vnodes.size(); ++k) reducer_->AddLoss(host_node_stats_[k]);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double extra =
        took * (slowdown_ - 1.0) + vnode_delay_ * static_cast<double>(local_vnodes.size());
    if (extra > 0) std::this_thread::sleep_for(std::chrono::duration<double>(extra));
    out.compute_seconds = took + extra;
    if (before_reduce_) before_reduce_(step_);
    auto reduced = reducer_->Finish(comm, header_extra, grad_.data());
    if (!reduced.ok()) {
      return reduced.status().WithContext("step " + std::to_string(step_ + 1));
    }
    if (reduced->redo) {
      ++out.redos;
      continue;
    }
    std::vector<float*> slots;
    for (auto& s : slots_) slots.push_back(s.data());
    ++optimizer_steps_;
    optimizer_->Apply(device_, params_.data(), grad_.data(), slots, model_->parameter_count(),
                      optimizer_steps_);
    const auto& t = reduced->totals;
    out.loss = t.samples > 0 ? t.loss_sum / static_cast<double>(t.samples) : 0.0;
    out.accuracy =
        t.samples > 0 ? static_cast<double>(t.correct) / static_cast<double>(t.samples) : 0.0;
    out.header_extra = std::move(reduced->header_extra);
    ++step_;
    return out;
  }
  return Internal("step " + std::to_string(step_ + 1) +
                  ": the exact reducer could not settle on a scale");
}

Result<LossStats> Executor::Evaluate(const Dataset& data, int chunk) {
  LossStats total;
  std::vector<int64_t> idx;
  for (int64_t start = 0; start < data.count; start += chunk) {
    const int64_t n = std::min<int64_t>(chunk, data.count - start);
    idx.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = start + i;
    VF_RETURN_IF_ERROR(Stage(data, idx, 0));
    VF_ASSIGN_OR_RETURN(LossStats s, model_->Evaluate(params_.data(), lanes_[0].x.data(),
                                                      lanes_[0].y.data(), static_cast<int>(n)));
    total.loss_sum += s.loss_sum;
    total.correct += s.correct;
    total.samples += s.samples;
  }
  return total;
}

std::string Executor::WeightsSha256() const {
  std::vector<float> host(model_->parameter_count());
  device_.CopyToHost(host.data(), params_.data(), host.size() * sizeof(float));
  return Sha256Hex(host.data(), host.size() * sizeof(float));
}

}  // namespace vf
