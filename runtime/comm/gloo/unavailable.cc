// CreateGlooCommunicator for builds configured without Gloo, so callers link either way and learn
// at run time, through a Status, what is missing.
#include <memory>

#include "runtime/comm/communicator.h"

namespace vf {

Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store& /*store*/, int /*rank*/,
                                                             int /*size*/,
                                                             const CommOptions& /*options*/) {
  return FailedPrecondition("this build has no Gloo support (configure with -DVF_WITH_GLOO=ON)");
}

}  // namespace vf
