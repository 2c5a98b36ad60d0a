#include "runtime/metrics/text_format.h"

#include <charconv>
#include <cmath>
#include <cstdint>

namespace vf::metrics {
namespace {

// Integers of up to 53 bits are exact in a double; within that range an integral value is
// written as an integer, whatever its size.
constexpr double kMaxExactInteger = 9007199254740992.0;  // 2^53

// name{a="x",b="y",extra_name="extra_value"} value
void AppendSample(std::string& out, const std::string& name, std::string_view suffix,
                  const std::vector<std::string>& label_names,
                  const std::vector<std::string>& label_values, std::string_view extra_name,
                  std::string_view extra_value, double value) {
  out += name;
  out += suffix;
  const bool has_labels = !label_names.empty() || !extra_name.empty();
  if (has_labels) {
    out += '{';
    bool first = true;
    for (size_t i = 0; i < label_names.size(); ++i) {
      if (!first) out += ',';
      first = false;
      out += label_names[i];
      out += "=\"";
      out += EscapeLabelValue(label_values[i]);
      out += '"';
    }
    if (!extra_name.empty()) {
      if (!first) out += ',';
      out += extra_name;
      out += "=\"";
      out += extra_value;
      out += '"';
    }
    out += '}';
  }
  out += ' ';
  out += FormatValue(value);
  out += '\n';
}

}  // namespace

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::trunc(value) && std::fabs(value) < kMaxExactInteger) {
    return std::to_string(static_cast<int64_t>(value));
  }
  char buffer[64];
  // Without a format argument, to_chars writes the shortest text that reads back as `value`.
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (const char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string SerializeText(const std::vector<FamilySnapshot>& families) {
  std::string out;
  for (const FamilySnapshot& snapshot : families) {
    if (snapshot.children.empty()) continue;
    const FamilyDescriptor& family = snapshot.family;
    out += "# HELP ";
    out += family.name;
    out += ' ';
    out += EscapeHelp(family.help);
    out += "\n# TYPE ";
    out += family.name;
    out += ' ';
    out += MetricTypeName(family.type);
    out += '\n';
    for (const ChildSnapshot& child : snapshot.children) {
      if (family.type != MetricType::kHistogram) {
        AppendSample(out, family.name, "", family.label_names, child.label_values, "", "",
                     child.value);
        continue;
      }
      const Histogram::Snapshot& h = child.histogram;
      for (size_t i = 0; i < h.cumulative.size(); ++i) {
        const std::string le = i < h.bounds.size() ? FormatValue(h.bounds[i]) : "+Inf";
        AppendSample(out, family.name, "_bucket", family.label_names, child.label_values, "le", le,
                     static_cast<double>(h.cumulative[i]));
      }
      AppendSample(out, family.name, "_sum", family.label_names, child.label_values, "", "", h.sum);
      AppendSample(out, family.name, "_count", family.label_names, child.label_values, "", "",
                   static_cast<double>(h.count));
    }
  }
  return out;
}

}  // namespace vf::metrics
