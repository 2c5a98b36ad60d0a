#include "cli/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace vf {

Result<std::vector<double>> ParseNumberList(const std::string& flag, const std::string& text,
                                            double lo, double hi, bool whole) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(v >= lo) || v > hi || (whole && v != std::floor(v))) {
      std::ostringstream range;
      range << lo << " and " << hi;
      return InvalidArgument(flag + ": '" + item + "' is not " +
                             (whole ? "an integer" : "a number") + " between " + range.str());
    }
    out.push_back(v);
  }
  if (out.empty()) return InvalidArgument(flag + " is empty");
  return out;
}

void FlagParser::AddString(const std::string& name, std::string* out, const std::string& help) {
  flags_.push_back({name, Kind::kString, out, help});
}
void FlagParser::AddInt(const std::string& name, int64_t* out, const std::string& help) {
  flags_.push_back({name, Kind::kInt, out, help});
}
void FlagParser::AddDouble(const std::string& name, double* out, const std::string& help) {
  flags_.push_back({name, Kind::kDouble, out, help});
}
void FlagParser::AddBool(const std::string& name, bool* out, const std::string& help) {
  flags_.push_back({name, Kind::kBool, out, help});
}

Status FlagParser::Set(const Flag& f, const std::string& value) {
  const std::string bad = "--" + f.name + ": '" + value + "' is not ";
  switch (f.kind) {
    case Kind::kString:
      *static_cast<std::string*>(f.out) = value;
      return Status::Ok();
    case Kind::kInt: {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || errno == ERANGE) {
        return InvalidArgument(bad + "an integer");
      }
      *static_cast<int64_t*>(f.out) = v;
      return Status::Ok();
    }
    case Kind::kDouble: {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !std::isfinite(v)) {
        return InvalidArgument(bad + "a number");
      }
      *static_cast<double*>(f.out) = v;
      return Status::Ok();
    }
    case Kind::kBool:
      if (value == "true" || value == "1") {
        *static_cast<bool*>(f.out) = true;
      } else if (value == "false" || value == "0") {
        *static_cast<bool*>(f.out) = false;
      } else {
        return InvalidArgument(bad + "true or false");
      }
      return Status::Ok();
  }
  return Internal("unreachable flag kind");
}

Result<std::vector<std::string>> FlagParser::Parse(int argc, char** argv, int start) {
  std::vector<std::string> positional;
  for (int i = start; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      positional.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const Flag* flag = nullptr;
    for (const auto& f : flags_) {
      if (f.name == name) flag = &f;
    }
    if (flag == nullptr) return InvalidArgument("unknown flag --" + name + " (see --help)");
    if (!has_value) {
      if (flag->kind == Kind::kBool) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return InvalidArgument("--" + name + " needs a value");
      }
    }
    VF_RETURN_IF_ERROR(Set(*flag, value));
  }
  return positional;
}

std::string FlagParser::Help() const {
  std::ostringstream s;
  s << usage_ << "\n\nOptions:\n";
  for (const auto& f : flags_) {
    std::string left = "  --" + f.name;
    if (f.kind == Kind::kInt) left += " N";
    if (f.kind == Kind::kDouble) left += " X";
    if (f.kind == Kind::kString) left += " VALUE";
    s << left;
    if (left.size() < 28)
      s << std::string(28 - left.size(), ' ');
    else
      s << "\n" << std::string(28, ' ');
    s << f.help << "\n";
  }
  s << "  --help                    show this help\n";
  return s.str();
}

}  // namespace vf
