// TLS for the coordinator's HTTP API: certificates made with OpenSSL's C API (a private CA and
// server certificates it signs, which the operator keeps in a Secret), the credentials a TLS
// Listener serves (replaceable while it serves, so that a renewed certificate needs no restart),
// and the client side's trust in one CA only.
//
// Hand-written over OpenSSL because cpprest leaves TLS to a callback that configures Boost.Asio's
// ssl::context: what goes into that context (which certificate, which CA) is the caller's.
#pragma once

#include <openssl/ssl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace vf::http {

// A certificate and its private key, both PEM. Value type.
struct KeyPair {
  std::string certificate_pem;
  std::string key_pem;
};

// A self-signed certificate authority named `common_name` (an EC P-256 key, CA:TRUE, allowed to
// sign certificates only), valid from an hour ago (clocks differ) for `valid_for`.
Result<KeyPair> MakeCertificateAuthority(const std::string& common_name,
                                         std::chrono::seconds valid_for);

// A server certificate signed by `ca` for `names`: each is a DNS name or an IP address (v4 or
// v6), which becomes an IP entry of the subjectAltName. Valid from an hour ago for `valid_for`
// (never past the CA's own end). InvalidArgument for an empty list or a name with characters a
// DNS name cannot have.
Result<KeyPair> IssueServerCertificate(const KeyPair& ca, const std::vector<std::string>& names,
                                       std::chrono::seconds valid_for);

// The end of the first certificate's validity in `pem`.
Result<std::chrono::system_clock::time_point> CertificateNotAfter(const std::string& pem);

// The subjectAltName entries of the first certificate in `pem`: DNS names and IP addresses as
// text.
Result<std::vector<std::string>> CertificateNames(const std::string& pem);

// Ok when `server`'s certificate chains to `ca_pem`, its key is the certificate's own, and it is
// valid now; FailedPrecondition saying what is wrong otherwise.
Status CheckServerCertificate(const KeyPair& server, const std::string& ca_pem);

// The certificate and key a TLS listener serves; Replace swaps them for handshakes from then on
// (connections already open keep theirs). Thread-safe.
class ServerCredentials {
 public:
  // InvalidArgument when the PEM does not parse or the key is not the certificate's.
  static Result<std::shared_ptr<ServerCredentials>> Create(const KeyPair& pair);
  ~ServerCredentials();
  ServerCredentials(const ServerCredentials&) = delete;
  ServerCredentials& operator=(const ServerCredentials&) = delete;

  Status Replace(const KeyPair& pair);
  // Makes `context` serve these credentials (TLS 1.2 at least). This object must outlive
  // `context`.
  void Configure(SSL_CTX* context);

 private:
  ServerCredentials() = default;
  static int SelectCertificate(SSL* ssl, void* self);

  std::mutex mu_;
  X509* certificate_ = nullptr;  // guarded by mu_; owned
  EVP_PKEY* key_ = nullptr;      // guarded by mu_; owned
};

// Makes a client's `context` trust the certificates in `ca_pem` and nothing else (not the
// system's CAs: the coordinator's certificate comes from the operator's own CA), TLS 1.2 at
// least. InvalidArgument when `ca_pem` holds no certificate, and then `context` trusts nothing.
Status TrustOnly(SSL_CTX* context, const std::string& ca_pem);

}  // namespace vf::http
