// Fuzz target: the bytes a client sends, read as one request the way the listener reads it
// (request_reader.h: Beast's parser under the listener's limits). The first byte picks how the
// bytes arrive (in pieces of 1 to 64 bytes, or whole) and whether the limits are the defaults or
// small ones; the rest is what the client sent. Any bytes must give a request, a refusal or
// "wait for more", never a crash; a request must fit the limits; a refusal must be one of the
// answers the server gives; and bytes taken as a request however they were cut are never
// refused when cut otherwise, and give the same request.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "agent/http/request_reader.h"

namespace {

using vf::http::Listener;
using vf::http::ParsedRequest;
using vf::http::ParseRequest;
namespace codes = vf::http::codes;

void Check(bool condition) {
  if (!condition) __builtin_trap();
}

void CheckFits(const ParsedRequest& parsed, const Listener::Limits& limits) {
  if (parsed.request.has_value()) {
    Check(!parsed.refusal.has_value());
    Check(parsed.request->body.size() <= limits.max_body_bytes);
    Check(!parsed.request->method.empty());
  }
  if (parsed.refusal.has_value()) {
    const int code = parsed.refusal->code;
    Check(code == codes::kBadRequest || code == codes::kPayloadTooLarge ||
          code == codes::kHeaderFieldsTooLarge);
    Check(!parsed.refusal->message.empty());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  Listener::Limits limits;
  if ((mode & 0x80) != 0) {
    limits.max_header_bytes = 256;
    limits.max_body_bytes = (mode & 0x40) != 0 ? 0 : 1024;
  }
  const size_t piece = 1 + (mode & 0x3f);
  std::vector<std::string_view> pieces;
  for (size_t at = 0; at < bytes.size(); at += piece) pieces.push_back(bytes.substr(at, piece));

  const ParsedRequest cut = ParseRequest(pieces, limits);
  const ParsedRequest whole = ParseRequest({bytes}, limits);
  CheckFits(cut, limits);
  CheckFits(whole, limits);
  // Bytes taken as a request one way are never refused the other way, and give the same
  // request. (A malformed head may be refused early from the whole bytes and still be waited
  // on when they come a few at a time: Beast parses some of a head before it has all of it
  // only when it has it all at once. The server's head deadline ends that wait.)
  Check(!(cut.request.has_value() && whole.refusal.has_value()));
  Check(!(whole.request.has_value() && cut.refusal.has_value()));
  if (cut.request.has_value() && whole.request.has_value()) {
    Check(cut.request->method == whole.request->method);
    Check(cut.request->target == whole.request->target);
    Check(cut.request->body == whole.request->body);
  }
  return 0;
}
