// For tests: runs Prometheus' own linter, `promtool check metrics`, over an exposition, so that
// the text format is checked by the parser that will read it rather than by our idea of it.
// promtool comes with the Debian package `prometheus` (scripts/setup.sh installs it).
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
