// The pods a controller created for one job that its informer cache does not show yet, as
// Kubernetes' Job controller keeps them (ControllerExpectations): until the cache catches up,
// they count as the job's own, so that none is created twice and their workers are admitted.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace vf::controller {

// Pods created and awaited in the cache, for one job. An expectation ends when the cache shows
// the pod, or after `timeout` (a create the cache never reflects, say because the pod was
// deleted at once, must not hold the job back for ever). Value type; not thread-safe (the
// Reconciler keeps one per job under its mutex).
class Expectations {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr Clock::duration kDefaultTimeout = std::chrono::seconds(60);

  Expectations() = default;
  explicit Expectations(Clock::duration timeout) : timeout_(timeout) {}

  // Pod `name` was created at `now`.
  void ExpectCreation(const std::string& name, Clock::time_point now);
  // Ends the expectations of the pods `in_cache` says the cache shows, and of those created
  // more than the timeout before `now`; returns how many are still awaited.
  int Observe(const std::function<bool(const std::string&)>& in_cache, Clock::time_point now);
  // The pods awaited, by name (as of the last Observe: timed-out ones stay until then).
  std::vector<std::string> Pending() const;
  bool empty() const { return created_.empty(); }

 private:
  Clock::duration timeout_ = kDefaultTimeout;
  std::map<std::string, Clock::time_point> created_;  // pod name -> when created
};

}  // namespace vf::controller
