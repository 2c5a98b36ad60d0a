// The entry point of libvirtualflow-cuda.so (see plugin.h).
#include "runtime/device/cuda/plugin.h"

#include <cuda_runtime.h>

#include <memory>
#include <string>

#ifdef VF_HAVE_NCCL
#include "runtime/comm/nccl/communicator.h"
#endif
#include "runtime/device/cuda/device.h"

namespace vf {
namespace {

int DeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (why != nullptr) *why = cudaGetErrorString(e);
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "the driver reports no CUDA device";
  return count;
}

Result<std::unique_ptr<Device>> CreateDevice(int ordinal) {
  std::string why;
  const int count = DeviceCount(&why);
  if (count == 0) return FailedPrecondition("no CUDA device: " + why);
  if (ordinal < 0 || ordinal >= count) {
    return InvalidArgument("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                           std::to_string(count) + " found)");
  }
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(ordinal));
}

#ifdef VF_HAVE_NCCL
const CudaPlugin kPlugin = {&DeviceCount, &CreateDevice, &NcclCommunicator::Create};
#else
Result<std::unique_ptr<Communicator>> NoNccl(Store& /*store*/, int /*rank*/, int /*size*/,
                                             const CommOptions& /*options*/, int /*device*/) {
  return FailedPrecondition("this build has no NCCL support (configure with -DVF_WITH_NCCL=ON)");
}
const CudaPlugin kPlugin = {&DeviceCount, &CreateDevice, &NoNccl};
#endif

}  // namespace
}  // namespace vf

extern "C" __attribute__((visibility("default"))) const vf::CudaPlugin* vf_cuda_plugin_v2() {
  return &vf::kPlugin;
}
