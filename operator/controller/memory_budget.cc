#include "operator/controller/memory_budget.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>

namespace vf::controller {

namespace {

// The suffixes of a Kubernetes quantity and the power of ten or two each stands for.
struct Suffix {
  std::string_view text;
  int base;
  int exponent;
};
constexpr Suffix kSuffixes[] = {{"Ki", 2, 10}, {"Mi", 2, 20}, {"Gi", 2, 30}, {"Ti", 2, 40},
                                {"Pi", 2, 50}, {"Ei", 2, 60}, {"k", 10, 3},  {"M", 10, 6},
                                {"G", 10, 9},  {"T", 10, 12}, {"P", 10, 15}, {"E", 10, 18}};

// "1 MiB" as the smallest budget that lets a coordinator hold anything.
constexpr uint64_t kMinBudget = uint64_t{1} << 20;

std::optional<std::string> ReadFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

}  // namespace

Result<uint64_t> ParseByteQuantity(std::string_view text) {
  const auto invalid = [&text] {
    return InvalidArgument("'" + std::string(text) +
                           "' is not a byte count (digits, optionally with a fraction and a "
                           "suffix Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or E, e.g. 256Mi)");
  };
  // Plain digits, read exactly.
  if (!text.empty() && text.size() <= 19 && std::all_of(text.begin(), text.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      })) {
    uint64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() ||
        value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return invalid();
    }
    return value;
  }
  std::string_view number = text;
  long double scale = 1;
  for (const Suffix& s : kSuffixes) {
    if (number.size() > s.text.size() && number.ends_with(s.text)) {
      number.remove_suffix(s.text.size());
      scale = std::pow(static_cast<long double>(s.base), s.exponent);
      break;
    }
  }
  // Digits, at most one '.', and an exponent (e or E and an integer) only without a suffix.
  size_t exponent_at = std::string_view::npos;
  if (scale == 1) exponent_at = number.find_first_of("eE");
  const std::string_view mantissa = number.substr(0, exponent_at);
  if (mantissa.empty() || mantissa == "." ||
      std::count(mantissa.begin(), mantissa.end(), '.') > 1 ||
      !std::all_of(mantissa.begin(), mantissa.end(), [](char c) {
        return c == '.' || std::isdigit(static_cast<unsigned char>(c));
      })) {
    return invalid();
  }
  if (exponent_at != std::string_view::npos) {
    std::string_view digits = number.substr(exponent_at + 1);
    if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
    if (digits.empty() || digits.size() > 2 ||
        !std::all_of(digits.begin(), digits.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      return invalid();
    }
    scale = std::pow(10.0L, std::stoi(std::string(digits)));
  }
  long double value = 0;
  std::istringstream in{std::string(mantissa)};
  in >> value;
  if (in.fail()) return invalid();
  value = std::ceil(value * scale);
  if (!(value >= 0) || value > static_cast<long double>(std::numeric_limits<int64_t>::max())) {
    return invalid();
  }
  return static_cast<uint64_t>(value);
}

std::optional<uint64_t> CgroupMemoryLimit(const std::string& root) {
  // cgroup v1 writes "no limit" as the largest page-aligned int64; anything at least 2^62 is
  // no limit a container is given.
  constexpr uint64_t kUnlimited = uint64_t{1} << 62;
  for (const std::string& path : {root + "/memory.max", root + "/memory/memory.limit_in_bytes"}) {
    std::optional<std::string> line = ReadFirstLine(path);
    if (!line) continue;
    if (*line == "max") return std::nullopt;
    if (line->empty() || !std::all_of(line->begin(), line->end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        })) {
      continue;
    }
    Result<uint64_t> limit = ParseByteQuantity(*line);
    if (!limit.ok() || *limit >= kUnlimited) return std::nullopt;
    return *limit;
  }
  return std::nullopt;
}

uint64_t CoordinatorMemoryBudget(std::optional<uint64_t> flag,
                                 std::optional<uint64_t> container_limit, uint64_t fallback) {
  uint64_t budget = fallback;
  if (flag) {
    budget = *flag;
  } else if (container_limit) {
    budget = std::min(*container_limit / 2, fallback);
  }
  return std::max(budget, kMinBudget);
}

}  // namespace vf::controller
