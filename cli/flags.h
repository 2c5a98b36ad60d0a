// Command-line flags for `vf` and `virtualflow-agent`.
//
// Hand-written (a few dozen lines) rather than CLI11 or cxxopts so the agent builds on GPU
// machines that have only a compiler, CMake, CUDA and NCCL.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace vf {

// Parses a flag's comma-separated list of numbers, each in [lo, hi] and, when `whole`, an
// integer: kInvalidArgument naming the flag and the bad item otherwise, or when it is empty.
Result<std::vector<double>> ParseNumberList(const std::string& flag, const std::string& text,
                                            double lo, double hi, bool whole = false);

// Declares flags bound to variables, parses argv, and renders --help. Not thread-safe.
class FlagParser {
 public:
  explicit FlagParser(std::string usage) : usage_(std::move(usage)) {}

  void AddString(const std::string& name, std::string* out, const std::string& help);
  void AddInt(const std::string& name, int64_t* out, const std::string& help);
  void AddDouble(const std::string& name, double* out, const std::string& help);
  void AddBool(const std::string& name, bool* out, const std::string& help);

  // Parses argv[start..]: "--name value", "--name=value", "--flag" for booleans; anything else
  // is positional. Unknown flags and bad values are kInvalidArgument naming the flag.
  Result<std::vector<std::string>> Parse(int argc, char** argv, int start);
  bool help_requested() const { return help_; }
  std::string Help() const;

 private:
  enum class Kind { kString, kInt, kDouble, kBool };
  struct Flag {
    std::string name;
    Kind kind;
    void* out;
    std::string help;
  };
  Status Set(const Flag& f, const std::string& value);

  std::string usage_;
  std::vector<Flag> flags_;
  bool help_ = false;
};

}  // namespace vf
