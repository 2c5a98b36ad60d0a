#include "operator/kube/watch.h"

namespace vf::kube {

using nlohmann::json;

std::string_view WatchEventTypeName(WatchEventType type) {
  switch (type) {
    case WatchEventType::kAdded:
      return "ADDED";
    case WatchEventType::kModified:
      return "MODIFIED";
    case WatchEventType::kDeleted:
      return "DELETED";
    case WatchEventType::kBookmark:
      return "BOOKMARK";
    case WatchEventType::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

std::string ResourceVersionOf(const json& object) {
  if (!object.is_object()) return "";
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  auto rv = metadata->find("resourceVersion");
  if (rv == metadata->end() || !rv->is_string()) return "";
  return rv->get<std::string>();
}

ApiResult<WatchEvent> ParseWatchEvent(std::string_view line) {
  auto bad = [&](const std::string& why) {
    ApiError error;
    error.reason = Reason::kBadResponse;
    error.message = "malformed watch event (" + why + "): " + std::string(line.substr(0, 200)) +
                    (line.size() > 200 ? "..." : "");
    return error;
  };
  json parsed = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return bad("not a JSON object");
  auto type = parsed.find("type");
  auto object = parsed.find("object");
  if (type == parsed.end() || !type->is_string()) return bad("no type");
  if (object == parsed.end() || !object->is_object()) return bad("no object");
  const std::string& name = type->get_ref<const std::string&>();
  WatchEvent event;
  if (name == "ADDED") {
    event.type = WatchEventType::kAdded;
  } else if (name == "MODIFIED") {
    event.type = WatchEventType::kModified;
  } else if (name == "DELETED") {
    event.type = WatchEventType::kDeleted;
  } else if (name == "BOOKMARK") {
    event.type = WatchEventType::kBookmark;
  } else if (name == "ERROR") {
    event.type = WatchEventType::kError;
  } else {
    return bad("unknown type \"" + name + "\"");
  }
  event.object = std::move(*object);
  return event;
}

}  // namespace vf::kube
