// What `vf run` does with its workers' output files: the names it gives them, and the lines it
// shows from them. Pure functions; thread-compatible.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace vf::local {

// The file holding worker `worker`'s standard output and error ("worker-3" -> "worker-3.log").
std::string WorkerLogName(std::string_view worker);

// The file listing each plan's members by rank, so that a rank's output can be found.
inline constexpr const char* kPlansLogName = "plans.log";

// Whether `file` is a name `vf run` writes in a logs directory (worker-N.log, plans.log): the
// only files a rerun into the same directory replaces.
bool IsRunLogName(std::string_view file);

// Appends `chunk` to `partial` and returns the complete lines it now holds (without their '\n'
// or a '\r' before it), leaving an unfinished last line in `partial`. A line longer than
// `max_line` bytes is returned in pieces of `max_line`, so that output without newlines
// cannot grow `partial` without bound.
std::vector<std::string> TakeLines(std::string& partial, std::string_view chunk, size_t max_line);

// The last `n` lines of `text` that are not blank, oldest first.
std::vector<std::string> LastLines(std::string_view text, size_t n);

}  // namespace vf::local
