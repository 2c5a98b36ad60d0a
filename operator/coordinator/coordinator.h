// Membership and rendezvous state of the jobs the control plane runs: each job's plan (which
// worker holds which rank and virtual nodes in which epoch), its registered workers, and a
// rendezvous key-value store. The HTTP server (server.h) exposes it to agents; the operator and
// the local launcher drive it directly and restore it after a restart, which is why every piece
// of state can be set from outside.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "agent/protocol/messages.h"
#include "runtime/status.h"

namespace vf {

// What the coordinator knows about one registered worker.
struct WorkerInfo {
  std::string worker;
  bool ready = false;
  std::string fingerprint;
  std::string build;
  bool leave_requested = false;
  // Epoch whose plan excluded the worker and that it acknowledged before exiting; -1: none.
  int64_t acked_epoch = -1;
  // Last epoch in which it reported a failed collective; -1: none.
  int64_t failure_epoch = -1;
  int64_t failure_step = -1;
  std::string failure_message;
  Report last_report;
  // Its last request of any kind (a plan poll counts: agents poll every second while they live).
  std::chrono::steady_clock::time_point last_seen;
  // Not heard from for the threshold of the last SweepSilent: stopped, hung or cut off.
  bool silent = false;
};

// A consistent copy of one job's state.
struct JobView {
  std::string fingerprint;
  std::string build;
  Plan plan;
  std::map<std::string, WorkerInfo> workers;
  // Strictly increases on every change of the job (registration, readiness, report, leave,
  // ack, failure, plan). Values come from one counter shared by all jobs, so a job that is
  // removed and added again never repeats a value a controller has already seen.
  uint64_t generation = 0;
};

// The newest failure a worker of `view` reported under plan `epoch` or a later one, as
// "<worker> reported: <message>" (the latest epoch, then the latest step, then the first name);
// empty when none did. For the messages of a controller that recovers from it, so that a failure
// that recurs is seen with its cause.
std::string ReportedFailure(const JobView& view, int64_t epoch);

// The credential of `worker` in a job whose secret is `job_secret`: the lowercase hex
// HMAC-SHA256 of the worker's name keyed with the secret (OpenSSL). Whoever holds the job's secret
// (the operator, `vf run`) mints one per worker; the coordinator recomputes it to check a
// request, so it keeps no table of credentials, and one worker's credential says nothing of
// another's. Internal only if OpenSSL fails.
Result<std::string> WorkerCredential(std::string_view job_secret, std::string_view worker);

// In-memory state of every job: plans, workers and rendezvous stores, plus callbacks that
// fire when a plan or key appears (so long polls need no waiting thread). Thread-safe; callbacks
// run without any internal lock held.
class Coordinator {
 public:
  using WatchId = uint64_t;
  using PlanCallback = std::function<void(Result<Plan>)>;
  using KeyCallback = std::function<void(Result<std::string>)>;
  // Returned by Watch* when the callback already ran before the call returned.
  static constexpr WatchId kNoWatch = 0;

  // Bounds on what one job may hold, so that no client can exhaust the process's memory.
  static constexpr size_t kMaxStoreBytesPerJob = 64u << 20;
  static constexpr size_t kMaxKeysPerJob = 1u << 18;
  static constexpr size_t kMaxWorkersPerJob = 16384;
  static constexpr size_t kMaxKeyBytes = 1024;
  // What all jobs together may hold (store keys and values, registered workers), by default.
  static constexpr size_t kDefaultMemoryBudget = size_t{1} << 30;
  // What a key or a registered worker costs the budget besides its strings: the map entries
  // around it, rounded up.
  static constexpr size_t kKeyOverheadBytes = 128;
  static constexpr size_t kWorkerOverheadBytes = 512;

  // `memory_budget` bounds what all jobs together hold; a write past it fails with
  // kFailedPrecondition, a registration past it with kUnavailable (kCoordinatorFull: the worker
  // waits for room). `protocol` is the coordinator protocol this coordinator speaks: this
  // build's kProtocolVersion; another only in tests, where an operator poses as one of another
  // protocol (VF_TEST_OPERATOR_PROTOCOL) to drain the jobs of the workers it cannot talk to.
  explicit Coordinator(size_t memory_budget = kDefaultMemoryBudget,
                       int64_t protocol = kProtocolVersion);
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // `job` is "namespace/name"; `secret` is the key its workers' credentials are derived from
  // (WorkerCredential). Adding a job that exists succeeds, and keeps its state, only if secret,
  // fingerprint and build are all equal; otherwise kFailedPrecondition.
  Status AddJob(const std::string& job, const std::string& secret, const std::string& fingerprint,
                const std::string& build);
  // Drops the job and everything it holds; pending watches fire with kNotFound.
  Status RemoveJob(const std::string& job);
  std::vector<std::string> ListJobs() const;

  // This coordinator's incarnation: 16 hex digits drawn at construction, so that a restarted
  // control plane's coordinator (whose store is empty) tells itself apart from the one before.
  // The server sends it with every successful answer (kIncarnationHeader).
  const std::string& incarnation() const { return incarnation_; }
  // The coordinator protocol it speaks, and that a worker must speak to register.
  int64_t protocol() const { return protocol_; }

  // Whether `credential` is `worker`'s in `job`. kUnauthenticated, with the same words, for an
  // unknown job, an invalid worker name and a wrong credential, so that the answer says nothing
  // of which jobs exist; compared in constant time (CRYPTO_memcmp), so that its timing says
  // nothing of the credential either.
  Status CheckCredential(const std::string& job, const std::string& worker,
                         std::string_view credential) const;
  // Restricts `job`'s credentials to the workers named in `admitted`, replacing the set of an
  // earlier call: from then on CheckCredential refuses every other worker's credential, with the
  // same words as a wrong one, however validly it derives from the job's secret. A credential
  // is a function of the worker's name and so cannot be taken back; this is how it is revoked
  // once its worker's pod is gone or the worker left its plan. A job never restricted accepts
  // every credential derived from its secret (vf run's workers). kNotFound for an unknown job.
  Status RestrictWorkers(const std::string& job, std::set<std::string> admitted);

  // At most `max_workers` (1..kMaxWorkersPerJob) registered workers in `job`; registrations
  // past it fail with kUnavailable (kCoordinatorFull: the worker waits for room). Workers already
  // registered stay.
  Status SetWorkerLimit(const std::string& job, size_t max_workers);
  // Bytes all jobs hold now, as the memory budget counts them.
  size_t MemoryUsed() const;

  // Publishes the next epoch's plan (previous epoch + 1, prefix "epoch-<epoch>") and wakes
  // its watchers. Members must have ranks 0..n-1 each once, distinct worker names and
  // non-empty, disjoint, non-negative virtual-node lists. An empty member list is a valid plan
  // ("nobody trains"), e.g. for a suspended job. Store keys of epochs older than epoch - 2 are
  // dropped: nobody rendezvouses in them any more, and keeping them would let memory grow with
  // every resize.
  Result<Plan> PublishPlan(const std::string& job, std::vector<Member> members);
  // The same with an explicit epoch, for restoring a job after an operator restart; `epoch`
  // must be greater than the current one.
  Result<Plan> PublishPlanWithEpoch(const std::string& job, int64_t epoch,
                                    std::vector<Member> members);
  Result<Plan> GetPlan(const std::string& job) const;

  // Registers `worker` or, if it is registered, updates its readiness. Refused
  // (kFailedPrecondition with a message naming the difference) unless the worker speaks this
  // coordinator's protocol (protocol()) and its fingerprint equals the job's, and its
  // build is the job's: the one given to AddJob, or, once the first member of the current plan
  // to register brought another (the workers of an operator upgraded under them), or in a job
  // whose plan has no members the first worker to register, that one. A refusal for the build
  // says kAnotherBuildRefusal. A new worker the job's worker limit or the memory budget has no
  // room for is refused for now: kUnavailable saying kCoordinatorFull.
  Status RegisterWorker(const std::string& job, const std::string& worker,
                        const std::string& fingerprint, const std::string& build, bool ready,
                        int64_t protocol = kProtocolVersion);
  // The worker must be registered (kNotFound) and report in the current epoch
  // (kFailedPrecondition otherwise, so that it goes and fetches the newer plan). Only rank 0 of
  // the current plan reports for the whole job (finished, the final weights' digest):
  // kPermissionDenied for anyone else.
  Status RecordReport(const std::string& job, const std::string& worker, const Report& report);
  Status RequestLeave(const std::string& job, const std::string& worker);
  // The worker saw plan `epoch` exclude it and is exiting. `epoch` may not be in the future,
  // and if it is the current epoch the current plan must indeed exclude the worker.
  Status AckPlan(const std::string& job, const std::string& worker, int64_t epoch);
  // A collective failed in `epoch` (not in the future) at `step`.
  Status RecordFailure(const std::string& job, const std::string& worker, int64_t epoch,
                       int64_t step, const std::string& message);
  // The worker made a request (a plan poll, a store access): it runs and reaches us. Unknown
  // jobs and workers are ignored (a worker polls before it registers).
  void Heard(const std::string& job, const std::string& worker);
  // Marks every registered worker not heard from for `threshold` as silent, and clears the mark
  // of one heard again; a change bumps the job's generation. The controller and the local
  // runner call it periodically, so that a hung member is noticed without any request.
  void SweepSilent(std::chrono::steady_clock::duration threshold);
  // Drops a worker's registration (a controller's verdict that it is dead).
  Status ForgetWorker(const std::string& job, const std::string& worker);

  Result<JobView> GetJob(const std::string& job) const;
  // Returns true as soon as the job's generation differs from `seen_generation`, false after
  // `timeout`. A job that does not exist has generation 0, so its removal, and its creation,
  // are changes too.
  bool WaitForChange(const std::string& job, uint64_t seen_generation,
                     std::chrono::milliseconds timeout);

  // Rendezvous store. A key whose first segment is "epoch-K" belongs to epoch K: writing it
  // once the current epoch is past K is kFailedPrecondition, since the ranks it was meant for
  // have moved on. A job holds at most kMaxKeysPerJob keys and kMaxStoreBytesPerJob bytes, and
  // all jobs together no more than the memory budget (kFailedPrecondition past either).
  // `writer` names the worker that writes (empty: the control plane itself). A worker writes
  // the keys of the current epoch only, and only as a member of its plan (kPermissionDenied),
  // so that no worker outside a plan can plant an address its ranks would connect to.
  Status SetKey(const std::string& job, const std::string& key, std::string_view value,
                std::string_view writer = {});
  // Calls `observer` after every successful SetKey, without the lock held; nullptr removes it.
  // For the operator's test-only fault injection, which acts at the moment a new epoch's
  // members meet to transfer the state.
  using KeySetObserver = std::function<void(const std::string& job, const std::string& key)>;
  void ObserveKeySets(KeySetObserver observer);
  // Waits up to `timeout` for `key`; kDeadlineExceeded naming the key after that. A missing key
  // of an epoch older than the current one fails at once (it can no longer be written).
  Result<std::string> GetKey(const std::string& job, const std::string& key,
                             std::chrono::milliseconds timeout);

  // Calls `done` once with the first plan whose epoch exceeds `after`, or with kNotFound if the
  // job is removed first. If such a plan exists already, `done` runs before this returns and
  // the result is kNoWatch. Fails (without calling `done`) for an unknown job.
  Result<WatchId> WatchPlan(const std::string& job, int64_t after, PlanCallback done);
  // Calls `done` once with the value of `key` when it is set (at once if it is), or with an
  // error if the job is removed or the key's epoch becomes older than the current one. Fails
  // (without calling `done`) for an unknown job, a malformed key, or a missing key whose epoch is
  // already older than the current one.
  Result<WatchId> WatchKey(const std::string& job, const std::string& key, KeyCallback done);
  // Removes a pending watch. True if its callback will never run; false if it has run or is
  // running (the caller lost the race and must let the callback finish the work).
  bool CancelWatch(WatchId id);

 private:
  struct PlanWatch {
    int64_t after;
    PlanCallback done;
  };
  struct KeyWatch {
    std::string key;
    KeyCallback done;
  };
  struct JobState {
    std::string secret;
    size_t max_workers = kMaxWorkersPerJob;
    // RestrictWorkers: the only workers whose credentials are accepted; unset: every worker.
    std::optional<std::set<std::string>> admitted;
    size_t charged = 0;  // what this job holds of the memory budget
    std::string fingerprint;
    std::string build;
    Plan plan;
    std::map<std::string, WorkerInfo> workers;
    uint64_t generation = 0;
    std::map<std::string, std::shared_ptr<const std::string>> store;
    size_t store_bytes = 0;
    std::map<WatchId, PlanWatch> plan_watches;
    std::map<WatchId, KeyWatch> key_watches;
  };
  // Work to do once the lock is released.
  using Deferred = std::vector<std::function<void()>>;

  // These expect mu_ to be held.
  Result<JobState*> FindLocked(const std::string& job);
  Result<const JobState*> FindLocked(const std::string& job) const;
  Result<WorkerInfo*> FindWorkerLocked(const std::string& job, const std::string& worker);
  void BumpLocked(JobState& state);
  // Moves `state`'s share of the budget from `before` to `after` bytes; fails, changing
  // nothing, when growing would pass the budget.
  Status ChargeLocked(JobState& state, size_t before, size_t after);
  Status AdoptBuildLocked(JobState& state, const std::string& worker, const std::string& build);
  Result<Plan> InstallPlanLocked(const std::string& job, JobState& state, int64_t epoch,
                                 std::vector<Member> members, Deferred& deferred);

  const size_t memory_budget_;
  const int64_t protocol_;
  const std::string incarnation_;
  mutable std::mutex mu_;
  std::condition_variable changed_;
  size_t memory_used_ = 0;
  KeySetObserver key_set_observer_;
  std::map<std::string, JobState> jobs_;
  // Which job each pending watch belongs to, so CancelWatch needs only the id.
  std::map<WatchId, std::string> watch_jobs_;
  uint64_t last_generation_ = 0;
  WatchId last_watch_ = kNoWatch;
};

// The epoch K of a key whose first path segment is "epoch-K", or -1 for other keys.
int64_t KeyEpoch(std::string_view key);

}  // namespace vf
