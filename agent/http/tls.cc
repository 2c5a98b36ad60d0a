#include "agent/http/tls.h"

#include <arpa/inet.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <utility>

namespace vf::http {

namespace {

struct Free {
  void operator()(X509* p) const { X509_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
  void operator()(GENERAL_NAMES* p) const { GENERAL_NAMES_free(p); }
  void operator()(BIGNUM* p) const { BN_free(p); }
};
template <typename T>
using Owned = std::unique_ptr<T, Free>;

// OpenSSL's error queue as one line (emptied), for the message of a failed call.
std::string OpenSslError(const std::string& what) {
  std::string text = what;
  while (const unsigned long e = ERR_get_error()) {
    char buffer[256];
    ERR_error_string_n(e, buffer, sizeof(buffer));
    text += std::string(": ") + buffer;
  }
  return text;
}

Result<Owned<X509>> ReadCertificate(const std::string& pem) {
  Owned<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Owned<X509> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) return InvalidArgument(OpenSslError("no PEM certificate"));
  return cert;
}

Result<Owned<EVP_PKEY>> ReadKey(const std::string& pem) {
  Owned<BIO> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Owned<EVP_PKEY> key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) return InvalidArgument(OpenSslError("no PEM private key"));
  return key;
}

Result<KeyPair> WritePem(X509* cert, EVP_PKEY* key) {
  Owned<BIO> cert_bio(BIO_new(BIO_s_mem()));
  Owned<BIO> key_bio(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(cert_bio.get(), cert) != 1 ||
      PEM_write_bio_PrivateKey(key_bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return Internal(OpenSslError("writing PEM"));
  }
  auto text = [](BIO* bio) {
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    return std::string(data, static_cast<size_t>(n));
  };
  return KeyPair{text(cert_bio.get()), text(key_bio.get())};
}

bool IsIpAddress(const std::string& name, unsigned char* bytes, int* length) {
  if (inet_pton(AF_INET, name.c_str(), bytes) == 1) {
    *length = 4;
    return true;
  }
  if (inet_pton(AF_INET6, name.c_str(), bytes) == 1) {
    *length = 16;
    return true;
  }
  return false;
}

bool IsDnsName(const std::string& name) {
  return !name.empty() && name.size() <= 253 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
  });
}

Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  Owned<X509_EXTENSION> ext(X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str()));
  if (ext == nullptr || X509_add_ext(cert, ext.get(), -1) != 1) {
    return Internal(OpenSslError("certificate extension " + value));
  }
  return Status::Ok();
}

// A new certificate for `key`, named `common_name`, valid from an hour ago for `valid_for`, with
// a random 127-bit serial; the caller adds extensions and signs it.
Result<Owned<X509>> NewCertificate(EVP_PKEY* key, const std::string& common_name,
                                   std::chrono::seconds valid_for) {
  Owned<X509> cert(X509_new());
  Owned<BIGNUM> serial(BN_new());
  if (cert == nullptr || serial == nullptr || X509_set_version(cert.get(), 2) != 1 ||
      BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) == nullptr ||
      X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(valid_for.count())) ==
          nullptr ||
      X509_set_pubkey(cert.get(), key) != 1) {
    return Internal(OpenSslError("new certificate"));
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1,
                                 -1, 0) != 1) {
    return Internal(OpenSslError("certificate name " + common_name));
  }
  return cert;
}

}  // namespace

Result<KeyPair> MakeCertificateAuthority(const std::string& common_name,
                                         std::chrono::seconds valid_for) {
  if (valid_for.count() <= 0) return InvalidArgument("a CA must be valid for some time");
  Owned<EVP_PKEY> key(EVP_EC_gen("P-256"));
  if (key == nullptr) return Internal(OpenSslError("CA key"));
  VF_ASSIGN_OR_RETURN(Owned<X509> cert, NewCertificate(key.get(), common_name, valid_for));
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(cert.get())) != 1) {
    return Internal(OpenSslError("CA issuer"));
  }
  VF_RETURN_IF_ERROR(
      AddExtension(cert.get(), cert.get(), NID_basic_constraints, "critical,CA:TRUE"));
  VF_RETURN_IF_ERROR(
      AddExtension(cert.get(), cert.get(), NID_key_usage, "critical,keyCertSign,cRLSign"));
  VF_RETURN_IF_ERROR(AddExtension(cert.get(), cert.get(), NID_subject_key_identifier, "hash"));
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
    return Internal(OpenSslError("signing the CA"));
  }
  return WritePem(cert.get(), key.get());
}

Result<KeyPair> IssueServerCertificate(const KeyPair& ca, const std::vector<std::string>& names,
                                       std::chrono::seconds valid_for) {
  if (names.empty()) return InvalidArgument("a server certificate needs at least one name");
  if (valid_for.count() <= 0) return InvalidArgument("a certificate must be valid for some time");
  std::string alt_names;
  for (const std::string& name : names) {
    unsigned char bytes[16];
    int length = 0;
    const bool ip = IsIpAddress(name, bytes, &length);
    if (!ip && !IsDnsName(name)) {
      return InvalidArgument("'" + name + "' is neither a DNS name nor an IP address");
    }
    alt_names += (alt_names.empty() ? "" : ",") + std::string(ip ? "IP:" : "DNS:") + name;
  }
  VF_ASSIGN_OR_RETURN(Owned<X509> ca_cert, ReadCertificate(ca.certificate_pem));
  VF_ASSIGN_OR_RETURN(Owned<EVP_PKEY> ca_key, ReadKey(ca.key_pem));
  Owned<EVP_PKEY> key(EVP_EC_gen("P-256"));
  if (key == nullptr) return Internal(OpenSslError("server key"));
  VF_ASSIGN_OR_RETURN(Owned<X509> cert, NewCertificate(key.get(), names.front(), valid_for));
  // Never valid past the CA: a client would refuse the chain then anyway.
  if (ASN1_TIME_compare(X509_get0_notAfter(cert.get()), X509_get0_notAfter(ca_cert.get())) > 0 &&
      X509_set1_notAfter(cert.get(), X509_get0_notAfter(ca_cert.get())) != 1) {
    return Internal(OpenSslError("server certificate's end"));
  }
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(ca_cert.get())) != 1) {
    return Internal(OpenSslError("server certificate's issuer"));
  }
  X509* issuer = ca_cert.get();
  VF_RETURN_IF_ERROR(AddExtension(cert.get(), issuer, NID_basic_constraints, "critical,CA:FALSE"));
  VF_RETURN_IF_ERROR(
      AddExtension(cert.get(), issuer, NID_key_usage, "critical,digitalSignature,keyEncipherment"));
  VF_RETURN_IF_ERROR(AddExtension(cert.get(), issuer, NID_ext_key_usage, "serverAuth"));
  VF_RETURN_IF_ERROR(AddExtension(cert.get(), issuer, NID_subject_alt_name, alt_names));
  VF_RETURN_IF_ERROR(AddExtension(cert.get(), issuer, NID_authority_key_identifier, "keyid"));
  if (X509_sign(cert.get(), ca_key.get(), EVP_sha256()) == 0) {
    return Internal(OpenSslError("signing the server certificate"));
  }
  return WritePem(cert.get(), key.get());
}

Result<std::chrono::system_clock::time_point> CertificateNotAfter(const std::string& pem) {
  VF_ASSIGN_OR_RETURN(Owned<X509> cert, ReadCertificate(pem));
  std::tm tm{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &tm) != 1) {
    return InvalidArgument(OpenSslError("certificate's notAfter"));
  }
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

Result<std::vector<std::string>> CertificateNames(const std::string& pem) {
  VF_ASSIGN_OR_RETURN(Owned<X509> cert, ReadCertificate(pem));
  Owned<GENERAL_NAMES> alt(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)));
  std::vector<std::string> names;
  for (int i = 0; alt != nullptr && i < sk_GENERAL_NAME_num(alt.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(alt.get(), i);
    if (name->type == GEN_DNS) {
      const ASN1_IA5STRING* dns = name->d.dNSName;
      names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                         static_cast<size_t>(ASN1_STRING_length(dns)));
    } else if (name->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = name->d.iPAddress;
      char text[INET6_ADDRSTRLEN] = {};
      const int length = ASN1_STRING_length(ip);
      if ((length == 4 || length == 16) &&
          inet_ntop(length == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(ip), text,
                    sizeof(text)) != nullptr) {
        names.emplace_back(text);
      }
    }
  }
  return names;
}

Status CheckServerCertificate(const KeyPair& server, const std::string& ca_pem) {
  auto read = [&]() -> Status {
    VF_ASSIGN_OR_RETURN(Owned<X509> cert, ReadCertificate(server.certificate_pem));
    VF_ASSIGN_OR_RETURN(Owned<EVP_PKEY> key, ReadKey(server.key_pem));
    VF_ASSIGN_OR_RETURN(Owned<X509> ca, ReadCertificate(ca_pem));
    if (X509_check_private_key(cert.get(), key.get()) != 1) {
      return FailedPrecondition(OpenSslError("the key is not the certificate's"));
    }
    Owned<X509_STORE> store(X509_STORE_new());
    Owned<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
    if (store == nullptr || ctx == nullptr || X509_STORE_add_cert(store.get(), ca.get()) != 1 ||
        X509_STORE_CTX_init(ctx.get(), store.get(), cert.get(), nullptr) != 1) {
      return Internal(OpenSslError("certificate store"));
    }
    if (X509_verify_cert(ctx.get()) != 1) {
      return FailedPrecondition(std::string("the certificate does not verify against the CA: ") +
                                X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx.get())));
    }
    return Status::Ok();
  };
  Status s = read();
  if (s.code() == StatusCode::kInvalidArgument) return FailedPrecondition(s.message());
  return s;
}

// ---- ServerCredentials ----

Result<std::shared_ptr<ServerCredentials>> ServerCredentials::Create(const KeyPair& pair) {
  std::shared_ptr<ServerCredentials> credentials(new ServerCredentials());
  VF_RETURN_IF_ERROR(credentials->Replace(pair));
  return credentials;
}

ServerCredentials::~ServerCredentials() {
  X509_free(certificate_);
  EVP_PKEY_free(key_);
}

Status ServerCredentials::Replace(const KeyPair& pair) {
  VF_ASSIGN_OR_RETURN(Owned<X509> cert, ReadCertificate(pair.certificate_pem));
  VF_ASSIGN_OR_RETURN(Owned<EVP_PKEY> key, ReadKey(pair.key_pem));
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return InvalidArgument(OpenSslError("the TLS key is not the certificate's"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  X509_free(certificate_);
  EVP_PKEY_free(key_);
  certificate_ = cert.release();
  key_ = key.release();
  return Status::Ok();
}

// Called by OpenSSL at each handshake, before the certificate is sent: SSL_use_* take their own
// references, so a later Replace does not pull the certificate from under a handshake.
int ServerCredentials::SelectCertificate(SSL* ssl, void* arg) {
  auto* self = static_cast<ServerCredentials*>(arg);
  std::lock_guard<std::mutex> lock(self->mu_);
  return SSL_use_certificate(ssl, self->certificate_) == 1 &&
                 SSL_use_PrivateKey(ssl, self->key_) == 1
             ? 1
             : 0;
}

void ServerCredentials::Configure(SSL_CTX* context) {
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  SSL_CTX_set_cert_cb(context, &ServerCredentials::SelectCertificate, this);
}

Status TrustOnly(SSL_CTX* context, const std::string& ca_pem) {
  Owned<X509_STORE> store(X509_STORE_new());
  Owned<BIO> bio(BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size())));
  int added = 0;
  while (Owned<X509> cert{PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)}) {
    if (X509_STORE_add_cert(store.get(), cert.get()) != 1) {
      return Internal(OpenSslError("adding a CA certificate"));
    }
    ++added;
  }
  ERR_clear_error();  // the read past the last certificate
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  // Installed even when empty: then nothing is trusted, rather than the system's CAs.
  SSL_CTX_set_cert_store(context, store.release());  // the context owns it from here
  if (added == 0) return InvalidArgument("no PEM certificate in the CA file");
  return Status::Ok();
}

}  // namespace vf::http
