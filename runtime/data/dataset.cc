#include "runtime/data/dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

namespace vf {
namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension
constexpr uint32_t kMaxSide = 4096;
// Bounds the up-front reservation so a header that claims an absurd count cannot make us
// allocate before the data proves it exists; Fashion-MNIST (47 MB) still fits in one.
constexpr uint64_t kMaxReserve = uint64_t{1} << 26;
constexpr unsigned kReadChunk = 1u << 20;

std::string Hex32(uint32_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s = "0x00000000";
  for (int i = 9; i >= 2; --i) {
    s[static_cast<size_t>(i)] = kDigits[v & 0xf];
    v >>= 4;
  }
  return s;
}

uint32_t BigEndian32(const std::vector<uint8_t>& b, size_t offset) {
  return (uint32_t{b[offset]} << 24) | (uint32_t{b[offset + 1]} << 16) |
         (uint32_t{b[offset + 2]} << 8) | uint32_t{b[offset + 3]};
}

// An open IDX file, plain or gzip (zlib detects which). Not thread-safe.
class IdxFile {
 public:
  IdxFile() = default;
  IdxFile(const IdxFile&) = delete;
  IdxFile& operator=(const IdxFile&) = delete;
  ~IdxFile() {
    if (file_ != nullptr) gzclose(file_);
  }

  Status Open(const std::string& path) {
    path_ = path;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT || errno == ENOTDIR) return NotFound(path + ": no such file");
      return FailedPrecondition(path + ": " + std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) return FailedPrecondition(path + ": not a regular file");
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      return FailedPrecondition(
          path + ": cannot open: " + (errno != 0 ? std::strerror(errno) : "out of memory"));
    }
    // Larger than zlib's default so a 47 MB training set is not read 8 KiB at a time.
    gzbuffer(file_, 1u << 18);
    return Status::Ok();
  }

  // Appends up to `want` bytes to `out`; stops early only at end of file. A zlib or I/O error
  // is kDataLoss.
  Status ReadUpTo(uint64_t want, std::vector<uint8_t>* out) {
    out->reserve(out->size() + static_cast<size_t>(std::min(want, kMaxReserve)));
    while (want > 0) {
      unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(want, kReadChunk));
      size_t old_size = out->size();
      out->resize(old_size + chunk);
      int n = gzread(file_, out->data() + old_size, chunk);
      if (n < 0) {
        out->resize(old_size);
        return ZlibError();
      }
      out->resize(old_size + static_cast<size_t>(n));
      want -= static_cast<uint64_t>(n);
      if (static_cast<unsigned>(n) < chunk) {
        // A short read is either the end of the data or an error zlib reports afterwards
        // (a gzip stream cut short, a bad CRC).
        int errnum = Z_OK;
        gzerror(file_, &errnum);
        if (errnum != Z_OK) return ZlibError();
        break;
      }
    }
    return Status::Ok();
  }

  // Reads the `n`-byte header, checking the magic number first so that a file of the wrong kind
  // is reported as such even when it is shorter than the header.
  Result<std::vector<uint8_t>> ReadHeader(size_t n, uint32_t magic, const char* kind) {
    std::vector<uint8_t> header;
    VF_RETURN_IF_ERROR(ReadUpTo(4, &header));
    if (header.size() == 4) {
      const uint32_t found = BigEndian32(header, 0);
      if (found != magic) {
        return DataLoss(path_ + ": bad magic " + Hex32(found) + ", expected " + Hex32(magic) +
                        " (an IDX " + kind + " file)");
      }
      VF_RETURN_IF_ERROR(ReadUpTo(n - 4, &header));
    }
    if (header.size() < n) {
      return DataLoss(path_ + ": truncated: expected " + std::to_string(n) +
                      " bytes of IDX header, found " + std::to_string(header.size()));
    }
    return header;
  }

  // Reads the `expected` data bytes that follow the header and checks nothing follows them
  // (reading past the data also makes zlib verify the gzip trailer's CRC and length).
  Result<std::vector<uint8_t>> ReadData(uint64_t expected, const char* what) {
    std::vector<uint8_t> data;
    VF_RETURN_IF_ERROR(ReadUpTo(expected, &data));
    if (data.size() < expected) {
      return DataLoss(path_ + ": truncated: expected " + std::to_string(expected) + " bytes of " +
                      what + " data, found " + std::to_string(data.size()));
    }
    std::vector<uint8_t> extra;
    VF_RETURN_IF_ERROR(ReadUpTo(kReadChunk, &extra));
    if (!extra.empty()) {
      // Count the rest so the message says how much is there.
      uint64_t total = extra.size();
      while (extra.size() == kReadChunk) {
        extra.clear();
        VF_RETURN_IF_ERROR(ReadUpTo(kReadChunk, &extra));
        total += extra.size();
      }
      return DataLoss(path_ + ": " + std::to_string(total) + " unexpected bytes after the " +
                      std::to_string(expected) + " bytes of " + what + " data");
    }
    return data;
  }

 private:
  Status ZlibError() {
    int errnum = Z_OK;
    const char* message = gzerror(file_, &errnum);
    if (errnum == Z_ERRNO) return DataLoss(path_ + ": read error: " + std::strerror(errno));
    return DataLoss(path_ + ": corrupt gzip stream: " +
                    (message != nullptr && *message != '\0' ? message : "unknown zlib error"));
  }

  std::string path_;
  gzFile file_ = nullptr;
};

struct ImageHeader {
  uint32_t count;
  uint32_t rows;
  uint32_t cols;
};

Result<ImageHeader> ReadImageHeader(IdxFile& file, const std::string& path) {
  VF_ASSIGN_OR_RETURN(std::vector<uint8_t> h,
                      file.ReadHeader(16, kIdxImagesMagic, "unsigned-byte image"));
  ImageHeader header{BigEndian32(h, 4), BigEndian32(h, 8), BigEndian32(h, 12)};
  if (header.count < 1) return DataLoss(path + ": the file declares 0 images");
  if (header.rows < 1 || header.rows > kMaxSide || header.cols < 1 || header.cols > kMaxSide) {
    return DataLoss(path + ": implausible image size " + std::to_string(header.rows) + "x" +
                    std::to_string(header.cols) + " (each side must be 1.." +
                    std::to_string(kMaxSide) + ")");
  }
  return header;
}

// Picks "<directory>/<name>.gz", else "<directory>/<name>".
Result<std::string> FindFashionMnistFile(const std::string& directory, const std::string& name) {
  std::string base =
      directory.empty() || directory.back() == '/' ? directory + name : directory + "/" + name;
  struct stat st;
  for (const std::string& candidate : {base + ".gz", base}) {
    if (stat(candidate.c_str(), &st) == 0) return candidate;
  }
  return NotFound(directory + ": Fashion-MNIST file " + name +
                  "[.gz] not found (install Debian's dataset-fashion-mnist)");
}

uint64_t SplitMix64Finalize(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;
constexpr uint64_t kPermutationStream = 0x5045524d;  // "PERM"
constexpr uint64_t kTemplateStream = 0x544d504c;     // "TMPL"
constexpr uint64_t kSampleStream = 0x534d504c;       // "SMPL"

Dataset MakeSyntheticSplit(int64_t count, int rows, int cols, int num_classes, uint64_t seed,
                           uint64_t split, const std::vector<uint8_t>& templates) {
  Dataset d;
  d.count = count;
  d.rows = rows;
  d.cols = cols;
  d.num_classes = num_classes;
  const size_t size = d.sample_size();
  d.images.resize(static_cast<size_t>(count) * size);
  d.labels.resize(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    // One stream per sample, so a sample does not depend on how many came before it.
    CounterRng rng(MixKey(seed, kSampleStream, split, static_cast<uint64_t>(i)));
    const auto label = static_cast<uint8_t>(rng.Below(static_cast<uint64_t>(num_classes)));
    d.labels[static_cast<size_t>(i)] = label;
    const uint8_t* t = templates.data() + size_t{label} * size;
    uint8_t* out = d.images.data() + static_cast<size_t>(i) * size;
    for (size_t p = 0; p < size; ++p) {
      // 0.6 * template + 0.4 * noise, in integers so every platform gets the same bytes.
      uint64_t noise = rng.Below(256);
      uint64_t v = (6 * uint64_t{t[p]} + 4 * noise + 5) / 10;
      out[p] = static_cast<uint8_t>(std::min<uint64_t>(v, 255));
    }
  }
  return d;
}

}  // namespace

Result<Dataset> LoadIdx(const std::string& images_path, const std::string& labels_path,
                        int num_classes) {
  if (num_classes < 1 || num_classes > 256) {
    return InvalidArgument("num_classes must be 1..256 for byte labels, got " +
                           std::to_string(num_classes));
  }
  Dataset d;
  d.num_classes = num_classes;
  {
    IdxFile file;
    VF_RETURN_IF_ERROR(file.Open(images_path));
    VF_ASSIGN_OR_RETURN(ImageHeader header, ReadImageHeader(file, images_path));
    d.count = header.count;
    d.rows = static_cast<int>(header.rows);
    d.cols = static_cast<int>(header.cols);
    const uint64_t expected = uint64_t{header.count} * header.rows * header.cols;
    VF_ASSIGN_OR_RETURN(d.images, file.ReadData(expected, "image"));
  }
  {
    IdxFile file;
    VF_RETURN_IF_ERROR(file.Open(labels_path));
    VF_ASSIGN_OR_RETURN(std::vector<uint8_t> h,
                        file.ReadHeader(8, kIdxLabelsMagic, "unsigned-byte label"));
    const uint32_t count = BigEndian32(h, 4);
    if (count != static_cast<uint64_t>(d.count)) {
      return DataLoss(labels_path + ": " + std::to_string(count) + " labels for the " +
                      std::to_string(d.count) + " images in " + images_path);
    }
    VF_ASSIGN_OR_RETURN(d.labels, file.ReadData(count, "label"));
  }
  for (size_t i = 0; i < d.labels.size(); ++i) {
    if (d.labels[i] >= num_classes) {
      return DataLoss(labels_path + ": label " + std::to_string(d.labels[i]) + " at index " +
                      std::to_string(i) + " is out of range for " + std::to_string(num_classes) +
                      " classes");
    }
  }
  return d;
}

Result<DatasetSplits> LoadFashionMnist(const std::string& directory) {
  constexpr int kClasses = 10;
  VF_ASSIGN_OR_RETURN(std::string train_images,
                      FindFashionMnistFile(directory, "train-images-idx3-ubyte"));
  VF_ASSIGN_OR_RETURN(std::string train_labels,
                      FindFashionMnistFile(directory, "train-labels-idx1-ubyte"));
  VF_ASSIGN_OR_RETURN(std::string test_images,
                      FindFashionMnistFile(directory, "t10k-images-idx3-ubyte"));
  VF_ASSIGN_OR_RETURN(std::string test_labels,
                      FindFashionMnistFile(directory, "t10k-labels-idx1-ubyte"));
  DatasetSplits splits;
  VF_ASSIGN_OR_RETURN(splits.train, LoadIdx(train_images, train_labels, kClasses));
  VF_ASSIGN_OR_RETURN(splits.test, LoadIdx(test_images, test_labels, kClasses));
  if (splits.train.rows != splits.test.rows || splits.train.cols != splits.test.cols) {
    return DataLoss(test_images + ": images are " + std::to_string(splits.test.rows) + "x" +
                    std::to_string(splits.test.cols) + " but the training images are " +
                    std::to_string(splits.train.rows) + "x" + std::to_string(splits.train.cols));
  }
  return splits;
}

DatasetSplits MakeSyntheticDataset(int64_t train_count, int64_t test_count, int rows, int cols,
                                   int num_classes, uint64_t seed) {
  assert(train_count >= 0 && test_count >= 0 && rows > 0 && cols > 0);
  assert(num_classes >= 1 && num_classes <= 256);
  const size_t size = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  std::vector<uint8_t> templates(static_cast<size_t>(num_classes) * size);
  for (int c = 0; c < num_classes; ++c) {
    CounterRng rng(MixKey(seed, kTemplateStream, static_cast<uint64_t>(c)));
    for (size_t p = 0; p < size; ++p) {
      templates[static_cast<size_t>(c) * size + p] = static_cast<uint8_t>(rng.Below(256));
    }
  }
  DatasetSplits splits;
  splits.train = MakeSyntheticSplit(train_count, rows, cols, num_classes, seed, 0, templates);
  splits.test = MakeSyntheticSplit(test_count, rows, cols, num_classes, seed, 1, templates);
  return splits;
}

Sharder::Sharder(uint64_t seed, int64_t dataset_size, int64_t global_batch, int virtual_nodes)
    : seed_(seed),
      dataset_size_(dataset_size),
      global_batch_(global_batch),
      virtual_nodes_(virtual_nodes),
      micro_batch_(global_batch / virtual_nodes),
      steps_per_epoch_(dataset_size / global_batch) {
  assert(Check(dataset_size, global_batch, virtual_nodes).ok());
}

Status Sharder::Check(int64_t dataset_size, int64_t global_batch, int virtual_nodes) {
  if (dataset_size < 1) return InvalidArgument("the training set is empty");
  if (global_batch < 1) {
    return InvalidArgument("global batch must be positive, got " + std::to_string(global_batch));
  }
  if (virtual_nodes < 1) {
    return InvalidArgument("virtual nodes must be positive, got " + std::to_string(virtual_nodes));
  }
  if (global_batch > dataset_size) {
    return InvalidArgument("global batch " + std::to_string(global_batch) +
                           " is larger than the training set (" + std::to_string(dataset_size) +
                           " samples)");
  }
  if (global_batch % virtual_nodes != 0) {
    return InvalidArgument("global batch " + std::to_string(global_batch) +
                           " is not divisible by " + std::to_string(virtual_nodes) +
                           " virtual nodes");
  }
  return Status::Ok();
}

void Sharder::MicroBatch(int64_t step, int vnode, std::vector<int64_t>* indices) {
  assert(step >= 0 && vnode >= 0 && vnode < virtual_nodes_);
  const int64_t epoch = step / steps_per_epoch_;
  if (epoch != cached_epoch_) {
    cached_permutation_ = Permutation(epoch);
    cached_epoch_ = epoch;
  }
  const int64_t begin = (step % steps_per_epoch_) * global_batch_ + vnode * micro_batch_;
  indices->assign(cached_permutation_.begin() + begin,
                  cached_permutation_.begin() + begin + micro_batch_);
}

std::vector<int64_t> Sharder::Permutation(int64_t epoch) const {
  std::vector<int64_t> perm(static_cast<size_t>(dataset_size_));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  CounterRng rng(MixKey(seed_, kPermutationStream, static_cast<uint64_t>(epoch)));
  for (size_t n = perm.size(); n > 1; --n) {
    const auto j = static_cast<size_t>(rng.Below(n));
    std::swap(perm[n - 1], perm[j]);
  }
  return perm;
}

uint64_t MixKey(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  // A distinct odd multiplier per position keeps (a, b) and (b, a) apart; finalizing after
  // each word makes every word affect every output bit.
  uint64_t h = SplitMix64Finalize(seed ^ 0x243f6a8885a308d3ULL);
  h = SplitMix64Finalize(h ^ (a * 0x9e3779b97f4a7c15ULL));
  h = SplitMix64Finalize(h ^ (b * 0xc2b2ae3d27d4eb4fULL));
  h = SplitMix64Finalize(h ^ (c * 0x165667b19e3779f9ULL));
  return h;
}

uint64_t CounterRng::Next() { return SplitMix64Finalize(key_ + counter_++ * kGoldenGamma); }

uint64_t CounterRng::Below(uint64_t bound) {
  assert(bound > 0);
  // Lemire, "Fast Random Integer Generation in an Interval" (2019): the high word of x * bound
  // is uniform once the low words below 2^64 mod bound are rejected.
  unsigned __int128 m = static_cast<unsigned __int128>(Next()) * bound;
  auto low = static_cast<uint64_t>(m);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(Next()) * bound;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

float CounterRng::Uniform() { return static_cast<float>(Next() >> 40) * 0x1p-24f; }

}  // namespace vf
