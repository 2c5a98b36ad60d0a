#include "operator/net/listen.h"

#include <gtest/gtest.h>

namespace vf::net {
namespace {

TEST(ListenTest, PicksAPortOnLoopback) {
  Result<int> port = PickFreePort("127.0.0.1");
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  EXPECT_GT(*port, 0);
  EXPECT_LT(*port, 65536);
}

TEST(ListenTest, UnresolvableHostIsInvalidArgument) {
  Result<int> port = PickFreePort("no such host .invalid");
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(port.status().message().find("no such host"), std::string::npos);
}

TEST(ListenTest, Ipv6HostsGoInBrackets) {
  EXPECT_EQ(HostForUri("::1"), "[::1]");
  EXPECT_EQ(HostForUri("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(HostForUri("localhost"), "localhost");
}

}  // namespace
}  // namespace vf::net
