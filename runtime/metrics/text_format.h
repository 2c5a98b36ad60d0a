// The Prometheus text exposition format, version 0.0.4: what GET /metrics answers.
// https://prometheus.io/docs/instrumenting/exposition_formats/ (the "text-based format").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/metrics/family.h"

namespace vf::metrics {

// The Content-Type of a body written by SerializeText.
inline constexpr std::string_view kTextContentType = "text/plain; version=0.0.4; charset=utf-8";

// Writes `families` in the order given (a Registry gives them sorted by name), each as
// "# HELP", "# TYPE" and one line per sample; histograms as cumulative _bucket{le=...} lines
// ending with le="+Inf", then _sum and _count. A family with no children is left out, as
// client_golang does: its HELP and TYPE alone would say nothing.
std::string SerializeText(const std::vector<FamilySnapshot>& families);

// A sample value as Prometheus parses it: "+Inf", "-Inf", "NaN", integral values as plain
// integers ("3", not "3e+00"; up to 1e15), anything else as the shortest decimal that reads back
// as the same double ("0.25", "1.5e-07").
std::string FormatValue(double value);

// HELP text: backslash and newline escaped.
std::string EscapeHelp(std::string_view help);
// Label values: backslash, double quote and newline escaped.
std::string EscapeLabelValue(std::string_view value);

}  // namespace vf::metrics
