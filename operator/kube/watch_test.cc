// Framing of watch streams: lines out of arbitrary chunks, events out of lines.
#include "operator/kube/watch.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace vf::kube {
namespace {

std::vector<std::string> Split(const std::vector<std::string>& chunks) {
  LineSplitter splitter;
  std::vector<std::string> lines;
  for (const std::string& chunk : chunks) {
    EXPECT_TRUE(splitter.Feed(chunk, [&](std::string_view line) {
      lines.emplace_back(line);
      return true;
    }));
  }
  EXPECT_EQ(splitter.pending(), 0u);
  return lines;
}

TEST(LineSplitterTest, SameLinesWhereverTheChunksBreak) {
  const std::string stream = "{\"a\":1}\n{\"b\":22}\r\n\n{\"c\":333}\n";
  const std::vector<std::string> expected = {"{\"a\":1}", "{\"b\":22}", "{\"c\":333}"};
  EXPECT_EQ(Split({stream}), expected);
  for (size_t i = 0; i <= stream.size(); ++i) {
    for (size_t j = i; j <= stream.size(); ++j) {
      EXPECT_EQ(Split({stream.substr(0, i), stream.substr(i, j - i), stream.substr(j)}), expected)
          << "breaks at " << i << " and " << j;
    }
  }
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  EXPECT_EQ(Split(bytes), expected);
}

TEST(LineSplitterTest, KeepsAnUnfinishedLineForLater) {
  LineSplitter splitter;
  int lines = 0;
  auto count = [&](std::string_view) {
    ++lines;
    return true;
  };
  EXPECT_TRUE(splitter.Feed("{\"a\":", count));
  EXPECT_EQ(lines, 0);
  EXPECT_EQ(splitter.pending(), 5u);
  EXPECT_TRUE(splitter.Feed("1}\n{", count));
  EXPECT_EQ(lines, 1);
  EXPECT_EQ(splitter.pending(), 1u);
}

TEST(LineSplitterTest, RefusesALineOverTheLimit) {
  LineSplitter splitter(8);
  auto ignore = [](std::string_view) { return true; };
  EXPECT_TRUE(splitter.Feed("12345678\n", ignore));
  EXPECT_TRUE(splitter.Feed("1234", ignore));
  EXPECT_FALSE(splitter.Feed("56789", ignore));
}

TEST(LineSplitterTest, StopsWhenTheCallbackSaysSo) {
  LineSplitter splitter;
  std::vector<std::string> seen;
  EXPECT_FALSE(splitter.Feed("a\nb\nc\n", [&](std::string_view line) {
    seen.emplace_back(line);
    return line != "b";
  }));
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b"}));
}

TEST(ParseWatchEventTest, EveryType) {
  struct Case {
    const char* name;
    WatchEventType type;
  };
  for (const Case& c :
       {Case{"ADDED", WatchEventType::kAdded}, Case{"MODIFIED", WatchEventType::kModified},
        Case{"DELETED", WatchEventType::kDeleted}, Case{"BOOKMARK", WatchEventType::kBookmark},
        Case{"ERROR", WatchEventType::kError}}) {
    const std::string line = std::string("{\"type\":\"") + c.name +
                             "\",\"object\":{\"metadata\":{\"resourceVersion\":\"42\"}}}";
    ApiResult<WatchEvent> event = ParseWatchEvent(line);
    ASSERT_TRUE(event.ok()) << line;
    EXPECT_EQ(event->type, c.type);
    EXPECT_EQ(WatchEventTypeName(event->type), c.name);
    EXPECT_EQ(ResourceVersionOf(event->object), "42");
  }
}

TEST(ParseWatchEventTest, MalformedLinesAreBadResponses) {
  for (const char* line :
       {"not json", "[1,2]", "{\"type\":\"ADDED\"}", "{\"type\":\"RENAMED\",\"object\":{}}",
        "{\"object\":{}}", "{\"type\":\"ADDED\",\"object\":\"x\"}"}) {
    ApiResult<WatchEvent> event = ParseWatchEvent(line);
    ASSERT_FALSE(event.ok()) << line;
    EXPECT_EQ(event.reason(), Reason::kBadResponse);
    EXPECT_NE(event.error().message.find("malformed watch event"), std::string::npos);
  }
}

TEST(ParseWatchEventTest, ErrorEventCarriesAStatus) {
  ApiResult<WatchEvent> event = ParseWatchEvent(
      R"({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},)"
      R"json("status":"Failure","message":"too old resource version: 1 (812)","reason":"Expired",)json"
      R"("code":410}})");
  ASSERT_TRUE(event.ok());
  const ApiError error = ApiErrorFromStatus(event->object);
  EXPECT_EQ(error.reason, Reason::kGone);
  EXPECT_EQ(error.message, "too old resource version: 1 (812)");
}

}  // namespace
}  // namespace vf::kube
