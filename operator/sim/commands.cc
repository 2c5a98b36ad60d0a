#include "operator/sim/commands.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "operator/policy/policy.h"
#include "operator/sim/model.h"
#include "operator/sim/simulator.h"
#include "operator/sim/trace.h"
#include "runtime/command_line.h"

namespace vf {
namespace {

using Json = nlohmann::json;

int Fail(const std::string& message, int code = 1) {
  std::fprintf(stderr, "vf: error: %s\n", message.c_str());
  return code;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string Base(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string Seconds(double s) { return s < 0.0 ? "-" : Fixed(s, 0); }

std::string DescribeGpus(const std::map<std::string, int>& gpus) {
  std::string s;
  for (const auto& [t, n] : gpus) s += (s.empty() ? "" : " + ") + std::to_string(n) + " x " + t;
  return s.empty() ? "no GPUs" : s;
}

std::string Pad(const std::string& s, size_t width, bool right = false) {
  if (s.size() >= width) return s;
  const std::string fill(width - s.size(), ' ');
  return right ? fill + s : s + fill;
}

constexpr const char* kSimulateDescription =
    "Runs a job trace on a simulated GPU cluster under the operator's own scheduling policies\n"
    "(the code the operator runs, unchanged; --policy lists them) and prints each job's\n"
    "completion time and, per policy side by side, mean / median / p99 JCT, makespan, GPU\n"
    "utilisation and resizes per job.\n\n"
    "A job's step time on an allocation is the slowest worker's virtual nodes x its seconds per\n"
    "virtual node (from the throughput profiles, per workload and GPU type) plus a ring\n"
    "all-reduce (latency + bytes / bandwidth, from the cluster file); every resize pauses the\n"
    "job (fixed switch cost + state broadcast). Traces use the VirtualFlow paper's format; make\n"
    "synthetic ones with `vf trace generate`.\n\n"
    "With --predict WORKLOAD (and --workers, --virtual-nodes, --global-batch), prints the\n"
    "predicted step time of one workload on 1..N workers instead of running a trace.";

struct SimulateFlags {
  std::string cluster, policies = "static,elastic", profiles, split = "proportional", types;
  std::string max_workers = "demand", predict, workers = "1,2,3,4";
  // The policies' own defaults, stated once in PolicyOptions.
  double cooldown = policy::PolicyOptions{}.cooldown_seconds;
  double threshold = policy::PolicyOptions{}.scaling_efficiency_threshold;
  double tick = 30.0;
  int64_t virtual_nodes = 0, global_batch = 0;
  bool json = false, backfill = false, summary_only = false, log = false;
};

struct Run {
  sim::SimResult result;
  std::string label;
};

int PrintTraceRuns(const std::string& trace_path, const sim::Cluster& cluster,
                   const std::vector<sim::SimJob>& jobs, const std::vector<Run>& runs,
                   const SimulateFlags& f) {
  if (f.json) {
    Json j;
    j["trace"] = trace_path;
    j["cluster"] = {{"name", cluster.name}, {"gpus", cluster.gpus}};
    j["runs"] = Json::array();
    for (const auto& run : runs) {
      const auto& r = run.result;
      Json jr;
      jr["policy"] = r.policy;
      jr["split"] = r.split;
      jr["summary"] = {{"mean_jct_seconds", r.mean_jct},       {"median_jct_seconds", r.median_jct},
                       {"p99_jct_seconds", r.p99_jct},         {"makespan_seconds", r.makespan},
                       {"gpu_utilisation", r.gpu_utilisation}, {"resizes_per_job", r.mean_resizes},
                       {"unfinished_jobs", r.unfinished},      {"decisions", r.decisions}};
      jr["jobs"] = Json::array();
      for (const auto& o : r.jobs) {
        jr["jobs"].push_back({{"id", o.id},
                              {"workload", o.label},
                              {"priority", o.priority},
                              {"gpu_demand", o.requested_workers},
                              {"virtual_nodes", o.virtual_nodes},
                              {"arrival_seconds", o.arrival_time},
                              {"start_seconds", o.start_time},
                              {"finish_seconds", o.finish_time},
                              {"jct_seconds", o.finished() ? o.jct() : -1.0},
                              {"resizes", o.resizes},
                              {"paused_seconds", o.paused_seconds},
                              {"gpu_seconds", o.gpu_seconds},
                              {"max_workers", o.max_workers_seen}});
      }
      j["runs"].push_back(std::move(jr));
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("trace %s: %zu jobs on %s (%s)\n\n", Base(trace_path).c_str(), jobs.size(),
              cluster.name.c_str(), DescribeGpus(cluster.gpus).c_str());
  if (!f.summary_only) {
    std::string head = Pad("job", 13) + Pad("workload", 20) + Pad("prio", 5, true) +
                       Pad("GPUs", 5, true) + Pad("arrival", 9, true);
    std::string sub = std::string(52, ' ');
    for (const auto& run : runs) {
      head += "  " + Pad(run.label, 16);
      sub += "  " + Pad("JCT s", 9, true) + Pad("resizes", 8, true);
    }
    std::printf("%s\n%s\n", head.c_str(), sub.c_str());
    for (size_t i = 0; i < jobs.size(); ++i) {
      const auto& o = runs.front().result.jobs[i];
      std::string line = Pad(o.id.substr(o.id.find('/') + 1), 13) + Pad(o.label, 20) +
                         Pad(std::to_string(o.priority), 5, true) +
                         Pad(std::to_string(o.requested_workers), 5, true) +
                         Pad(Seconds(o.arrival_time), 9, true);
      for (const auto& run : runs) {
        const auto& x = run.result.jobs[i];
        line += "  " + Pad(x.finished() ? Seconds(x.jct()) : "unfinished", 9, true) +
                Pad(std::to_string(x.resizes), 8, true);
      }
      std::printf("%s\n", line.c_str());
    }
    std::printf("\n");
  }
  std::string head = Pad("", 18);
  for (const auto& run : runs) head += Pad(run.label, 18, true);
  std::printf("%s\n", head.c_str());
  auto row = [&](const std::string& name, auto value) {
    std::string line = Pad(name, 18);
    for (const auto& run : runs) line += Pad(value(run.result), 18, true);
    std::printf("%s\n", line.c_str());
  };
  row("mean JCT s", [](const sim::SimResult& r) { return Seconds(r.mean_jct); });
  row("median JCT s", [](const sim::SimResult& r) { return Seconds(r.median_jct); });
  row("p99 JCT s", [](const sim::SimResult& r) { return Seconds(r.p99_jct); });
  row("makespan s", [](const sim::SimResult& r) { return Seconds(r.makespan); });
  row("GPU utilisation",
      [](const sim::SimResult& r) { return Fixed(100.0 * r.gpu_utilisation, 1) + "%"; });
  row("resizes per job", [](const sim::SimResult& r) { return Fixed(r.mean_resizes, 2); });
  row("unfinished jobs", [](const sim::SimResult& r) { return std::to_string(r.unfinished); });
  // Each run against the first one (the baseline when listed first).
  const auto& base = runs.front();
  for (size_t k = 1; k < runs.size(); ++k) {
    const auto& r = runs[k].result;
    if (base.result.mean_jct <= 0.0 || base.result.median_jct <= 0.0) break;
    std::printf("%s vs %s: mean JCT %+.1f%%, median JCT %+.1f%%, makespan %+.1f%%\n",
                runs[k].label.c_str(), base.label.c_str(),
                100.0 * (r.mean_jct / base.result.mean_jct - 1.0),
                100.0 * (r.median_jct / base.result.median_jct - 1.0),
                100.0 * (r.makespan / base.result.makespan - 1.0));
  }
  return 0;
}

int Predict(const sim::Profiles& profiles, const sim::Cluster& cluster, const SimulateFlags& f,
            const std::vector<sim::SplitMode>& splits) {
  auto it = profiles.workloads.find(f.predict);
  if (it == profiles.workloads.end()) {
    std::string known;
    for (const auto& [name, w] : profiles.workloads) known += (known.empty() ? "" : ", ") + name;
    return Fail("--predict: unknown workload '" + f.predict + "' (known: " + known + ")", 2);
  }
  if (f.virtual_nodes < 1 || f.global_batch < 1) {
    return Fail("--predict needs --virtual-nodes and --global-batch", 2);
  }
  const sim::WorkloadProfile& w = it->second;
  Json out = Json::array();
  if (!f.json) {
    std::printf("%s on %s: V=%lld, B=%lld (micro-batch %lld)\n", w.name.c_str(),
                cluster.name.c_str(), static_cast<long long>(f.virtual_nodes),
                static_cast<long long>(f.global_batch),
                static_cast<long long>(f.global_batch / f.virtual_nodes));
    std::printf("%-8s %-13s %-24s %12s %14s %10s %12s\n", "workers", "split", "virtual nodes",
                "compute ms", "all-reduce ms", "step ms", "samples/s");
  }
  for (const std::string& item : SplitList(f.workers)) {
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || n < 1 || n > 1 << 20) return Fail("--workers: bad count '" + item + "'", 2);
    // Workers fill the cluster's types in speed-hint order (fastest first), like the policies.
    std::vector<std::string> types;
    for (const auto& [t, c] : cluster.gpus) types.push_back(t);
    std::stable_sort(types.begin(), types.end(), [&](const std::string& a, const std::string& b) {
      auto ha = cluster.speed_hints.count(a) ? cluster.speed_hints.at(a) : 0.0;
      auto hb = cluster.speed_hints.count(b) ? cluster.speed_hints.at(b) : 0.0;
      return ha > hb;
    });
    policy::Allocation alloc;
    long left = n;
    for (const auto& t : types) {
      const long take = std::min<long>(left, cluster.gpus.at(t));
      if (take > 0) alloc[t] = static_cast<int>(take);
      left -= take;
    }
    if (left > 0) return Fail("--workers " + item + ": the cluster has fewer GPUs", 2);
    for (sim::SplitMode split : splits) {
      auto p = sim::PredictStep(w, cluster, alloc, static_cast<int>(f.virtual_nodes),
                                f.global_batch, split);
      if (!p.ok()) return Fail(p.status().message());
      std::string counts;
      for (int c : p->virtual_nodes) counts += (counts.empty() ? "" : ",") + std::to_string(c);
      const double sps = static_cast<double>(f.global_batch) / p->step_seconds;
      if (f.json) {
        out.push_back({{"workers", n},
                       {"allocation", alloc},
                       {"split", sim::SplitModeName(split)},
                       {"virtual_nodes", p->virtual_nodes},
                       {"compute_seconds", p->compute_seconds},
                       {"allreduce_seconds", p->allreduce_seconds},
                       {"step_seconds", p->step_seconds},
                       {"samples_per_second", sps}});
      } else {
        std::printf("%-8ld %-13s %-24s %12.2f %14.2f %10.2f %12.1f\n", n, sim::SplitModeName(split),
                    counts.c_str(), 1e3 * p->compute_seconds, 1e3 * p->allreduce_seconds,
                    1e3 * p->step_seconds, sps);
      }
    }
  }
  if (f.json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int RunSimulateCommand(int argc, char** argv) {
  SimulateFlags f;
  std::string trace_path;
  CLI::App app(kSimulateDescription, "vf simulate");
  app.add_option("TRACE.json", trace_path, "the job trace (not with --predict)");
  app.add_option("--cluster", f.cluster, "cluster description (YAML; see examples/clusters/)")
      ->type_name("CLUSTER.yaml");
  app.add_option("--policy", f.policies,
                 "policies to compare, comma-separated; the first is the baseline\n"
                 "of the % lines. The policies:\n" +
                     policy::PolicyHelp("  "))
      ->type_name("NAME[,NAME...]")
      ->capture_default_str();
  const std::string built_in = sim::kBuiltInProfilesName;
  app.add_option("--profiles", f.profiles, "throughput profiles (default: the\n" + built_in + ")")
      ->type_name("PROFILES.yaml");
  app.add_flag("--json", f.json, "print JSON instead of tables");
  app.add_option("--split", f.split,
                 "virtual nodes per worker: proportional (to speed, the product's\n"
                 "way) and/or even, comma-separated")
      ->capture_default_str();
  app.add_option("--types", f.types, "use only these GPU types of the cluster, comma-separated");
  app.add_option("--max-workers", f.max_workers,
                 "a trace job may use 1..gpu_demand workers (demand, as the\n"
                 "published scheduler) or 1..its virtual nodes (virtual-nodes)")
      ->capture_default_str();
  app.add_option("--cooldown", f.cooldown, "seconds between voluntary resizes of a job")
      ->check(FiniteNumber())
      ->capture_default_str();
  app.add_option("--tick", f.tick, "seconds between policy decisions besides events")
      ->check(FiniteNumber())
      ->capture_default_str();
  app.add_option("--efficiency-threshold", f.threshold,
                 "autoscale: keep a worker adding at least this fraction of an\n"
                 "average worker's throughput")
      ->check(FiniteNumber())
      ->capture_default_str();
  app.add_flag("--backfill", f.backfill,
               "let smaller jobs start while a higher-priority job waits");
  app.add_flag("--summary-only", f.summary_only, "omit the per-job table");
  app.add_flag("--log", f.log, "print every allocation change with the policy's reason (stderr)");
  app.add_option("--predict", f.predict,
                 "print predicted step times of this workload (a name in the\n"
                 "profiles) instead of running a trace")
      ->type_name("WORKLOAD");
  app.add_option("--workers", f.workers, "--predict: worker counts, comma-separated")
      ->type_name("N[,N...]")
      ->capture_default_str();
  app.add_option("--virtual-nodes", f.virtual_nodes, "--predict: virtual nodes V")
      ->transform(Base10Integer());
  app.add_option("--global-batch", f.global_batch, "--predict: global batch B")
      ->transform(Base10Integer());
  if (auto exit_code = ParseCommandLine(app, "vf", argc - 1, argv + 1)) return *exit_code;
  if (f.cluster.empty()) return Fail("vf simulate needs --cluster CLUSTER.yaml (see --help)", 2);
  if (f.predict.empty() && trace_path.empty()) {
    return Fail("vf simulate needs exactly one trace file (see --help)", 2);
  }
  std::vector<sim::SplitMode> splits;
  for (const auto& s : SplitList(f.split)) {
    if (s == "proportional") {
      splits.push_back(sim::SplitMode::kProportional);
    } else if (s == "even") {
      splits.push_back(sim::SplitMode::kEven);
    } else {
      return Fail("--split: unknown '" + s + "' (known: proportional, even)", 2);
    }
  }
  if (splits.empty()) return Fail("--split: give proportional and/or even", 2);
  sim::MaxWorkers max_workers;
  if (f.max_workers == "demand") {
    max_workers = sim::MaxWorkers::kDemand;
  } else if (f.max_workers == "virtual-nodes") {
    max_workers = sim::MaxWorkers::kVirtualNodes;
  } else {
    return Fail("--max-workers: unknown '" + f.max_workers + "' (known: demand, virtual-nodes)", 2);
  }
  if (!(f.tick > 0.0)) return Fail("--tick must be positive", 2);

  const auto names = SplitList(f.policies);
  if (names.empty()) return Fail("--policy: give at least one policy", 2);
  for (const auto& name : names) {
    auto policy = policy::CreatePolicy(name, {});
    if (!policy.ok()) return Fail("--policy: " + policy.status().message(), 2);
  }
  auto cluster = sim::LoadCluster(f.cluster);
  if (!cluster.ok()) return Fail(cluster.status().message());
  if (!f.types.empty()) {
    const auto types = SplitList(f.types);
    for (const auto& t : types) {
      if (!cluster->gpus.count(t)) {
        return Fail("--types: cluster " + cluster->name + " has no " + t, 2);
      }
    }
    *cluster = sim::RestrictTypes(*cluster, types);
  }
  auto profiles = f.profiles.empty() ? sim::BuiltInProfiles() : sim::LoadProfiles(f.profiles);
  if (!profiles.ok()) return Fail(profiles.status().message());
  if (!f.predict.empty()) return Predict(*profiles, *cluster, f, splits);

  auto trace = sim::LoadTrace(trace_path);
  if (!trace.ok()) return Fail(trace.status().message());
  auto jobs = sim::MakeJobs(*trace, *profiles, max_workers);
  if (!jobs.ok()) return Fail(jobs.status().message());

  policy::PolicyOptions options;
  options.cooldown_seconds = f.cooldown;
  options.scaling_efficiency_threshold = f.threshold;
  options.backfill = f.backfill;
  options.gpu_type_speed = cluster->speed_hints;
  sim::SimOptions sim_options;
  sim_options.tick_seconds = f.tick;

  std::vector<Run> runs;
  for (const auto& name : names) {
    auto policy = policy::CreatePolicy(name, options);
    if (!policy.ok()) return Fail("--policy: " + policy.status().message(), 2);
    for (sim::SplitMode split : splits) {
      sim_options.split = split;
      sim_options.record_events = f.log;
      auto r = sim::Simulate(*jobs, *cluster, **policy, sim_options);
      if (!r.ok()) return Fail(r.status().message());
      std::string label = name;
      if (splits.size() > 1) label += std::string("/") + sim::SplitModeName(split);
      if (f.log) {
        std::fprintf(stderr, "--- %s\n", label.c_str());
        for (const auto& e : r->events) std::fprintf(stderr, "%s\n", e.c_str());
      }
      runs.push_back({std::move(r).value(), label});
    }
  }
  return PrintTraceRuns(trace_path, *cluster, *jobs, runs, f);
}

int RunTraceCommand(int argc, char** argv) {
  int64_t jobs = 20, seed = 1;
  double rate = 8.0;
  std::string mix = "resnet=0.4,bert=0.3,transformer=0.3", output;
  CLI::App app(
      "Writes a synthetic job trace in the format of the VirtualFlow paper's traces (the ones\n"
      "`vf simulate` reads): Poisson arrivals at R jobs per hour, workloads drawn from the mix,\n"
      "priorities uniform over 1, 5 and 10, and per-workload shapes (GPUs, batch, length) like\n"
      "those of the published traces. The same seed gives the same trace on every machine.",
      "vf trace generate");
  app.add_option("--jobs", jobs, "number of jobs")
      ->transform(Base10Integer())
      ->capture_default_str();
  app.add_option("--jobs-per-hour", rate, "mean arrival rate R")
      ->check(FiniteNumber())
      ->capture_default_str();
  app.add_option("--seed", seed, "random seed")->transform(Base10Integer())->capture_default_str();
  app.add_option("--mix", mix, "workload shares (default " + mix + ")")->type_name("SHARES");
  app.add_option("--output", output, "write to PATH instead of stdout")->type_name("PATH");
  const std::string command = argc < 3 ? "" : argv[2];
  if (command == "--help" || command == "-h") {
    return ParseCommandLine(app, "vf", argc - 1, argv + 1).value_or(0);  // prints the help
  }
  if (command != "generate") {
    return Fail(command.empty() ? "vf trace needs a command: generate (see vf trace --help)"
                                : "unknown trace command '" + command + "' (known: generate)",
                2);
  }
  if (auto exit_code = ParseCommandLine(app, "vf", argc - 2, argv + 2)) return *exit_code;
  if (jobs < 1 || jobs > 1000000) return Fail("--jobs must be within 1..1000000", 2);
  if (seed < 0) return Fail("--seed must be non-negative", 2);
  sim::TraceGeneratorOptions o;
  o.jobs = static_cast<int>(jobs);
  o.jobs_per_hour = rate;
  o.seed = static_cast<uint64_t>(seed);
  auto parsed_mix = sim::ParseMix(mix);
  if (!parsed_mix.ok()) return Fail(parsed_mix.status().message(), 2);
  o.mix = *parsed_mix;
  auto trace = sim::GenerateTrace(o);
  if (!trace.ok()) return Fail(trace.status().message(), 2);
  const std::string text = sim::TraceToJson(*trace);
  if (output.empty()) {
    std::fputs(text.c_str(), stdout);
    return 0;
  }
  std::ofstream out(output);
  out << text;
  if (!out) return Fail("cannot write " + output);
  return 0;
}

}  // namespace vf
