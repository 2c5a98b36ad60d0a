// Helpers shared by the coordinator's server tests.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>

namespace vf::coordinator_test {

// A port that is free now and below Linux's ephemeral range (32768 and up), searched from
// `first` (each test binary its own range, so that binaries running at once differ). A client
// that keeps connecting to a closed ephemeral port on loopback can end up connected to itself,
// holding the very port a server is about to bind. -1 if none is free.
inline int FreeLowPort(int first) {
  for (int port = first + static_cast<int>(getpid() % 1000) * 10; port < 32000; port += 7) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool bound = bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
    close(fd);
    if (bound) return port;
  }
  return -1;
}

}  // namespace vf::coordinator_test
