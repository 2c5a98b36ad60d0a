#include "operator/local/capacity.h"

#include <gtest/gtest.h>

namespace vf {
namespace {

TEST(Capacity, StepScheduleChangesAtEachEntry) {
  auto s = CapacitySchedule::Parse("0:2,150:4,300:1");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_FALSE(s->by_seconds());
  EXPECT_EQ(s->At(0, 99), 2);
  EXPECT_EQ(s->At(149, 0), 2);
  EXPECT_EQ(s->At(150, 0), 4);
  EXPECT_EQ(s->At(10000, 0), 1);
  EXPECT_EQ(s->Max(), 4);
  EXPECT_EQ(s->ToString(), "0:2,150:4,300:1");
}

TEST(Capacity, SecondsScheduleUsesElapsedTime) {
  auto s = CapacitySchedule::Parse("0s:1,2.5s:3");
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->by_seconds());
  EXPECT_EQ(s->At(1000, 2.4), 1);
  EXPECT_EQ(s->At(0, 2.5), 3);
}

TEST(Capacity, BadSchedulesNameTheEntry) {
  struct Case {
    const char* text;
    const char* fragment;
  };
  for (const Case& c :
       {Case{"", "empty"}, Case{"0:2,x", "AT:SLOTS"}, Case{"5:2", "start at 0"},
        Case{"0:2,10:3,10:4", "increase"}, Case{"0:2,10s:3", "mixes"}, Case{"0:-1", "slot count"},
        Case{"0:0", "never"}, Case{"0:two", "slot count"}}) {
    auto s = CapacitySchedule::Parse(c.text);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(c.fragment), std::string::npos)
        << c.text << ": " << s.status().message();
  }
}

}  // namespace
}  // namespace vf
