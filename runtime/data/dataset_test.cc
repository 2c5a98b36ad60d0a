#include "runtime/data/dataset.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace vf {
namespace {

namespace fs = std::filesystem;

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// A directory of its own for each test, removed afterwards. Not thread-safe.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "vf_data_test.XXXXXX").string();
    char* made = mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr) << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void PutBigEndian32(std::vector<uint8_t>* out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out->push_back(static_cast<uint8_t>(v >> shift));
}

std::vector<uint8_t> ImageFile(uint32_t count, uint32_t rows, uint32_t cols,
                               const std::vector<uint8_t>& pixels, uint32_t magic = 0x803) {
  std::vector<uint8_t> out;
  PutBigEndian32(&out, magic);
  PutBigEndian32(&out, count);
  PutBigEndian32(&out, rows);
  PutBigEndian32(&out, cols);
  out.insert(out.end(), pixels.begin(), pixels.end());
  return out;
}

std::vector<uint8_t> LabelFile(const std::vector<uint8_t>& labels, uint32_t magic = 0x801) {
  std::vector<uint8_t> out;
  PutBigEndian32(&out, magic);
  PutBigEndian32(&out, static_cast<uint32_t>(labels.size()));
  out.insert(out.end(), labels.begin(), labels.end());
  return out;
}

void WritePlain(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void WriteGzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::vector<uint8_t> bytes(static_cast<size_t>(fs::file_size(path)));
  std::ifstream f(path, std::ios::binary);
  f.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(f.good()) << path;
  return bytes;
}

std::vector<uint8_t> Pixels(size_t n) {
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(i * 7 + 3);
  return p;
}

// Three 2x3 images labelled 2, 0, 1.
struct SmallFiles {
  std::vector<uint8_t> pixels = Pixels(18);
  std::vector<uint8_t> images = ImageFile(3, 2, 3, pixels);
  std::vector<uint8_t> labels = LabelFile({2, 0, 1});
};

void ExpectError(const Status& s, StatusCode code, const std::string& must_contain) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(must_contain), std::string::npos)
      << "message: " << s.message() << "\nexpected to contain: " << must_contain;
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << "not one line: " << s.message();
}

TEST(LoadIdx, ReadsPlainFiles) {
  TempDir dir;
  SmallFiles files;
  WritePlain(dir.File("i"), files.images);
  WritePlain(dir.File("l"), files.labels);
  Result<Dataset> d = LoadIdx(dir.File("i"), dir.File("l"), 3);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->count, 3);
  EXPECT_EQ(d->rows, 2);
  EXPECT_EQ(d->cols, 3);
  EXPECT_EQ(d->num_classes, 3);
  EXPECT_EQ(d->sample_size(), 6u);
  EXPECT_EQ(d->images, files.pixels);
  EXPECT_EQ(d->labels, (std::vector<uint8_t>{2, 0, 1}));
}

TEST(LoadIdx, ReadsGzipFiles) {
  TempDir dir;
  SmallFiles files;
  WriteGzip(dir.File("i.gz"), files.images);
  WriteGzip(dir.File("l.gz"), files.labels);
  Result<Dataset> d = LoadIdx(dir.File("i.gz"), dir.File("l.gz"), 3);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->count, 3);
  EXPECT_EQ(d->images, files.pixels);
  EXPECT_EQ(d->labels, (std::vector<uint8_t>{2, 0, 1}));
}

TEST(LoadIdx, ReadsDataLargerThanOneReadChunk) {
  TempDir dir;
  const uint32_t count = 3000;  // 3000 * 28 * 28 bytes: several internal read chunks
  std::vector<uint8_t> pixels = Pixels(size_t{count} * 28 * 28);
  std::vector<uint8_t> labels(count);
  for (uint32_t i = 0; i < count; ++i) labels[i] = static_cast<uint8_t>(i % 10);
  WriteGzip(dir.File("i.gz"), ImageFile(count, 28, 28, pixels));
  WriteGzip(dir.File("l.gz"), LabelFile(labels));
  Result<Dataset> d = LoadIdx(dir.File("i.gz"), dir.File("l.gz"), 10);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->images, pixels);
  EXPECT_EQ(d->labels, labels);
}

TEST(LoadIdx, MissingFileIsNotFound) {
  TempDir dir;
  SmallFiles files;
  WritePlain(dir.File("l"), files.labels);
  Result<Dataset> d = LoadIdx(dir.File("absent"), dir.File("l"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kNotFound, dir.File("absent") + ": no such file");

  WritePlain(dir.File("i"), files.images);
  d = LoadIdx(dir.File("i"), dir.File("absent-labels"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kNotFound, dir.File("absent-labels") + ": no such file");
}

TEST(LoadIdx, BadMagicIsDataLoss) {
  TempDir dir;
  SmallFiles files;
  // A label file where the image file should be, and the other way round.
  WritePlain(dir.File("i"), files.images);
  WritePlain(dir.File("l"), files.labels);
  Result<Dataset> d = LoadIdx(dir.File("l"), dir.File("l"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss, dir.File("l") + ": bad magic 0x00000801");
  d = LoadIdx(dir.File("i"), dir.File("i"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss, dir.File("i") + ": bad magic 0x00000803");
}

TEST(LoadIdx, TruncatedImageDataIsDataLoss) {
  TempDir dir;
  SmallFiles files;
  files.images.pop_back();
  WritePlain(dir.File("i"), files.images);
  WriteGzip(dir.File("i.gz"), files.images);
  WritePlain(dir.File("l"), files.labels);
  for (const char* name : {"i", "i.gz"}) {
    Result<Dataset> d = LoadIdx(dir.File(name), dir.File("l"), 3);
    ASSERT_FALSE(d.ok());
    ExpectError(
        d.status(), StatusCode::kDataLoss,
        std::string(dir.File(name)) + ": truncated: expected 18 bytes of image data, found 17");
  }
}

TEST(LoadIdx, TruncatedHeaderIsDataLoss) {
  TempDir dir;
  SmallFiles files;
  WritePlain(dir.File("i"), std::vector<uint8_t>(files.images.begin(), files.images.begin() + 10));
  WritePlain(dir.File("l"), files.labels);
  Result<Dataset> d = LoadIdx(dir.File("i"), dir.File("l"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss,
              dir.File("i") + ": truncated: expected 16 bytes of IDX header, found 10");
}

TEST(LoadIdx, TruncatedLabelDataIsDataLoss) {
  TempDir dir;
  SmallFiles files;
  files.labels.pop_back();
  WritePlain(dir.File("i"), files.images);
  WritePlain(dir.File("l"), files.labels);
  Result<Dataset> d = LoadIdx(dir.File("i"), dir.File("l"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss,
              dir.File("l") + ": truncated: expected 3 bytes of label data, found 2");
}

TEST(LoadIdx, TrailingBytesAreDataLoss) {
  TempDir dir;
  SmallFiles files;
  std::vector<uint8_t> longer = files.images;
  longer.insert(longer.end(), {1, 2, 3, 4, 5});
  WritePlain(dir.File("i"), longer);
  WriteGzip(dir.File("i.gz"), longer);
  WritePlain(dir.File("l"), files.labels);
  for (const char* name : {"i", "i.gz"}) {
    Result<Dataset> d = LoadIdx(dir.File(name), dir.File("l"), 3);
    ASSERT_FALSE(d.ok());
    ExpectError(
        d.status(), StatusCode::kDataLoss,
        std::string(dir.File(name)) + ": 5 unexpected bytes after the 18 bytes of image data");
  }
  std::vector<uint8_t> longer_labels = files.labels;
  longer_labels.push_back(0);
  WritePlain(dir.File("l2"), longer_labels);
  WritePlain(dir.File("i"), files.images);
  Result<Dataset> d = LoadIdx(dir.File("i"), dir.File("l2"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss,
              dir.File("l2") + ": 1 unexpected bytes after the 3 bytes of label data");
}

TEST(LoadIdx, CorruptGzipStreamIsDataLoss) {
  TempDir dir;
  const uint32_t count = 200;
  std::vector<uint8_t> pixels(size_t{count} * 16 * 16);
  // Pseudo-random bytes compress poorly, so the deflate stream is long and mostly payload.
  uint32_t x = 12345;
  for (uint8_t& p : pixels) {
    x = x * 1664525u + 1013904223u;
    p = static_cast<uint8_t>(x >> 24);
  }
  WriteGzip(dir.File("i.gz"), ImageFile(count, 16, 16, pixels));
  WritePlain(dir.File("l"), LabelFile(std::vector<uint8_t>(count, 0)));
  std::string path = dir.File("i.gz");
  std::vector<uint8_t> gz = ReadBytes(path);
  ASSERT_GT(gz.size(), 1000u);
  for (size_t i = gz.size() / 2; i < gz.size() / 2 + 16; ++i) gz[i] ^= 0x5a;
  WritePlain(path, gz);
  Result<Dataset> d = LoadIdx(path, dir.File("l"), 1);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss, path + ": corrupt gzip stream: ");
}

TEST(LoadIdx, GzipFileCutShortIsDataLoss) {
  TempDir dir;
  SmallFiles files;
  WriteGzip(dir.File("i.gz"), files.images);
  WritePlain(dir.File("l"), files.labels);
  std::vector<uint8_t> gz = ReadBytes(dir.File("i.gz"));
  ASSERT_GT(gz.size(), 20u);
  gz.erase(gz.end() - 6, gz.end());  // inside the CRC and length trailer
  WritePlain(dir.File("i.gz"), gz);
  Result<Dataset> d = LoadIdx(dir.File("i.gz"), dir.File("l"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss, dir.File("i.gz") + ": corrupt gzip stream: ");
}

TEST(LoadIdx, LabelOutOfRangeIsDataLoss) {
  TempDir dir;
  SmallFiles files;
  WritePlain(dir.File("i"), files.images);
  WritePlain(dir.File("l"), LabelFile({2, 7, 1}));
  Result<Dataset> d = LoadIdx(dir.File("i"), dir.File("l"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss,
              dir.File("l") + ": label 7 at index 1 is out of range for 3 classes");
}

TEST(LoadIdx, LabelCountMismatchIsDataLoss) {
  TempDir dir;
  SmallFiles files;
  WritePlain(dir.File("i"), files.images);
  WritePlain(dir.File("l"), LabelFile({2, 0}));
  Result<Dataset> d = LoadIdx(dir.File("i"), dir.File("l"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss,
              dir.File("l") + ": 2 labels for the 3 images in " + dir.File("i"));
}

TEST(LoadIdx, ImplausibleDimensionsAreDataLoss) {
  TempDir dir;
  SmallFiles files;
  WritePlain(dir.File("l"), files.labels);
  WritePlain(dir.File("zero-rows"), ImageFile(3, 0, 3, {}));
  WritePlain(dir.File("huge-cols"), ImageFile(3, 2, 5000, {}));
  WritePlain(dir.File("no-images"), ImageFile(0, 2, 3, {}));
  for (const char* name : {"zero-rows", "huge-cols"}) {
    Result<Dataset> d = LoadIdx(dir.File(name), dir.File("l"), 3);
    ASSERT_FALSE(d.ok());
    ExpectError(d.status(), StatusCode::kDataLoss,
                std::string(dir.File(name)) + ": implausible image size");
  }
  Result<Dataset> d = LoadIdx(dir.File("no-images"), dir.File("l"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(d.status(), StatusCode::kDataLoss, dir.File("no-images") + ": the file declares 0");
}

TEST(LoadIdx, HugeDeclaredCountIsTruncationNotAnAllocation) {
  TempDir dir;
  SmallFiles files;
  // Claims 2^32-1 images of 4096x4096 (2^56 bytes) but holds 18.
  WritePlain(dir.File("i"), ImageFile(0xffffffffu, 4096, 4096, files.pixels));
  WritePlain(dir.File("l"), files.labels);
  Result<Dataset> d = LoadIdx(dir.File("i"), dir.File("l"), 3);
  ASSERT_FALSE(d.ok());
  ExpectError(
      d.status(), StatusCode::kDataLoss,
      dir.File("i") + ": truncated: expected 72057594021150720 bytes of image data, found 18");
}

TEST(LoadIdx, InvalidClassCountIsInvalidArgument) {
  TempDir dir;
  SmallFiles files;
  WritePlain(dir.File("i"), files.images);
  WritePlain(dir.File("l"), files.labels);
  EXPECT_EQ(LoadIdx(dir.File("i"), dir.File("l"), 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadIdx(dir.File("i"), dir.File("l"), 257).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(LoadFashionMnist, LoadsDebianDataset) {
  ASSERT_TRUE(fs::is_directory(kFashionMnistDir))
      << kFashionMnistDir << " is missing: install the Debian package dataset-fashion-mnist";
  Result<DatasetSplits> splits = LoadFashionMnist(kFashionMnistDir);
  ASSERT_TRUE(splits.ok()) << splits.status().ToString();
  const Dataset& train = splits->train;
  const Dataset& test = splits->test;
  EXPECT_EQ(train.count, 60000);
  EXPECT_EQ(test.count, 10000);
  for (const Dataset* d : {&train, &test}) {
    EXPECT_EQ(d->rows, 28);
    EXPECT_EQ(d->cols, 28);
    EXPECT_EQ(d->num_classes, 10);
    EXPECT_EQ(d->images.size(), static_cast<size_t>(d->count) * 784);
    EXPECT_EQ(d->labels.size(), static_cast<size_t>(d->count));
  }
  std::vector<int> train_per_class(10), test_per_class(10);
  for (uint8_t l : train.labels) ++train_per_class.at(l);
  for (uint8_t l : test.labels) ++test_per_class.at(l);
  EXPECT_EQ(train_per_class, std::vector<int>(10, 6000));
  EXPECT_EQ(test_per_class, std::vector<int>(10, 1000));
  // The published first samples: an ankle boot (9) in both splits.
  EXPECT_EQ(std::vector<uint8_t>(train.labels.begin(), train.labels.begin() + 4),
            (std::vector<uint8_t>{9, 0, 0, 3}));
  EXPECT_EQ(std::vector<uint8_t>(test.labels.begin(), test.labels.begin() + 4),
            (std::vector<uint8_t>{9, 2, 1, 1}));
  EXPECT_EQ(std::accumulate(train.images.begin(), train.images.begin() + 784, 0), 76247);
}

TEST(LoadFashionMnist, AcceptsUncompressedFilesAndPrefersGzip) {
  TempDir dir;
  SmallFiles files;
  WritePlain(dir.File("train-images-idx3-ubyte"), files.images);
  WritePlain(dir.File("train-labels-idx1-ubyte"), LabelFile({9, 0, 1}));
  WritePlain(dir.File("t10k-images-idx3-ubyte"), ImageFile(1, 2, 3, Pixels(6)));
  WritePlain(dir.File("t10k-labels-idx1-ubyte"), LabelFile({5}));
  Result<DatasetSplits> splits = LoadFashionMnist(dir.path());
  ASSERT_TRUE(splits.ok()) << splits.status().ToString();
  EXPECT_EQ(splits->train.count, 3);
  EXPECT_EQ(splits->train.num_classes, 10);
  EXPECT_EQ(splits->test.labels, std::vector<uint8_t>{5});

  WriteGzip(dir.File("t10k-labels-idx1-ubyte.gz"), LabelFile({4}));
  splits = LoadFashionMnist(dir.path());
  ASSERT_TRUE(splits.ok()) << splits.status().ToString();
  EXPECT_EQ(splits->test.labels, std::vector<uint8_t>{4});
}

TEST(LoadFashionMnist, MissingFileNamesThePackage) {
  TempDir dir;
  SmallFiles files;
  WriteGzip(dir.File("train-images-idx3-ubyte.gz"), files.images);
  Result<DatasetSplits> splits = LoadFashionMnist(dir.path());
  ASSERT_FALSE(splits.ok());
  ExpectError(splits.status(), StatusCode::kNotFound,
              dir.path() +
                  ": Fashion-MNIST file train-labels-idx1-ubyte[.gz] not found (install Debian's "
                  "dataset-fashion-mnist)");
}

TEST(LoadFashionMnist, ErrorInAFileNamesThatFile) {
  TempDir dir;
  SmallFiles files;
  WritePlain(dir.File("train-images-idx3-ubyte"), files.images);
  WritePlain(dir.File("train-labels-idx1-ubyte"), LabelFile({9, 0, 1}));
  WritePlain(dir.File("t10k-images-idx3-ubyte"), ImageFile(1, 2, 3, Pixels(6)));
  WritePlain(dir.File("t10k-labels-idx1-ubyte"), LabelFile({10}));
  Result<DatasetSplits> splits = LoadFashionMnist(dir.path());
  ASSERT_FALSE(splits.ok());
  ExpectError(splits.status(), StatusCode::kDataLoss,
              dir.File("t10k-labels-idx1-ubyte") + ": label 10 at index 0");
}

TEST(Synthetic, IsDeterministicPerSeed) {
  DatasetSplits a = MakeSyntheticDataset(50, 20, 4, 5, 3, 77);
  DatasetSplits b = MakeSyntheticDataset(50, 20, 4, 5, 3, 77);
  DatasetSplits c = MakeSyntheticDataset(50, 20, 4, 5, 3, 78);
  EXPECT_EQ(a.train.images, b.train.images);
  EXPECT_EQ(a.train.labels, b.train.labels);
  EXPECT_EQ(a.test.images, b.test.images);
  EXPECT_EQ(a.test.labels, b.test.labels);
  EXPECT_NE(a.train.images, c.train.images);
  EXPECT_NE(a.train.images, a.test.images);  // the splits are different samples
}

TEST(Synthetic, HasTheRequestedShapeAndValidLabels) {
  DatasetSplits s = MakeSyntheticDataset(300, 40, 7, 9, 4, 1);
  EXPECT_EQ(s.train.count, 300);
  EXPECT_EQ(s.test.count, 40);
  for (const Dataset* d : {&s.train, &s.test}) {
    EXPECT_EQ(d->rows, 7);
    EXPECT_EQ(d->cols, 9);
    EXPECT_EQ(d->num_classes, 4);
    EXPECT_EQ(d->images.size(), static_cast<size_t>(d->count) * 63);
    EXPECT_EQ(d->labels.size(), static_cast<size_t>(d->count));
  }
  std::set<uint8_t> seen(s.train.labels.begin(), s.train.labels.end());
  EXPECT_EQ(seen, (std::set<uint8_t>{0, 1, 2, 3}));
}

TEST(Synthetic, IsLearnableByNearestClassMean) {
  const int classes = 10;
  DatasetSplits s = MakeSyntheticDataset(2000, 500, 8, 8, classes, 5);
  const size_t size = s.train.sample_size();
  std::vector<double> mean(classes * size, 0.0);
  std::vector<int> n(classes, 0);
  for (int64_t i = 0; i < s.train.count; ++i) {
    const int l = s.train.labels[static_cast<size_t>(i)];
    ++n[static_cast<size_t>(l)];
    for (size_t p = 0; p < size; ++p) {
      mean[static_cast<size_t>(l) * size + p] += s.train.images[static_cast<size_t>(i) * size + p];
    }
  }
  for (int c = 0; c < classes; ++c) {
    ASSERT_GT(n[static_cast<size_t>(c)], 0);
    for (size_t p = 0; p < size; ++p) {
      mean[static_cast<size_t>(c) * size + p] /= n[static_cast<size_t>(c)];
    }
  }
  int correct = 0;
  for (int64_t i = 0; i < s.test.count; ++i) {
    int best = -1;
    double best_distance = 0;
    for (int c = 0; c < classes; ++c) {
      double distance = 0;
      for (size_t p = 0; p < size; ++p) {
        double diff = s.test.images[static_cast<size_t>(i) * size + p] -
                      mean[static_cast<size_t>(c) * size + p];
        distance += diff * diff;
      }
      if (best < 0 || distance < best_distance) {
        best = c;
        best_distance = distance;
      }
    }
    if (best == s.test.labels[static_cast<size_t>(i)]) ++correct;
  }
  EXPECT_GT(correct, 475) << "nearest-mean accuracy " << correct << "/500";
}

TEST(CounterRng, MatchesTheReferenceSequence) {
  // Values from an independent implementation of the same definitions; a change here changes
  // every job's data order, so it must be deliberate.
  EXPECT_EQ(MixKey(42, 1, 2, 3), 0x7420c438ecbe341dULL);
  CounterRng rng(MixKey(7, 0));
  EXPECT_EQ(rng.Next(), 0x924419b8726d8526ULL);
  EXPECT_EQ(rng.Next(), 0x61c3e8a4f5d5cfe7ULL);
  EXPECT_EQ(rng.Next(), 0xe860b06ea5b19f2eULL);
  CounterRng below(MixKey(7, 0));
  std::vector<uint64_t> draws;
  for (int i = 0; i < 10; ++i) draws.push_back(below.Below(10));
  EXPECT_EQ(draws, (std::vector<uint64_t>{5, 3, 9, 6, 0, 7, 3, 5, 5, 5}));
}

TEST(CounterRng, IsAFunctionOfTheKeyOnly) {
  CounterRng a(MixKey(1, 2, 3)), b(MixKey(1, 2, 3)), c(MixKey(1, 3, 2));
  for (int i = 0; i < 100; ++i) {
    uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    EXPECT_NE(x, c.Next());
  }
  EXPECT_NE(MixKey(0, 0), MixKey(0, 1));
  EXPECT_NE(MixKey(0, 0, 0, 0), MixKey(0, 0, 0, 1));
  EXPECT_NE(MixKey(1, 0), MixKey(0, 1));
}

TEST(CounterRng, BelowIsInRangeAndRoughlyUniform) {
  CounterRng rng(MixKey(99, 1));
  const int buckets = 10;
  const int draws = 100000;
  std::vector<int> count(buckets, 0);
  for (int i = 0; i < draws; ++i) {
    uint64_t x = rng.Below(buckets);
    ASSERT_LT(x, static_cast<uint64_t>(buckets));
    ++count[x];
  }
  double chi2 = 0;
  const double expected = static_cast<double>(draws) / buckets;
  for (int c : count) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 27.88) << "chi-square with 9 degrees of freedom, p = 0.001";

  EXPECT_EQ(rng.Below(1), 0u);
  // A bound just over 2^63 rejects almost half of all draws: the rejection path must still
  // return values in range and reach both halves.
  const uint64_t big = (uint64_t{1} << 63) + 12345;
  bool upper_half = false;
  for (int i = 0; i < 1000; ++i) {
    uint64_t x = rng.Below(big);
    ASSERT_LT(x, big);
    upper_half |= x >= big / 2;
  }
  EXPECT_TRUE(upper_half);
}

TEST(CounterRng, BelowIsUnbiasedForLargeBounds) {
  // For bound = 3 * 2^62 a multiply-shift without rejection maps two of every four 64-bit draws
  // to multiples of 3, so they would come up half of the time instead of a third.
  const uint64_t bound = uint64_t{3} << 62;
  CounterRng rng(MixKey(17, 4));
  const int draws = 30000;
  int multiples_of_three = 0;
  for (int i = 0; i < draws; ++i) {
    uint64_t x = rng.Below(bound);
    ASSERT_LT(x, bound);
    if (x % 3 == 0) ++multiples_of_three;
  }
  EXPECT_NEAR(static_cast<double>(multiples_of_three) / draws, 1.0 / 3, 0.015);
}

TEST(CounterRng, UniformIsInTheUnitInterval) {
  CounterRng rng(MixKey(3, 4));
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    float u = rng.Uniform();
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

bool IsPermutation(std::vector<int64_t> p, int64_t n) {
  std::sort(p.begin(), p.end());
  std::vector<int64_t> identity(static_cast<size_t>(n));
  std::iota(identity.begin(), identity.end(), int64_t{0});
  return p == identity;
}

TEST(Sharder, PermutationIsAPermutation) {
  Sharder s(11, 1000, 100, 4);
  for (int64_t e = 0; e < 3; ++e) EXPECT_TRUE(IsPermutation(s.Permutation(e), 1000)) << e;
  Sharder one(11, 1, 1, 1);
  EXPECT_EQ(one.Permutation(0), std::vector<int64_t>{0});
}

TEST(Sharder, PermutationMatchesTheReference) {
  Sharder s(1234, 20, 4, 2);
  EXPECT_EQ(s.Permutation(0), (std::vector<int64_t>{17, 16, 13, 19, 8,  1, 10, 2, 12, 5,
                                                    4,  18, 9,  7,  14, 6, 15, 3, 0,  11}));
  EXPECT_EQ(s.Permutation(3), (std::vector<int64_t>{8, 4,  12, 19, 5,  18, 7, 9,  17, 13,
                                                    3, 11, 1,  0,  10, 15, 2, 16, 6,  14}));
}

TEST(Sharder, SameSeedAndEpochGiveTheSamePermutation) {
  Sharder a(5, 500, 50, 5);
  Sharder b(5, 500, 50, 5);
  Sharder other_batch(5, 500, 100, 2);  // the order depends on the data, not the batch
  EXPECT_EQ(a.Permutation(2), b.Permutation(2));
  EXPECT_EQ(a.Permutation(2), other_batch.Permutation(2));
  Sharder other_seed(6, 500, 50, 5);
  EXPECT_NE(a.Permutation(2), other_seed.Permutation(2));
}

TEST(Sharder, DifferentEpochsGiveDifferentPermutations) {
  Sharder s(5, 500, 50, 5);
  std::set<std::vector<int64_t>> seen;
  for (int64_t e = 0; e < 10; ++e) seen.insert(s.Permutation(e));
  EXPECT_EQ(seen.size(), 10u);
}

TEST(Sharder, VirtualNodeSlicesPartitionTheStep) {
  Sharder s(8, 103, 20, 4);
  EXPECT_EQ(s.micro_batch(), 5);
  std::vector<int64_t> perm = s.Permutation(0);
  for (int64_t step = 0; step < s.steps_per_epoch(); ++step) {
    std::vector<int64_t> step_samples;
    for (int v = 0; v < 4; ++v) {
      std::vector<int64_t> mb;
      s.MicroBatch(step, v, &mb);
      ASSERT_EQ(mb.size(), 5u);
      step_samples.insert(step_samples.end(), mb.begin(), mb.end());
    }
    // In order, the slices are exactly the step's B samples of the permutation.
    EXPECT_EQ(step_samples,
              std::vector<int64_t>(perm.begin() + step * 20, perm.begin() + (step + 1) * 20));
  }
}

TEST(Sharder, AnEpochNeverRepeatsASampleAndDropsTheTail) {
  Sharder s(8, 103, 20, 4);
  EXPECT_EQ(s.steps_per_epoch(), 5);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    for (int64_t step = epoch * 5; step < (epoch + 1) * 5; ++step) {
      EXPECT_EQ(s.EpochOf(step), epoch);
      for (int v = 0; v < 4; ++v) {
        std::vector<int64_t> mb;
        s.MicroBatch(step, v, &mb);
        for (int64_t i : mb) {
          EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " repeated in epoch " << epoch;
          EXPECT_GE(i, 0);
          EXPECT_LT(i, 103);
        }
      }
    }
    EXPECT_EQ(seen.size(), 100u);
  }
}

TEST(Sharder, ResultsDoNotDependOnCallOrder) {
  Sharder forward(21, 97, 12, 3);
  Sharder shuffled(21, 97, 12, 3);
  const int64_t steps = 4 * forward.steps_per_epoch();
  std::vector<std::vector<int64_t>> expected;
  for (int64_t step = 0; step < steps; ++step) {
    for (int v = 0; v < 3; ++v) {
      expected.emplace_back();
      forward.MicroBatch(step, v, &expected.back());
    }
  }
  // Jump between epochs in a scrambled order, so the cache is refilled many times.
  CounterRng rng(MixKey(1, 2));
  for (int i = 0; i < 200; ++i) {
    const auto step = static_cast<int64_t>(rng.Below(static_cast<uint64_t>(steps)));
    const auto v = static_cast<int>(rng.Below(3));
    std::vector<int64_t> mb;
    shuffled.MicroBatch(step, v, &mb);
    EXPECT_EQ(mb, expected[static_cast<size_t>(step * 3 + v)]) << "step " << step << " v " << v;
  }
}

TEST(Sharder, CheckRejectsABatchLargerThanTheTrainingSet) {
  Status s = Sharder::Check(60000, 70000, 8);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "global batch 70000 is larger than the training set (60000 samples)");
}

TEST(Sharder, CheckRejectsABatchNotDivisibleByTheVirtualNodes) {
  Status s = Sharder::Check(60000, 100, 8);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "global batch 100 is not divisible by 8 virtual nodes");
}

TEST(Sharder, CheckRejectsNonPositiveSizes) {
  EXPECT_EQ(Sharder::Check(0, 1, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Sharder::Check(10, 0, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Sharder::Check(10, 2, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Sharder::Check(10, -2, 1).code(), StatusCode::kInvalidArgument);
}

TEST(Sharder, CheckAcceptsAValidJob) {
  EXPECT_TRUE(Sharder::Check(60000, 256, 8).ok());
  EXPECT_TRUE(Sharder::Check(60000, 60000, 1).ok());
}

}  // namespace
}  // namespace vf
