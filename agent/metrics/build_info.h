// vf_build_info: which build of VirtualFlow serves a /metrics endpoint, so that a dashboard or
// an alert can tell an operator and its workers of different versions apart.
#pragma once

#include <string_view>

#include "agent/metrics/described_registry.h"

namespace vf::metrics {

// The version of this build: CMake's PROJECT_VERSION, the same value the coordinator's build
// check and `vf --version` report.
std::string_view BuildVersion();

// Registers vf_build_info{version} in `registry`, a gauge always 1 (the Prometheus convention
// for information as labels: join it with `* on (...) group_left (version)`).
void AddBuildInfo(DescribedRegistry& registry);

}  // namespace vf::metrics
