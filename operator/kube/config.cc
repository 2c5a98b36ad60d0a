#include "operator/kube/config.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace vf::kube {
namespace {

constexpr char kDefaultServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

Result<std::string> ReadFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(std::string(what) + " " + path + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return DataLoss(std::string(what) + " " + path + ": read failed");
  return text.str();
}

std::string Trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

std::string Resolve(const std::string& path, const std::string& base_dir) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return base_dir + "/" + path;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A named entry of a kubeconfig list ("clusters", "users", "contexts"): its inner map under
// `field`, or an error naming what is missing.
Result<YAML::Node> FindNamed(const YAML::Node& root, const char* list, const char* field,
                             const std::string& name) {
  const YAML::Node entries = root[list];
  if (entries && !entries.IsSequence()) {
    return InvalidArgument(std::string("\"") + list + "\" is not a list");
  }
  if (entries) {
    for (const YAML::Node& entry : entries) {
      if (!entry.IsMap() || !entry["name"] || entry["name"].as<std::string>() != name) continue;
      const YAML::Node inner = entry[field];
      if (inner && !inner.IsMap() && !inner.IsNull()) {
        return InvalidArgument(std::string(list) + " entry \"" + name + "\": \"" + field +
                               "\" is not a map");
      }
      // An entry with an empty body is legal (an anonymous user: "user: {}").
      return inner.IsMap() ? inner : YAML::Node(YAML::NodeType::Map);
    }
  }
  return NotFound(std::string("no entry named \"") + name + "\" in " + list);
}

std::string Scalar(const YAML::Node& map, const char* key) {
  const YAML::Node value = map[key];
  if (!value || value.IsNull()) return "";
  return value.as<std::string>();
}

// A PEM value given either inline as base64 (`data_key`) or as a file name (`file_key`); the
// inline form wins, as in kubectl.
Result<std::string> Material(const YAML::Node& map, const char* data_key, const char* file_key,
                             const std::string& base_dir) {
  const std::string data = Scalar(map, data_key);
  if (!data.empty()) {
    Result<std::string> decoded = DecodeBase64(data);
    if (!decoded.ok()) return decoded.status().WithContext(data_key);
    return decoded;
  }
  const std::string file = Scalar(map, file_key);
  if (file.empty()) return std::string();
  return ReadFile(Resolve(file, base_dir), file_key);
}

Result<Config> ParseKubeconfigOrThrow(std::string_view yaml, const std::string& base_dir,
                                      const std::string& wanted_context) {
  const YAML::Node root = YAML::Load(std::string(yaml));
  if (!root.IsMap()) return InvalidArgument("not a kubeconfig: the document is not a map");
  std::string context_name = wanted_context;
  if (context_name.empty()) context_name = Scalar(root, "current-context");
  if (context_name.empty()) {
    return InvalidArgument("no context given and the kubeconfig has no current-context");
  }
  VF_ASSIGN_OR_RETURN(const YAML::Node context,
                      FindNamed(root, "contexts", "context", context_name));
  const std::string cluster_name = Scalar(context, "cluster");
  const std::string user_name = Scalar(context, "user");
  if (cluster_name.empty()) {
    return InvalidArgument("context \"" + context_name + "\" names no cluster");
  }

  Config config;
  config.default_namespace = Scalar(context, "namespace");

  VF_ASSIGN_OR_RETURN(const YAML::Node cluster,
                      FindNamed(root, "clusters", "cluster", cluster_name));
  const std::string cluster_what = "cluster \"" + cluster_name + "\"";
  config.server = Scalar(cluster, "server");
  if (config.server.empty()) return InvalidArgument(cluster_what + " has no server");
  while (config.server.size() > 1 && config.server.back() == '/') config.server.pop_back();
  {
    Result<std::string> ca =
        Material(cluster, "certificate-authority-data", "certificate-authority", base_dir);
    if (!ca.ok()) return ca.status().WithContext(cluster_what);
    config.ca_pem = std::move(ca).value();
  }
  if (const YAML::Node insecure = cluster["insecure-skip-tls-verify"]; insecure) {
    config.insecure_skip_tls_verify = insecure.as<bool>();
  }
  config.tls_server_name = Scalar(cluster, "tls-server-name");
  if (cluster["proxy-url"]) {
    return InvalidArgument(cluster_what + ": proxy-url is not supported");
  }

  if (user_name.empty()) return config;  // anonymous
  VF_ASSIGN_OR_RETURN(const YAML::Node user, FindNamed(root, "users", "user", user_name));
  const std::string user_what = "user \"" + user_name + "\"";
  for (const char* unsupported : {"exec", "auth-provider", "username", "password"}) {
    if (user[unsupported]) {
      return InvalidArgument(user_what + ": \"" + unsupported +
                             "\" credentials are not supported; use client certificates or a "
                             "token");
    }
  }
  {
    Result<std::string> cert =
        Material(user, "client-certificate-data", "client-certificate", base_dir);
    if (!cert.ok()) return cert.status().WithContext(user_what);
    config.client_cert_pem = std::move(cert).value();
    Result<std::string> key = Material(user, "client-key-data", "client-key", base_dir);
    if (!key.ok()) return key.status().WithContext(user_what);
    config.client_key_pem = std::move(key).value();
  }
  if (config.client_cert_pem.empty() != config.client_key_pem.empty()) {
    return InvalidArgument(user_what +
                           " has a client certificate without a key, or a key "
                           "without a certificate");
  }
  config.token = Trim(Scalar(user, "token"));
  const std::string token_file = Scalar(user, "tokenFile");
  if (!token_file.empty()) {
    config.token_file = Resolve(token_file, base_dir);
    // Fail now, not at the first request, when the file is not there.
    VF_ASSIGN_OR_RETURN(const std::string token, ReadFile(config.token_file, "tokenFile"));
    if (config.token.empty()) config.token = Trim(token);
  }
  return config;
}

}  // namespace

Result<std::string> DecodeBase64(std::string_view text) {
  std::string out;
  out.reserve(text.size() * 3 / 4);
  uint32_t bits = 0;
  int count = 0;
  int padding = 0;
  for (const char c : text) {
    int value;
    if (c >= 'A' && c <= 'Z') {
      value = c - 'A';
    } else if (c >= 'a' && c <= 'z') {
      value = c - 'a' + 26;
    } else if (c >= '0' && c <= '9') {
      value = c - '0' + 52;
    } else if (c == '+') {
      value = 62;
    } else if (c == '/') {
      value = 63;
    } else if (c == '=') {
      ++padding;
      continue;
    } else if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
      continue;
    } else {
      return InvalidArgument("invalid base64: unexpected character '" + std::string(1, c) + "'");
    }
    if (padding > 0) return InvalidArgument("invalid base64: data after padding");
    bits = (bits << 6) | static_cast<uint32_t>(value);
    if (++count == 4) {
      out += static_cast<char>((bits >> 16) & 0xFF);
      out += static_cast<char>((bits >> 8) & 0xFF);
      out += static_cast<char>(bits & 0xFF);
      bits = 0;
      count = 0;
    }
  }
  if (count == 1 || padding > 2) return InvalidArgument("invalid base64: truncated");
  if (count == 2) {
    out += static_cast<char>((bits >> 4) & 0xFF);
  } else if (count == 3) {
    out += static_cast<char>((bits >> 10) & 0xFF);
    out += static_cast<char>((bits >> 2) & 0xFF);
  }
  return out;
}

Result<Config> ParseKubeconfig(std::string_view yaml, const std::string& base_dir,
                               const std::string& context) {
  try {
    return ParseKubeconfigOrThrow(yaml, base_dir, context);
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("malformed kubeconfig: ") + e.what());
  }
}

Result<Config> LoadKubeconfig(const std::string& path, const std::string& context) {
  VF_ASSIGN_OR_RETURN(const std::string text, ReadFile(path, "kubeconfig"));
  Result<Config> config = ParseKubeconfig(text, DirName(path), context);
  if (!config.ok()) return config.status().WithContext("kubeconfig " + path);
  return config;
}

std::string ServiceAccountDir() {
  std::string dir = Env("VF_SERVICEACCOUNT_DIR");
  return dir.empty() ? kDefaultServiceAccountDir : dir;
}

Result<Config> InClusterConfig() {
  const std::string host = Env("KUBERNETES_SERVICE_HOST");
  const std::string port = Env("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    return FailedPrecondition(
        "not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be "
        "set");
  }
  const std::string dir = ServiceAccountDir();
  Config config;
  // An IPv6 service address needs brackets in a URL.
  config.server =
      "https://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + port;
  config.token_file = dir + "/token";
  VF_ASSIGN_OR_RETURN(const std::string token,
                      ReadFile(config.token_file, "service-account token"));
  config.token = Trim(token);
  if (config.token.empty()) {
    return FailedPrecondition("service-account token " + config.token_file + " is empty");
  }
  VF_ASSIGN_OR_RETURN(config.ca_pem, ReadFile(dir + "/ca.crt", "service-account CA certificate"));
  // The namespace file is optional: a token mounted by hand may come without one.
  Result<std::string> ns = ReadFile(dir + "/namespace", "namespace");
  if (ns.ok()) config.default_namespace = Trim(std::move(ns).value());
  return config;
}

Result<Config> DefaultConfig() {
  if (!Env("KUBERNETES_SERVICE_HOST").empty()) return InClusterConfig();
  std::string path = Env("KUBECONFIG");
  if (const size_t colon = path.find(':'); colon != std::string::npos) {
    path = path.substr(0, colon);
  }
  if (path.empty()) {
    const std::string home = Env("HOME");
    if (home.empty()) return FailedPrecondition("no KUBECONFIG, no HOME and not in a cluster");
    path = home + "/.kube/config";
  }
  return LoadKubeconfig(path);
}

}  // namespace vf::kube
