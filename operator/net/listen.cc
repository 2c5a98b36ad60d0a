#include "operator/net/listen.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace vf::net {

Result<int> PickFreePort(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &found);
  if (rc != 0) return InvalidArgument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  std::string error = "no address";
  int port = -1;
  for (addrinfo* ai = found; ai != nullptr && port < 0; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      port = bound.ss_family == AF_INET6
                 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                 : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (port < 0) return Unavailable("cannot find a free port on '" + host + "': " + error);
  return port;
}

Status OpenOnPort(const std::string& host, int port, const std::function<Status(int)>& open) {
  constexpr int kAttempts = 5;
  Status last;
  for (int attempt = 0; attempt < (port == 0 ? kAttempts : 1); ++attempt) {
    int chosen = port;
    if (chosen == 0) {
      VF_ASSIGN_OR_RETURN(chosen, PickFreePort(host));
    }
    last = open(chosen);
    if (last.ok()) return last;
  }
  return last;
}

std::string HostForUri(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

}  // namespace vf::net
