// The boundary between the binaries and libvirtualflow-cuda.so, the shared library that holds
// the CUDA device and the NCCL communicator. Binaries load it only when they use a GPU
// (loader.cc), so the CPU path never maps the CUDA libraries (hundreds of megabytes) and runs
// where they are not installed. Both sides come from the same build, so C++ types cross it.
#pragma once

#include <memory>
#include <string>

#include "runtime/comm/communicator.h"
#include "runtime/device.h"

namespace vf {

// The entry points of the library; the version in the symbol name changes with this struct and
// with the interfaces it hands out (Device, Communicator).
struct CudaPlugin {
  int (*device_count)(std::string* why);
  Result<std::unique_ptr<Device>> (*create_device)(int ordinal);
  Result<std::unique_ptr<Communicator>> (*create_nccl_communicator)(Store& store, int rank,
                                                                    int size,
                                                                    const CommOptions& options,
                                                                    int cuda_device);
};

// File name of the library, looked for beside the running executable unless $VF_CUDA_PLUGIN
// names it (a Python worker's executable is the interpreter).
inline constexpr const char* kCudaPluginFile = "libvirtualflow-cuda.so";
// Its one exported symbol: `extern "C" const CudaPlugin* vf_cuda_plugin_v2()`.
inline constexpr const char* kCudaPluginSymbol = "vf_cuda_plugin_v2";

// Loads the library if this process has not yet (loader.cc) and returns its path, or why it
// cannot be loaded: none there, a CUDA library it needs missing, another version. Needs no
// driver and no GPU, so an image can be checked on any machine. Thread-safe.
Result<std::string> LoadCudaPlugin();

}  // namespace vf
