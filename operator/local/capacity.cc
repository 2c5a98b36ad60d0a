#include "operator/local/capacity.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace vf {

CapacitySchedule CapacitySchedule::Constant(int slots) {
  CapacitySchedule s;
  s.entries_.push_back({0, slots});
  return s;
}

Result<CapacitySchedule> CapacitySchedule::Parse(const std::string& text) {
  CapacitySchedule s;
  std::stringstream in(text);
  std::string item;
  bool first = true;
  while (std::getline(in, item, ',')) {
    const std::string where = "--capacity entry '" + item + "'";
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      return InvalidArgument(where + ": expected AT:SLOTS, e.g. 150:4 or 30s:4");
    }
    std::string at = item.substr(0, colon);
    const std::string slots = item.substr(colon + 1);
    const bool seconds = !at.empty() && at.back() == 's';
    if (seconds) at.pop_back();
    if (first) {
      s.by_seconds_ = seconds;
    } else if (seconds != s.by_seconds_) {
      return InvalidArgument(where + ": mixes steps and seconds");
    }
    char* end = nullptr;
    const double at_value = std::strtod(at.c_str(), &end);
    if (at.empty() || *end != '\0' || at_value < 0) {
      return InvalidArgument(where + ": '" + at + "' is not a step or a number of seconds");
    }
    const long slot_value = std::strtol(slots.c_str(), &end, 10);
    if (slots.empty() || *end != '\0' || slot_value < 0 || slot_value > 4096) {
      return InvalidArgument(where + ": '" + slots + "' is not a slot count (0..4096)");
    }
    if (first && at_value != 0) {
      return InvalidArgument(where + ": the schedule must start at 0");
    }
    if (!first && at_value <= s.entries_.back().at) {
      return InvalidArgument(where + ": times must increase");
    }
    s.entries_.push_back({at_value, static_cast<int>(slot_value)});
    first = false;
  }
  if (s.entries_.empty()) return InvalidArgument("--capacity is empty");
  if (s.Max() == 0) return InvalidArgument("--capacity never gives the job a slot");
  return s;
}

int CapacitySchedule::At(int64_t step, double seconds) const {
  const double x = by_seconds_ ? seconds : static_cast<double>(step);
  int slots = entries_.front().slots;
  for (const auto& e : entries_) {
    if (e.at <= x) slots = e.slots;
  }
  return slots;
}

int CapacitySchedule::Max() const {
  int m = 0;
  for (const auto& e : entries_) m = std::max(m, e.slots);
  return m;
}

std::string CapacitySchedule::ToString() const {
  std::string out;
  for (const auto& e : entries_) {
    if (!out.empty()) out += ",";
    std::ostringstream at;
    at << e.at;
    out += at.str() + (by_seconds_ ? "s" : "") + ":" + std::to_string(e.slots);
  }
  return out;
}

}  // namespace vf
