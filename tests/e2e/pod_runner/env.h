// A container's environment as the kubelet builds it: envFrom, then env (literal values with
// $(VAR) references, valueFrom secretKeyRef / configMapKeyRef / fieldRef), then HOSTNAME and
// PATH. Pure: Secrets and ConfigMaps come through a lookup function, so this is tested without
// an API server.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace vf::podrunner {

enum class SourceKind { kSecret, kConfigMap };

// Reads one Secret or ConfigMap (the object as the API returns it). Must return a status with
// code kNotFound when the object does not exist, and any other error when it could not be read
// (which the caller retries).
using ObjectLookup = std::function<Result<nlohmann::json>(SourceKind kind, const std::string& ns,
                                                          const std::string& name)>;

// What the environment depends on besides the pod. Value type; thread-compatible.
struct EnvContext {
  std::string pod_ip = "127.0.0.1";   // status.podIP(s)
  std::string host_ip = "127.0.0.1";  // status.hostIP(s)
  // Directories put before everything else on PATH (--path), ':'-separated; may be empty.
  std::string path_prefix;
  // The rest of PATH when the container sets none: the runner's own PATH.
  std::string base_path;
};

// One NAME=value. Value type; thread-compatible.
struct EnvVar {
  std::string name;
  std::string value;
  friend bool operator==(const EnvVar&, const EnvVar&) = default;
};

// The environment of `container` (an element of pod.spec.containers), in definition order, a
// later definition of a name replacing the earlier value in place. Ends with HOSTNAME (the pod's
// name, unless the container sets it) and PATH (context.path_prefix, then the container's PATH
// or context.base_path).
//
// Errors, with the kubelet's wording: kNotFound for a Secret, ConfigMap or key that does not
// exist and is not `optional: true` ("secret \"db\" not found", "couldn't find key password in
// Secret team/db"); kInvalidArgument for what cannot be resolved at all (an unsupported
// fieldPath, resourceFieldRef, data that is not base64); the lookup's own error, with context,
// when it failed otherwise.
Result<std::vector<EnvVar>> ResolveEnv(const nlohmann::json& pod, const nlohmann::json& container,
                                       const ObjectLookup& lookup, const EnvContext& context);

// The value of a fieldRef: metadata.name, metadata.namespace, metadata.uid,
// metadata.labels['k'], metadata.annotations['k'], spec.nodeName, spec.serviceAccountName,
// status.podIP(s), status.hostIP(s).
Result<std::string> FieldRefValue(const nlohmann::json& pod, std::string_view field_path,
                                  const EnvContext& context);

// Kubernetes' $(VAR) expansion: $(NAME) becomes lookup(NAME) when that has a value and stays
// as written otherwise; $$ is a literal $; anything else is copied.
std::string ExpandReferences(
    std::string_view input,
    const std::function<std::optional<std::string>(std::string_view name)>& lookup);

// command + args of `container` with $(VAR) references to `env` expanded: the argv to run.
// Empty when the container has no command (the runner cannot run an image's entrypoint).
std::vector<std::string> ExpandCommand(const nlohmann::json& container,
                                       const std::vector<EnvVar>& env);

// The value of NAME in `env`, if set.
std::optional<std::string> Lookup(const std::vector<EnvVar>& env, std::string_view name);

}  // namespace vf::podrunner
