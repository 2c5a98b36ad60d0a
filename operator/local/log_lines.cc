#include "operator/local/log_lines.h"

#include <algorithm>
#include <cctype>

namespace vf::local {

std::string WorkerLogName(std::string_view worker) { return std::string(worker) + ".log"; }

bool IsRunLogName(std::string_view file) {
  if (file == kPlansLogName) return true;
  constexpr std::string_view kPrefix = "worker-";
  constexpr std::string_view kSuffix = ".log";
  if (file.size() <= kPrefix.size() + kSuffix.size() || !file.starts_with(kPrefix) ||
      !file.ends_with(kSuffix)) {
    return false;
  }
  const std::string_view number =
      file.substr(kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size());
  return std::all_of(number.begin(), number.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; });
}

std::vector<std::string> TakeLines(std::string& partial, std::string_view chunk, size_t max_line) {
  std::vector<std::string> lines;
  max_line = std::max<size_t>(max_line, 1);
  for (const char c : chunk) {
    if (c == '\n') {
      if (!partial.empty() && partial.back() == '\r') partial.pop_back();
      lines.push_back(std::move(partial));
      partial.clear();
      continue;
    }
    partial.push_back(c);
    if (partial.size() >= max_line) {
      lines.push_back(std::move(partial));
      partial.clear();
    }
  }
  return lines;
}

std::vector<std::string> LastLines(std::string_view text, size_t n) {
  std::vector<std::string> last;
  std::string partial;
  std::vector<std::string> lines = TakeLines(partial, text, text.size() + 1);
  if (!partial.empty()) lines.push_back(partial);
  for (auto it = lines.rbegin(); it != lines.rend() && last.size() < n; ++it) {
    const bool blank = std::all_of(it->begin(), it->end(), [](char c) {
      return std::isspace(static_cast<unsigned char>(c)) != 0;
    });
    if (!blank) last.push_back(*it);
  }
  std::reverse(last.begin(), last.end());
  return last;
}

}  // namespace vf::local
