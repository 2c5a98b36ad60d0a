#include "runtime/comm/local/communicator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "runtime/comm/communicator.h"

namespace vf {
namespace {

TEST(LocalCommunicator, IsRankZeroOfOne) {
  std::unique_ptr<Communicator> comm = CreateLocalCommunicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), "local");
}

TEST(LocalCommunicator, CollectivesLeaveDataAsIs) {
  std::unique_ptr<Communicator> comm = CreateLocalCommunicator();
  int64_t ints[3] = {1, -2, 3};
  float floats[2] = {0.5f, -1.5f};
  EXPECT_TRUE(comm->AllReduce(ints, 3, ReduceOp::kSum).ok());
  EXPECT_TRUE(comm->AllReduce(ints, 3, ReduceOp::kMax).ok());
  EXPECT_TRUE(comm->AllReduce(floats, 2, ReduceOp::kSum).ok());
  EXPECT_TRUE(comm->AllReduce(floats, 2, ReduceOp::kMax).ok());
  EXPECT_TRUE(comm->AllReduce(static_cast<float*>(nullptr), 0, ReduceOp::kSum).ok());
  EXPECT_EQ(ints[0], 1);
  EXPECT_EQ(ints[1], -2);
  EXPECT_EQ(ints[2], 3);
  EXPECT_EQ(floats[0], 0.5f);
  EXPECT_EQ(floats[1], -1.5f);

  char bytes[4] = {'a', 'b', 'c', 'd'};
  EXPECT_TRUE(comm->Broadcast(bytes, sizeof(bytes), 0).ok());
  EXPECT_EQ(std::string(bytes, 4), "abcd");
  EXPECT_TRUE(comm->Barrier().ok());

  // One rank's shard is the whole buffer, already reduced and already gathered.
  EXPECT_TRUE(comm->ReduceScatter(ints, 3, ReduceOp::kSum).ok());
  EXPECT_TRUE(comm->AllGather(bytes, sizeof(bytes)).ok());
  EXPECT_EQ(ints[1], -2);
  EXPECT_EQ(std::string(bytes, 4), "abcd");
}

TEST(LocalCommunicator, BroadcastFromAnotherRootIsInvalid) {
  std::unique_ptr<Communicator> comm = CreateLocalCommunicator();
  char byte = 'x';
  EXPECT_EQ(comm->Broadcast(&byte, 1, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Broadcast(&byte, 1, -1).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vf
