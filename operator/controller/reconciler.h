// The VirtualFlowJob reconciler: level-triggered, by key. Each call reads the job, its pods and
// the cluster's nodes from the informer caches and the job's membership from the coordinator,
// and moves the world one step toward what the job asks for: its NetworkPolicy, worker pods
// (created and deleted) and their credential Secrets, the next membership plan, and the status
// subresource.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/controller/event_recorder.h"
#include "operator/controller/expectations.h"
#include "operator/controller/fault.h"
#include "operator/controller/informer.h"
#include "operator/controller/inventory.h"
#include "operator/controller/job_status.h"
#include "operator/controller/kueue.h"
#include "operator/controller/kueue_contract.h"
#include "operator/controller/worker_pod.h"
#include "operator/coordinator/coordinator.h"
#include "operator/kube/client.h"
#include "operator/policy/membership.h"
#include "operator/policy/policy.h"
#include "runtime/job/spec.h"
#include "runtime/status.h"

namespace vf::controller {

// What a reconcile asks of the work queue afterwards. Value type.
struct ReconcileResult {
  // Look again after this long even if nothing changes (0: only on a change).
  std::chrono::milliseconds requeue_after{0};
};

// Why the membership of a running job changed: more workers, fewer (GPUs taken back), a
// worker lost or failed, or a worker that asked to leave.
enum class ResizeKind { kGrow, kShrink, kFailure, kLeave };

// The kind of a membership change as policy::MembershipDecision names it ("grow", ...);
// nullopt for a job's first plan ("start") and for a name it does not know.
std::optional<ResizeKind> ResizeKindOf(std::string_view kind);

// Things the reconciler reports for metrics, none required. Value type.
struct ReconcilerHooks {
  std::function<void(const std::string& job, ResizeKind kind, int from, int to)> on_resize;
  std::function<void(const std::string& job, double pause_seconds)> on_resize_pause;
  // Once for each failed periodic checkpoint a worker of the job reported.
  std::function<void(const std::string& job)> on_checkpoint_failure;
  // After every reconcile of a job that exists: its phase, workers and progress.
  std::function<void(const std::string& job, const nlohmann::json& status, const JobSpec& spec)>
      on_job_status;
  std::function<void(const std::string& job)> on_job_gone;
  std::function<void(const ClusterGpus& gpus)> on_inventory;
};

// Value type.
struct ReconcilerOptions {
  PodSettings pods;
  std::string policy = "elastic";
  double join_batch_seconds = policy::kJoinBatchSeconds;
  // The build the coordinator expects of a new job's workers; empty: this operator's own.
  std::string build;
  // The key every job's secret is derived from (job_key.h); at least kMinJobKeyBytes.
  std::string job_key;
  // Each job gets a NetworkPolicy that admits only its own pods to its workers
  // (BuildNetworkPolicy), kept as built: made again when deleted, restored when changed. Unset:
  // none (a cluster whose CNI ignores NetworkPolicies).
  std::optional<NetworkPolicySettings> network_policy;
  // Every job goes through Kueue: a job without a kueue.x-k8s.io/queue-name label gets no
  // workers and waits, its Admitted condition (reason kNoQueueName) saying what to add. Off:
  // such a job is scheduled by the operator alone.
  bool require_queue = false;
  // Test-only: the phase at which the operator kills itself (fault.h).
  OperatorFault fault;
};

// Reconciles one job at a time per key. Reconcile may run on several threads for different
// keys (the work queue never hands out one key twice at once); its own bookkeeping is guarded
// by a mutex, and the informers, the coordinator and the client are thread-safe.
class Reconciler {
 public:
  // Everything passed in must outlive the reconciler. `workloads` mirrors Kueue's Workloads
  // (null: jobs with a queue label wait, saying that the operator does not watch Workloads).
  // `network_policies` mirrors the NetworkPolicies labelled kManagedByLabel=kManagedBy; it is
  // required with options.network_policy.
  static Result<std::unique_ptr<Reconciler>> Create(
      kube::Client& client, const Informer& jobs, const Informer& pods, const Informer& nodes,
      Coordinator& coordinator, ReconcilerOptions options, ReconcilerHooks hooks = {},
      const Informer* workloads = nullptr, const Informer* network_policies = nullptr);

  ~Reconciler();
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

  // `key` is "namespace/name".
  Result<ReconcileResult> Reconcile(const std::string& key);

 private:
  Reconciler(kube::Client& client, const Informer& jobs, const Informer& pods,
             const Informer& nodes, const Informer* workloads, const Informer* network_policies,
             Coordinator& coordinator, ReconcilerOptions options, ReconcilerHooks hooks,
             std::unique_ptr<policy::Policy> policy);

  // One reconcile of one job, and whether a step ended it.
  struct Pass;
  enum class Next { kGoOn, kDone };

  // The steps of Reconcile, in order. The job is gone: forget what was kept for it.
  Result<ReconcileResult> Forget(const std::string& key);
  void Begin(Pass& p);
  // The steps that act on a job that is still running. A step that fails names what it was
  // doing in Pass::failed_action, for the condition and Event below.
  Result<ReconcileResult> Advance(Pass& p);
  // A reconcile error that blocks the job (an API call refused: 403 from RBAC, a quota, an
  // admission webhook; a coordinator that refuses the job) becomes the ReconcileError
  // condition and a Warning Event on the job, not only a line in the operator's log.
  void RecordBlocked(Pass& p, const Status& error);
  // A spec the parser rejects fails the job, with the parser's one-line error as the message.
  Status FailInvalidSpec(Pass& p, const Status& why);
  // The job's secret, from which each worker's credential is derived: DeriveJobSecret of the
  // job's UID with options_.job_key. Nothing is read or kept per job.
  Result<std::string> JobSecret(const nlohmann::json& job) const;
  Status EnsureCoordinatorJob(const std::string& key, const nlohmann::json& job,
                              const std::string& token, const std::string& fingerprint);
  // With options_.network_policy: creates the job's NetworkPolicy when the cache has none, and
  // writes it back as BuildNetworkPolicy makes it when its spec, labels or owner differ. A
  // policy of that name that is not the operator's (no kManagedByLabel) is left alone, and the
  // job says so.
  Status EnsureNetworkPolicy(Pass& p);
  // Reads the job's pods, the cluster's GPUs, the coordinator's view and the policy's decision.
  Status Observe(Pass& p);
  // Kueue (kueue.h), for a job with a queue label: creates its Workload when it has none and
  // reads what Kueue admitted into the pass (the policy has already capped the job's workers at
  // it: PolicyJobOf). kGoOn to go on; kDone when the Workloads are not mirrored yet.
  Result<Next> AdmitThroughKueue(Pass& p);
  // The job's Workload as the cache or, when the cache does not have it yet, the API server
  // has it; null when there is none.
  Result<nlohmann::json> FindWorkload(const Pass& p);
  // The Admitted condition of a job with a queue label, and the job's message while it waits.
  void SetAdmittedCondition(Pass& p, nlohmann::json& conditions);
  // A job that ended marks its Workload finished, so that Kueue releases its quota.
  Status FinishWorkload(Pass& p);
  // The unit Workloads (kueue.h) exist while the core is admitted, and not otherwise.
  Status KeepUnits(Pass& p, const JobAdmission& admission,
                   const std::vector<nlohmann::json>& units);
  // Each unit Kueue evicted is released (its reservation cleared and Requeued set, as Kueue's
  // job framework does) once the job holds a worker fewer: the policy has already shrunk the
  // job to what stays admitted.
  // Deletes units beyond `keep` of the `existing` ones, those waiting in the queue first, and
  // counts them off `existing`.
  Status DeleteSurplusUnits(Pass& p, const std::vector<nlohmann::json>& units, int keep,
                            int& existing);
  Status ReleaseEvictedUnits(Pass& p, const JobAdmission& admission,
                             const std::vector<nlohmann::json>& units);
  // The PodsReady condition of the core and each unit Workload, from the workers that train.
  Status WritePodsReady(Pass& p, const nlohmann::json& core,
                        const std::vector<nlohmann::json>& units);
  // Kueue evicted the job's core Workload: the job drains (its pods deleted gracefully, rank 0
  // writing a checkpoint), then its units are deleted and the core's reservation cleared so
  // that Kueue queues it again; readmitted, it resumes from the checkpoint. kDone while so.
  Result<Next> DrainEvicted(Pass& p, ReconcileResult& result);
  // Where Kueue's admission of the job's core puts its pods (kueue_contract.h PlacementOf): the
  // admitted ResourceFlavors' node labels and tolerations and the admission checks'
  // podSetUpdates, read from the API server; nullopt for a job Kueue plays no part in.
  Result<std::optional<PodSetPlacement>> KueuePlacement(Pass& p);
  // The most workers the policy may give `job` under Kueue: nullopt when Kueue plays no part
  // (no queue label, or Workloads not mirrored yet), else what Kueue admitted (0 while waiting).
  std::optional<int> KueueCap(const nlohmann::json& job, const JobSpec& spec) const;
  // Rank 0 reported the final weights: the job has succeeded.
  Result<Next> RecordSuccess(Pass& p);
  // Final reports in termination messages that may not end the job (FinalReportOfPods's
  // `refused`: a pod and why) are ignored; each pod's is recorded once, with a Warning Event
  // ForgedOutcomeIgnored naming the pod and why.
  void IgnoreForgedOutcomes(
      Pass& p, const std::vector<std::pair<const nlohmann::json*, std::string>>& refused);
  // The workers whose credentials the coordinator accepts (Coordinator::RestrictWorkers): those
  // of the job's pods that have not ended, but for a worker that acknowledged a plan without it
  // (it is exiting), and of the pods created but not in the cache yet. A worker whose pod is
  // deleted or ended, or that left its plan, has its credential revoked.
  std::set<std::string> AdmittedWorkers(const Pass& p);
  // A worker pod that has not started yet and whose credential Secret is missing (the operator
  // died between creating the pod and the Secret, or someone deleted the Secret) would wait
  // forever and count as a live worker. Each such pod not seen to have its Secret within
  // kCredentialRecheck is asked for it by creating a placeholder Secret without a credential:
  // AlreadyExists says the Secret is there; a placeholder made says it was missing, and the pod
  // is deleted (and replaced by CreateMissingPods) with a Warning Event
  // CredentialSecretMissing. Replaced rather than given its credential: the operator may not
  // read Secrets, and after a restart it cannot tell a pod it made from one that copies its
  // label, owner reference and name, so minting a credential for a pod it did not just create
  // would hand one to whoever made such a pod; a pod that has not started has trained nothing,
  // and its replacement gets its credential the moment it is made.
  Status RepairCredentials(Pass& p);
  // Counts failed pods in status.failed (recorded, with the pods counted, before any is
  // deleted, so an operator that restarts counts none twice); spec.runPolicy.podFailurePolicy
  // may ignore one or fail the job for it. One whose agent found that the job cannot go on
  // fails the job, and so do more failures than spec.runPolicy.backoffLimit.
  Result<Next> RecordFailures(Pass& p);
  // Ends the job as Failed with the condition reason `reason` (and an event `event_reason`);
  // the coordinator forgets it, so its workers stop.
  Status FailJob(Pass& p, const std::string& reason, const std::string& event_reason,
                 const std::string& message);
  // spec.suspend, as batch/v1 Job has it: a suspended job leaves the coordinator, its pods are
  // deleted gracefully (each agent leaves at a step boundary, rank 0 writing a checkpoint), its
  // startTime is cleared (the deadline counts again from the resume) and its status says so.
  // Done for a suspended job; for a resumed one, records the resume and goes on.
  Result<Next> Suspend(Pass& p, ReconcileResult& result);
  // The Suspended condition once a job has ever been suspended: False (JobResumed) after it.
  void SetResumedCondition(Pass& p, nlohmann::json& conditions);
  // Removes job `key` from the coordinator and forgets this reconciler's registration of it, so
  // that its workers meet a coordinator that does not know the job (they leave untold when
  // their pods are deleted) and the job starts again under a fresh registration.
  void ForgetRegistration(const std::string& key);
  // Deletes every pod of the job, each with its own grace period (the kubelet's SIGTERM makes
  // the agent leave at a step boundary, rank 0 writing a checkpoint when its coordinator no
  // longer knows the job). Returns how many are still running or terminating; `left`, when
  // given, receives how many the cache still shows, ended ones included.
  Result<int> DeleteAllPods(Pass& p, int* left = nullptr);
  // An upgrade that changed the coordinator protocol under a running job: its workers speak
  // another protocol than this operator's coordinator (status.workerProtocol), which cannot
  // talk to them, so the job is drained on purpose rather than failed. It leaves the
  // coordinator, its pods are deleted (rank 0 checkpoints its last step as it leaves), and once
  // none is left it starts again like a resumed job, with pods of the image a job started now
  // would get, speaking this protocol, from its checkpoint, or from step 0 without
  // spec.checkpoint.path. The condition Draining and Events say why, naming both protocols.
  // Done while its old workers stop; kGoOn for a job whose workers speak this protocol.
  Result<Next> Drain(Pass& p, ReconcileResult& result);
  // Draining, once a job was ever drained, carried over as it is (to its end: a finished job
  // still says that it was drained).
  void KeepDrainCondition(Pass& p, nlohmann::json& conditions);
  // spec.runPolicy.activeDeadlineSeconds: fails a job past it, or says when to look again.
  Result<Next> EnforceDeadline(Pass& p, ReconcileResult& result);
  // A finished job: spec.runPolicy.cleanPodPolicy for its pods, then
  // spec.runPolicy.ttlSecondsAfterFinished (from its Succeeded or Failed condition): deletes it
  // past it, or says when to look again.
  Result<ReconcileResult> EnforceTtl(Pass& p);
  // status.startTime and status.completionTime (on success only, as batch/v1): each set once
  // and kept, even while the cache has not yet seen this operator's own write. And
  // status.selector, for the scale subresource.
  void StampTimes(Pass& p);
  // Publishes the next membership plan when one is due: the status first, then the coordinator.
  Status UpdateMembership(Pass& p);
  // Test-only: kills the operator at the phase options_.fault names, if the pass is in it.
  void InjectFault(const Pass& p);
  // Test-only: a store key of an epoch this operator published with joiners was written: its
  // members are meeting to transfer the state to them.
  void InjectStateTransferFault(const std::string& job, const std::string& key);
  policy::MembershipInput MembershipInputOf(const Pass& p) const;
  // Deletes pods that served their purpose and surplus joiners; creates the missing ones.
  Status ReconcilePods(Pass& p);
  Status DeleteEndedPods(Pass& p, int& live, std::vector<const nlohmann::json*>& spare);
  int PendingCreations(const Pass& p);
  Status DeleteSurplusPods(Pass& p, int& live, std::vector<const nlohmann::json*>& spare);
  Status CreateMissingPods(Pass& p, int live);
  // status.workerCounts: the job's pods by state (pending, joining, training, leaving, failed),
  // from the pods and the plan.
  nlohmann::json WorkerCounts(const Pass& p) const;
  // Progress from the members' reports, the phase and the conditions, written to the status.
  Status WriteProgress(Pass& p);
  void SetPhase(Pass& p, bool all_switched);
  // CheckpointFailing from the newest checkpoint outcome the workers reported: True while the
  // latest periodic write failed (training goes on), False once one succeeds again; absent if
  // none ever failed. A Warning Event for each failure seen, a Normal one on recovery.
  void SetCheckpointCondition(Pass& p, nlohmann::json& conditions);
  // ImageKept: True while the job's workers run an image (status.workerImage) other than the
  // one a job started now would get (an operator upgraded with a new default, a template whose
  // image changed), saying both; False once they agree again; absent if they always did.
  void SetImageCondition(Pass& p, nlohmann::json& conditions);

  // Workers the policy gives the job now (no more than fit on the nodes its template allows),
  // why when it waits, and by type.
  struct Desired {
    int workers = 0;
    std::string reason;
    policy::Allocation allocation;
    // Workers that fit on the nodes the template allows, counting only what other workloads
    // hold: what the job could use whatever the policy and Kueue say.
    int fit = 0;
  };
  // What every reconcile reads of the whole cluster: the GPU inventory, every job's pods and
  // the policy's decision for every job. Computed once per version of the caches (and at most
  // kViewMaxAge ago, as the policy's cooldowns count time), not once per reconcile: with a
  // thousand jobs, deciding for all of them on each reconcile of each one is quadratic.
  // Immutable once made but for `fit`, a memo guarded by fit_mu; shared by the passes that use
  // it, on any thread.
  struct ClusterView {
    uint64_t jobs_version = 0;
    uint64_t pods_version = 0;
    uint64_t nodes_version = 0;
    uint64_t workloads_version = 0;
    std::chrono::steady_clock::time_point made;
    ClusterGpus gpus;
    // "namespace/job name" -> the pods that carry the job's label.
    std::map<std::string, std::vector<std::shared_ptr<const nlohmann::json>>> pods_by_job;
    Result<policy::Decision> decision = policy::Decision{};
    // EligibleWorkers by template (dumped), GPUs and millicores a worker: what each reconcile
    // asks of its own job, over every node, made once per view and template.
    mutable std::mutex fit_mu;
    mutable std::map<std::string, int> fit;
  };
  static constexpr auto kViewMaxAge = std::chrono::seconds(1);
  std::shared_ptr<const ClusterView> View();
  std::shared_ptr<const ClusterView> MakeView(uint64_t jobs_version, uint64_t pods_version,
                                              uint64_t nodes_version, uint64_t workloads_version);
  // What the view's decision gives the job of the pass, within what fits on the nodes its
  // template allows.
  Desired DesiredWorkers(const Pass& p, const ClusterView& view);
  // What the policy needs to know of every job, computed once per view rather than once per
  // job: each job's pods, and the GPU products each distinct pod template may use.
  struct PolicyContext {
    const std::map<std::string, std::vector<std::shared_ptr<const nlohmann::json>>>* pods_by_job;
    // The template (dumped) -> EligibleProducts of it.
    std::map<std::string, std::vector<std::string>> products_by_template;
  };
  // A job as the policy sees it; nothing for a job that has ended, is being deleted or does not
  // parse.
  std::optional<policy::PolicyJob> PolicyJobOf(const nlohmann::json& job, const ClusterGpus& gpus,
                                               PolicyContext& context);
  // JobSpecOf(job), parsed once per version of the job: every reconcile reads every job's spec
  // for the policy, and parsing a thousand specs each time would cost more than the rest.
  std::shared_ptr<const Result<JobSpec>> CachedSpecOf(const nlohmann::json& job);
  // Writes `status` as the job's whole status, its step never below the one this operator last
  // wrote for the job (see JobMemory::step_written).
  Status PatchStatus(const nlohmann::json& job, const nlohmann::json& status);
  // Forgets the step last written: the job starts again from step 0 (a drain with no checkpoint).
  void ResetStep(const Pass& p);
  // Records an Event on the job (events_ aggregates repeats).
  void Event(const nlohmann::json& job, bool warning, const std::string& reason,
             const std::string& message);

  kube::Client& client_;
  const Informer& jobs_;
  const Informer& pods_;
  const Informer& nodes_;
  const Informer* const workloads_;
  const Informer* const network_policies_;
  Coordinator& coordinator_;
  const ReconcilerOptions options_;
  const ReconcilerHooks hooks_;
  const std::unique_ptr<policy::Policy> policy_;

  // What this reconciler remembers of one job between reconciles, for the incarnation (UID) it
  // was gathered for: a job deleted and made again under the same name starts afresh
  // (MemoryOf), and a job that is gone is forgotten whole (Forget). Value type; guarded by mu_.
  struct JobMemory {
    std::string uid;
    // Registered with the coordinator.
    bool registered = false;
    // Pods created but not yet seen in the cache.
    Expectations pods;
    // When this operator created the job's NetworkPolicy: one created but not yet in the cache
    // is not created again.
    std::optional<std::chrono::steady_clock::time_point> policy_created;
    // Failed pods already counted and reported.
    std::set<std::string> failures_seen;
    // UIDs of the pods whose final reports were refused and reported.
    std::set<std::string> forged_seen;
    // Worker pod -> when the operator last saw that its credential Secret exists.
    std::map<std::string, std::chrono::steady_clock::time_point> credentials_checked;
    // Test-only (options_.fault armed for state-transfer): the epoch of the last plan this
    // operator published and the joiners it added.
    int64_t published_epoch = 0;
    std::set<std::string> published_joiners;
    // The step of the last failed checkpoint an Event was recorded for.
    int64_t checkpoint_failure_seen = 0;
    // The drain Events recorded ("Draining", "Restarted"): the cache may not show this
    // operator's own status write yet.
    std::set<std::string> drain_events;
    // The startTime and completionTime written.
    std::string start_time;
    std::string completion_time;
    // The resourceVersion a spec was parsed from, and the result (null: none parsed yet).
    std::string spec_version;
    std::shared_ptr<const Result<JobSpec>> spec;
    // The last status this operator wrote (without transition times), and the resourceVersion
    // of the job it was written over (empty: none written).
    std::string written_over_version;
    nlohmann::json written_status;
    // status.step as this operator last wrote it: a pass whose cache does not show that write
    // yet must not write an older step back (PatchStatus).
    int64_t step_written = 0;
  };
  // The memory of job `key` for incarnation `uid`: made when there is none, and emptied when it
  // was another incarnation's. The one place that tells incarnations apart. Under mu_.
  JobMemory& MemoryOf(const std::string& key, const std::string& uid);

  std::mutex mu_;
  std::map<std::string, JobMemory> memory_;  // by job key
  // The newest ClusterView; view_mu_ is held while one is made, so that one thread makes it and
  // the others wait for it rather than make it too. Taken before mu_, never after.
  std::mutex view_mu_;
  std::shared_ptr<const ClusterView> view_;
  EventRecorder events_;
};

}  // namespace vf::controller
