#include "operator/policy/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <tuple>

#include "operator/policy/policy_internal.h"

namespace vf::policy {

int TotalWorkers(const Allocation& allocation) {
  int n = 0;
  for (const auto& [type, count] : allocation) n += count;
  return n;
}

const JobDecision* Decision::Find(const std::string& id) const {
  for (const auto& d : jobs) {
    if (d.id == id) return &d;
  }
  return nullptr;
}

namespace {

// Per-worker rate of `type` from the job's single-type measurement whose worker count is
// nearest to `near` (ties: the larger count, which includes more of the scaling loss).
// Negative when the job has never run on `type` alone.
double PerWorkerRate(const PolicyJob& job, const std::string& type, int near) {
  double rate = -1.0;
  int best_distance = 0;
  int best_workers = 0;
  for (const auto& p : job.throughput) {
    if (p.workers.size() != 1 || p.samples_per_second <= 0.0) continue;
    const auto& [t, n] = *p.workers.begin();
    if (t != type || n <= 0) continue;
    const int distance = std::abs(n - near);
    if (rate < 0.0 || distance < best_distance ||
        (distance == best_distance && n >= best_workers)) {
      rate = p.samples_per_second / n;
      best_distance = distance;
      best_workers = n;
    }
  }
  return rate;
}

}  // namespace

double EstimateThroughput(const PolicyJob& job, const Allocation& workers) {
  const int total = TotalWorkers(workers);
  if (total == 0) return 0.0;
  // The newest measurement of exactly this allocation wins.
  for (auto it = job.throughput.rbegin(); it != job.throughput.rend(); ++it) {
    if (it->workers == workers && it->samples_per_second > 0.0) return it->samples_per_second;
  }
  double sum = 0.0;
  for (const auto& [type, count] : workers) {
    const double rate = PerWorkerRate(job, type, total);
    if (rate < 0.0) return -1.0;
    sum += rate * count;
  }
  return sum;
}

namespace internal {

std::vector<size_t> ServiceOrder(const std::vector<PolicyJob>& jobs) {
  std::vector<size_t> order(jobs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PolicyJob& x = jobs[a];
    const PolicyJob& y = jobs[b];
    if (x.priority != y.priority) return x.priority > y.priority;
    return std::tie(x.arrival_time, x.submission_order, x.id) <
           std::tie(y.arrival_time, y.submission_order, y.id);
  });
  return order;
}

std::string InvalidReason(const PolicyJob& j) {
  auto s = [](long long v) { return std::to_string(v); };
  if (j.virtual_nodes < 1) return "virtual_nodes " + s(j.virtual_nodes) + " < 1";
  if (j.gpus_per_worker < 1) return "gpus_per_worker " + s(j.gpus_per_worker) + " < 1";
  if (j.min_workers < 1) return "min_workers " + s(j.min_workers) + " < 1";
  if (j.min_workers > j.max_workers) {
    return "min_workers " + s(j.min_workers) + " > max_workers " + s(j.max_workers);
  }
  if (j.max_workers > j.virtual_nodes) {
    return "max_workers " + s(j.max_workers) + " > virtual_nodes " + s(j.virtual_nodes);
  }
  if (j.requested_workers != 0 &&
      (j.requested_workers < j.min_workers || j.requested_workers > j.max_workers)) {
    return "requested_workers " + s(j.requested_workers) + " outside " + s(j.min_workers) + ".." +
           s(j.max_workers);
  }
  for (const auto& [type, n] : j.current) {
    if (n < 0) return "negative current workers on " + type;
  }
  if (j.unbound_workers < 0) return "unbound_workers " + s(j.unbound_workers) + " < 0";
  if (!j.policy.empty() && !IsKnownPolicy(j.policy)) return "unknown policy '" + j.policy + "'";
  if (!(j.resize_pause_seconds >= 0.0)) return "negative resize pause";
  return "";
}

Status ValidateInput(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                     double now) {
  if (!std::isfinite(now)) return InvalidArgument("decision time is not finite");
  for (const auto& [type, n] : inventory.gpus) {
    if (type.empty()) return InvalidArgument("inventory has an unnamed GPU type");
    if (n < 0) return InvalidArgument("inventory has " + std::to_string(n) + " " + type);
  }
  std::set<std::string> ids;
  for (const auto& j : jobs) {
    if (j.id.empty()) return InvalidArgument("a job has no id");
    if (!ids.insert(j.id).second) return InvalidArgument("duplicate job id " + j.id);
    if (!std::isfinite(j.arrival_time)) {
      return InvalidArgument("job " + j.id + " has no finite arrival time");
    }
  }
  return Status::Ok();
}

double Weight(const PolicyJob& job) { return std::max(1, job.priority); }

std::vector<std::string> TypesFastestFirst(const PolicyJob& job, const GpuInventory& inventory,
                                           const PolicyOptions& options) {
  std::vector<std::string> types;
  for (const auto& [type, n] : inventory.gpus) {
    const auto& allowed = job.allowed_types;
    if (allowed.empty() || std::find(allowed.begin(), allowed.end(), type) != allowed.end()) {
      types.push_back(type);
    }
  }
  std::map<std::string, double> measured;
  bool all_measured = !types.empty();
  for (const auto& t : types) {
    const double rate = PerWorkerRate(job, t, 1);
    if (rate < 0.0) {
      all_measured = false;
      break;
    }
    measured[t] = rate;
  }
  auto hint = [&](const std::string& t) {
    auto it = options.gpu_type_speed.find(t);
    return it == options.gpu_type_speed.end() ? -1.0 : it->second;
  };
  std::stable_sort(types.begin(), types.end(), [&](const std::string& a, const std::string& b) {
    const double sa = all_measured ? measured[a] : hint(a);
    const double sb = all_measured ? measured[b] : hint(b);
    if (sa != sb) return sa > sb;
    return a < b;
  });
  return types;
}

GpuPool::GpuPool(const GpuInventory& inventory) : free_(inventory.gpus) {}

int GpuPool::Free(const std::string& type) const {
  auto it = free_.find(type);
  return it == free_.end() ? 0 : it->second;
}

int GpuPool::TotalFree() const {
  int n = 0;
  for (const auto& [type, count] : free_) n += count;
  return n;
}

int GpuPool::WorkersThatFit(int gpus_per_worker) const {
  int n = 0;
  for (const auto& [type, count] : free_) n += count / gpus_per_worker;
  return n;
}

std::optional<Allocation> GpuPool::Take(int workers, int gpus_per_worker, const Allocation& prefer,
                                        const std::vector<std::string>& type_order,
                                        bool allow_mixed) {
  if (workers <= 0) return Allocation{};
  // Preferred types in speed order, then the rest in speed order.
  std::vector<std::string> candidates;
  for (const auto& t : type_order) {
    if (prefer.count(t) && prefer.at(t) > 0) candidates.push_back(t);
  }
  if (!allow_mixed) {
    // The preferred type with the most workers first, so a single-type job stays put.
    std::stable_sort(
        candidates.begin(), candidates.end(),
        [&](const std::string& a, const std::string& b) { return prefer.at(a) > prefer.at(b); });
    for (const auto& t : type_order) candidates.push_back(t);
    for (const auto& t : candidates) {
      if (Free(t) / gpus_per_worker >= workers) {
        free_[t] -= workers * gpus_per_worker;
        return Allocation{{t, workers}};
      }
    }
    return std::nullopt;
  }
  std::map<std::string, int> left = free_;
  Allocation got;
  int need = workers;
  auto take_from = [&](const std::string& t, int cap) {
    const int n = std::min({need, cap, left[t] / gpus_per_worker});
    if (n <= 0) return;
    left[t] -= n * gpus_per_worker;
    got[t] += n;
    need -= n;
  };
  for (const auto& t : candidates) take_from(t, prefer.at(t));
  for (const auto& t : type_order) take_from(t, need);
  if (need > 0) return std::nullopt;
  for (auto& [t, n] : left) {
    if (free_.count(t)) free_[t] = n;
  }
  return got;
}

bool GpuPool::AddOne(Allocation& into, int gpus_per_worker, const Allocation& prefer,
                     const std::vector<std::string>& type_order, bool allow_mixed) {
  if (!allow_mixed && !into.empty()) {
    const std::string& t = into.begin()->first;
    if (Free(t) < gpus_per_worker) return false;
    free_[t] -= gpus_per_worker;
    into[t] += 1;
    return true;
  }
  // Restore a worker the job holds now before taking a new type.
  const Allocation missing = Minus(prefer, into);
  auto one = Take(1, gpus_per_worker, missing, type_order, allow_mixed);
  if (!one) return false;
  for (const auto& [t, n] : *one) into[t] += n;
  return true;
}

bool GpuPool::TakeExact(const Allocation& allocation, int gpus_per_worker) {
  for (const auto& [t, n] : allocation) {
    if (Free(t) < n * gpus_per_worker) return false;
  }
  for (const auto& [t, n] : allocation) free_[t] -= n * gpus_per_worker;
  return true;
}

Allocation Minus(const Allocation& a, const Allocation& b) {
  Allocation out;
  for (const auto& [t, n] : a) {
    auto it = b.find(t);
    const int d = n - (it == b.end() ? 0 : it->second);
    if (d > 0) out[t] = d;
  }
  return out;
}

std::string Describe(const Allocation& allocation) {
  if (allocation.empty()) return "no workers";
  if (allocation.size() == 1) {
    const auto& [t, n] = *allocation.begin();
    return std::to_string(n) + " x " + t;
  }
  std::string s;
  for (const auto& [t, n] : allocation) {
    s += (s.empty() ? "" : " + ") + std::to_string(n) + " x " + t;
  }
  return s;
}

namespace {
Allocation Normalized(const Allocation& a) {
  Allocation out;
  for (const auto& [t, n] : a) {
    if (n > 0) out[t] = n;
  }
  return out;
}
}  // namespace

void MarkChanged(const std::vector<PolicyJob>& jobs, Decision& decision) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    auto& d = decision.jobs[i];
    d.workers = Normalized(d.workers);
    d.changed = d.workers != Normalized(jobs[i].current);
  }
}

bool ResizePaysOff(const PolicyJob& job, const Allocation& from, const Allocation& to) {
  const int n_from = TotalWorkers(from);
  const int n_to = TotalWorkers(to);
  if (n_from == 0) return true;  // starting, not resizing
  if (n_to == 0) return false;
  const double t_from = EstimateThroughput(job, from);
  double t_to = EstimateThroughput(job, to);
  if (t_from <= 0.0) return n_to > n_from;  // nothing measured: more workers is the bet
  if (t_to < 0.0) t_to = t_from * n_to / n_from;
  if (t_to <= t_from) return false;
  if (job.remaining_samples < 0.0) return true;
  const double r = job.remaining_samples;
  return job.resize_pause_seconds + r / t_to < r / t_from;
}

MinimumPass ReserveMinimums(const std::vector<PolicyJob>& jobs, const GpuInventory& inventory,
                            const PolicyOptions& options) {
  const size_t n = jobs.size();
  MinimumPass m(inventory);
  m.order = ServiceOrder(jobs);
  m.types.resize(n);
  m.base.resize(n);
  m.running.assign(n, false);
  m.started.assign(n, false);
  m.reason.resize(n);
  std::vector<bool> valid(n, false);
  for (size_t i : m.order) {
    const std::string why = InvalidReason(jobs[i]);
    if (!why.empty()) {
      m.reason[i] = "invalid: " + why;
      continue;
    }
    valid[i] = true;
    m.types[i] = TypesFastestFirst(jobs[i], inventory, options);
  }
  for (size_t i : m.order) {
    const PolicyJob& j = jobs[i];
    if (!valid[i] || TotalWorkers(j.current) == 0) continue;
    auto a = m.pool.Take(j.min_workers, j.gpus_per_worker, j.current, m.types[i],
                         options.allow_mixed_types);
    if (!a) {
      m.reason[i] = "stopped: fewer than " + std::to_string(j.min_workers * j.gpus_per_worker) +
                    " " + j.unit + " (min) left for it";
      continue;
    }
    m.base[i] = *a;
    m.running[i] = true;
  }
  std::string blocker;
  for (size_t i : m.order) {
    const PolicyJob& j = jobs[i];
    if (!valid[i] || TotalWorkers(j.current) != 0) continue;
    if (!blocker.empty() && !options.backfill) {
      m.reason[i] = "waiting: behind higher-priority job " + blocker;
      continue;
    }
    int free = 0;
    for (const std::string& t : m.types[i]) free += m.pool.Free(t);
    auto a =
        m.pool.Take(j.min_workers, j.gpus_per_worker, {}, m.types[i], options.allow_mixed_types);
    if (!a) {
      m.reason[i] = "waiting: needs " + std::to_string(j.min_workers * j.gpus_per_worker) + " " +
                    j.unit + " (min), " + std::to_string(free) +
                    " free beyond running jobs' minimums";
      if (blocker.empty()) blocker = j.id;
      continue;
    }
    m.base[i] = *a;
    m.started[i] = true;
  }
  return m;
}

void KeepUnbound(const PolicyJob& job, int cap, const std::vector<std::string>& type_order,
                 bool allow_mixed, GpuPool& pool, Allocation& target) {
  for (int k = 0; k < job.unbound_workers && TotalWorkers(target) < cap; ++k) {
    if (!pool.AddOne(target, job.gpus_per_worker, job.current, type_order, allow_mixed)) break;
  }
}

double CooldownLeft(const PolicyJob& job, const PolicyOptions& options, double now) {
  const double cooldown =
      job.cooldown_seconds >= 0.0 ? job.cooldown_seconds : options.cooldown_seconds;
  if (!std::isfinite(job.last_resize_time)) return 0.0;
  return std::max(0.0, job.last_resize_time + cooldown - now);
}

}  // namespace internal
}  // namespace vf::policy
