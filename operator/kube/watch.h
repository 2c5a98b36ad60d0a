// Watch events and the framing of a watch stream: the API server answers a watch with one JSON
// object per line, {"type": "ADDED", "object": {...}}, in a chunked response whose chunk
// boundaries fall anywhere (mid-line, several lines per chunk).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "operator/kube/errors.h"

namespace vf::kube {

enum class WatchEventType {
  kAdded,
  kModified,
  kDeleted,
  // Carries only metadata.resourceVersion: everything up to it has been sent, so a new watch
  // may resume from it.
  kBookmark,
  // The object is a Status; the server ends the stream after it.
  kError,
};

std::string_view WatchEventTypeName(WatchEventType type);

// One change to one object. Value type; thread-compatible.
struct WatchEvent {
  WatchEventType type = WatchEventType::kAdded;
  nlohmann::json object;
};

// One line of a watch stream as an event; a line that is not a well-formed event is a
// kBadResponse error.
ApiResult<WatchEvent> ParseWatchEvent(std::string_view line);

// metadata.resourceVersion of an object, or "" when it has none.
std::string ResourceVersionOf(const nlohmann::json& object);

// Cuts a byte stream into lines, whatever the chunking. Not thread-safe (one per stream).
class LineSplitter {
 public:
  // A line longer than this is a broken stream, not an object (the API server's own limit on a
  // request is 3 MiB; objects are smaller).
  static constexpr size_t kDefaultMaxLine = 64u << 20;

  explicit LineSplitter(size_t max_line = kDefaultMaxLine) : max_line_(max_line) {}

  // Appends `bytes` and calls `on_line(std::string_view)` for every line completed by them,
  // without its "\n" (or "\r\n"); empty lines are skipped. Returns false, calling nothing more,
  // once the unfinished line is longer than the maximum or `on_line` returns false.
  template <typename OnLine>
  bool Feed(std::string_view bytes, OnLine&& on_line);

  // Bytes of an unfinished line (what is left when the stream ends mid-line).
  size_t pending() const { return buffer_.size(); }

 private:
  size_t max_line_;
  std::string buffer_;
};

template <typename OnLine>
bool LineSplitter::Feed(std::string_view bytes, OnLine&& on_line) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      if (buffer_.size() + bytes.size() > max_line_) return false;
      buffer_.append(bytes);
      return true;
    }
    std::string_view line;
    if (buffer_.empty()) {
      line = bytes.substr(0, newline);  // the common case: no copy
    } else {
      buffer_.append(bytes.substr(0, newline));
      line = buffer_;
    }
    if (line.size() > max_line_) return false;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    bool more = true;
    if (!line.empty()) more = on_line(line);
    buffer_.clear();
    bytes.remove_prefix(newline + 1);
    if (!more) return false;
  }
  return true;
}

}  // namespace vf::kube
