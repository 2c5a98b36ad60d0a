// CudaDeviceCount, CreateCudaDevice and CreateNcclCommunicator for every build: they load
// libvirtualflow-cuda.so (plugin.h) on first use and report, as a Status, when it is not there
// (a build without CUDA) or cannot load (no CUDA libraries on the machine).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/comm/communicator.h"
#include "runtime/device.h"
#include "runtime/device/cuda/plugin.h"
#include "runtime/job/worker_env.h"

namespace vf {
namespace {

struct Loaded {
  const CudaPlugin* plugin = nullptr;
  std::string path;   // the library's
  std::string error;  // why there is none
};

// The library beside the executable, or $VF_CUDA_PLUGIN.
std::string PluginPath() {
  if (const char* p = std::getenv(worker_env::kCudaPlugin.name); p != nullptr && *p != '\0')
    return p;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return kCudaPluginFile;
  return (exe.parent_path() / kCudaPluginFile).string();
}

// Loaded once per process and never unloaded: devices and communicators it made live on.
const Loaded& Plugin() {
  static const Loaded loaded = [] {
    Loaded l;
    const std::string path = PluginPath();
    l.path = path;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      l.error = "no CUDA support: " + path +
                " not found (a build configured with -DVF_WITH_CUDA=ON makes it beside its "
                "binaries; $VF_CUDA_PLUGIN names it for another program, such as a Python "
                "worker)";
      return l;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      l.error = "cannot load " + path + ": " + (e != nullptr ? e : "unknown error");
      return l;
    }
    using Entry = const CudaPlugin* (*)();
    auto* entry = reinterpret_cast<Entry>(dlsym(handle, kCudaPluginSymbol));
    if (entry == nullptr) {
      l.error = path + " has no " + kCudaPluginSymbol + " (a library of another version?)";
      return l;
    }
    l.plugin = entry();
    return l;
  }();
  return loaded;
}

}  // namespace

int CudaDeviceCount(std::string* why) {
  // Without the driver's library there is no GPU to find, and the CUDA libraries the plugin
  // pulls in (hundreds of megabytes) need not be mapped into every CPU worker to learn that.
  if (void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); driver == nullptr) {
    const char* e = dlerror();
    if (why != nullptr) *why = std::string("no NVIDIA driver (") + (e != nullptr ? e : "") + ")";
    return 0;
  }
  const Loaded& l = Plugin();
  if (l.plugin == nullptr) {
    if (why != nullptr) *why = l.error;
    return 0;
  }
  return l.plugin->device_count(why);
}

Result<std::string> LoadCudaPlugin() {
  const Loaded& l = Plugin();
  if (l.plugin == nullptr) return FailedPrecondition(l.error);
  return l.path;
}

Result<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  const Loaded& l = Plugin();
  if (l.plugin == nullptr) return FailedPrecondition(l.error);
  return l.plugin->create_device(ordinal);
}

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store& store, int rank, int size,
                                                             const CommOptions& options,
                                                             int cuda_device) {
  const Loaded& l = Plugin();
  if (l.plugin == nullptr) return FailedPrecondition(l.error);
  return l.plugin->create_nccl_communicator(store, rank, size, options, cuda_device);
}

}  // namespace vf
