#include "cli/flags.h"

#include <gtest/gtest.h>

#include <vector>

namespace vf {
namespace {

struct Argv {
  explicit Argv(std::vector<std::string> a) : args(std::move(a)) {
    for (auto& s : args) ptrs.push_back(s.data());
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> args;
  std::vector<char*> ptrs;
};

TEST(Flags, ParsesBothSpellingsAndPositionals) {
  int64_t n = 0;
  double x = 0;
  std::string s;
  bool b = false;
  FlagParser p("usage");
  p.AddInt("workers", &n, "");
  p.AddDouble("rate", &x, "");
  p.AddString("out", &s, "");
  p.AddBool("quiet", &b, "");
  Argv a({"vf", "run", "job.yaml", "--workers", "3", "--rate=0.5", "--out", "o.json", "--quiet"});
  auto pos = p.Parse(a.argc(), a.argv(), 2);
  ASSERT_TRUE(pos.ok());
  EXPECT_EQ(*pos, std::vector<std::string>{"job.yaml"});
  EXPECT_EQ(n, 3);
  EXPECT_EQ(x, 0.5);
  EXPECT_EQ(s, "o.json");
  EXPECT_TRUE(b);
}

TEST(Flags, RejectsUnknownFlagsAndBadValues) {
  int64_t n = 0;
  FlagParser p("usage");
  p.AddInt("workers", &n, "");
  Argv unknown({"vf", "--wrokers", "2"});
  auto r = p.Parse(unknown.argc(), unknown.argv(), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--wrokers"), std::string::npos);
  Argv bad({"vf", "--workers", "two"});
  r = p.Parse(bad.argc(), bad.argv(), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not an integer"), std::string::npos);
  Argv missing({"vf", "--workers"});
  EXPECT_FALSE(p.Parse(missing.argc(), missing.argv(), 1).ok());
}

TEST(Flags, HelpListsEveryFlag) {
  int64_t n = 0;
  FlagParser p("usage: x");
  p.AddInt("workers", &n, "how many workers");
  Argv a({"x", "--help"});
  ASSERT_TRUE(p.Parse(a.argc(), a.argv(), 1).ok());
  EXPECT_TRUE(p.help_requested());
  EXPECT_NE(p.Help().find("--workers N"), std::string::npos);
  EXPECT_NE(p.Help().find("how many workers"), std::string::npos);
}

TEST(NumberList, ParsesCommaSeparatedNumbersInRange) {
  auto v = ParseNumberList("--slowdown", "1,2.5,3", 1, 1000);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(*v, (std::vector<double>{1, 2.5, 3}));
  auto whole = ParseNumberList("--micro-batches", "32,64", 1, 1e9, /*whole=*/true);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, (std::vector<double>{32, 64}));
}

TEST(NumberList, NamesTheFlagAndTheBadItem) {
  struct Case {
    const char* text;
    bool whole;
    const char* message;
  };
  for (const Case& c : {Case{"1,x", false, "--f: 'x' is not a number between 1 and 10"},
                        Case{"1,,2", false, "--f: '' is not a number"},
                        Case{"0.5", false, "--f: '0.5' is not a number between 1 and 10"},
                        Case{"11", false, "--f: '11' is not a number"},
                        Case{"nan", false, "--f: 'nan' is not a number"},
                        Case{"2.5", true, "--f: '2.5' is not an integer between 1 and 10"},
                        Case{"", false, "--f is empty"}}) {
    auto r = ParseNumberList("--f", c.text, 1, 10, c.whole);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message().rfind(c.message, 0), 0u) << r.status().message();
  }
}

}  // namespace
}  // namespace vf
