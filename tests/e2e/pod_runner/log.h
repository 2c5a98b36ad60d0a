// One line per action on stderr, for the people (and tests) reading what vf-pod-runner did.
#pragma once

#include <string_view>

namespace vf::podrunner {

// Writes "vf-pod-runner HH:MM:SS.mmm <line>\n" to stderr in one write, so that lines from
// several threads never interleave. Thread-safe.
void LogLine(std::string_view line);

}  // namespace vf::podrunner
