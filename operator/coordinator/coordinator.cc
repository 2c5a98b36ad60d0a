#include "operator/coordinator/coordinator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "runtime/deadline.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxNameBytes = 253;  // a Kubernetes object name
constexpr size_t kMaxSecretBytes = 4096;
constexpr size_t kMaxFailureMessageBytes = 4096;

// A registration the coordinator has no room for now (`why`): kUnavailable (HTTP 503), which the
// worker waits out, rather than kFailedPrecondition (409), which would fail its job.
Status Full(const std::string& worker, const std::string& why) {
  return Unavailable("worker " + worker + " is not admitted yet: " + kCoordinatorFull + " (" + why +
                     "); the worker will retry until there is room");
}

// The worker was heard from just now.
void Touch(WorkerInfo& info) {
  info.last_seen = Clock::now();
  info.silent = false;
}

// 16 hex digits from OpenSSL's generator; should it fail, from the clock, which still differs
// between two coordinators started one after the other.
std::string DrawIncarnation() {
  uint64_t bits = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&bits), sizeof(bits)) != 1) {
    bits = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  }
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(bits));
  return text;
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_';
}

bool IsName(std::string_view s) {
  return !s.empty() && s.size() <= kMaxNameBytes && std::all_of(s.begin(), s.end(), IsNameChar);
}

Status ValidateJobName(const std::string& job) {
  const size_t slash = job.find('/');
  if (slash == std::string::npos || !IsName(std::string_view(job).substr(0, slash)) ||
      !IsName(std::string_view(job).substr(slash + 1))) {
    return InvalidArgument("job name '" + job +
                           "' must be 'namespace/name', each part 1-253 characters of "
                           "[A-Za-z0-9._-]");
  }
  return Status::Ok();
}

Status ValidateWorkerName(const std::string& worker) {
  if (!IsName(worker)) {
    return InvalidArgument("worker name '" + worker +
                           "' must be 1-253 characters of [A-Za-z0-9._-]");
  }
  return Status::Ok();
}

Status ValidateKey(const std::string& key) {
  if (key.empty()) return InvalidArgument("store key is empty");
  if (key.size() > Coordinator::kMaxKeyBytes) {
    return InvalidArgument("store key is " + std::to_string(key.size()) + " bytes; the limit is " +
                           std::to_string(Coordinator::kMaxKeyBytes));
  }
  return Status::Ok();
}

// Time depends only on the lengths (a credential's is fixed), never on where the first
// difference is.
bool ConstantTimeEquals(std::string_view expected, std::string_view given) {
  return expected.size() == given.size() &&
         CRYPTO_memcmp(expected.data(), given.data(), expected.size()) == 0;
}

// What a registered worker holds of the memory budget.
size_t WorkerBytes(const WorkerInfo& info) {
  return Coordinator::kWorkerOverheadBytes + info.worker.size() + info.fingerprint.size() +
         info.build.size() + info.failure_message.size() + info.last_report.weights_sha256.size();
}

size_t KeyBytes(std::string_view key, std::string_view value) {
  return Coordinator::kKeyOverheadBytes + key.size() + value.size();
}

Status OlderEpoch(int64_t epoch, int64_t current) {
  return FailedPrecondition("epoch " + std::to_string(epoch) + " is older than the current epoch " +
                            std::to_string(current));
}

Status FutureEpoch(int64_t epoch, int64_t current) {
  return FailedPrecondition("epoch " + std::to_string(epoch) +
                            " is from the future (the current epoch is " + std::to_string(current) +
                            ")");
}

Status ValidateMembers(const std::vector<Member>& members) {
  const int n = static_cast<int>(members.size());
  std::vector<const Member*> by_rank(members.size(), nullptr);
  std::set<std::string> names;
  std::map<int, const Member*> owners;
  for (const Member& m : members) {
    VF_RETURN_IF_ERROR(ValidateWorkerName(m.worker).WithContext("invalid plan"));
    if (!names.insert(m.worker).second) {
      return InvalidArgument("invalid plan: worker " + m.worker + " appears twice");
    }
    if (m.rank < 0 || m.rank >= n) {
      return InvalidArgument("invalid plan: worker " + m.worker + " has rank " +
                             std::to_string(m.rank) + "; ranks must be 0.." +
                             std::to_string(n - 1) + ", each once");
    }
    if (by_rank[m.rank] != nullptr) {
      return InvalidArgument("invalid plan: rank " + std::to_string(m.rank) + " is given to both " +
                             by_rank[m.rank]->worker + " and " + m.worker);
    }
    by_rank[m.rank] = &m;
    if (m.virtual_nodes.empty()) {
      return InvalidArgument("invalid plan: worker " + m.worker + " has no virtual nodes");
    }
    for (int v : m.virtual_nodes) {
      if (v < 0) {
        return InvalidArgument("invalid plan: worker " + m.worker + " has virtual node " +
                               std::to_string(v) + "; virtual nodes are non-negative");
      }
      auto [it, inserted] = owners.emplace(v, &m);
      if (!inserted) {
        return InvalidArgument("invalid plan: virtual node " + std::to_string(v) +
                               " is given to both " + it->second->worker + " and " + m.worker);
      }
    }
  }
  return Status::Ok();
}

bool IsMember(const Plan& plan, const std::string& worker) {
  return std::any_of(plan.members.begin(), plan.members.end(),
                     [&](const Member& m) { return m.worker == worker; });
}

bool IsRankZero(const Plan& plan, const std::string& worker) {
  return std::any_of(plan.members.begin(), plan.members.end(),
                     [&](const Member& m) { return m.rank == 0 && m.worker == worker; });
}

}  // namespace

std::string ReportedFailure(const JobView& view, int64_t epoch) {
  const WorkerInfo* newest = nullptr;
  std::string who;
  for (const auto& [name, info] : view.workers) {
    if (info.failure_epoch < epoch || info.failure_epoch < 0) continue;
    if (newest == nullptr || std::tie(info.failure_epoch, info.failure_step) >
                                 std::tie(newest->failure_epoch, newest->failure_step)) {
      newest = &info;
      who = name;
    }
  }
  return newest == nullptr ? "" : who + " reported: " + newest->failure_message;
}

Result<std::string> WorkerCredential(std::string_view job_secret, std::string_view worker) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), job_secret.data(), static_cast<int>(job_secret.size()),
           reinterpret_cast<const unsigned char*>(worker.data()), worker.size(), digest,
           &length) == nullptr) {
    return Internal("HMAC-SHA256 failed for the credential of worker " + std::string(worker));
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * static_cast<size_t>(length));
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kDigits[digest[i] >> 4]);
    hex.push_back(kDigits[digest[i] & 0xf]);
  }
  return hex;
}

int64_t KeyEpoch(std::string_view key) {
  static constexpr std::string_view kPrefix = "epoch-";
  const std::string_view segment = key.substr(0, key.find('/'));
  if (segment.size() <= kPrefix.size() || segment.substr(0, kPrefix.size()) != kPrefix) return -1;
  const std::string_view digits = segment.substr(kPrefix.size());
  if (digits.size() > 18) return -1;  // keeps the value below 2^63
  int64_t epoch = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    epoch = epoch * 10 + (c - '0');
  }
  return epoch;
}

Result<Coordinator::JobState*> Coordinator::FindLocked(const std::string& job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return NotFound("job " + job + " is not known to the coordinator");
  return &it->second;
}

Result<const Coordinator::JobState*> Coordinator::FindLocked(const std::string& job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return NotFound("job " + job + " is not known to the coordinator");
  return &it->second;
}

Result<WorkerInfo*> Coordinator::FindWorkerLocked(const std::string& job,
                                                  const std::string& worker) {
  VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
  auto it = state->workers.find(worker);
  if (it == state->workers.end()) {
    return NotFound("worker " + worker + " not registered with job " + job);
  }
  return &it->second;
}

void Coordinator::BumpLocked(JobState& state) {
  state.generation = ++last_generation_;
  changed_.notify_all();
}

Status Coordinator::ChargeLocked(JobState& state, size_t before, size_t after) {
  if (after > before && after - before > memory_budget_ - memory_used_) {
    return FailedPrecondition("the coordinator's memory budget (" + std::to_string(memory_budget_) +
                              " bytes across all jobs) is spent");
  }
  memory_used_ = memory_used_ - before + after;
  state.charged = state.charged - before + after;
  return Status::Ok();
}

Coordinator::Coordinator(size_t memory_budget, int64_t protocol)
    : memory_budget_(memory_budget), protocol_(protocol), incarnation_(DrawIncarnation()) {}

Status Coordinator::AddJob(const std::string& job, const std::string& secret,
                           const std::string& fingerprint, const std::string& build) {
  VF_RETURN_IF_ERROR(ValidateJobName(job));
  if (secret.empty() || secret.size() > kMaxSecretBytes) {
    return InvalidArgument("secret of job " + job + " must be 1-4096 bytes");
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  if (it != jobs_.end()) {
    const JobState& existing = it->second;
    if (!ConstantTimeEquals(existing.secret, secret)) {
      return FailedPrecondition("job " + job + " exists with a different secret");
    }
    if (existing.fingerprint != fingerprint) {
      return FailedPrecondition("job " + job + " exists with a different spec fingerprint");
    }
    if (existing.build != build) {
      return FailedPrecondition("job " + job + " exists with build " + existing.build + ", not " +
                                build);
    }
    return Status::Ok();
  }
  JobState& state = jobs_[job];
  state.secret = secret;
  state.fingerprint = fingerprint;
  state.build = build;
  BumpLocked(state);
  return Status::Ok();
}

Status Coordinator::RemoveJob(const std::string& job) {
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return NotFound("job " + job + " is not known to the coordinator");
    const Status removed = NotFound("job " + job + " was removed");
    for (auto& [id, watch] : it->second.plan_watches) {
      watch_jobs_.erase(id);
      deferred.push_back([done = std::move(watch.done), removed] { done(removed); });
    }
    for (auto& [id, watch] : it->second.key_watches) {
      watch_jobs_.erase(id);
      deferred.push_back([done = std::move(watch.done), removed] { done(removed); });
    }
    memory_used_ -= it->second.charged;
    jobs_.erase(it);
    changed_.notify_all();
  }
  for (auto& fn : deferred) fn();
  return Status::Ok();
}

std::vector<std::string> Coordinator::ListJobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  names.reserve(jobs_.size());
  for (const auto& entry : jobs_) names.push_back(entry.first);
  return names;
}

Status Coordinator::CheckCredential(const std::string& job, const std::string& worker,
                                    std::string_view credential) const {
  Status refused =
      Unauthenticated("the credential is not valid for worker " + worker + " of job " + job);
  if (!IsName(worker)) return refused;
  std::string secret;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return refused;
    const std::optional<std::set<std::string>>& admitted = it->second.admitted;
    if (admitted && admitted->count(worker) == 0) return refused;  // revoked, or never given
    secret = it->second.secret;
  }
  Result<std::string> expected = WorkerCredential(secret, worker);
  if (!expected.ok()) return expected.status();
  if (!ConstantTimeEquals(*expected, credential)) return refused;
  return Status::Ok();
}

Status Coordinator::RestrictWorkers(const std::string& job, std::set<std::string> admitted) {
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
  state->admitted = std::move(admitted);
  return Status::Ok();
}

Status Coordinator::SetWorkerLimit(const std::string& job, size_t max_workers) {
  if (max_workers < 1 || max_workers > kMaxWorkersPerJob) {
    return InvalidArgument("worker limit " + std::to_string(max_workers) + " is not in 1.." +
                           std::to_string(kMaxWorkersPerJob));
  }
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
  state->max_workers = max_workers;
  return Status::Ok();
}

size_t Coordinator::MemoryUsed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return memory_used_;
}

Result<Plan> Coordinator::InstallPlanLocked(const std::string& job, JobState& state, int64_t epoch,
                                            std::vector<Member> members, Deferred& deferred) {
  VF_RETURN_IF_ERROR(ValidateMembers(members).WithContext("job " + job));
  std::sort(members.begin(), members.end(),
            [](const Member& a, const Member& b) { return a.rank < b.rank; });
  state.plan.epoch = epoch;
  state.plan.members = std::move(members);
  state.plan.store_prefix = "epoch-" + std::to_string(epoch);
  BumpLocked(state);

  for (auto it = state.store.begin(); it != state.store.end();) {
    const int64_t key_epoch = KeyEpoch(it->first);
    if (key_epoch >= 0 && key_epoch < epoch - 2) {
      state.store_bytes -= it->first.size() + it->second->size();
      (void)ChargeLocked(state, KeyBytes(it->first, *it->second), 0);
      it = state.store.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = state.plan_watches.begin(); it != state.plan_watches.end();) {
    if (it->second.after < epoch) {
      watch_jobs_.erase(it->first);
      deferred.push_back([done = std::move(it->second.done), plan = state.plan] { done(plan); });
      it = state.plan_watches.erase(it);
    } else {
      ++it;
    }
  }
  // Waiters for keys of an older epoch would otherwise sit out their whole timeout.
  for (auto it = state.key_watches.begin(); it != state.key_watches.end();) {
    const int64_t key_epoch = KeyEpoch(it->second.key);
    if (key_epoch >= 0 && key_epoch < epoch) {
      watch_jobs_.erase(it->first);
      deferred.push_back([done = std::move(it->second.done), error = OlderEpoch(key_epoch, epoch)] {
        done(error);
      });
      it = state.key_watches.erase(it);
    } else {
      ++it;
    }
  }
  return state.plan;
}

Result<Plan> Coordinator::PublishPlan(const std::string& job, std::vector<Member> members) {
  Deferred deferred;
  std::optional<Result<Plan>> result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
    result.emplace(
        InstallPlanLocked(job, *state, state->plan.epoch + 1, std::move(members), deferred));
  }
  for (auto& fn : deferred) fn();
  return std::move(*result);
}

Result<Plan> Coordinator::PublishPlanWithEpoch(const std::string& job, int64_t epoch,
                                               std::vector<Member> members) {
  Deferred deferred;
  std::optional<Result<Plan>> result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
    if (epoch <= state->plan.epoch) {
      return FailedPrecondition("job " + job + ": epoch " + std::to_string(epoch) +
                                " is not newer than the current epoch " +
                                std::to_string(state->plan.epoch));
    }
    result.emplace(InstallPlanLocked(job, *state, epoch, std::move(members), deferred));
  }
  for (auto& fn : deferred) fn();
  return std::move(*result);
}

Result<Plan> Coordinator::GetPlan(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(const JobState* state, FindLocked(job));
  return state->plan;
}

// The workers of a job run one build: builds may differ in arithmetic, and the weights must not
// depend on which worker computed a virtual node. That build is the workers'; the one given to
// AddJob holds only until a worker brings another. After an operator upgrade, the new
// coordinator expects its own build, while the workers of the plan it restored run the old one:
// a member of the current plan that registers as the first of the plan's members sets the
// job's build. A job whose plan has no members (a new job, or one resumed) has no build to keep
// yet: the first worker to register while no other is registered sets it, so that a job whose
// image is of another build than the operator (the same protocol) runs on it. Registered
// workers outside the plan of another build are dropped (they are refused when they register
// again).
Status Coordinator::AdoptBuildLocked(JobState& state, const std::string& worker,
                                     const std::string& build) {
  if (build == state.build) return Status::Ok();
  auto is_member = [&state](const std::string& name) {
    return std::any_of(state.plan.members.begin(), state.plan.members.end(),
                       [&name](const Member& m) { return m.worker == name; });
  };
  const bool member_registered = std::any_of(
      state.workers.begin(), state.workers.end(),
      [&](const auto& entry) { return entry.first != worker && is_member(entry.first); });
  const bool other_registered =
      std::any_of(state.workers.begin(), state.workers.end(),
                  [&](const auto& entry) { return entry.first != worker; });
  const bool first_member = is_member(worker) && !member_registered;
  const bool first_worker = state.plan.members.empty() && !other_registered;
  if (!first_member && !first_worker) {
    return FailedPrecondition("worker " + worker + " " + kAnotherBuildRefusal + build +
                              ", the job runs build " + state.build);
  }
  state.build = build;
  for (auto it = state.workers.begin(); it != state.workers.end();) {
    if (it->first != worker && it->second.build != build) {
      (void)ChargeLocked(state, WorkerBytes(it->second), 0);
      it = state.workers.erase(it);
    } else {
      ++it;
    }
  }
  return Status::Ok();
}

Status Coordinator::RegisterWorker(const std::string& job, const std::string& worker,
                                   const std::string& fingerprint, const std::string& build,
                                   bool ready, int64_t protocol) {
  VF_RETURN_IF_ERROR(ValidateWorkerName(worker));
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
  if (fingerprint != state->fingerprint) {
    return FailedPrecondition("worker " + worker +
                              " was refused: its job spec differs from the job's (virtual nodes, "
                              "batch, model, dataset, optimizer, reduction or seed)");
  }
  if (protocol != protocol_) {
    return FailedPrecondition("worker " + worker + " was refused: it speaks coordinator protocol " +
                              std::to_string(protocol) + ", this coordinator speaks protocol " +
                              std::to_string(protocol_) +
                              "; run workers of an agent build with this protocol");
  }
  VF_RETURN_IF_ERROR(AdoptBuildLocked(*state, worker, build));
  auto it = state->workers.find(worker);
  if (it == state->workers.end()) {
    if (state->workers.size() >= state->max_workers) {
      return Full(worker, "job " + job + " already has " + std::to_string(state->max_workers) +
                              " registered workers, as many as it may have");
    }
    WorkerInfo fresh;
    fresh.worker = worker;
    fresh.fingerprint = fingerprint;
    fresh.build = build;
    const Status charged = ChargeLocked(*state, 0, WorkerBytes(fresh));
    if (!charged.ok()) return Full(worker, charged.message());
    it = state->workers.emplace(worker, std::move(fresh)).first;
  }
  // Fingerprint and build equal the job's: a registration again changes no size.
  WorkerInfo& info = it->second;
  info.ready = ready;
  Touch(info);
  BumpLocked(*state);
  return Status::Ok();
}

Status Coordinator::RecordReport(const std::string& job, const std::string& worker,
                                 const Report& report) {
  if (report.epoch < 0 || report.step < 0) {
    return InvalidArgument("report epoch and step must be non-negative");
  }
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(WorkerInfo * info, FindWorkerLocked(job, worker));
  JobState& state = jobs_.at(job);
  if (report.epoch > state.plan.epoch) return FutureEpoch(report.epoch, state.plan.epoch);
  if (report.epoch < state.plan.epoch) return OlderEpoch(report.epoch, state.plan.epoch);
  if ((report.finished || !report.weights_sha256.empty()) && !IsRankZero(state.plan, worker)) {
    return PermissionDenied("worker " + worker + " is not rank 0 of epoch " +
                            std::to_string(state.plan.epoch) +
                            "; only rank 0 reports the job finished and its final weights");
  }
  const size_t before = WorkerBytes(*info);
  const size_t after =
      before - info->last_report.weights_sha256.size() + report.weights_sha256.size();
  VF_RETURN_IF_ERROR(ChargeLocked(state, before, after));
  info->last_report = report;
  Touch(*info);
  BumpLocked(state);
  return Status::Ok();
}

Status Coordinator::RequestLeave(const std::string& job, const std::string& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(WorkerInfo * info, FindWorkerLocked(job, worker));
  info->leave_requested = true;
  Touch(*info);
  BumpLocked(jobs_.at(job));
  return Status::Ok();
}

Status Coordinator::AckPlan(const std::string& job, const std::string& worker, int64_t epoch) {
  if (epoch < 0) return InvalidArgument("acknowledged epoch must be non-negative");
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(WorkerInfo * info, FindWorkerLocked(job, worker));
  JobState& state = jobs_.at(job);
  if (epoch > state.plan.epoch) return FutureEpoch(epoch, state.plan.epoch);
  if (epoch == state.plan.epoch && IsMember(state.plan, worker)) {
    return FailedPrecondition("worker " + worker + " is a member of epoch " +
                              std::to_string(epoch) +
                              "; only a worker that a plan excludes acknowledges it");
  }
  info->acked_epoch = std::max(info->acked_epoch, epoch);
  Touch(*info);
  BumpLocked(state);
  return Status::Ok();
}

Status Coordinator::RecordFailure(const std::string& job, const std::string& worker, int64_t epoch,
                                  int64_t step, const std::string& message) {
  if (epoch < 0 || step < 0) return InvalidArgument("failure epoch and step must be non-negative");
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(WorkerInfo * info, FindWorkerLocked(job, worker));
  JobState& state = jobs_.at(job);
  if (epoch > state.plan.epoch) return FutureEpoch(epoch, state.plan.epoch);
  if (epoch >= info->failure_epoch) {
    std::string kept = message.substr(0, kMaxFailureMessageBytes);
    const size_t before = WorkerBytes(*info);
    const size_t after = before - info->failure_message.size() + kept.size();
    VF_RETURN_IF_ERROR(ChargeLocked(state, before, after));
    info->failure_epoch = epoch;
    info->failure_step = step;
    info->failure_message = std::move(kept);
  }
  Touch(*info);
  BumpLocked(state);
  return Status::Ok();
}

void Coordinator::Heard(const std::string& job, const std::string& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  auto state = FindLocked(job);
  if (!state.ok()) return;
  auto it = (*state)->workers.find(worker);
  if (it == (*state)->workers.end()) return;
  const bool was_silent = it->second.silent;
  Touch(it->second);
  if (was_silent) BumpLocked(**state);
}

void Coordinator::SweepSilent(std::chrono::steady_clock::duration threshold) {
  std::lock_guard<std::mutex> lock(mu_);
  const Clock::time_point now = Clock::now();
  for (auto& [name, state] : jobs_) {
    bool changed = false;
    for (auto& [worker, info] : state.workers) {
      const bool silent = now - info.last_seen > threshold;
      changed = changed || silent != info.silent;
      info.silent = silent;
    }
    if (changed) BumpLocked(state);
  }
}

Status Coordinator::ForgetWorker(const std::string& job, const std::string& worker) {
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
  auto it = state->workers.find(worker);
  if (it == state->workers.end()) {
    return NotFound("worker " + worker + " not registered with job " + job);
  }
  (void)ChargeLocked(*state, WorkerBytes(it->second), 0);
  state->workers.erase(it);
  BumpLocked(*state);
  return Status::Ok();
}

Result<JobView> Coordinator::GetJob(const std::string& job) const {
  std::lock_guard<std::mutex> lock(mu_);
  VF_ASSIGN_OR_RETURN(const JobState* state, FindLocked(job));
  JobView view;
  view.fingerprint = state->fingerprint;
  view.build = state->build;
  view.plan = state->plan;
  view.workers = state->workers;
  view.generation = state->generation;
  return view;
}

bool Coordinator::WaitForChange(const std::string& job, uint64_t seen_generation,
                                std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = DeadlineAfter(timeout);
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_until(lock, deadline, [&] {
    auto it = jobs_.find(job);
    const uint64_t generation = it == jobs_.end() ? 0 : it->second.generation;
    return generation != seen_generation;
  });
}

void Coordinator::ObserveKeySets(KeySetObserver observer) {
  std::lock_guard<std::mutex> lock(mu_);
  key_set_observer_ = std::move(observer);
}

Status Coordinator::SetKey(const std::string& job, const std::string& key, std::string_view value,
                           std::string_view writer) {
  VF_RETURN_IF_ERROR(ValidateKey(key));
  KeySetObserver observer;
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    observer = key_set_observer_;
    VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
    const int64_t key_epoch = KeyEpoch(key);
    if (key_epoch >= 0 && key_epoch < state->plan.epoch) {
      return OlderEpoch(key_epoch, state->plan.epoch);
    }
    // Rendezvous happens under the current plan (or, in a race with its publication, the next
    // one): keys for later epochs would only hold memory until those epochs come, if ever.
    if (key_epoch > state->plan.epoch + 1) return FutureEpoch(key_epoch, state->plan.epoch);
    // A worker has seen only published plans, so it never writes the next epoch's keys.
    if (!writer.empty() && key_epoch > state->plan.epoch) {
      return FutureEpoch(key_epoch, state->plan.epoch);
    }
    if (!writer.empty() && key_epoch >= 0 && !IsMember(state->plan, std::string(writer))) {
      return PermissionDenied("worker " + std::string(writer) + " is not a member of epoch " +
                              std::to_string(key_epoch) + "; only its members write its keys");
    }
    auto existing = state->store.find(key);
    const bool fresh = existing == state->store.end();
    if (fresh && state->store.size() >= kMaxKeysPerJob) {
      return FailedPrecondition("the store of job " + job + " is full (" +
                                std::to_string(kMaxKeysPerJob) + " keys)");
    }
    const size_t replaced = fresh ? 0 : existing->first.size() + existing->second->size();
    const size_t bytes = state->store_bytes - replaced + key.size() + value.size();
    if (bytes > kMaxStoreBytesPerJob) {
      return FailedPrecondition("the store of job " + job + " is full (" +
                                std::to_string(kMaxStoreBytesPerJob >> 20) + " MiB)");
    }
    VF_RETURN_IF_ERROR(
        ChargeLocked(*state, fresh ? 0 : KeyBytes(key, *existing->second), KeyBytes(key, value)));
    auto shared = std::make_shared<const std::string>(value);
    state->store[key] = shared;
    state->store_bytes = bytes;
    for (auto it = state->key_watches.begin(); it != state->key_watches.end();) {
      if (it->second.key == key) {
        watch_jobs_.erase(it->first);
        deferred.push_back(
            [done = std::move(it->second.done), shared] { done(std::string(*shared)); });
        it = state->key_watches.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& fn : deferred) fn();
  if (observer) observer(job, key);
  return Status::Ok();
}

Result<std::string> Coordinator::GetKey(const std::string& job, const std::string& key,
                                        std::chrono::milliseconds timeout) {
  struct Waiter {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Result<std::string>> result;
  };
  const Clock::time_point deadline = DeadlineAfter(timeout);
  auto waiter = std::make_shared<Waiter>();
  VF_ASSIGN_OR_RETURN(WatchId id, WatchKey(job, key, [waiter](Result<std::string> value) {
                        std::lock_guard<std::mutex> lock(waiter->mu);
                        waiter->result.emplace(std::move(value));
                        waiter->cv.notify_all();
                      }));
  std::unique_lock<std::mutex> lock(waiter->mu);
  const auto done = [&] { return waiter->result.has_value(); };
  if (!waiter->cv.wait_until(lock, deadline, done)) {
    lock.unlock();
    if (CancelWatch(id)) {
      return DeadlineExceeded("timed out after " + std::to_string(timeout.count()) +
                              "ms waiting for store key '" + key + "' of job " + job);
    }
    // The callback won the race; it is about to deliver the value.
    lock.lock();
    waiter->cv.wait(lock, done);
  }
  return std::move(*waiter->result);
}

Result<Coordinator::WatchId> Coordinator::WatchPlan(const std::string& job, int64_t after,
                                                    PlanCallback done) {
  Plan ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
    if (state->plan.epoch <= after) {
      const WatchId id = ++last_watch_;
      state->plan_watches.emplace(id, PlanWatch{after, std::move(done)});
      watch_jobs_.emplace(id, job);
      return id;
    }
    ready = state->plan;
  }
  done(std::move(ready));
  return kNoWatch;
}

Result<Coordinator::WatchId> Coordinator::WatchKey(const std::string& job, const std::string& key,
                                                   KeyCallback done) {
  VF_RETURN_IF_ERROR(ValidateKey(key));
  std::shared_ptr<const std::string> value;
  {
    std::lock_guard<std::mutex> lock(mu_);
    VF_ASSIGN_OR_RETURN(JobState * state, FindLocked(job));
    auto it = state->store.find(key);
    if (it == state->store.end()) {
      const int64_t key_epoch = KeyEpoch(key);
      if (key_epoch >= 0 && key_epoch < state->plan.epoch) {
        return OlderEpoch(key_epoch, state->plan.epoch);
      }
      const WatchId id = ++last_watch_;
      state->key_watches.emplace(id, KeyWatch{key, std::move(done)});
      watch_jobs_.emplace(id, job);
      return id;
    }
    value = it->second;
  }
  done(std::string(*value));
  return kNoWatch;
}

bool Coordinator::CancelWatch(WatchId id) {
  // Destroyed after the lock is released: a callback may own things whose destructors call back
  // into the coordinator.
  PlanCallback plan_done;
  KeyCallback key_done;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = watch_jobs_.find(id);
  if (it == watch_jobs_.end()) return false;
  auto job = jobs_.find(it->second);
  if (job != jobs_.end()) {
    auto plan_watch = job->second.plan_watches.find(id);
    if (plan_watch != job->second.plan_watches.end()) {
      plan_done = std::move(plan_watch->second.done);
      job->second.plan_watches.erase(plan_watch);
    }
    auto key_watch = job->second.key_watches.find(id);
    if (key_watch != job->second.key_watches.end()) {
      key_done = std::move(key_watch->second.done);
      job->second.key_watches.erase(key_watch);
    }
  }
  watch_jobs_.erase(it);
  return true;
}

}  // namespace vf
