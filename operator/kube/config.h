// How to reach and authenticate to an API server: from a kubeconfig file, or from what a pod
// is given (in-cluster configuration).
#pragma once

#include <string>
#include <string_view>

#include "runtime/status.h"

namespace vf::kube {

// Where the API server is and which credentials to present. PEM material is held in memory,
// whether it came from files or from base64 "-data" fields, so that a Config is complete on its
// own. Value type; thread-compatible.
struct Config {
  std::string server;  // "https://127.0.0.1:6443"; may carry a path prefix
  // PEM certificates the server's certificate must chain to. Empty: the system's trust store.
  std::string ca_pem;
  bool insecure_skip_tls_verify = false;
  // The name the server's certificate is checked against (and sent as SNI) when it differs
  // from the host in `server`.
  std::string tls_server_name;
  // Client-certificate authentication: a PEM certificate (chain) and its PEM private key.
  std::string client_cert_pem;
  std::string client_key_pem;
  // Bearer-token authentication: a fixed token, or a file the token is read from (and re-read
  // about once a minute, because projected service-account tokens are rotated).
  std::string token;
  std::string token_file;
  // The namespace of the kubeconfig context, or the pod's own namespace; "" if none is given.
  std::string default_namespace;
};

// Reads `path` (a kubeconfig: clusters, users, contexts, current-context) and resolves
// `context`, or the current context when `context` is empty. Supports certificate-authority(-data),
// insecure-skip-tls-verify, tls-server-name, client-certificate(-data), client-key(-data), token
// and tokenFile; relative file names are relative to the kubeconfig's directory. exec and
// auth-provider plugins and basic auth are refused with a message naming them.
Result<Config> LoadKubeconfig(const std::string& path, const std::string& context = "");

// LoadKubeconfig on text already read; `base_dir` resolves relative file names.
Result<Config> ParseKubeconfig(std::string_view yaml, const std::string& base_dir,
                               const std::string& context = "");

// The configuration of a process running in a pod: the API server at
// $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the service-account token (re-read as it is
// rotated), CA certificate and namespace from /var/run/secrets/kubernetes.io/serviceaccount, or
// from the directory named by $VF_SERVICEACCOUNT_DIR (which lets a process outside a pod use a
// service account's credentials the same way).
Result<Config> InClusterConfig();

// The default service-account directory, or $VF_SERVICEACCOUNT_DIR when set.
std::string ServiceAccountDir();

// What a client without explicit configuration uses: InClusterConfig() when
// $KUBERNETES_SERVICE_HOST is set, else the kubeconfig at $KUBECONFIG (its first entry), else
// ~/.kube/config.
Result<Config> DefaultConfig();

// Decodes standard base64, ignoring whitespace (kubeconfigs wrap long "-data" values).
Result<std::string> DecodeBase64(std::string_view text);

}  // namespace vf::kube
