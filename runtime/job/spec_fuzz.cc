// Fuzz target: the VirtualFlowJob manifest parser and validator (what `vf run` reads from a
// user's file and the operator reads from the API server) must answer any text with a job or
// an error, never a crash, an exception or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/job/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  vf::Result<vf::JobSpec> job = vf::ParseJobYaml(text, "fuzz.yaml");
  if (job.ok()) {
    // A parsed job is valid, so everything derived from it is defined.
    if (!vf::ValidateJob(*job).ok()) __builtin_trap();
    (void)job->Fingerprint();
    (void)vf::TotalSteps(*job, 60000);
  }
  return 0;
}
