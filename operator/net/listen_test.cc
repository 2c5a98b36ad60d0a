#include "operator/net/listen.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

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

TEST(ListenTest, OpenOnPortRetriesPickedPortsAndReturnsTheLastFailure) {
  std::vector<int> tried;
  Status s = OpenOnPort("127.0.0.1", 0, [&](int port) {
    tried.push_back(port);
    return tried.size() < 3 ? Unavailable("taken") : Status::Ok();
  });
  EXPECT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(tried.size(), 3u);
  for (int port : tried) EXPECT_GT(port, 0);
  tried.clear();
  s = OpenOnPort("127.0.0.1", 0, [&](int port) {
    tried.push_back(port);
    return Unavailable("taken " + std::to_string(tried.size()));
  });
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "taken 5");
}

TEST(ListenTest, OpenOnPortTriesAGivenPortOnce) {
  std::vector<int> tried;
  const Status s = OpenOnPort("127.0.0.1", 8123, [&](int port) {
    tried.push_back(port);
    return Unavailable("in use");
  });
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(tried, std::vector<int>{8123});
}

TEST(ListenTest, Ipv6HostsGoInBrackets) {
  EXPECT_EQ(HostForUri("::1"), "[::1]");
  EXPECT_EQ(HostForUri("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(HostForUri("localhost"), "localhost");
}

}  // namespace
}  // namespace vf::net
