#include "operator/controller/leader_label.h"

#include <condition_variable>
#include <mutex>

#include <nlohmann/json.hpp>

namespace vf::controller {

Status MarkLeader(kube::Client& client, const OwnPod& pod, bool leading,
                  std::chrono::milliseconds timeout) {
  if (!pod.known()) return Status::Ok();
  // null deletes the key in a merge patch (RFC 7386), and deleting an absent one is a no-op.
  const nlohmann::json value =
      leading ? nlohmann::json(kLeaderLabelValue) : nlohmann::json(nullptr);
  const nlohmann::json patch = {{"metadata", {{"labels", {{kLeaderLabel, value}}}}}};
  kube::CallOptions options;
  options.timeout = timeout;
  auto patched = client.MergePatch(kube::kPods, pod.ns, pod.name, patch, options);
  if (patched.reason() == kube::Reason::kNotFound) return Status::Ok();
  if (!patched.ok()) {
    return patched.status().WithContext(std::string(leading ? "setting" : "removing") +
                                        " the leader label of pod " + pod.ns + "/" + pod.name);
  }
  return Status::Ok();
}

Status MarkLeaderUntilDone(kube::Client& client, const OwnPod& pod, bool leading,
                           std::chrono::milliseconds retry, std::stop_token stop,
                           const std::function<void(std::string_view)>& log) {
  std::mutex mu;
  std::condition_variable_any wake;
  while (!stop.stop_requested()) {
    Status s = MarkLeader(client, pod, leading, retry);
    if (s.ok()) return s;
    if (log) log(s.message() + "; trying again");
    std::unique_lock<std::mutex> lock(mu);
    wake.wait_for(lock, stop, retry, [] { return false; });
  }
  return Unavailable("stopped before the leader label of pod " + pod.ns + "/" + pod.name + " was " +
                     (leading ? "set" : "removed"));
}

}  // namespace vf::controller
