// For tests: a client that speaks raw bytes over TCP, so that a test can send what no HTTP
// library would (a negative chunk size, a header that never ends) and read exactly what the
// server answers. Header-only, for the tests of agent/http and of the servers built on it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <string>

namespace vf::http::testing {

// A connected socket to 127.0.0.1:port, closed with the object; -1 when the connection failed.
// Not thread-safe.
class RawConnection {
 public:
  explicit RawConnection(int port) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ >= 0 &&
        connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawConnection() {
    if (fd_ >= 0) close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool ok() const { return fd_ >= 0; }

  // False when the server has closed its side (or the send failed otherwise).
  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // What arrives until the server closes the connection, `timeout` passes, or (with
  // `until_answer`) one whole answer whose head has a Content-Length has come. `closed` says
  // whether the server closed the connection.
  std::string Read(std::chrono::milliseconds timeout, bool* closed = nullptr,
                   bool until_answer = false) {
    std::string got;
    const auto end = std::chrono::steady_clock::now() + timeout;
    if (closed != nullptr) *closed = false;
    for (;;) {
      if (until_answer && HasWholeAnswer(got)) return got;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return got;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return got;
      char buffer[16384];
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) {
        if (closed != nullptr) *closed = true;
        return got;
      }
      got.append(buffer, static_cast<size_t>(n));
    }
  }

  // Whether `reply` holds one whole answer with a Content-Length.
  static bool HasWholeAnswer(const std::string& reply) {
    const size_t head_end = reply.find("\r\n\r\n");
    if (head_end == std::string::npos) return false;
    const std::string head = reply.substr(0, head_end);
    std::string lower;
    for (char c : head) lower += static_cast<char>(tolower(static_cast<unsigned char>(c)));
    const size_t at = lower.find("content-length:");
    if (at == std::string::npos) return true;
    const size_t length = std::stoul(head.substr(at + 15));
    return reply.size() >= head_end + 4 + length;
  }

 private:
  int fd_;
};

// The status code of the first answer in `reply`, or 0 when there is none.
inline int StatusOf(const std::string& reply) {
  if (reply.rfind("HTTP/1.", 0) != 0 || reply.size() < 12) return 0;
  return std::stoi(reply.substr(9, 3));
}

// The body of the first answer in `reply` (everything after its head).
inline std::string BodyOf(const std::string& reply) {
  const size_t head_end = reply.find("\r\n\r\n");
  return head_end == std::string::npos ? std::string() : reply.substr(head_end + 4);
}

// Sends `bytes` on a new connection and reads until the server closes it or `timeout` passes.
inline std::string Exchange(int port, const std::string& bytes,
                            std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  RawConnection connection(port);
  if (!connection.ok() || !connection.Send(bytes)) return {};
  return connection.Read(timeout, nullptr, /*until_answer=*/true);
}

// A GET of `path` on a new connection; the whole reply.
inline std::string Get(int port, const std::string& path,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  return Exchange(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", timeout);
}

}  // namespace vf::http::testing
