#include "operator/local/log_lines.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vf::local {
namespace {

using Lines = std::vector<std::string>;

TEST(LogLines, AWorkersLogIsNamedAfterIt) {
  EXPECT_EQ(WorkerLogName("worker-12"), "worker-12.log");
}

TEST(LogLines, OnlyTheFilesVfRunWritesAreItsOwn) {
  EXPECT_TRUE(IsRunLogName("worker-0.log"));
  EXPECT_TRUE(IsRunLogName("worker-123.log"));
  EXPECT_TRUE(IsRunLogName("plans.log"));
  EXPECT_FALSE(IsRunLogName("worker-.log"));
  EXPECT_FALSE(IsRunLogName("worker-1.log.bak"));
  EXPECT_FALSE(IsRunLogName("worker-a.log"));
  EXPECT_FALSE(IsRunLogName("notes.txt"));
  EXPECT_FALSE(IsRunLogName("my-worker-1.log"));
}

TEST(LogLines, AnUnfinishedLineWaitsForItsNewline) {
  std::string partial;
  EXPECT_EQ(TakeLines(partial, "step 1\nste", 100), Lines({"step 1"}));
  EXPECT_EQ(partial, "ste");
  EXPECT_EQ(TakeLines(partial, "p 2\r\n\nstep 3\n", 100), Lines({"step 2", "", "step 3"}));
  EXPECT_EQ(partial, "");
}

TEST(LogLines, OutputWithoutNewlinesComesOutInPiecesOfTheLongestLine) {
  std::string partial;
  EXPECT_EQ(TakeLines(partial, "abcdefg", 3), Lines({"abc", "def"}));
  EXPECT_EQ(partial, "g");
}

TEST(LogLines, LastLinesSkipBlankOnesAndKeepAnUnfinishedOne) {
  EXPECT_EQ(LastLines("a\nb\n\n  \nc\nd", 3), Lines({"b", "c", "d"}));
  EXPECT_EQ(LastLines("only\n", 5), Lines({"only"}));
  EXPECT_EQ(LastLines("", 5), Lines());
}

}  // namespace
}  // namespace vf::local
