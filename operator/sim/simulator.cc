#include "operator/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

#include "runtime/job/spec.h"

namespace vf::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int Gpus(const policy::Allocation& a, int gpus_per_worker) {
  return policy::TotalWorkers(a) * gpus_per_worker;
}

// The live state of one job during a run. Plain data.
struct JobState {
  const SimJob* job = nullptr;
  JobOutcome out;
  bool arrived = false;
  bool done = false;
  double remaining_steps = 0.0;
  policy::Allocation alloc;
  double step_seconds = 0.0;
  double paused_until = 0.0;
  double last_resize = -kInf;
  double pause_seconds = 0.0;  // one resize's pause for this job on this cluster
  std::vector<policy::ThroughputPoint> measured;
  std::map<policy::Allocation, double> step_cache;

  bool running() const { return arrived && !done && !alloc.empty(); }
  // When it finishes if nothing changes.
  double Completion(double now) const {
    return std::max(now, paused_until) + remaining_steps * step_seconds;
  }
};

}  // namespace

Result<std::vector<SimJob>> MakeJobs(const std::vector<TraceJob>& trace, const Profiles& profiles,
                                     MaxWorkers max_workers) {
  std::vector<SimJob> jobs;
  for (size_t i = 0; i < trace.size(); ++i) {
    const TraceJob& t = trace[i];
    char id[32];
    std::snprintf(id, sizeof(id), "trace/job-%02zu", i);
    const std::string where = std::string("job ") + std::to_string(i);
    VF_ASSIGN_OR_RETURN(const WorkloadProfile* w, profiles.ForTrace(t.workload, t.dataset));
    SimJob j;
    j.id = id;
    j.workload = w;
    j.label = t.workload + (t.dataset.empty() ? "" : "/" + t.dataset);
    j.priority = t.priority;
    j.policy = t.policy;
    j.arrival_time = t.arrival_time;
    j.virtual_nodes = t.VirtualNodes();
    j.global_batch = t.batch_size;
    j.min_workers = 1;
    j.requested_workers = std::min(t.gpu_demand, j.virtual_nodes);
    j.max_workers = max_workers == MaxWorkers::kDemand ? j.requested_workers : j.virtual_nodes;
    // The job's length as every part of the product computes it.
    JobSpec length;
    length.global_batch_size = t.batch_size;
    length.steps = t.num_steps;
    length.epochs = t.num_epochs;
    int64_t train_samples = 0;
    if (t.num_steps <= 0) {
      auto it = profiles.dataset_samples.find(t.dataset);
      if (it == profiles.dataset_samples.end()) {
        return NotFound(where + ": no size for dataset '" + t.dataset + "' in " + profiles.path);
      }
      train_samples = it->second;
      if (train_samples < t.batch_size) {
        return InvalidArgument(where + ": batch " + std::to_string(t.batch_size) +
                               " is larger than the dataset " + t.dataset);
      }
    }
    j.steps = TotalSteps(length, train_samples);
    jobs.push_back(std::move(j));
  }
  return jobs;
}

void Summarize(SimResult& r, const Cluster& cluster) {
  std::vector<double> jcts;
  double gpu_seconds = 0.0;
  int resizes = 0;
  r.makespan = 0.0;
  r.unfinished = 0;
  for (const auto& j : r.jobs) {
    gpu_seconds += j.gpu_seconds;
    resizes += j.resizes;
    if (!j.finished()) {
      ++r.unfinished;
      continue;
    }
    jcts.push_back(j.jct());
    r.makespan = std::max(r.makespan, j.finish_time);
  }
  std::sort(jcts.begin(), jcts.end());
  const size_t n = jcts.size();
  r.mean_jct = r.median_jct = r.p99_jct = 0.0;
  if (n > 0) {
    for (double x : jcts) r.mean_jct += x / static_cast<double>(n);
    r.median_jct = n % 2 ? jcts[n / 2] : 0.5 * (jcts[n / 2 - 1] + jcts[n / 2]);
    const size_t rank = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n)));
    r.p99_jct = jcts[std::max<size_t>(rank, 1) - 1];
  }
  r.mean_resizes =
      r.jobs.empty() ? 0.0 : static_cast<double>(resizes) / static_cast<double>(r.jobs.size());
  const double capacity = cluster.TotalGpus() * r.makespan;
  r.gpu_utilisation = capacity > 0.0 ? gpu_seconds / capacity : 0.0;
}

namespace {

std::vector<JobState> InitialStates(const std::vector<SimJob>& jobs, const Cluster& cluster) {
  std::vector<JobState> states(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    JobState& s = states[i];
    s.job = &jobs[i];
    s.remaining_steps = static_cast<double>(jobs[i].steps);
    s.pause_seconds = ResizePauseSeconds(*jobs[i].workload, cluster);
    s.out.id = jobs[i].id;
    s.out.label = jobs[i].label;
    s.out.priority = jobs[i].priority;
    s.out.requested_workers = jobs[i].requested_workers;
    s.out.virtual_nodes = jobs[i].virtual_nodes;
    s.out.arrival_time = jobs[i].arrival_time;
  }
  return states;
}

// What the next event depends on: the earliest arrival or completion, and what is going on.
// Value type.
struct Outlook {
  double next = kInf;
  bool active = false;  // a job has arrived and not finished
  bool running = false;
  bool future_arrivals = false;
};

Outlook LookAhead(const std::vector<JobState>& states, double now) {
  Outlook o;
  for (const JobState& s : states) {
    if (s.done) continue;
    if (!s.arrived) {
      o.next = std::min(o.next, s.job->arrival_time);
      o.future_arrivals = true;
      continue;
    }
    o.active = true;
    if (s.running()) {
      o.running = true;
      o.next = std::min(o.next, s.Completion(now));
    }
  }
  return o;
}

// Moves every running job from `now` to `next`, then admits arrivals and retires finished jobs.
void Advance(std::vector<JobState>& states, double now, double next) {
  for (JobState& s : states) {
    if (!s.running()) continue;
    const double from = std::max(now, s.paused_until);
    if (next > from) s.remaining_steps -= (next - from) / s.step_seconds;
    s.out.paused_seconds += std::max(0.0, std::min(next, s.paused_until) - now);
    s.out.gpu_seconds += (next - now) * Gpus(s.alloc, 1);
  }
  for (JobState& s : states) {
    if (!s.arrived && s.job->arrival_time <= next) s.arrived = true;
    if (s.running() && s.remaining_steps <= 1e-9 * static_cast<double>(s.job->steps)) {
      s.done = true;
      s.remaining_steps = 0.0;
      s.alloc.clear();
      s.out.finish_time = next;
    }
  }
}

// The active jobs as the policy sees them, exactly as the operator would show them.
std::vector<policy::PolicyJob> PolicyView(std::vector<JobState>& states,
                                          std::vector<JobState*>& viewed) {
  std::vector<policy::PolicyJob> view;
  for (JobState& s : states) {
    if (!s.arrived || s.done) continue;
    const SimJob& j = *s.job;
    policy::PolicyJob p;
    p.id = j.id;
    p.priority = j.priority;
    p.arrival_time = j.arrival_time;
    p.submission_order = static_cast<int64_t>(&s - states.data());
    p.min_workers = j.min_workers;
    p.max_workers = j.max_workers;
    p.requested_workers = j.requested_workers;
    p.virtual_nodes = j.virtual_nodes;
    p.current = s.alloc;
    p.last_resize_time = s.last_resize;
    p.resize_pause_seconds = s.pause_seconds;
    p.remaining_samples = s.remaining_steps * static_cast<double>(j.global_batch);
    p.throughput = s.measured;
    p.policy = j.policy;  // as the operator passes spec.elasticity.policy
    view.push_back(std::move(p));
    viewed.push_back(&s);
  }
  return view;
}

// Gives the job its new workers at `now`: a start or a resize pause, and its step time there.
Status Apply(JobState& s, const policy::Allocation& workers, const Cluster& cluster,
             const SimOptions& options, double now) {
  const bool starting = s.alloc.empty();
  s.alloc = workers;
  if (s.alloc.empty()) return Status::Ok();  // stopped: it waits again
  if (starting) {
    if (s.out.start_time < 0.0) s.out.start_time = now;
    s.paused_until = now + cluster.start_seconds;
  } else {
    ++s.out.resizes;
    s.paused_until = std::max(s.paused_until, now) + s.pause_seconds;
  }
  s.last_resize = now;
  s.out.max_workers_seen = std::max(s.out.max_workers_seen, policy::TotalWorkers(s.alloc));
  auto cached = s.step_cache.find(s.alloc);
  if (cached == s.step_cache.end()) {
    VF_ASSIGN_OR_RETURN(StepPrediction p,
                        PredictStep(*s.job->workload, cluster, s.alloc, s.job->virtual_nodes,
                                    s.job->global_batch, options.split));
    cached = s.step_cache.emplace(s.alloc, p.step_seconds).first;
    // Agents report their throughput after the first steps on a new allocation.
    s.measured.push_back({s.alloc, static_cast<double>(s.job->global_batch) / p.step_seconds});
  }
  s.step_seconds = cached->second;
  return Status::Ok();
}

// Asks the policy, exactly as the operator would, and applies what changed. Returns whether
// any allocation changed.
Result<bool> Decide(std::vector<JobState>& states, const Cluster& cluster,
                    const policy::Policy& policy, const SimOptions& options, double now,
                    SimResult& result) {
  std::vector<JobState*> viewed;
  const std::vector<policy::PolicyJob> view = PolicyView(states, viewed);
  if (view.empty()) return false;
  const policy::GpuInventory inventory{cluster.gpus};
  VF_ASSIGN_OR_RETURN(policy::Decision decision, policy.Decide(view, inventory, now));
  ++result.decisions;
  bool changed = false;
  for (size_t k = 0; k < viewed.size(); ++k) {
    const policy::JobDecision& d = decision.jobs[k];
    if (!d.changed) continue;
    changed = true;
    JobState& s = *viewed[k];
    if (options.record_events) {
      char at[32];
      std::snprintf(at, sizeof(at), "%9.0f s  ", now);
      result.events.push_back(at + s.job->id + ": " + d.reason);
    }
    VF_RETURN_IF_ERROR(Apply(s, d.workers, cluster, options, now));
  }
  return changed;
}

}  // namespace

Result<SimResult> Simulate(const std::vector<SimJob>& jobs, const Cluster& cluster,
                           const policy::Policy& policy, const SimOptions& options) {
  if (!(options.tick_seconds > 0.0)) return InvalidArgument("tick must be positive");
  std::vector<JobState> states = InitialStates(jobs, cluster);
  SimResult result;
  result.policy = policy.name();
  result.split = SplitModeName(options.split);

  double now = 0.0;
  double last_decision = -kInf;
  while (true) {
    const Outlook o = LookAhead(states, now);
    if (!o.active && !o.future_arrivals) break;
    double next = o.next;
    if (o.active) next = std::min(next, last_decision + options.tick_seconds);
    next = std::max(next, now);
    if (next > options.horizon_seconds) break;
    Advance(states, now, next);
    now = next;

    VF_ASSIGN_OR_RETURN(const bool changed, Decide(states, cluster, policy, options, now, result));
    last_decision = now;
    // Nothing runs, nothing will arrive, and the policy will not start anything: the
    // remaining jobs can never run on this cluster.
    if (!o.running && !changed && !o.future_arrivals) {
      bool any_running = false;
      for (const JobState& s : states) any_running = any_running || s.running();
      if (!any_running) break;
    }
  }
  for (JobState& s : states) result.jobs.push_back(s.out);
  Summarize(result, cluster);
  return result;
}

}  // namespace vf::sim
