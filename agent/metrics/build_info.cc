#include "agent/metrics/build_info.h"

namespace vf::metrics {

std::string_view BuildVersion() { return VF_VERSION; }

void AddBuildInfo(DescribedRegistry& registry) {
  // The version only: the build knows no source revision (images are built without .git), and
  // a revision label that always said "unknown" would be noise in every series join.
  registry
      .AddGauge("vf_build_info", "Always 1; the version of VirtualFlow that serves this endpoint.",
                {"version"})
      .Add({{"version", std::string(BuildVersion())}})
      .Set(1);
}

}  // namespace vf::metrics
