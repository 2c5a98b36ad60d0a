#include "tests/e2e/pod_runner/network.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace vf::podrunner {
namespace {

TEST(Ipv4CidrTest, ParsesAddressAndPrefix) {
  auto c = Ipv4Cidr::Parse("10.244.0.0/16");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->prefix, 16);
  EXPECT_EQ(FormatIpv4(c->At(1)), "10.244.0.1");
  EXPECT_EQ(c->Size(), 65536U);
}

TEST(Ipv4CidrTest, RejectsMalformedOnes) {
  for (const char* bad : {"10.244.0.0", "10.244.0.1/16", "10.244.0/16", "10.244.0.256/24",
                          "10.244.0.0/31", "10.244.0.0/x", "a.b.c.d/8", "10.244.0.0/16/1"}) {
    EXPECT_FALSE(Ipv4Cidr::Parse(bad).ok()) << bad;
  }
}

TEST(AddressPoolTest, NeverGivesNetworkGatewayOrBroadcast) {
  AddressPool pool(*Ipv4Cidr::Parse("10.1.2.0/29"));  // .0 network, .1 gateway, .7 broadcast
  EXPECT_EQ(pool.gateway(), "10.1.2.1");
  std::set<std::string> got;
  for (int i = 0; i < 5; ++i) {
    auto a = pool.Allocate("pod-" + std::to_string(i));
    ASSERT_TRUE(a.ok()) << i;
    got.insert(*a);
  }
  EXPECT_EQ(got,
            (std::set<std::string>{"10.1.2.2", "10.1.2.3", "10.1.2.4", "10.1.2.5", "10.1.2.6"}));
  auto full = pool.Allocate("one-too-many");
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kUnavailable);
}

TEST(AddressPoolTest, AnOwnerKeepsItsAddress) {
  AddressPool pool(*Ipv4Cidr::Parse("10.244.0.0/16"));
  const std::string a = *pool.Allocate("a");
  EXPECT_EQ(*pool.Allocate("a"), a);
  EXPECT_NE(*pool.Allocate("b"), a);
}

TEST(AddressPoolTest, AFreedAddressIsNotTheNextOneGiven) {
  AddressPool pool(*Ipv4Cidr::Parse("10.1.2.0/29"));
  const std::string a = *pool.Allocate("a");
  pool.Release("a");
  EXPECT_NE(*pool.Allocate("b"), a);
  // Once the others are taken, it comes round again.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.Allocate("x" + std::to_string(i)).ok());
  EXPECT_EQ(*pool.Allocate("c"), a);
}

TEST(NetNamesTest, FitAnInterfaceNameAndAreRecognised) {
  const PodNetNames n = NetNamesFor("3f2a9c1e-77b0-4d21-9e0f-1234567890ab");
  EXPECT_EQ(n.veth, "vf3f2a9c1e77b0");
  EXPECT_EQ(n.netns, n.veth);
  EXPECT_LE(n.veth.size(), 15U);
  EXPECT_TRUE(IsPodNetName(n.veth));
  EXPECT_TRUE(IsPodNetName(NetNamesFor("").veth));
  for (const char* other : {"vfpods0", "veth12", "vf3f2a9c1e77b", "vf3f2a9c1e77bz", "eth0"}) {
    EXPECT_FALSE(IsPodNetName(other)) << other;
  }
}

TEST(CommandsTest, BridgeIsCreatedOnlyWhenMissing) {
  auto fresh = BridgeCommands("vfpods0", "10.244.0.1", 16, false);
  ASSERT_EQ(fresh.size(), 4U);
  EXPECT_EQ(fresh[0], (Command{"ip", "link", "add", "vfpods0", "type", "bridge"}));
  // Its own MAC, so that pods joining the bridge never change the gateway's.
  EXPECT_EQ(fresh[1], (Command{"ip", "link", "set", "vfpods0", "address", "02:76:66:f4:00:01"}));
  EXPECT_EQ(fresh[2], (Command{"ip", "addr", "replace", "10.244.0.1/16", "dev", "vfpods0"}));
  EXPECT_EQ(fresh[3], (Command{"ip", "link", "set", "vfpods0", "up"}));
  EXPECT_EQ(BridgeCommands("vfpods0", "10.244.0.1", 16, true).size(), 3U);
}

TEST(CommandsTest, PodGetsEth0WithAddressAndDefaultRoute) {
  const auto c = PodSetupCommands({"vfab", "vfab"}, "vfpods0", "10.244.0.7", 16, "10.244.0.1");
  EXPECT_EQ(c.front(), (Command{"ip", "netns", "add", "vfab"}));
  auto has = [&](const Command& want) {
    for (const auto& cmd : c) {
      if (cmd == want) return true;
    }
    return false;
  };
  EXPECT_TRUE(
      has({"ip", "link", "add", "vfab", "type", "veth", "peer", "name", "eth0", "netns", "vfab"}));
  EXPECT_TRUE(has({"ip", "link", "set", "vfab", "master", "vfpods0", "up"}));
  EXPECT_TRUE(has({"ip", "-n", "vfab", "addr", "add", "10.244.0.7/16", "dev", "eth0"}));
  EXPECT_TRUE(has({"ip", "-n", "vfab", "link", "set", "lo", "up"}));
  EXPECT_TRUE(has({"ip", "-n", "vfab", "route", "add", "default", "via", "10.244.0.1"}));
  EXPECT_EQ(c.back()[3], "route") << "the route needs eth0 up first";
}

TEST(ParseTest, NetnsListNames) {
  EXPECT_EQ(ParseNetnsList("vfab (id: 3)\nother\n\n"), (std::vector<std::string>{"vfab", "other"}));
  EXPECT_TRUE(ParseNetnsList("").empty());
}

TEST(ParseTest, LinkNames) {
  const std::string out =
      "7: vf3f2a9c1e77b0@if2: <BROADCAST,MULTICAST,UP> mtu 1500 master vfpods0\n"
      "9: vfpods0: <BROADCAST> mtu 1500\n";
  EXPECT_EQ(ParseLinkNames(out), (std::vector<std::string>{"vf3f2a9c1e77b0", "vfpods0"}));
}

TEST(RunCommandTest, ReturnsStdoutAndReportsFailuresWithStderr) {
  auto ok = RunCommand({"sh", "-c", "echo out; echo err >&2"});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, "out\n");
  auto bad = RunCommand({"sh", "-c", "echo why >&2; exit 3"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("exit status 3"), std::string::npos);
  EXPECT_NE(bad.status().message().find("why"), std::string::npos);
  EXPECT_FALSE(RunCommand({"vf-no-such-tool"}).ok());
}

}  // namespace
}  // namespace vf::podrunner
