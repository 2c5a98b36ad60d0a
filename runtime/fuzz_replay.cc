// A main() for the fuzz targets in the gcc build: runs every file of the given folders (the
// committed seed corpus) through LLVMFuzzerTestOneInput once, under the sanitizers the target
// is built with. libFuzzer itself needs clang; this keeps the corpus a regression test on any
// compiler. Exits non-zero on an empty corpus, so a corpus that went missing is noticed.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i) {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(argv[i], error)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
    if (error) {
      std::cerr << "fuzz replay: " << argv[i] << ": " << error.message() << "\n";
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::cerr << "fuzz replay: no corpus files in the given folders\n";
    return 2;
  }
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::cout << "fuzz replay: " << files.size() << " inputs ran clean\n";
  return 0;
}
