// One network namespace and address per pod, as a CNI bridge plugin gives them: a Linux bridge
// holding the first address of the pod CIDR (the pods' gateway and the host's address as they
// see it), and per pod a namespace with a veth pair, eth0 inside with the pod's address and a
// default route through the bridge, the other end on the bridge.
//
// Everything is done by running iproute2's `ip`: a few commands per pod cost milliseconds, and
// hand-written netlink would be far more code to get right for a test tool.
//
// Pods reach the host only at the bridge address: whatever a pod must reach on the host (the
// API server, the operator's coordinator, Prometheus) must listen on 0.0.0.0 or that address,
// not on 127.0.0.1, which inside a pod's namespace is the pod itself.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace vf::podrunner {

// An IPv4 prefix such as 10.244.0.0/16. Value type; thread-compatible.
struct Ipv4Cidr {
  uint32_t network = 0;  // host byte order, host bits zero
  int prefix = 0;

  // "10.244.0.0/16"; host bits that are set are an error, as are prefixes past /30 (no room
  // for a gateway and a pod).
  static Result<Ipv4Cidr> Parse(std::string_view text);
  // The n-th address of the prefix (0 is the network address).
  uint32_t At(uint32_t n) const { return network + n; }
  uint32_t Size() const { return prefix == 0 ? 0xFFFFFFFFU : (1U << (32 - prefix)); }
};

std::string FormatIpv4(uint32_t address);

// Hands out the addresses of a CIDR to pods: never the network address, the gateway (the first
// host address) or the broadcast address, and round-robin, so that an address freed a moment ago
// is not the next one given (a late packet must not reach a new pod). Not thread-safe.
class AddressPool {
 public:
  explicit AddressPool(Ipv4Cidr cidr) : cidr_(cidr), next_(2) {}

  std::string gateway() const { return FormatIpv4(cidr_.At(1)); }
  int prefix() const { return cidr_.prefix; }

  // The address of `owner`: the one it already holds, else a free one; kUnavailable when none
  // is left.
  Result<std::string> Allocate(const std::string& owner);
  void Release(const std::string& owner);

 private:
  Ipv4Cidr cidr_;
  uint32_t next_;                          // the offset to try first
  std::map<std::string, uint32_t> owned_;  // owner -> offset
  std::map<uint32_t, std::string> used_;   // offset -> owner
};

// What the runner creates for one pod. Value type; thread-compatible.
struct PodNetNames {
  std::string netns;  // the namespace, /var/run/netns/<netns>
  std::string veth;   // the host end of the pair (the other end is eth0 in the namespace)
};

// Names derived from the pod's uid: "vf" and 12 hex digits of it, within the 15 characters an
// interface name may have. Both the namespace and the veth take that name.
PodNetNames NetNamesFor(std::string_view uid);

// Whether `name` is one NetNamesFor gives (what the stale clean-up may remove).
bool IsPodNetName(std::string_view name);

using Command = std::vector<std::string>;

// The `ip` commands that create the bridge with the gateway address and a fixed MAC address
// and bring it up (the bridge itself only when it does not exist yet: `exists`).
std::vector<Command> BridgeCommands(const std::string& bridge, const std::string& gateway,
                                    int prefix, bool exists);

// The `ip` commands that give a pod its namespace, veth pair, address and default route.
std::vector<Command> PodSetupCommands(const PodNetNames& names, const std::string& bridge,
                                      const std::string& address, int prefix,
                                      const std::string& gateway);

// The names in `ip netns list` output.
std::vector<std::string> ParseNetnsList(std::string_view output);

// The interface names in `ip -o link show` output ("7: vfab@if2: <...> ..." gives "vfab").
std::vector<std::string> ParseLinkNames(std::string_view output);

// Runs `argv` (no shell) and returns its stdout; an exit other than 0 is an error carrying the
// command and its stderr.
Result<std::string> RunCommand(const Command& argv);

// How the pod network is laid out. Value type; thread-compatible.
struct NetworkOptions {
  std::string bridge = "vfpods0";
  std::string cidr = "10.244.0.0/16";
};

// The pod network of one runner: the bridge, the address pool and each pod's namespace. Not
// thread-safe: the reconcile thread owns it.
class PodNetwork {
 public:
  // Removes what a killed runner left (veths on the bridge; vf-named namespaces with no process
  // in them), then creates the bridge with the gateway address if needed and brings it up.
  static Result<std::unique_ptr<PodNetwork>> Create(const NetworkOptions& options);
  // Deletes every pod's namespace and the bridge.
  ~PodNetwork();
  PodNetwork(const PodNetwork&) = delete;
  PodNetwork& operator=(const PodNetwork&) = delete;

  std::string gateway() const { return pool_.gateway(); }

  // The pod's address, allocated on the first call (nothing is created in the kernel yet).
  Result<std::string> Address(const std::string& uid) { return pool_.Allocate(uid); }

  // Creates the pod's namespace with its address; returns the path a process joins it by. Tears
  // down what it made when a step fails.
  Result<std::string> Attach(const std::string& uid);

  // Deletes the pod's namespace and veth (if made) and frees its address. Idempotent.
  void Detach(const std::string& uid);

 private:
  PodNetwork(NetworkOptions options, Ipv4Cidr cidr) : options_(std::move(options)), pool_(cidr) {}

  NetworkOptions options_;
  AddressPool pool_;
  std::map<std::string, PodNetNames> attached_;  // by uid
};

// Deletes a namespace and veth of these names if they exist; errors are logged, not returned.
void RemovePodNet(const PodNetNames& names);

}  // namespace vf::podrunner
