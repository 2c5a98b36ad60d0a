// Reads of API objects that may lack any field or hold the wrong type: a pod from a watch is
// data, not a promise, so nothing here throws whatever the JSON holds.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace vf::podrunner {

// The member `key` of `object`, or nullptr when `object` is not an object or has no such member.
const nlohmann::json* Field(const nlohmann::json& object, std::string_view key);

// Follows `path` through nested objects; nullptr when any step is missing.
const nlohmann::json* FieldPath(const nlohmann::json& object,
                                std::initializer_list<std::string_view> path);

// The string at `path`, or "" when it is missing or not a string.
std::string StringAt(const nlohmann::json& object, std::initializer_list<std::string_view> path);

// The integer at `path`, or nothing when it is missing or not an integer.
std::optional<int64_t> IntAt(const nlohmann::json& object,
                             std::initializer_list<std::string_view> path);

// The boolean at `path`, or `fallback` when it is missing or not a boolean.
bool BoolAt(const nlohmann::json& object, std::initializer_list<std::string_view> path,
            bool fallback = false);

// Which pod an object is: its namespace, name and uid (each "" when missing). Value type;
// thread-compatible.
struct PodRef {
  std::string ns;
  std::string name;
  std::string uid;

  // "namespace/name", how log lines name a pod.
  std::string ToString() const { return ns + "/" + name; }
};

PodRef RefOf(const nlohmann::json& pod);

// spec.containers[0] when it is an object, else nullptr: the one container the runner runs.
const nlohmann::json* FirstContainer(const nlohmann::json& pod);

}  // namespace vf::podrunner
