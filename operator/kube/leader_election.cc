#include "operator/kube/leader_election.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "operator/kube/rate_limiter.h"

namespace vf::kube {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

// Candidates wait retry_period plus up to this much more of it between attempts (client-go's
// JitterFactor).
constexpr double kJitterFactor = 1.2;

// The fields of a Lease's spec that make up the election record; what changes in them (and
// only in them) counts as the holder having been heard from.
constexpr const char* kRecordFields[] = {"holderIdentity", "leaseDurationSeconds", "acquireTime",
                                         "renewTime", "leaseTransitions"};

// (contains/at rather than find: GCC's -Wnull-dereference misreads json's inlined iterators
// here.)
json RecordOf(const json& lease) {
  json record = json::object();
  if (!lease.is_object() || !lease.contains("spec")) return record;
  const json& spec = lease.at("spec");
  if (!spec.is_object()) return record;
  for (const char* field : kRecordFields) {
    if (spec.contains(field) && !spec.at(field).is_null()) record[field] = spec.at(field);
  }
  return record;
}

std::string HolderOf(const json& record) {
  if (!record.contains("holderIdentity") || !record.at("holderIdentity").is_string()) return "";
  return record.at("holderIdentity").get<std::string>();
}

// leaseDurationSeconds as written; 0 (expired at once, as client-go reads a missing one) when
// absent or malformed.
std::chrono::seconds DurationOf(const json& record) {
  if (!record.contains("leaseDurationSeconds")) return std::chrono::seconds(0);
  const json& duration = record.at("leaseDurationSeconds");
  if (!duration.is_number_integer()) return std::chrono::seconds(0);
  return std::chrono::seconds(std::max<int64_t>(0, duration.get<int64_t>()));
}

int64_t TransitionsOf(const json& record) {
  if (!record.contains("leaseTransitions")) return 0;
  const json& transitions = record.at("leaseTransitions");
  return transitions.is_number_integer() ? transitions.get<int64_t>() : 0;
}

std::string Millis(milliseconds duration) { return std::to_string(duration.count()) + " ms"; }

}  // namespace

std::string FormatMicroTime(std::chrono::system_clock::time_point time) {
  const auto since_epoch = time.time_since_epoch();
  const auto seconds = std::chrono::floor<std::chrono::seconds>(since_epoch);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(since_epoch - seconds);
  std::string text = FormatTime(std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(seconds)));
  char fraction[32];
  std::snprintf(fraction, sizeof(fraction), ".%06lld", static_cast<long long>(micros.count()));
  text.insert(text.size() - 1, fraction);  // before the "Z"
  return text;
}

Result<std::unique_ptr<LeaderElector>> LeaderElector::Create(Client& client,
                                                             LeaderElectionConfig config) {
  const std::string what = "leader election on lease " + config.ns + "/" + config.name;
  if (config.ns.empty() || config.name.empty()) {
    return InvalidArgument("leader election: the lease's namespace and name are required");
  }
  if (config.identity.empty()) return InvalidArgument(what + ": an identity is required");
  if (config.retry_period <= milliseconds::zero()) {
    return InvalidArgument(what + ": retry_period must be positive");
  }
  if (config.lease_duration < std::chrono::seconds(1)) {
    return InvalidArgument(what + ": lease_duration must be at least 1 s (Leases count seconds)");
  }
  if (config.lease_duration <= config.renew_deadline) {
    return InvalidArgument(what + ": lease_duration (" + Millis(config.lease_duration) +
                           ") must be longer than renew_deadline (" +
                           Millis(config.renew_deadline) + ")");
  }
  if (static_cast<double>(config.renew_deadline.count()) <=
      kJitterFactor * static_cast<double>(config.retry_period.count())) {
    return InvalidArgument(what + ": renew_deadline (" + Millis(config.renew_deadline) +
                           ") must be longer than 1.2 * retry_period (" +
                           Millis(config.retry_period) + ")");
  }
  return std::unique_ptr<LeaderElector>(new LeaderElector(client, std::move(config)));
}

LeaderElector::LeaderElector(Client& client, LeaderElectionConfig config)
    : client_(client), config_(std::move(config)), random_(std::random_device{}()) {}

LeaderElector::~LeaderElector() = default;

bool LeaderElector::IsLeader() const {
  if (!leading_.load()) return false;
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
          .count();
  return now < valid_until_ns_.load();
}

std::string LeaderElector::LeaderIdentity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leader_identity_;
}

void LeaderElector::Log(const std::string& message) const {
  if (config_.log) {
    config_.log(message);
    return;
  }
  std::fprintf(stderr, "leader election %s/%s (%s): %s\n", config_.ns.c_str(), config_.name.c_str(),
               config_.identity.c_str(), message.c_str());
}

void LeaderElector::NoteFailure(std::string_view what, const ApiError& error) {
  Log(std::string(what) + " failed: " + error.ToString());
  // A call cut short by the renew deadline (each call's timeout is the time left) says less than
  // the server's answer before it, so that answer stays the one Run's result names.
  if (error.reason == Reason::kDeadlineExceeded && !last_error_.empty()) return;
  last_error_ = error.ToString();
}

CallOptions LeaderElector::CallsUntil(SteadyClock::time_point deadline) const {
  CallOptions options;
  // At least a millisecond: 0 would mean the client's own, longer, timeout.
  options.timeout = std::max(
      milliseconds(1), std::chrono::duration_cast<milliseconds>(deadline - SteadyClock::now()));
  return options;
}

void LeaderElector::Observe(const json& lease, SteadyClock::time_point now) {
  lease_ = lease;
  json record = RecordOf(lease);
  if (record == observed_record_) return;
  // Expiry is judged from when we saw the record change, never from the times written in it:
  // the holder's clock need not agree with ours.
  observed_record_ = std::move(record);
  observed_at_ = now;
  const std::string holder = HolderOf(observed_record_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    leader_identity_ = holder;
  }
  if (!holder.empty() && holder != reported_leader_) {
    reported_leader_ = holder;
    if (holder != config_.identity) Log("the lease is held by " + holder);
    if (config_.on_new_leader) config_.on_new_leader(holder);
  }
}

LeaderElector::Attempt LeaderElector::TryAcquireOrRenew(SteadyClock::time_point deadline) {
  const std::string now = FormatMicroTime(std::chrono::system_clock::now());
  const int64_t duration_seconds = static_cast<int64_t>(
      std::ceil(std::chrono::duration<double>(config_.lease_duration).count()));

  // The leader renews from the copy it wrote last; a conflict means someone else has written
  // since, and the slow path below finds out who.
  if (leading_.load() && lease_.has_value() &&
      SteadyClock::now() < observed_at_ + DurationOf(observed_record_)) {
    json lease = *lease_;
    json& spec = lease["spec"];
    spec["holderIdentity"] = config_.identity;
    spec["leaseDurationSeconds"] = duration_seconds;
    spec["renewTime"] = now;
    ApiResult<json> renewed = client_.Replace(kLeases, config_.ns, lease, CallsUntil(deadline));
    if (renewed.ok()) {
      Observe(*renewed, SteadyClock::now());
      return Attempt::kSucceeded;
    }
    NoteFailure("renewing from the lease last written", renewed.error());
    if (SteadyClock::now() >= deadline) return Attempt::kFailed;
  }

  ApiResult<json> got = client_.Get(kLeases, config_.ns, config_.name, CallsUntil(deadline));
  if (!got.ok()) {
    if (got.reason() != Reason::kNotFound) {
      NoteFailure("reading the lease", got.error());
      return Attempt::kFailed;
    }
    json lease = {{"metadata", {{"name", config_.name}, {"namespace", config_.ns}}},
                  {"spec",
                   {{"holderIdentity", config_.identity},
                    {"leaseDurationSeconds", duration_seconds},
                    {"acquireTime", now},
                    {"renewTime", now},
                    {"leaseTransitions", 0}}}};
    ApiResult<json> created = client_.Create(kLeases, config_.ns, lease, CallsUntil(deadline));
    if (!created.ok()) {
      // AlreadyExists: another candidate created it first; the next attempt reads theirs.
      NoteFailure("creating the lease", created.error());
      return Attempt::kFailed;
    }
    Observe(*created, SteadyClock::now());
    return Attempt::kSucceeded;
  }

  Observe(*got, SteadyClock::now());
  const std::string holder = HolderOf(observed_record_);
  if (!holder.empty() && holder != config_.identity &&
      SteadyClock::now() < observed_at_ + DurationOf(observed_record_)) {
    last_error_ = "the lease is held by " + holder;
    return Attempt::kHeldByOther;
  }

  json lease = *got;
  json& spec = lease["spec"];
  if (!spec.is_object()) spec = json::object();
  if (holder != config_.identity) {
    // A takeover (of an expired or released Lease): a new term.
    spec["acquireTime"] = now;
    spec["leaseTransitions"] = TransitionsOf(observed_record_) + 1;
  } else if (!spec.contains("acquireTime") || spec["acquireTime"].is_null()) {
    spec["acquireTime"] = now;
  }
  spec["holderIdentity"] = config_.identity;
  spec["leaseDurationSeconds"] = duration_seconds;
  spec["renewTime"] = now;
  // Conditional on the version read: of two candidates racing for an expired Lease, one gets
  // Conflict.
  ApiResult<json> written = client_.Replace(kLeases, config_.ns, lease, CallsUntil(deadline));
  if (!written.ok()) {
    NoteFailure(holder == config_.identity ? "renewing the lease" : "taking the lease over",
                written.error());
    return Attempt::kFailed;
  }
  Observe(*written, SteadyClock::now());
  return Attempt::kSucceeded;
}

void LeaderElector::Release() {
  if (!lease_.has_value() || HolderOf(observed_record_) != config_.identity) return;
  const std::string now = FormatMicroTime(std::chrono::system_clock::now());
  json lease = *lease_;
  json& spec = lease["spec"];
  spec["holderIdentity"] = "";
  spec["leaseDurationSeconds"] = 1;
  spec["acquireTime"] = now;
  spec["renewTime"] = now;
  // Conditional on our last write: if anyone has written since, the Lease is not ours to give.
  ApiResult<json> released = client_.Replace(
      kLeases, config_.ns, lease, CallsUntil(SteadyClock::now() + config_.renew_deadline));
  if (!released.ok()) {
    Log("releasing the lease failed: " + released.error().ToString());
    return;
  }
  Observe(*released, SteadyClock::now());
  Log("released the lease");
}

Status LeaderElector::Run(std::stop_token stop) {
  const std::string what = "leader election on lease " + config_.ns + "/" + config_.name;
  if (ran_) return FailedPrecondition(what + ": Run may be called only once");
  ran_ = true;

  auto mark_renewed = [&](SteadyClock::time_point attempt_started) {
    // From when the attempt began: the write may have landed at any point after that.
    valid_until_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          (attempt_started + config_.renew_deadline).time_since_epoch())
                          .count();
  };

  // Campaign.
  SteadyClock::time_point last_renewal;
  while (true) {
    if (stop.stop_requested()) return Status::Ok();
    const SteadyClock::time_point started = SteadyClock::now();
    if (TryAcquireOrRenew(started + config_.renew_deadline) == Attempt::kSucceeded) {
      last_renewal = started;
      break;
    }
    std::uniform_real_distribution<double> jitter(0.0, kJitterFactor);
    const auto wait = std::chrono::duration_cast<SteadyClock::duration>(
        std::chrono::duration<double>(config_.retry_period) * (1.0 + jitter(random_)));
    if (!SleepUntil(SteadyClock::now() + wait, stop)) return Status::Ok();
  }

  mark_renewed(last_renewal);
  last_error_.clear();
  leading_ = true;
  Log("acquired the lease; leading");
  std::stop_source term;
  if (config_.on_started_leading) config_.on_started_leading(term.get_token());

  // Renew.
  Status result;
  bool cancelled = false;
  SteadyClock::time_point last_attempt = last_renewal;
  while (true) {
    const SteadyClock::time_point renew_by = last_renewal + config_.renew_deadline;
    if (!SleepUntil(std::min(last_attempt + config_.retry_period, renew_by), stop)) {
      cancelled = true;
      break;
    }
    const SteadyClock::time_point now = SteadyClock::now();
    if (now >= renew_by) {
      result = Unavailable(what + ": not renewed within " + Millis(config_.renew_deadline) +
                           (last_error_.empty() ? "" : "; last failure: " + last_error_));
      break;
    }
    last_attempt = now;
    const Attempt attempt = TryAcquireOrRenew(renew_by);
    if (attempt == Attempt::kSucceeded) {
      last_renewal = now;
      mark_renewed(now);
      last_error_.clear();
    } else if (attempt == Attempt::kHeldByOther) {
      result = FailedPrecondition(what + ": now held by " + HolderOf(observed_record_));
      break;
    }
  }

  leading_ = false;
  valid_until_ns_ = 0;
  term.request_stop();
  Log(cancelled ? "stopped leading: asked to stop" : "stopped leading: " + result.message());
  if (config_.on_stopped_leading) config_.on_stopped_leading();
  if (cancelled && config_.release_on_cancel) Release();
  return result;
}

}  // namespace vf::kube
