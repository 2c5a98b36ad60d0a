// Fuzz target: the IDX reader (Fashion-MNIST's format, gzip or plain) that loads whatever files
// a job's data directory holds. Any bytes must give a dataset that keeps its promises (sizes
// and label range) or an error, never a crash or an out-of-bounds read.
//
// Input layout: 4 bytes little-endian length n, then n bytes of the image file, then the label
// file. The two files are written to a private temporary folder, because the reader's contract
// is a path (zlib reads it).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "runtime/data/dataset.h"

namespace {

// The folder the two files go to: made once per process, removed at its exit.
class TempFolder {
 public:
  TempFolder() {
    // Memory-backed where the machine has it: the files are rewritten for every input.
    path_ = access("/dev/shm", W_OK) == 0 ? "/dev/shm/vf-dataset-fuzz-XXXXXX"
                                          : "/tmp/vf-dataset-fuzz-XXXXXX";
    if (mkdtemp(path_.data()) == nullptr) std::abort();
  }
  ~TempFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

const std::string& Folder() {
  static const TempFolder folder;
  return folder.path();
}

void WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  size_t images_size = static_cast<size_t>(data[0]) | static_cast<size_t>(data[1]) << 8 |
                       static_cast<size_t>(data[2]) << 16 | static_cast<size_t>(data[3]) << 24;
  data += 4;
  size -= 4;
  if (images_size > size) images_size = size;
  const std::string images = Folder() + "/images";
  const std::string labels = Folder() + "/labels";
  WriteFile(images, data, images_size);
  WriteFile(labels, data + images_size, size - images_size);
  vf::Result<vf::Dataset> set = vf::LoadIdx(images, labels, 10);
  if (set.ok()) {
    // The promises every caller relies on.
    if (set->images.size() != static_cast<size_t>(set->count) * set->sample_size())
      __builtin_trap();
    if (set->labels.size() != static_cast<size_t>(set->count)) __builtin_trap();
    for (uint8_t label : set->labels) {
      if (label >= set->num_classes) __builtin_trap();
    }
  }
  return 0;
}
