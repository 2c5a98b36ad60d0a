#include <gtest/gtest.h>

#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"

namespace vf {
namespace {

TEST(GlooUnavailable, CreateReportsTheMissingBackend) {
  MemoryStore store;
  auto comm = CreateGlooCommunicator(store, 0, 1, CommOptions{});
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(comm.status().message().find("-DVF_WITH_GLOO=ON"), std::string::npos);
}

}  // namespace
}  // namespace vf
