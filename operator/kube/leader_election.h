// Leader election on a coordination.k8s.io/v1 Lease, as client-go's leaderelection does it, so
// that of several operator replicas exactly one acts at a time.
//
//   LeaderElectionConfig config{.ns = "virtualflow", .name = "virtualflow-operator",
//                               .identity = pod_name};
//   config.on_started_leading = [&](std::stop_token leading) { controller.Start(leading); };
//   config.on_stopped_leading = [&] { controller.StopAndWait(); };
//   VF_ASSIGN_OR_RETURN(std::unique_ptr<LeaderElector> elector,
//                       LeaderElector::Create(client, config));
//   Status why = elector->Run(process_stop);  // returns when leadership ends
//
// Safety rests on timing, not on clocks agreeing: a candidate takes the Lease over only when
// it has seen the Lease's record unchanged for leaseDurationSeconds by its own clock, while the
// holder stops acting once it has failed to renew for renew_deadline, which is shorter.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stop_token>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "operator/kube/client.h"
#include "runtime/status.h"

namespace vf::kube {

// Which Lease, who we are, the timing and what to call; value type.
struct LeaderElectionConfig {
  std::string ns;
  std::string name;
  // Unique among the candidates (the pod's name); written as the Lease's holderIdentity.
  std::string identity;
  // How long others wait, after they last saw the Lease change, before taking it over.
  std::chrono::milliseconds lease_duration{15000};
  // How long the leader keeps trying to renew before it gives up leading. Below
  // lease_duration, so that the leader has stopped before anyone may take over.
  std::chrono::milliseconds renew_deadline{10000};
  // How often the leader renews, and candidates try to acquire (the latter with up to 120%
  // jitter, so that candidates do not move in lockstep).
  std::chrono::milliseconds retry_period{2000};
  // When Run is stopped while leading, give the Lease up (an empty holderIdentity) so that a
  // successor takes over at once instead of after lease_duration. Only safe if
  // on_stopped_leading returns after the work the Lease guards has stopped.
  bool release_on_cancel = true;

  // The callbacks (log included) run on the thread that called Run and must not block for
  // long: renewals wait for them.
  //
  // On becoming leader. `leading` is stopped the moment this term ends (before
  // on_stopped_leading runs): start the leader's work on threads of its own and hand it this.
  std::function<void(std::stop_token leading)> on_started_leading = nullptr;
  // Once, after a term that on_started_leading began has ended (lost, or Run stopped); not
  // called if Run ends without ever leading. When release_on_cancel is set, the Lease is
  // released after this returns: return only once the leader's work has stopped.
  std::function<void()> on_stopped_leading = nullptr;
  // Whenever the Lease is seen held by a non-empty identity (ours included) other than the one
  // last reported.
  std::function<void(const std::string& identity)> on_new_leader = nullptr;
  // Where messages go (failed calls with their reason, gaining and losing the Lease); null:
  // one line each on stderr.
  std::function<void(std::string_view message)> log = nullptr;
};

// Campaigns for one Lease and, once it holds it, keeps it renewed until leadership is lost or
// Run is stopped. Run may be called once, from one thread, which also runs the callbacks, and
// the elector must outlive it; IsLeader, LeaderIdentity and config are thread-safe.
class LeaderElector {
 public:
  // Fails on an incomplete or inconsistent configuration: no namespace, name or identity; or
  // not lease_duration > renew_deadline > 1.2 * retry_period > 0 (the renew deadline must
  // leave time for a retry); or a lease_duration under a second. `client` must outlive the
  // elector; a client of its own is best, so that the operator's other calls cannot hold
  // renewals up in its rate limiter.
  static Result<std::unique_ptr<LeaderElector>> Create(Client& client, LeaderElectionConfig config);

  // Acquires the Lease (retrying every retry_period, creating it if missing), calls
  // on_started_leading, then renews every retry_period. Returns when leadership ends: OK when
  // `stop` was requested (before or after acquiring; then, with release_on_cancel, the Lease
  // is released), kUnavailable when renewing failed for renew_deadline, kFailedPrecondition
  // when another candidate was seen holding the Lease. API errors never end it early: they
  // are logged and retried.
  Status Run(std::stop_token stop);

  // Whether this elector holds the Lease and has renewed it within renew_deadline: check it
  // right before acting as leader. Lock-free.
  bool IsLeader() const;
  // The holder most recently seen on the Lease ("" before the first read, or after a release).
  std::string LeaderIdentity() const;
  const LeaderElectionConfig& config() const { return config_; }

  ~LeaderElector();
  LeaderElector(const LeaderElector&) = delete;
  LeaderElector& operator=(const LeaderElector&) = delete;

 private:
  using SteadyClock = std::chrono::steady_clock;
  enum class Attempt { kSucceeded, kFailed, kHeldByOther };

  LeaderElector(Client& client, LeaderElectionConfig config);

  // One read-check-write of the Lease, as client-go's tryAcquireOrRenew; `deadline` bounds
  // its calls.
  Attempt TryAcquireOrRenew(SteadyClock::time_point deadline);
  // Notes `lease` as read or written at `now`, resetting the observation time when its record
  // changed.
  void Observe(const nlohmann::json& lease, SteadyClock::time_point now);
  // Gives the Lease up (empty holder, 1 s duration) after a term ends by cancellation.
  void Release();
  void Log(const std::string& message) const;
  // Logs a failed call and records it as the last failure (see the .cc for which one wins).
  void NoteFailure(std::string_view what, const ApiError& error);
  CallOptions CallsUntil(SteadyClock::time_point deadline) const;

  Client& client_;
  const LeaderElectionConfig config_;
  std::mt19937_64 random_;

  // Touched only by the Run thread.
  std::optional<nlohmann::json> lease_;  // the Lease as last read or written
  nlohmann::json observed_record_;       // its spec's election fields, as last seen to change
  SteadyClock::time_point observed_at_{};
  std::string reported_leader_;
  std::string last_error_;  // why the last attempt failed, for Run's result
  bool ran_ = false;

  // Shared with IsLeader callers.
  std::atomic<bool> leading_{false};
  std::atomic<int64_t> valid_until_ns_{0};  // steady clock: last renewal + renew_deadline
  mutable std::mutex mu_;
  std::string leader_identity_;  // guarded by mu_
};

// metav1.MicroTime: RFC 3339 in UTC with exactly six fractional digits
// ("2024-05-01T12:00:00.123456Z"), as Leases carry their times.
std::string FormatMicroTime(std::chrono::system_clock::time_point time);

}  // namespace vf::kube
