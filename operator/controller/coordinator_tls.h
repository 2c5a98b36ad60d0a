// The coordinator's TLS certificate, kept by the operator in a Secret of its own namespace: a
// private CA (whose certificate, never its key, goes to every worker) and a server certificate
// it signs for the names workers dial. Every replica reads the same Secret, so whichever leads
// serves a certificate the workers trust.
//
// The rule (docs/security.md): the CA is valid for kCaValidity and is replaced, at an operator
// start, once less than kCaRenewBefore is left; the server certificate is valid for
// kServerValidity and is replaced once less than kServerRenewBefore is left, or when it does not
// name every name the coordinator must answer for, or does not chain to the CA. The operator
// checks at start and every kCheckEvery while it runs; a replaced server certificate is served
// from the next handshake on.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "agent/http/tls.h"
#include "operator/kube/client.h"
#include "runtime/status.h"

namespace vf::controller {

inline constexpr std::chrono::hours kCaValidity{24 * 3650};
inline constexpr std::chrono::hours kCaRenewBefore{24 * 365};
inline constexpr std::chrono::hours kServerValidity{24 * 90};
inline constexpr std::chrono::hours kServerRenewBefore{24 * 30};
inline constexpr std::chrono::hours kCheckEvery{1};
inline constexpr char kDefaultTlsSecret[] = "virtualflow-coordinator-tls";

// Where the material lives and what it must cover. Value type.
struct CoordinatorTlsOptions {
  std::string ns;  // the operator's namespace
  std::string secret = kDefaultTlsSecret;
  std::vector<std::string> names;  // DNS names and addresses the certificate must name
};

// The CA and the server certificate. Value type.
struct CoordinatorTls {
  http::KeyPair ca;
  http::KeyPair server;
};

// The names a coordinator reached at `url` must answer for: the URL's host (with
// "<host>.cluster.local" too for a Service name ending in ".svc"), localhost and 127.0.0.1.
std::vector<std::string> CoordinatorNames(const std::string& url);

// What to keep of `current` at `now`: the same when nothing needs renewing, else with a new CA
// and/or server certificate by the rule above. `current` may be empty (a first start). A new CA
// only with `renew_ca` (at a start: the workers of running jobs hold the CA their pods were
// made with). Sets `changed` when anything was made.
Result<CoordinatorTls> Renewed(const CoordinatorTls& current, const std::vector<std::string>& names,
                               std::chrono::system_clock::time_point now, bool renew_ca,
                               bool* changed);

// What a running replica that serves `served` should serve once the Secret holds `stored`:
// nullopt to keep what it serves. The Secret's when it is of the same CA and newer. When another
// replica rotated the CA at its start, the workers of running jobs still trust the one served,
// so the replica keeps that CA and renews its server certificate from it when the rule says so
// (its pods get the new CA once it starts again); without this, the served certificate would
// expire unrenewed.
Result<std::optional<CoordinatorTls>> NextServed(const CoordinatorTls& served,
                                                 const CoordinatorTls& stored,
                                                 const std::vector<std::string>& names,
                                                 std::chrono::system_clock::time_point now);

// Reads the Secret (creating it when missing), renews what the rule says, writes it back, and
// returns what is in it now. Two replicas starting together agree: a lost create or update
// (409) reads the other's and goes on from there.
Result<CoordinatorTls> EnsureCoordinatorTls(kube::Client& client,
                                            const CoordinatorTlsOptions& options, bool renew_ca);

}  // namespace vf::controller
