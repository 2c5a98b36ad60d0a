#include "operator/controller/coordinator_tls.h"

#include <openssl/evp.h>

#include <algorithm>

#include <cpprest/uri.h>
#include <nlohmann/json.hpp>

#include "operator/controller/worker_pod.h"

namespace vf::controller {

using nlohmann::json;
using Clock = std::chrono::system_clock;

namespace {

// Keys of the Secret: the usual kubernetes.io/tls pair plus the CA's.
constexpr char kCertKey[] = "tls.crt";
constexpr char kKeyKey[] = "tls.key";
constexpr char kCaCertKey[] = "ca.crt";
constexpr char kCaKeyKey[] = "ca.key";

std::string DecodeBase64(const std::string& encoded) {
  std::string out(encoded.size(), '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(encoded.data()),
                                static_cast<int>(encoded.size()));
  if (n < 0) return "";
  out.resize(static_cast<size_t>(n));
  while (!out.empty() && out.back() == '\0') out.pop_back();  // the padding's zero bytes
  return out;
}

CoordinatorTls FromSecret(const json& secret) {
  const json data = secret.value("data", json::object());
  auto field = [&](const char* key) { return DecodeBase64(data.value(key, "")); };
  return {{field(kCaCertKey), field(kCaKeyKey)}, {field(kCertKey), field(kKeyKey)}};
}

json ToSecret(const CoordinatorTlsOptions& options, const CoordinatorTls& tls,
              const std::string& resource_version) {
  json meta = {{"name", options.secret},
               {"namespace", options.ns},
               {"labels", {{kManagedByLabel, kManagedBy}}}};
  if (!resource_version.empty()) meta["resourceVersion"] = resource_version;
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", meta},
          {"type", "kubernetes.io/tls"},
          {"stringData",
           {{kCertKey, tls.server.certificate_pem},
            {kKeyKey, tls.server.key_pem},
            {kCaCertKey, tls.ca.certificate_pem},
            {kCaKeyKey, tls.ca.key_pem}}}};
}

// Whether `pem` is valid past `now + margin` (false for anything that does not parse).
bool ValidPast(const std::string& pem, Clock::time_point now, std::chrono::hours margin) {
  Result<Clock::time_point> end = http::CertificateNotAfter(pem);
  return end.ok() && *end > now + margin;
}

bool NamesAll(const std::string& pem, const std::vector<std::string>& names) {
  Result<std::vector<std::string>> has = http::CertificateNames(pem);
  if (!has.ok()) return false;
  return std::all_of(names.begin(), names.end(), [&](const std::string& name) {
    return std::find(has->begin(), has->end(), name) != has->end();
  });
}

}  // namespace

std::vector<std::string> CoordinatorNames(const std::string& url) {
  std::vector<std::string> names;
  try {
    std::string host = web::uri(url).host();
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    if (!host.empty()) names.push_back(host);
    const std::string svc = ".svc";
    if (host.size() > svc.size() && host.compare(host.size() - svc.size(), svc.size(), svc) == 0) {
      names.push_back(host + ".cluster.local");
    }
  } catch (const std::exception&) {
    // Not a URL: the caller's own check of the flag says so.
  }
  for (const char* local : {"localhost", "127.0.0.1"}) {
    if (std::find(names.begin(), names.end(), local) == names.end()) names.emplace_back(local);
  }
  return names;
}

Result<CoordinatorTls> Renewed(const CoordinatorTls& current, const std::vector<std::string>& names,
                               Clock::time_point now, bool renew_ca, bool* changed) {
  CoordinatorTls tls = current;
  *changed = false;
  const bool no_ca = tls.ca.certificate_pem.empty() || tls.ca.key_pem.empty();
  if (no_ca || (renew_ca && !ValidPast(tls.ca.certificate_pem, now, kCaRenewBefore))) {
    VF_ASSIGN_OR_RETURN(tls.ca,
                        http::MakeCertificateAuthority("virtualflow coordinator CA", kCaValidity));
    tls.server = {};
    *changed = true;
  }
  if (!ValidPast(tls.server.certificate_pem, now, kServerRenewBefore) ||
      !NamesAll(tls.server.certificate_pem, names) ||
      !http::CheckServerCertificate(tls.server, tls.ca.certificate_pem).ok()) {
    VF_ASSIGN_OR_RETURN(tls.server, http::IssueServerCertificate(tls.ca, names, kServerValidity));
    *changed = true;
  }
  return tls;
}

Result<CoordinatorTls> EnsureCoordinatorTls(kube::Client& client,
                                            const CoordinatorTlsOptions& options, bool renew_ca) {
  const std::string where = "coordinator TLS Secret " + options.ns + "/" + options.secret;
  constexpr int kAttempts = 5;
  Status last;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    kube::ApiResult<json> got = client.Get(kube::kSecrets, options.ns, options.secret);
    if (!got.ok() && got.reason() != kube::Reason::kNotFound) {
      return got.status().WithContext(where);
    }
    const bool exists = got.ok();
    const CoordinatorTls current = exists ? FromSecret(*got) : CoordinatorTls{};
    bool changed = false;
    VF_ASSIGN_OR_RETURN(CoordinatorTls tls,
                        Renewed(current, options.names, Clock::now(), renew_ca, &changed));
    if (!changed) return tls;
    const std::string version =
        exists ? got->value("metadata", json::object()).value("resourceVersion", "") : "";
    kube::ApiResult<json> written =
        exists ? client.Replace(kube::kSecrets, options.ns, ToSecret(options, tls, version))
               : client.Create(kube::kSecrets, options.ns, ToSecret(options, tls, ""));
    if (written.ok()) return tls;
    // Another replica wrote first: start again from what it wrote.
    if (written.reason() != kube::Reason::kAlreadyExists &&
        written.reason() != kube::Reason::kConflict) {
      return written.status().WithContext(where);
    }
    last = written.status();
  }
  return last.WithContext(where);
}

Result<std::optional<CoordinatorTls>> NextServed(const CoordinatorTls& served,
                                                 const CoordinatorTls& stored,
                                                 const std::vector<std::string>& names,
                                                 std::chrono::system_clock::time_point now) {
  if (stored.ca.certificate_pem == served.ca.certificate_pem) {
    if (stored.server.certificate_pem == served.server.certificate_pem) {
      return std::optional<CoordinatorTls>();
    }
    return std::optional<CoordinatorTls>(stored);
  }
  bool changed = false;
  VF_ASSIGN_OR_RETURN(CoordinatorTls renewed,
                      Renewed(served, names, now, /*renew_ca=*/false, &changed));
  if (!changed) return std::optional<CoordinatorTls>();
  return std::optional<CoordinatorTls>(std::move(renewed));
}

}  // namespace vf::controller
