// For tests (built only with them): runs Prometheus' own linter, `promtool check metrics`, over an
// exposition, so that what the project exports is checked by the parser that will read it, with
// the label values, help texts and numbers the project writes. promtool comes with the Debian
// package `prometheus` (scripts/setup.sh installs it).
#pragma once

#include <optional>
#include <string>

#include "runtime/status.h"

namespace vf::metrics {

// The path of promtool: $PROMTOOL if set, else the first `promtool` on $PATH; nullopt if none.
std::optional<std::string> FindPromtool();

// What `promtool check metrics` said. Value type.
struct PromtoolReport {
  int exit_code = -1;  // 0: parsed, no lint problems; 1: parse error; 3: lint problems
  std::string output;  // stdout and stderr together: the problems, one a line
  bool clean() const { return exit_code == 0 && output.empty(); }
};

// Pipes `exposition` into `<promtool> check metrics`. Unavailable if it cannot be run at all.
Result<PromtoolReport> PromtoolCheckMetrics(const std::string& promtool,
                                            const std::string& exposition);

}  // namespace vf::metrics
