// The command line every VirtualFlow binary shares, on CLI11: how it reports bad usage, what
// --help does, how numbers are spelt, and the comma-separated number lists some flags take.
//
// Each binary declares its flags on a CLI::App itself; this header holds only what would
// otherwise be repeated in every main. It lives in the runtime, the lowest floor whose tools
// (vf-bench) need it.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace vf {

// Parses the arguments after argv[0] into `app` and says whether the program goes on:
//   std::nullopt  parsed; the variables bound to `app` hold the values given.
//   0             --help or -h was given; the help (usage line, `app`'s description, the
//                 options with their defaults, `app`'s footer) went to stdout.
//   2             bad usage (an unknown flag, a missing or malformed value, an unexpected
//                 argument); one line, "PROGRAM: error: MESSAGE", went to stderr.
// A flag given twice takes its last value, so a script can append an override. Sets every
// option of `app` to that policy and `app`'s help format before parsing. Not thread-safe.
std::optional<int> ParseCommandLine(CLI::App& app, const std::string& program, int argc,
                                    const char* const* argv);

// Prints "PROGRAM: error: MESSAGE" to stderr and returns 2, the exit status of bad usage: for
// what only the program can check after parsing (a value out of range, flags that conflict).
int UsageError(const std::string& program, const std::string& message);

// For integer options, as ->transform(vf::Base10Integer()): the value is a base-10 integer
// that fits in 64 bits. CLI11 alone reads "010" as octal 8 and saturates out-of-range values;
// this keeps "010" ten and rejects the rest with "'VALUE' is not an integer".
class Base10Integer : public CLI::Validator {
 public:
  Base10Integer();
};

// For floating-point options, as ->check(vf::FiniteNumber()): the value is a finite number.
// CLI11 alone accepts "nan" and "inf", which every range check after parsing lets through.
class FiniteNumber : public CLI::Validator {
 public:
  FiniteNumber();
};

// Parses a flag's comma-separated list of numbers, each in [lo, hi] and, when `whole`, an
// integer: kInvalidArgument naming the flag and the bad item otherwise, or when it is empty.
Result<std::vector<double>> ParseNumberList(const std::string& flag, const std::string& text,
                                            double lo, double hi, bool whole = false);

}  // namespace vf
