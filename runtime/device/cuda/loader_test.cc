// The CUDA entry points in a process without a GPU (every CI machine): they say why there is
// none instead of failing to start, whether the build has CUDA (the library loads, the driver
// is missing) or not (no library). On a GPU machine these cases skip.
#include <gtest/gtest.h>

#include <string>

#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/device.h"

namespace vf {
namespace {

TEST(CudaLoader, WithoutAGpuEveryEntryPointSaysWhy) {
  std::string why;
  if (CudaDeviceCount(&why) > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_FALSE(why.empty());
  auto device = CreateCudaDevice(0);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(device.status().message().find("no CUDA device"), std::string::npos)
      << device.status().ToString();
  MemoryStore store;
  CommOptions options;
  options.timeout = std::chrono::milliseconds(200);
  auto comm = CreateNcclCommunicator(store, 0, 1, options, 0);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kFailedPrecondition) << comm.status().ToString();
}

TEST(CudaLoader, AnswersTheSameEveryTime) {
  std::string first;
  std::string second;
  const int a = CudaDeviceCount(&first);
  const int b = CudaDeviceCount(&second);
  EXPECT_EQ(a, b);
  EXPECT_EQ(first, second);
}

}  // namespace
}  // namespace vf
