// A unit test's helper: the typed spec of a VirtualFlowJob the test wrote, which the test expects
// to be valid. Header-only; no state.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "operator/controller/job_spec.h"

namespace vf::controller {

// JobSpecOf(job), failing the test (and returning an empty spec) when the job is invalid.
inline JobSpec SpecOf(const nlohmann::json& job) {
  Result<JobSpec> spec = JobSpecOf(job);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  return spec.ok() ? spec.value() : JobSpec{};
}

}  // namespace vf::controller
