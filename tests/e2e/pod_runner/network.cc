#include "tests/e2e/pod_runner/network.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <utility>

#include "tests/e2e/pod_runner/log.h"

extern char** environ;

namespace vf::podrunner {
namespace {

constexpr std::string_view kNamePrefix = "vf";
constexpr size_t kUidDigits = 12;  // "vf" + 12 = 14 characters, under IFNAMSIZ - 1 = 15

Result<uint32_t> ParseIpv4(std::string_view text) {
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t dot = text.find('.');
    if ((i < 3) != (dot != std::string_view::npos)) break;
    const std::string_view part = text.substr(0, dot);
    unsigned value = 256;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (ec != std::errc() || end != part.data() + part.size() || part.empty() || value > 255) {
      break;
    }
    out = out << 8 | value;
    if (i == 3) return out;
    text.remove_prefix(dot + 1);
  }
  return InvalidArgument("not an IPv4 address");
}

std::string Join(const Command& argv) {
  std::string out;
  for (const auto& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Reads both pipes to their ends (a child that fills one while we wait on the other would
// otherwise never finish).
void Drain(int out_fd, int err_fd, std::string& out, std::string& err) {
  pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  std::string* bufs[2] = {&out, &err};
  int open_count = 2;
  char buf[4096];
  while (open_count > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        bufs[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;
        --open_count;
      }
    }
  }
}

}  // namespace

Result<Ipv4Cidr> Ipv4Cidr::Parse(std::string_view text) {
  const size_t slash = text.find('/');
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("pod CIDR '" + std::string(text) + "': " + why);
  };
  if (slash == std::string_view::npos) return bad("want ADDRESS/PREFIX, e.g. 10.244.0.0/16");
  Result<uint32_t> address = ParseIpv4(text.substr(0, slash));
  if (!address.ok()) return bad(address.status().message());
  const std::string_view prefix_text = text.substr(slash + 1);
  int prefix = -1;
  const auto [end, ec] =
      std::from_chars(prefix_text.data(), prefix_text.data() + prefix_text.size(), prefix);
  if (ec != std::errc() || end != prefix_text.data() + prefix_text.size() || prefix < 8 ||
      prefix > 30) {
    return bad("the prefix length must be between 8 and 30");
  }
  const uint32_t mask = ~uint32_t{0} << (32 - prefix);
  if ((*address & ~mask) != 0) return bad("host bits are set");
  return Ipv4Cidr{*address, prefix};
}

std::string FormatIpv4(uint32_t address) {
  return std::to_string(address >> 24) + "." + std::to_string(address >> 16 & 0xFF) + "." +
         std::to_string(address >> 8 & 0xFF) + "." + std::to_string(address & 0xFF);
}

Result<std::string> AddressPool::Allocate(const std::string& owner) {
  if (auto it = owned_.find(owner); it != owned_.end()) return FormatIpv4(cidr_.At(it->second));
  const uint32_t first = 2;                // after the network address and the gateway
  const uint32_t last = cidr_.Size() - 2;  // before the broadcast address
  const uint32_t count = last - first + 1;
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t offset = first + (next_ - first + i) % count;
    if (used_.count(offset)) continue;
    used_[offset] = owner;
    owned_[owner] = offset;
    next_ = offset + 1 > last ? first : offset + 1;
    return FormatIpv4(cidr_.At(offset));
  }
  return Unavailable("every address of the pod CIDR " + FormatIpv4(cidr_.network) + "/" +
                     std::to_string(cidr_.prefix) + " is taken");
}

void AddressPool::Release(const std::string& owner) {
  auto it = owned_.find(owner);
  if (it == owned_.end()) return;
  used_.erase(it->second);
  owned_.erase(it);
}

PodNetNames NetNamesFor(std::string_view uid) {
  std::string name(kNamePrefix);
  for (char c : uid) {
    if (name.size() == kNamePrefix.size() + kUidDigits) break;
    if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) name.push_back(c);
  }
  // A uid that is not hex (only hand-made objects): pad so the name keeps its shape.
  while (name.size() < kNamePrefix.size() + kUidDigits) name.push_back('0');
  return {name, name};
}

bool IsPodNetName(std::string_view name) {
  if (name.size() != kNamePrefix.size() + kUidDigits || !name.starts_with(kNamePrefix)) {
    return false;
  }
  for (char c : name.substr(kNamePrefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::vector<Command> BridgeCommands(const std::string& bridge, const std::string& gateway,
                                    int prefix, bool exists) {
  std::vector<Command> out;
  if (!exists) out.push_back({"ip", "link", "add", bridge, "type", "bridge"});
  // A fixed MAC address (locally administered, from the gateway's address): a bridge whose
  // address was never set takes the lowest of its ports', so each pod that joins could change
  // the gateway's MAC under the pods that already resolved it, and their packets to the host
  // would go to another pod's port until their ARP entry expires (seconds of silence).
  Result<uint32_t> ip = ParseIpv4(gateway);
  if (ip.ok()) {
    char mac[18];
    std::snprintf(mac, sizeof(mac), "02:76:66:%02x:%02x:%02x", *ip >> 16 & 0xFF, *ip >> 8 & 0xFF,
                  *ip & 0xFF);
    out.push_back({"ip", "link", "set", bridge, "address", mac});
  }
  out.push_back({"ip", "addr", "replace", gateway + "/" + std::to_string(prefix), "dev", bridge});
  out.push_back({"ip", "link", "set", bridge, "up"});
  return out;
}

std::vector<Command> PodSetupCommands(const PodNetNames& names, const std::string& bridge,
                                      const std::string& address, int prefix,
                                      const std::string& gateway) {
  const std::string& ns = names.netns;
  return {
      {"ip", "netns", "add", ns},
      {"ip", "link", "add", names.veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
      {"ip", "link", "set", names.veth, "master", bridge, "up"},
      {"ip", "-n", ns, "addr", "add", address + "/" + std::to_string(prefix), "dev", "eth0"},
      {"ip", "-n", ns, "link", "set", "lo", "up"},
      {"ip", "-n", ns, "link", "set", "eth0", "up"},
      {"ip", "-n", ns, "route", "add", "default", "via", gateway},
  };
}

std::vector<std::string> ParseNetnsList(std::string_view output) {
  std::vector<std::string> out;
  while (!output.empty()) {
    const size_t nl = output.find('\n');
    std::string_view line = output.substr(0, nl);
    const size_t space = line.find(' ');
    line = line.substr(0, space);
    if (!line.empty()) out.emplace_back(line);
    if (nl == std::string_view::npos) break;
    output.remove_prefix(nl + 1);
  }
  return out;
}

std::vector<std::string> ParseLinkNames(std::string_view output) {
  std::vector<std::string> out;
  while (!output.empty()) {
    const size_t nl = output.find('\n');
    const std::string_view line = output.substr(0, nl);
    const size_t colon = line.find(": ");
    if (colon != std::string_view::npos) {
      std::string_view name = line.substr(colon + 2);
      name = name.substr(0, name.find_first_of(":@ "));
      if (!name.empty()) out.emplace_back(name);
    }
    if (nl == std::string_view::npos) break;
    output.remove_prefix(nl + 1);
  }
  return out;
}

Result<std::string> RunCommand(const Command& argv) {
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
    return Internal(Join(argv) + ": pipe: " + std::strerror(err));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);  // the runner blocks SIGTERM for its signal thread
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(out_pipe[1]);
  close(err_pipe[1]);
  std::string out, err;
  if (spawned == 0) Drain(out_pipe[0], err_pipe[0], out, err);
  close(out_pipe[0]);
  close(err_pipe[0]);
  if (spawned != 0) return Unavailable(Join(argv) + ": " + std::strerror(spawned));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return out;
  const std::string how = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                            : "signal " + std::to_string(WTERMSIG(status));
  return Internal(Join(argv) + " failed (" + how + "): " + Trim(err));
}

void RemovePodNet(const PodNetNames& names) {
  // Deleting the namespace destroys eth0 and with it the host end; the veth is deleted first in
  // case the namespace is already gone and only the pair is left.
  if (RunCommand({"ip", "link", "show", names.veth}).ok()) {
    if (auto r = RunCommand({"ip", "link", "del", names.veth}); !r.ok()) {
      LogLine(r.status().message());
    }
  }
  if (access(("/var/run/netns/" + names.netns).c_str(), F_OK) == 0) {
    if (auto r = RunCommand({"ip", "netns", "del", names.netns}); !r.ok()) {
      LogLine(r.status().message());
    }
  }
}

namespace {

// What a killed runner left: veths still on the bridge, and pod namespaces with no process in
// them. A namespace with processes belongs to a runner that is alive (another bridge's), as do
// namespaces of other bridges' runners being set up this very moment, a window of milliseconds.
void RemoveStale(const std::string& bridge) {
  if (Result<std::string> links = RunCommand({"ip", "-o", "link", "show", "master", bridge});
      links.ok()) {
    for (const auto& name : ParseLinkNames(*links)) {
      if (!IsPodNetName(name)) continue;
      LogLine("removing veth " + name + " left on bridge " + bridge + " by an earlier runner");
      if (auto r = RunCommand({"ip", "link", "del", name}); !r.ok()) LogLine(r.status().message());
    }
  }
  Result<std::string> list = RunCommand({"ip", "netns", "list"});
  if (!list.ok()) return;
  for (const auto& ns : ParseNetnsList(*list)) {
    if (!IsPodNetName(ns)) continue;
    Result<std::string> pids = RunCommand({"ip", "netns", "pids", ns});
    if (!pids.ok() || !Trim(*pids).empty()) continue;
    LogLine("removing network namespace " + ns + " left by an earlier runner");
    RemovePodNet({ns, ns});
  }
}

}  // namespace

Result<std::unique_ptr<PodNetwork>> PodNetwork::Create(const NetworkOptions& options) {
  VF_ASSIGN_OR_RETURN(const Ipv4Cidr cidr, Ipv4Cidr::Parse(options.cidr));
  if (options.bridge.empty() || options.bridge.size() > 15) {
    return InvalidArgument("bridge name '" + options.bridge + "' must have 1 to 15 characters");
  }
  RemoveStale(options.bridge);
  std::unique_ptr<PodNetwork> net(new PodNetwork(options, cidr));
  const bool exists = RunCommand({"ip", "link", "show", options.bridge}).ok();
  for (const Command& c :
       BridgeCommands(options.bridge, net->pool_.gateway(), net->pool_.prefix(), exists)) {
    if (Result<std::string> r = RunCommand(c); !r.ok()) {
      return r.status().WithContext("creating the pod bridge " + options.bridge);
    }
  }
  LogLine("pod network: bridge " + options.bridge + " at " + net->gateway() + "/" +
          std::to_string(net->pool_.prefix()) + (exists ? " (it existed)" : ""));
  return net;
}

PodNetwork::~PodNetwork() {
  for (const auto& [uid, names] : attached_) RemovePodNet(names);
  if (auto r = RunCommand({"ip", "link", "del", options_.bridge}); !r.ok()) {
    LogLine(r.status().message());
  } else {
    LogLine("pod network: removed bridge " + options_.bridge);
  }
}

Result<std::string> PodNetwork::Attach(const std::string& uid) {
  VF_ASSIGN_OR_RETURN(const std::string address, pool_.Allocate(uid));
  const PodNetNames names = NetNamesFor(uid);
  attached_[uid] = names;
  for (const Command& c :
       PodSetupCommands(names, options_.bridge, address, pool_.prefix(), pool_.gateway())) {
    if (Result<std::string> r = RunCommand(c); !r.ok()) {
      RemovePodNet(names);
      attached_.erase(uid);
      return r.status().WithContext("setting up the pod's network");
    }
  }
  return "/var/run/netns/" + names.netns;
}

void PodNetwork::Detach(const std::string& uid) {
  if (auto it = attached_.find(uid); it != attached_.end()) {
    RemovePodNet(it->second);
    attached_.erase(it);
  }
  pool_.Release(uid);
}

}  // namespace vf::podrunner
