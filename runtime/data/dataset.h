// Datasets held in host memory as raw bytes, and the deterministic data order of invariant 2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace vf {

// A labelled image dataset: `count` samples of `rows * cols` bytes each. Kept as uint8 (the IDX
// files' own format) so the resident size is a quarter of a float copy. Immutable after loading;
// safe to read from several threads.
struct Dataset {
  int64_t count = 0;
  int rows = 0;
  int cols = 0;
  int num_classes = 0;
  std::vector<uint8_t> images;  // count * rows * cols
  std::vector<uint8_t> labels;  // count, each < num_classes

  size_t sample_size() const { return static_cast<size_t>(rows) * static_cast<size_t>(cols); }
};

// Train and test splits of one dataset.
struct DatasetSplits {
  Dataset train;
  Dataset test;
};

// Reads an IDX image file (magic 0x00000803) and its label file (magic 0x00000801), gzip or
// plain. Validates magics, dimensions, file lengths, matching counts and label range; errors
// name the file and what is wrong (kNotFound for a missing file, kDataLoss for a corrupt one).
Result<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path,
                        int num_classes);

// Loads Fashion-MNIST from a directory holding the four files as Debian's
// dataset-fashion-mnist ships them: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
Result<DatasetSplits> LoadFashionMnist(const std::string& directory);

// A deterministic stand-in dataset (for benchmarks and fault tests): images are noise drawn from
// `seed` plus a class-dependent pattern, so a model can learn it.
DatasetSplits MakeSyntheticDataset(int64_t train_count, int64_t test_count, int rows, int cols,
                                   int num_classes, uint64_t seed);

// Invariant 2: the data order is a function of (seed, epoch, step, virtual node) only.
// Epoch e visits the training set in a permutation drawn from (seed, e); the global step s takes
// the next B samples of that permutation (the tail that does not fill a whole step is dropped);
// virtual node v takes the v-th slice of b = B / V of them.
// Caches the current epoch's permutation; not thread-safe.
class Sharder {
 public:
  // Requires Check(dataset_size, global_batch, virtual_nodes).ok().
  Sharder(uint64_t seed, int64_t dataset_size, int64_t global_batch, int virtual_nodes);

  // Whether a job with this batch and virtual-node count can run on a training set this size:
  // InvalidArgument naming the problem if B > N, B % V != 0 or any of them is not positive.
  static Status Check(int64_t dataset_size, int64_t global_batch, int virtual_nodes);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t micro_batch() const { return micro_batch_; }
  // Epoch that global step `step` (0-based, counted from the start of the job) falls in.
  int64_t EpochOf(int64_t step) const { return step / steps_per_epoch_; }

  // Sample indices for virtual node `vnode` at global step `step`, in order.
  void MicroBatch(int64_t step, int vnode, std::vector<int64_t>* indices);

  // The permutation of epoch `epoch` (exposed for tests).
  std::vector<int64_t> Permutation(int64_t epoch) const;

 private:
  uint64_t seed_;
  int64_t dataset_size_;
  int64_t global_batch_;
  int virtual_nodes_;
  int64_t micro_batch_;
  int64_t steps_per_epoch_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> cached_permutation_;
};

// Counter-based random numbers: a pure function of (seed, stream ids, counter), so any rank can
// draw the same numbers for (seed, step, vnode) without carrying generator state. SplitMix64
// finalizer over a mixed key; written here because the standard library's distributions are not
// specified bit-for-bit across implementations.
uint64_t MixKey(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);
class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : key_(key) {}
  uint64_t Next();
  // Uniform integer in [0, bound), bound > 0, without modulo bias.
  uint64_t Below(uint64_t bound);
  // Uniform float in [0, 1).
  float Uniform();

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace vf
