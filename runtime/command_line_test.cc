#include "runtime/command_line.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace vf {
namespace {

// argv for ParseCommandLine: the program name, then `args`.
struct Argv {
  explicit Argv(std::vector<std::string> args) : strings(std::move(args)) {
    strings.insert(strings.begin(), "prog");
    for (const std::string& s : strings) pointers.push_back(s.c_str());
  }
  int argc() const { return static_cast<int>(pointers.size()); }
  const char* const* argv() const { return pointers.data(); }
  std::vector<std::string> strings;
  std::vector<const char*> pointers;
};

// A command line with one option of each kind, parsed as a binary parses its own.
struct Flags {
  Flags() : app("Runs the test program.", "prog") {
    app.add_option("input", input, "the input file");
    app.add_option("--workers", workers, "worker count")
        ->transform(Base10Integer())
        ->capture_default_str();
    app.add_option("--rate", rate, "a rate")->check(FiniteNumber())->capture_default_str();
    app.add_option("--out", out, "where to write");
    app.add_flag("--quiet", quiet, "print less");
  }

  // The exit status ParseCommandLine asks for (-1: go on), with what it printed.
  int Parse(const std::vector<std::string>& args) {
    const Argv a(args);
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    const std::optional<int> exit_code = ParseCommandLine(app, "prog", a.argc(), a.argv());
    stdout_text = testing::internal::GetCapturedStdout();
    stderr_text = testing::internal::GetCapturedStderr();
    return exit_code.value_or(-1);
  }

  CLI::App app;
  std::string input;
  int64_t workers = 4;
  double rate = 0.25;
  std::string out;
  bool quiet = false;
  std::string stdout_text, stderr_text;
};

TEST(ParseCommandLine, TakesBothSpellingsOfAValueAndBareBooleans) {
  Flags f;
  EXPECT_EQ(f.Parse({"in.yaml", "--workers", "3", "--rate=0.5", "--out", "o.json", "--quiet"}), -1)
      << f.stderr_text;
  EXPECT_EQ(f.input, "in.yaml");
  EXPECT_EQ(f.workers, 3);
  EXPECT_EQ(f.rate, 0.5);
  EXPECT_EQ(f.out, "o.json");
  EXPECT_TRUE(f.quiet);
  EXPECT_EQ(f.stderr_text, "");
}

TEST(ParseCommandLine, SetsBooleansWithTrueFalseOneAndZero) {
  for (const auto& [arg, want] : std::vector<std::pair<std::string, bool>>{{"--quiet=true", true},
                                                                           {"--quiet=1", true},
                                                                           {"--quiet=false", false},
                                                                           {"--quiet=0", false}}) {
    Flags f;
    f.quiet = !want;
    ASSERT_EQ(f.Parse({arg}), -1) << arg << ": " << f.stderr_text;
    EXPECT_EQ(f.quiet, want) << arg;
  }
}

TEST(ParseCommandLine, KeepsDefaultsOfFlagsNotGiven) {
  Flags f;
  ASSERT_EQ(f.Parse({}), -1);
  EXPECT_EQ(f.workers, 4);
  EXPECT_EQ(f.rate, 0.25);
  EXPECT_FALSE(f.quiet);
}

TEST(ParseCommandLine, TakesTheLastValueOfARepeatedFlag) {
  Flags f;
  ASSERT_EQ(f.Parse({"--workers", "2", "--workers", "5"}), -1) << f.stderr_text;
  EXPECT_EQ(f.workers, 5);
}

TEST(ParseCommandLine, TakesNegativeNumbersAsValues) {
  Flags f;
  ASSERT_EQ(f.Parse({"--workers", "-1", "--rate", "-0.5"}), -1) << f.stderr_text;
  EXPECT_EQ(f.workers, -1);
  EXPECT_EQ(f.rate, -0.5);
}

TEST(ParseCommandLine, ReadsIntegersInBase10) {
  Flags f;
  ASSERT_EQ(f.Parse({"--workers", "010"}), -1) << f.stderr_text;
  EXPECT_EQ(f.workers, 10);
}

TEST(ParseCommandLine, BadUsageIsOneLineNamingTheProblemAndExitStatus2) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{"--wrokers", "2"}, "prog: error: unknown flag --wrokers (see --help)\n"},
           {{"--wrokers=2"}, "prog: error: unknown flag --wrokers (see --help)\n"},
           {{"in.yaml", "extra"}, "prog: error: unexpected argument 'extra' (see --help)\n"},
           {{"--workers", "two"}, "prog: error: --workers: 'two' is not an integer\n"},
           {{"--workers", "1.5"}, "prog: error: --workers: '1.5' is not an integer\n"},
           {{"--workers", "99999999999999999999"},
            "prog: error: --workers: '99999999999999999999' is not an integer\n"},
           {{"--rate", "fast"}, "prog: error: --rate: 'fast' is not a number\n"},
           {{"--rate", "nan"}, "prog: error: --rate: 'nan' is not a number\n"},
           {{"--rate=inf"}, "prog: error: --rate: 'inf' is not a number\n"},
       }) {
    Flags f;
    EXPECT_EQ(f.Parse(c.args), 2) << c.args.front();
    EXPECT_EQ(f.stderr_text, c.message);
    EXPECT_EQ(f.stdout_text, "");
  }
  Flags missing;
  EXPECT_EQ(missing.Parse({"--workers"}), 2);
  EXPECT_EQ(missing.stderr_text.rfind("prog: error: --workers", 0), 0u) << missing.stderr_text;
  EXPECT_EQ(std::count(missing.stderr_text.begin(), missing.stderr_text.end(), '\n'), 1);
}

TEST(ParseCommandLine, HelpGoesToStdoutWithEveryFlagAndItsDefault) {
  for (const char* help : {"--help", "-h"}) {
    Flags f;
    EXPECT_EQ(f.Parse({"--workers", "7", help}), 0);
    EXPECT_EQ(f.stderr_text, "");
    EXPECT_EQ(f.stdout_text.rfind("usage: prog [OPTIONS] [input]\n\nRuns the test program.\n", 0),
              0u)
        << f.stdout_text;
    for (const char* fragment : {"Runs the test program.", "--workers", "worker count", "=4",
                                 "--rate", "=0.25", "--out", "--quiet", "print less", "input"}) {
      EXPECT_NE(f.stdout_text.find(fragment), std::string::npos) << fragment << "\n"
                                                                 << f.stdout_text;
    }
  }
}

TEST(UsageError, PrintsOneLineAndReturns2) {
  testing::internal::CaptureStderr();
  EXPECT_EQ(UsageError("vf", "--timeout must be positive"), 2);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "vf: error: --timeout must be positive\n");
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
