// The leader label: how the coordinator's Service finds the operator pod that leads. Every
// operator replica is ready when it is healthy (a standby too, so that a Deployment of two is
// Available and a PodDisruptionBudget can let one go), so readiness alone cannot pick the
// leader's coordinator; the Service selects this label as well, which the leader puts on its own
// pod once its caches have synced and takes off when it stops leading.
//
// A label left on a pod whose operator died does not send agents there: the Service selects
// ready pods only, and a dead or restarting operator is not ready. A restarted container in the
// same pod clears the label before it stands by (ready), so a standby never carries it.
#pragma once

#include <chrono>
#include <functional>
#include <stop_token>
#include <string>
#include <string_view>

#include "operator/kube/client.h"
#include "runtime/status.h"

namespace vf::controller {

inline constexpr char kLeaderLabel[] = "virtualflow.io/leader";
inline constexpr char kLeaderLabelValue[] = "true";

// The pod an operator replica runs in (the Downward API's POD_NAMESPACE and POD_NAME). Empty
// outside a pod: then there is nothing to label. Value type.
struct OwnPod {
  std::string ns;
  std::string name;
  bool known() const { return !ns.empty() && !name.empty(); }
};

// Puts the leader label on `pod` (`leading`) or takes it off, with one merge patch bounded by
// `timeout`. A pod that does not exist is success: no Service can select it (an operator run
// outside a pod of that name, or a pod already deleted). Nothing to do without a known pod.
Status MarkLeader(kube::Client& client, const OwnPod& pod, bool leading,
                  std::chrono::milliseconds timeout);

// MarkLeader until it succeeds or `stop` is requested (then kUnavailable), `retry` apart, each
// failure passed to `log` (a line for people). A leader whose label is not set is unreachable
// through the Service, and a standby with a stale one would be reached: neither may give up.
Status MarkLeaderUntilDone(kube::Client& client, const OwnPod& pod, bool leading,
                           std::chrono::milliseconds retry, std::stop_token stop,
                           const std::function<void(std::string_view)>& log);

}  // namespace vf::controller
