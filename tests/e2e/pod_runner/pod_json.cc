#include "tests/e2e/pod_runner/pod_json.h"

namespace vf::podrunner {

using nlohmann::json;

const json* Field(const json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

const json* FieldPath(const json& object, std::initializer_list<std::string_view> path) {
  const json* at = &object;
  for (std::string_view key : path) {
    at = Field(*at, key);
    if (at == nullptr) return nullptr;
  }
  return at;
}

std::string StringAt(const json& object, std::initializer_list<std::string_view> path) {
  const json* at = FieldPath(object, path);
  return at != nullptr && at->is_string() ? at->get<std::string>() : std::string();
}

std::optional<int64_t> IntAt(const json& object, std::initializer_list<std::string_view> path) {
  const json* at = FieldPath(object, path);
  if (at == nullptr || !at->is_number_integer()) return std::nullopt;
  return at->get<int64_t>();
}

bool BoolAt(const json& object, std::initializer_list<std::string_view> path, bool fallback) {
  const json* at = FieldPath(object, path);
  return at != nullptr && at->is_boolean() ? at->get<bool>() : fallback;
}

PodRef RefOf(const json& pod) {
  return {StringAt(pod, {"metadata", "namespace"}), StringAt(pod, {"metadata", "name"}),
          StringAt(pod, {"metadata", "uid"})};
}

const json* FirstContainer(const json& pod) {
  const json* containers = FieldPath(pod, {"spec", "containers"});
  if (containers == nullptr || !containers->is_array() || containers->empty()) return nullptr;
  const json& first = (*containers)[0];
  return first.is_object() ? &first : nullptr;
}

}  // namespace vf::podrunner
