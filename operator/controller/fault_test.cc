#include "operator/controller/fault.h"

#include <signal.h>

#include <gtest/gtest.h>

namespace vf::controller {
namespace {

TEST(OperatorFaultTest, UnsetArmsNothing) {
  Result<OperatorFault> fault = OperatorFault::Parse("");
  ASSERT_TRUE(fault.ok());
  for (std::string_view phase : kOperatorFaultPhases) EXPECT_FALSE(fault->armed(phase));
  fault->At("plan-published", "ns/job");  // returns: nothing armed
}

TEST(OperatorFaultTest, ArmsTheNamedPhaseOnly) {
  Result<OperatorFault> fault = OperatorFault::Parse("acks-pending");
  ASSERT_TRUE(fault.ok());
  EXPECT_TRUE(fault->armed("acks-pending"));
  EXPECT_FALSE(fault->armed("plan-published"));
}

TEST(OperatorFaultTest, AnUnknownPhaseIsRefusedListingTheKnownOnes) {
  Result<OperatorFault> fault = OperatorFault::Parse("plan-publish");
  EXPECT_EQ(fault.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(fault.status().message().find("joiners-warming"), std::string::npos);
}

TEST(OperatorFaultDeathTest, AnArmedPhaseKillsTheProcess) {
  Result<OperatorFault> fault = OperatorFault::Parse("state-transfer");
  ASSERT_TRUE(fault.ok());
  EXPECT_EXIT(fault->At("state-transfer", "ns/job"), testing::KilledBySignal(SIGKILL),
              "killing the operator at state-transfer of ns/job");
}

}  // namespace
}  // namespace vf::controller
