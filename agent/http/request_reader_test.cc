// How the server reads a request's bytes (request_reader.h), the same whether they come whole or
// a byte at a time.
#include "agent/http/request_reader.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

namespace vf::http {
namespace {

std::vector<std::string_view> ByteByByte(std::string_view bytes) {
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < bytes.size(); ++i) pieces.push_back(bytes.substr(i, 1));
  return pieces;
}

TEST(RequestReaderTest, AChunkedBodyIsDecodedWholeOrByteByByte) {
  const std::string bytes =
      "PUT /store/k?x=1 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\n\r\n";
  for (const auto& pieces : {std::vector<std::string_view>{bytes}, ByteByByte(bytes)}) {
    const ParsedRequest parsed = ParseRequest(pieces, Listener::Limits{});
    ASSERT_TRUE(parsed.request.has_value());
    EXPECT_EQ(parsed.request->method, "PUT");
    EXPECT_EQ(parsed.request->path, "/store/k");
    EXPECT_EQ(parsed.request->query, "x=1");
    EXPECT_EQ(parsed.request->body, "abcdefg");
  }
}

TEST(RequestReaderTest, RefusalsNameTheLimit) {
  Listener::Limits limits;
  limits.max_body_bytes = 5;
  limits.max_header_bytes = 64;
  const ParsedRequest long_body =
      ParseRequest({"POST / HTTP/1.1\r\nContent-Length: 6\r\n\r\nabcdef"}, limits);
  ASSERT_TRUE(long_body.refusal.has_value());
  EXPECT_EQ(long_body.refusal->code, 413);
  EXPECT_EQ(long_body.refusal->message, "request body is 6 bytes; the limit is 5");

  const ParsedRequest long_chunks = ParseRequest(
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n"},
      limits);
  ASSERT_TRUE(long_chunks.refusal.has_value());
  EXPECT_EQ(long_chunks.refusal->code, 413);

  const ParsedRequest long_head =
      ParseRequest({"GET / HTTP/1.1\r\nX: " + std::string(100, 'a') + "\r\n\r\n"}, limits);
  ASSERT_TRUE(long_head.refusal.has_value());
  EXPECT_EQ(long_head.refusal->code, 431);
  EXPECT_EQ(long_head.refusal->message, "request header is over the limit of 64 bytes");

  const ParsedRequest negative = ParseRequest(
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-2\r\nab\r\n0\r\n\r\n"}, limits);
  ASSERT_TRUE(negative.refusal.has_value());
  EXPECT_EQ(negative.refusal->code, 400);
  EXPECT_EQ(negative.refusal->message.rfind("malformed request body: ", 0), 0u)
      << negative.refusal->message;
}

TEST(RequestReaderTest, AnUnfinishedRequestIsNeitherTakenNorRefused) {
  const ParsedRequest parsed =
      ParseRequest({"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc"}, Listener::Limits{});
  EXPECT_FALSE(parsed.request.has_value());
  EXPECT_FALSE(parsed.refusal.has_value());
}

}  // namespace
}  // namespace vf::http
