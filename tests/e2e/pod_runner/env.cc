#include "tests/e2e/pod_runner/env.h"

#include <map>
#include <utility>

#include "operator/kube/config.h"
#include "tests/e2e/pod_runner/pod_json.h"

namespace vf::podrunner {
namespace {

using nlohmann::json;

std::string_view KindWord(SourceKind kind) {
  return kind == SourceKind::kSecret ? "secret" : "configmap";
}
std::string_view KindTitle(SourceKind kind) {
  return kind == SourceKind::kSecret ? "Secret" : "ConfigMap";
}

// Each Secret and ConfigMap is read once per resolution, however many variables name it. Lives
// for one ResolveEnv call; not thread-safe.
class SourceCache {
 public:
  SourceCache(const ObjectLookup& lookup, std::string ns) : lookup_(lookup), ns_(std::move(ns)) {}

  // The object, kNotFound (with the kubelet's message) when it does not exist, or the lookup's
  // error with context.
  Result<json> Get(SourceKind kind, const std::string& name) {
    auto key = std::make_pair(kind, name);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      Result<json> got = Internal("no lookup function");
      if (lookup_) got = lookup_(kind, ns_, name);
      it = cache_.emplace(std::move(key), std::move(got)).first;
    }
    const Result<json>& got = it->second;
    if (got.ok()) return got.value();
    if (got.status().code() == StatusCode::kNotFound) {
      return NotFound(std::string(KindWord(kind)) + " \"" + name + "\" not found");
    }
    return got.status().WithContext("reading " + std::string(KindWord(kind)) + " " + ns_ + "/" +
                                    name);
  }

  const std::string& ns() const { return ns_; }

 private:
  const ObjectLookup& lookup_;
  const std::string ns_;
  std::map<std::pair<SourceKind, std::string>, Result<json>> cache_;
};

// Every key of the object's data (and, for ConfigMaps, binaryData) with its decoded value.
Result<std::vector<EnvVar>> AllData(SourceKind kind, const json& object, const std::string& where) {
  std::vector<EnvVar> out;
  auto add_from = [&](const char* field, bool base64) -> Status {
    const json* data = Field(object, field);
    if (data == nullptr || !data->is_object()) return Status::Ok();
    for (const auto& [key, value] : data->items()) {
      if (!value.is_string()) continue;
      if (!base64) {
        out.push_back({key, value.get<std::string>()});
        continue;
      }
      Result<std::string> decoded = kube::DecodeBase64(value.get<std::string>());
      if (!decoded.ok()) {
        return InvalidArgument("key " + key + " of " + where + " is not valid base64");
      }
      out.push_back({key, std::move(decoded).value()});
    }
    return Status::Ok();
  };
  const bool secret = kind == SourceKind::kSecret;
  VF_RETURN_IF_ERROR(add_from("data", secret));
  if (!secret) VF_RETURN_IF_ERROR(add_from("binaryData", true));
  return out;
}

Result<std::string> KeyOf(SourceKind kind, const json& object, const std::string& ns,
                          const std::string& name, const std::string& key) {
  const std::string where = std::string(KindTitle(kind)) + " " + ns + "/" + name;
  VF_ASSIGN_OR_RETURN(std::vector<EnvVar> data, AllData(kind, object, where));
  for (auto& var : data) {
    if (var.name == key) return std::move(var.value);
  }
  return NotFound("couldn't find key " + key + " in " + where);
}

// A valueFrom.secretKeyRef / configMapKeyRef: the value, or nothing for a missing optional one.
Result<std::optional<std::string>> KeyRef(SourceKind kind, const json& ref, SourceCache& sources,
                                          const std::string& var) {
  const std::string name = StringAt(ref, {"name"});
  const std::string key = StringAt(ref, {"key"});
  const bool optional = BoolAt(ref, {"optional"});
  const std::string what =
      std::string(kind == SourceKind::kSecret ? "secretKeyRef" : "configMapKeyRef");
  if (name.empty() || key.empty()) {
    return InvalidArgument("env " + var + ": " + what + " needs a name and a key");
  }
  Result<json> object = sources.Get(kind, name);
  if (!object.ok()) {
    if (object.status().code() == StatusCode::kNotFound && optional) {
      return std::optional<std::string>();
    }
    return object.status();
  }
  Result<std::string> value = KeyOf(kind, *object, sources.ns(), name, key);
  if (!value.ok()) {
    if (value.status().code() == StatusCode::kNotFound && optional) {
      return std::optional<std::string>();
    }
    return value.status();
  }
  return std::optional<std::string>(std::move(value).value());
}

void Set(std::vector<EnvVar>& env, std::string name, std::string value) {
  for (auto& var : env) {
    if (var.name == name) {
      var.value = std::move(value);
      return;
    }
  }
  env.push_back({std::move(name), std::move(value)});
}

// "metadata.labels['app']" -> "app" when `path` has that shape under `prefix`.
std::optional<std::string> Subscript(std::string_view path, std::string_view prefix) {
  if (path.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::string_view rest = path.substr(prefix.size());
  if (rest.size() < 4 || rest.substr(0, 2) != "['" || rest.substr(rest.size() - 2) != "']") {
    return std::nullopt;
  }
  return std::string(rest.substr(2, rest.size() - 4));
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  return std::string(a) + ":" + std::string(b);
}

}  // namespace

std::optional<std::string> Lookup(const std::vector<EnvVar>& env, std::string_view name) {
  for (const auto& var : env) {
    if (var.name == name) return var.value;
  }
  return std::nullopt;
}

std::string ExpandReferences(
    std::string_view input,
    const std::function<std::optional<std::string>(std::string_view name)>& lookup) {
  std::string out;
  size_t i = 0;
  while (i < input.size()) {
    const char c = input[i];
    if (c != '$' || i + 1 == input.size()) {
      out.push_back(c);
      ++i;
      continue;
    }
    const char next = input[i + 1];
    if (next == '$') {  // escaped operator
      out.push_back('$');
      i += 2;
      continue;
    }
    if (next != '(') {
      out.push_back('$');
      out.push_back(next);
      i += 2;
      continue;
    }
    const size_t close = input.find(')', i + 2);
    if (close == std::string_view::npos) {  // incomplete reference: copied as written
      out.append("$(");
      i += 2;
      continue;
    }
    const std::string_view name = input.substr(i + 2, close - i - 2);
    std::optional<std::string> value = lookup ? lookup(name) : std::nullopt;
    if (value.has_value()) {
      out.append(*value);
    } else {
      out.append(input.substr(i, close - i + 1));
    }
    i = close + 1;
  }
  return out;
}

Result<std::string> FieldRefValue(const json& pod, std::string_view field_path,
                                  const EnvContext& context) {
  if (field_path == "metadata.name") return StringAt(pod, {"metadata", "name"});
  if (field_path == "metadata.namespace") return StringAt(pod, {"metadata", "namespace"});
  if (field_path == "metadata.uid") return StringAt(pod, {"metadata", "uid"});
  if (field_path == "spec.nodeName") return StringAt(pod, {"spec", "nodeName"});
  if (field_path == "spec.serviceAccountName") {
    return StringAt(pod, {"spec", "serviceAccountName"});
  }
  if (field_path == "status.podIP" || field_path == "status.podIPs") return context.pod_ip;
  if (field_path == "status.hostIP" || field_path == "status.hostIPs") return context.host_ip;
  if (auto label = Subscript(field_path, "metadata.labels")) {
    return StringAt(pod, {"metadata", "labels", *label});
  }
  if (auto annotation = Subscript(field_path, "metadata.annotations")) {
    return StringAt(pod, {"metadata", "annotations", *annotation});
  }
  return InvalidArgument("fieldRef " + std::string(field_path) +
                         " is not supported by vf-pod-runner");
}

Result<std::vector<EnvVar>> ResolveEnv(const json& pod, const json& container,
                                       const ObjectLookup& lookup, const EnvContext& context) {
  SourceCache sources(lookup, StringAt(pod, {"metadata", "namespace"}));
  std::vector<EnvVar> env;

  if (const json* env_from = Field(container, "envFrom");
      env_from != nullptr && env_from->is_array()) {
    for (const json& source : *env_from) {
      const std::string prefix = StringAt(source, {"prefix"});
      for (const auto& [field, kind] : {std::pair{"configMapRef", SourceKind::kConfigMap},
                                        std::pair{"secretRef", SourceKind::kSecret}}) {
        const json* ref = Field(source, field);
        if (ref == nullptr) continue;
        const std::string name = StringAt(*ref, {"name"});
        Result<json> object = sources.Get(kind, name);
        if (!object.ok()) {
          if (object.status().code() == StatusCode::kNotFound && BoolAt(*ref, {"optional"})) {
            continue;
          }
          return object.status();
        }
        VF_ASSIGN_OR_RETURN(
            std::vector<EnvVar> data,
            AllData(kind, *object, std::string(KindTitle(kind)) + " " + sources.ns() + "/" + name));
        for (auto& var : data) {
          // The kubelet skips keys that are not valid variable names (and records an event).
          if (var.name.empty() || var.name.find('=') != std::string::npos) continue;
          Set(env, prefix + var.name, std::move(var.value));
        }
      }
    }
  }

  if (const json* vars = Field(container, "env"); vars != nullptr && vars->is_array()) {
    for (const json& var : *vars) {
      const std::string name = StringAt(var, {"name"});
      if (name.empty()) continue;
      const json* from = Field(var, "valueFrom");
      if (from == nullptr || !from->is_object()) {
        // Literal values may refer to variables defined before them.
        Set(env, name, ExpandReferences(StringAt(var, {"value"}), [&](std::string_view ref) {
              return Lookup(env, ref);
            }));
        continue;
      }
      std::optional<std::string> value;
      if (const json* ref = Field(*from, "secretKeyRef")) {
        VF_ASSIGN_OR_RETURN(value, KeyRef(SourceKind::kSecret, *ref, sources, name));
      } else if (const json* cm = Field(*from, "configMapKeyRef")) {
        VF_ASSIGN_OR_RETURN(value, KeyRef(SourceKind::kConfigMap, *cm, sources, name));
      } else if (const json* field = Field(*from, "fieldRef")) {
        Result<std::string> got = FieldRefValue(pod, StringAt(*field, {"fieldPath"}), context);
        if (!got.ok()) return got.status().WithContext("env " + name);
        value = std::move(got).value();
      } else if (Field(*from, "resourceFieldRef") != nullptr) {
        return InvalidArgument("env " + name +
                               ": resourceFieldRef is not supported by "
                               "vf-pod-runner");
      } else {
        return InvalidArgument("env " + name + ": valueFrom names no source");
      }
      if (value.has_value()) Set(env, name, *std::move(value));
    }
  }

  if (!Lookup(env, "HOSTNAME").has_value()) {
    Set(env, "HOSTNAME", StringAt(pod, {"metadata", "name"}));
  }
  const std::optional<std::string> own_path = Lookup(env, "PATH");
  Set(env, "PATH", JoinPath(context.path_prefix, own_path ? *own_path : context.base_path));
  return env;
}

std::vector<std::string> ExpandCommand(const json& container, const std::vector<EnvVar>& env) {
  std::vector<std::string> argv;
  auto lookup = [&](std::string_view name) { return Lookup(env, name); };
  for (const char* field : {"command", "args"}) {
    const json* list = Field(container, field);
    if (list == nullptr || !list->is_array()) continue;
    for (const json& item : *list) {
      if (item.is_string()) argv.push_back(ExpandReferences(item.get<std::string>(), lookup));
    }
  }
  // args without a command would be appended to the image's entrypoint, which cannot be run.
  const json* command = Field(container, "command");
  if (command == nullptr || !command->is_array() || command->empty()) argv.clear();
  return argv;
}

}  // namespace vf::podrunner
