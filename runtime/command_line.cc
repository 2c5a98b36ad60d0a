#include "runtime/command_line.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <utility>

namespace vf {
namespace {

constexpr int kExitHelp = 0;
constexpr int kExitUsage = 2;

// "-x", "--name", "--name=value": what a user meant as a flag (a negative number is a value).
bool LooksLikeFlag(const std::string& arg) {
  return arg.size() > 1 && arg[0] == '-' && !(arg[1] >= '0' && arg[1] <= '9') && arg[1] != '.';
}

// CLI11's help, rearranged the way Unix tools print theirs: the usage line first, then the
// description and the options with a blank line between them.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { label("Usage", "usage"); }

  std::string make_help(const CLI::App* app, std::string name,
                        CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::string out = make_usage(app, std::move(name));
    std::string description = app->get_description();
    while (!description.empty() && description.back() == '\n') description.pop_back();
    if (!description.empty()) out += "\n" + description + "\n";
    out += make_positionals(app) + make_groups(app, mode) + make_subcommands(app, mode);
    if (!app->get_footer().empty()) out += "\n" + app->get_footer() + "\n";
    return out;
  }
};

}  // namespace

std::optional<int> ParseCommandLine(CLI::App& app, const std::string& program, int argc,
                                    const char* const* argv) {
  for (CLI::Option* option : app.get_options()) {
    option->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  app.formatter(std::make_shared<HelpFormatter>());
  // Left over arguments are reported below, naming the first one, instead of CLI11's list of
  // all of them (which it gives last first).
  app.allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return kExitHelp;
  } catch (const CLI::ParseError& e) {
    return UsageError(program, e.what());
  }
  const std::vector<std::string> extra = app.remaining();
  if (extra.empty()) return std::nullopt;
  const std::string& first = extra.front();
  if (LooksLikeFlag(first)) {
    return UsageError(program,
                      "unknown flag " + first.substr(0, first.find('=')) + " (see --help)");
  }
  return UsageError(program, "unexpected argument '" + first + "' (see --help)");
}

int UsageError(const std::string& program, const std::string& message) {
  std::fprintf(stderr, "%s: error: %s\n", program.c_str(), message.c_str());
  return kExitUsage;
}

Base10Integer::Base10Integer()
    : CLI::Validator(
          [](std::string& text) -> std::string {
            errno = 0;
            char* end = nullptr;
            const long long value = std::strtoll(text.c_str(), &end, 10);
            if (text.empty() || *end != '\0' || errno == ERANGE) {
              return "'" + text + "' is not an integer";
            }
            text = std::to_string(value);
            return "";
          },
          /*validator_desc=*/"") {}

FiniteNumber::FiniteNumber()
    : CLI::Validator(
          [](std::string& text) -> std::string {
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            if (text.empty() || *end != '\0' || !std::isfinite(value)) {
              return "'" + text + "' is not a number";
            }
            return "";
          },
          /*validator_desc=*/"") {}

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

}  // namespace vf
