// Test helpers for the Kubernetes client: certificates made in memory, temporary files, and a
// scripted HTTP(S) server on 127.0.0.1 that stands in for an API server where the real one
// cannot be made to misbehave on cue.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace vf::kube::testing {

struct KeyPair {
  std::string cert_pem;
  std::string key_pem;
};

// A certificate authority made in memory, and certificates it signs. Not thread-safe.
class TestCa {
 public:
  explicit TestCa(const std::string& cn = "vf-test-ca") : key_(NewKey()) {
    cert_ = NewCert(cn, key_, nullptr, key_, /*ca=*/true, /*server=*/false, {});
  }
  ~TestCa() {
    X509_free(cert_);
    EVP_PKEY_free(key_);
  }
  TestCa(const TestCa&) = delete;
  TestCa& operator=(const TestCa&) = delete;

  std::string cert_pem() const { return CertPem(cert_); }

  // A leaf certificate; `sans` are "IP:1.2.3.4" or "DNS:name" entries.
  KeyPair Issue(const std::string& cn, bool server, const std::vector<std::string>& sans = {}) {
    EVP_PKEY* key = NewKey();
    X509* cert = NewCert(cn, key, cert_, key_, /*ca=*/false, server, sans);
    KeyPair pair{CertPem(cert), KeyPem(key)};
    X509_free(cert);
    EVP_PKEY_free(key);
    return pair;
  }

 private:
  static EVP_PKEY* NewKey() {
    // EVP_EC_gen() without its C-style cast.
    return EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  }

  static void AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : cert, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    ASSERT_NE(ext, nullptr) << value;
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }

  static X509* NewCert(const std::string& cn, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
                       bool ca, bool server, const std::vector<std::string>& sans) {
    static std::atomic<long> serial{1};
    X509* cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), serial++);
    X509_gmtime_adj(X509_getm_notBefore(cert), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert), 24L * 3600);
    X509_set_pubkey(cert, key);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
    X509_set_issuer_name(cert, issuer != nullptr ? X509_get_subject_name(issuer) : name);
    if (ca) {
      AddExtension(cert, issuer, NID_basic_constraints, "critical,CA:TRUE");
      AddExtension(cert, issuer, NID_key_usage, "critical,keyCertSign,cRLSign,digitalSignature");
    } else {
      AddExtension(cert, issuer, NID_basic_constraints, "critical,CA:FALSE");
      AddExtension(cert, issuer, NID_ext_key_usage, server ? "serverAuth" : "clientAuth");
    }
    if (!sans.empty()) {
      std::string joined;
      for (const std::string& san : sans) joined += (joined.empty() ? "" : ",") + san;
      AddExtension(cert, issuer, NID_subject_alt_name, joined);
    }
    X509_sign(cert, issuer_key, EVP_sha256());
    return cert;
  }

  static std::string CertPem(X509* cert) {
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(bio, cert);
    return Drain(bio);
  }
  static std::string KeyPem(EVP_PKEY* key) {
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
    return Drain(bio);
  }
  static std::string Drain(BIO* bio) {
    char* data = nullptr;
    const long size = BIO_get_mem_data(bio, &data);
    std::string text(data, static_cast<size_t>(size));
    BIO_free(bio);
    return text;
  }

  EVP_PKEY* key_;
  X509* cert_ = nullptr;
};

// A fresh directory under $TMPDIR, removed with everything in it when this goes. Not
// thread-safe.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "vf-kube-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Writes `text` to `name` inside the directory; returns the file's path.
  std::string Write(const std::string& name, std::string_view text) const {
    std::string file = path_ + "/" + name;
    std::ofstream out(file, std::ios::binary);
    out << text;
    return file;
  }

 private:
  std::string path_;
};

// What the fake server read from the client.
struct Request {
  std::string method;
  std::string target;  // path and query
  std::string head;    // the request line and headers, as sent
  std::string body;

  // The value of header `name` (case-insensitive), or "".
  std::string Header(std::string_view name) const {
    size_t pos = head.find("\r\n");
    while (pos != std::string::npos && pos + 2 < head.size()) {
      const size_t start = pos + 2;
      const size_t end = head.find("\r\n", start);
      const std::string line = head.substr(start, end - start);
      const size_t colon = line.find(':');
      if (colon != std::string::npos && colon == name.size() &&
          strncasecmp(line.c_str(), std::string(name).c_str(), colon) == 0) {
        size_t value = colon + 1;
        while (value < line.size() && line[value] == ' ') ++value;
        return line.substr(value);
      }
      pos = end;
    }
    return "";
  }
  std::string Path() const { return target.substr(0, target.find('?')); }
  std::string Query() const {
    const size_t q = target.find('?');
    return q == std::string::npos ? "" : target.substr(q + 1);
  }
};

// One accepted connection, plain or TLS. Not thread-safe (one handler thread owns it).
class Connection {
 public:
  Connection(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}
  ~Connection() {
    if (ssl_ != nullptr) {
      SSL_shutdown(ssl_);
      SSL_free(ssl_);
    }
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // The client certificate's common name, or "" without one.
  std::string peer_cn() const {
    if (ssl_ == nullptr) return "";
    X509* peer = SSL_get1_peer_certificate(ssl_);
    if (peer == nullptr) return "";
    char cn[256] = {};
    X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, cn, sizeof(cn));
    X509_free(peer);
    return cn;
  }

  bool ReadRequest(Request* request) {
    std::string data;
    size_t end;
    while ((end = data.find("\r\n\r\n")) == std::string::npos) {
      if (!ReadSome(&data)) return false;
    }
    request->head = data.substr(0, end + 2);
    std::string rest = data.substr(end + 4);
    const size_t sp1 = request->head.find(' ');
    const size_t sp2 = request->head.find(' ', sp1 + 1);
    request->method = request->head.substr(0, sp1);
    request->target = request->head.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string length = request->Header("Content-Length");
    const size_t want = length.empty() ? 0 : std::stoul(length);
    while (rest.size() < want) {
      if (!ReadSome(&rest)) return false;
    }
    request->body = rest.substr(0, want);
    return true;
  }

  bool Write(std::string_view bytes) {
    while (!bytes.empty()) {
      const int n = ssl_ != nullptr
                        ? SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size()))
                        : static_cast<int>(send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL));
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // A complete answer; the connection is closed afterwards.
  bool Respond(int code, std::string_view body, const std::string& headers = "") {
    return Write("HTTP/1.1 " + std::to_string(code) + " X\r\nContent-Type: application/json\r\n" +
                 "Content-Length: " + std::to_string(body.size()) + "\r\n" + headers +
                 "Connection: close\r\n\r\n" + std::string(body));
  }
  // A streamed answer: StartChunked, then Chunk as often as needed, then EndChunked.
  bool StartChunked(int code = 200) {
    return Write("HTTP/1.1 " + std::to_string(code) +
                 " X\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                 "Connection: close\r\n\r\n");
  }
  bool Chunk(std::string_view bytes) {
    char size[32];
    std::snprintf(size, sizeof(size), "%zx\r\n", bytes.size());
    return Write(std::string(size) + std::string(bytes) + "\r\n");
  }
  bool EndChunked() { return Write("0\r\n\r\n"); }

 private:
  bool ReadSome(std::string* out) {
    char buffer[16384];
    const int n = ssl_ != nullptr ? SSL_read(ssl_, buffer, sizeof(buffer))
                                  : static_cast<int>(recv(fd_, buffer, sizeof(buffer), 0));
    if (n <= 0) return false;
    out->append(buffer, static_cast<size_t>(n));
    return true;
  }

  int fd_;
  SSL* ssl_;
};

// Serves every connection on its own thread with `handler`, one request per connection. With
// `tls`, speaks TLS with that certificate and, given `client_ca`, demands a client certificate
// signed by it. A handler that holds a connection open should return once its stop token is
// triggered (when the server goes away). Thread-safe.
class FakeServer {
 public:
  using Handler = std::function<void(const Request&, Connection&, std::stop_token)>;

  explicit FakeServer(Handler handler, const KeyPair* tls = nullptr,
                      const std::string& client_ca = "")
      : handler_(std::move(handler)) {
    signal(SIGPIPE, SIG_IGN);
    if (tls != nullptr) SetUpTls(*tls, client_ca);
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 64) != 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
    }
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::jthread([this](std::stop_token stop) { Accept(stop); });
  }

  ~FakeServer() {
    acceptor_.request_stop();
    acceptor_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (Worker& worker : workers_) {
        worker.thread.request_stop();
        // Unblocks a handler stuck reading from a client that went quiet.
        shutdown(worker.fd, SHUT_RDWR);
      }
    }
    for (Worker& worker : workers_) worker.thread.join();
    for (Worker& worker : workers_) close(worker.fd);
    close(listen_fd_);
    if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
  }
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  int port() const { return port_; }
  std::string url() const {
    return std::string(ssl_ctx_ != nullptr ? "https" : "http") +
           "://127.0.0.1:" + std::to_string(port_);
  }
  int connections() const { return connections_.load(); }
  // Connections whose TLS handshake failed.
  int handshake_failures() const { return handshake_failures_.load(); }

 private:
  struct Worker {
    int fd;
    std::jthread thread;
  };

  void SetUpTls(const KeyPair& tls, const std::string& client_ca) {
    ssl_ctx_ = SSL_CTX_new(TLS_server_method());
    BIO* cert = BIO_new_mem_buf(tls.cert_pem.data(), static_cast<int>(tls.cert_pem.size()));
    X509* x509 = PEM_read_bio_X509(cert, nullptr, nullptr, nullptr);
    SSL_CTX_use_certificate(ssl_ctx_, x509);
    X509_free(x509);
    BIO_free(cert);
    BIO* key = BIO_new_mem_buf(tls.key_pem.data(), static_cast<int>(tls.key_pem.size()));
    EVP_PKEY* pkey = PEM_read_bio_PrivateKey(key, nullptr, nullptr, nullptr);
    SSL_CTX_use_PrivateKey(ssl_ctx_, pkey);
    EVP_PKEY_free(pkey);
    BIO_free(key);
    if (!client_ca.empty()) {
      BIO* ca = BIO_new_mem_buf(client_ca.data(), static_cast<int>(client_ca.size()));
      X509* ca_cert = PEM_read_bio_X509(ca, nullptr, nullptr, nullptr);
      X509_STORE_add_cert(SSL_CTX_get_cert_store(ssl_ctx_), ca_cert);
      X509_free(ca_cert);
      BIO_free(ca);
      SSL_CTX_set_verify(ssl_ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
  }

  void Accept(std::stop_token stop) {
    while (!stop.stop_requested()) {
      pollfd pfd{listen_fd_, POLLIN, 0};
      if (poll(&pfd, 1, 50) <= 0) continue;
      const int fd = accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      ++connections_;
      std::lock_guard<std::mutex> lock(mu_);
      workers_.push_back(Worker{fd, std::jthread([this, fd](std::stop_token s) { Serve(fd, s); })});
    }
  }

  void Serve(int fd, std::stop_token stop) {
    SSL* ssl = nullptr;
    if (ssl_ctx_ != nullptr) {
      ssl = SSL_new(ssl_ctx_);
      SSL_set_fd(ssl, fd);
      if (SSL_accept(ssl) != 1) {
        ++handshake_failures_;
        ERR_clear_error();
        SSL_free(ssl);
        shutdown(fd, SHUT_RDWR);
        return;
      }
    }
    Connection connection(fd, ssl);
    Request request;
    if (connection.ReadRequest(&request)) handler_(request, connection, stop);
    shutdown(fd, SHUT_RDWR);
  }

  Handler handler_;
  SSL_CTX* ssl_ctx_ = nullptr;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> connections_{0};
  std::atomic<int> handshake_failures_{0};
  std::mutex mu_;
  std::list<Worker> workers_;
  std::jthread acceptor_;
};

// Waits until `stop` or `done()`; for handlers that hold a connection open.
template <typename Done>
void HoldUntil(std::stop_token stop, Done done) {
  while (!stop.stop_requested() && !done()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace vf::kube::testing
