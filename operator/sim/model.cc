#include "operator/sim/model.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "runtime/split.h"

namespace vf::sim {
namespace {

// yaml-cpp reports problems by exception; they become one-line errors naming file and line.
Status YamlError(const std::string& path, const YAML::Exception& e) {
  std::string where = path;
  if (!e.mark.is_null()) where += ":" + std::to_string(e.mark.line + 1);
  return InvalidArgument(where + ": " + e.msg);
}

Result<YAML::Node> LoadYaml(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open");
  try {
    return YAML::Load(in);
  } catch (const YAML::Exception& e) {
    return YamlError(path, e);
  }
}

std::string Where(const std::string& path, const YAML::Node& node, const std::string& what) {
  const YAML::Mark m = node.Mark();
  return path + (m.is_null() ? "" : ":" + std::to_string(m.line + 1)) + ": " + what;
}

// A positive finite number at node[key], or `fallback` when absent.
Result<double> Positive(const std::string& path, const YAML::Node& node, const std::string& key,
                        double fallback, bool allow_zero = false) {
  const YAML::Node v = node[key];
  if (!v) return fallback;
  double x = 0.0;
  try {
    x = v.as<double>();
  } catch (const YAML::Exception&) {
    return InvalidArgument(Where(path, v, key + " must be a number"));
  }
  if (!std::isfinite(x) || x < 0.0 || (!allow_zero && x == 0.0)) {
    return InvalidArgument(Where(
        path, v, key + (allow_zero ? " must be a non-negative number" : " must be positive")));
  }
  return x;
}

Result<std::vector<std::pair<double, double>>> BatchTable(const std::string& path,
                                                          const YAML::Node& table, bool is_rate) {
  std::vector<std::pair<double, double>> out;
  if (!table.IsMap()) return InvalidArgument(Where(path, table, "expected {micro-batch: value}"));
  for (const auto& kv : table) {
    double b = 0.0, v = 0.0;
    try {
      b = kv.first.as<double>();
      v = kv.second.as<double>();
    } catch (const YAML::Exception&) {
      return InvalidArgument(Where(path, kv.first, "micro-batch and value must be numbers"));
    }
    if (!(b > 0.0) || !(v > 0.0) || !std::isfinite(b) || !std::isfinite(v)) {
      return InvalidArgument(Where(path, kv.first, "micro-batch and value must be positive"));
    }
    out.emplace_back(b, is_rate ? 1.0 / v : v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<WorkloadProfile> ParseWorkload(const std::string& path, const std::string& name,
                                      const YAML::Node& w) {
  WorkloadProfile p;
  p.name = name;
  if (!w.IsMap()) return InvalidArgument(Where(path, w, "workload " + name + " is not a map"));
  if (w["description"]) p.description = w["description"].as<std::string>();
  if (const YAML::Node t = w["trace"]) {
    if (t["workload"]) p.trace_workload = t["workload"].as<std::string>();
    if (t["datasets"]) p.datasets = t["datasets"].as<std::vector<std::string>>();
  }
  VF_ASSIGN_OR_RETURN(p.parameters, Positive(path, w, "parameters", 0.0));
  if (p.parameters <= 0.0) return InvalidArgument(Where(path, w, name + ": needs parameters"));
  VF_ASSIGN_OR_RETURN(p.gradient_bytes_per_parameter,
                      Positive(path, w, "gradient_bytes_per_parameter", 4.0));
  VF_ASSIGN_OR_RETURN(double slots, Positive(path, w, "optimizer_slots", 1.0, true));
  p.optimizer_slots = static_cast<int>(slots);
  const YAML::Node devices = w["devices"];
  if (!devices || !devices.IsMap() || devices.size() == 0) {
    return InvalidArgument(Where(path, w, name + ": needs devices"));
  }
  for (const auto& kv : devices) {
    const std::string type = kv.first.as<std::string>();
    const YAML::Node d = kv.second;
    DeviceProfile dp;
    if (d["source"]) dp.source = d["source"].as<std::string>();
    if (d["steps_per_second"]) {
      VF_ASSIGN_OR_RETURN(dp.batch_seconds, BatchTable(path, d["steps_per_second"], true));
    } else if (d["seconds_per_micro_batch"]) {
      VF_ASSIGN_OR_RETURN(dp.batch_seconds, BatchTable(path, d["seconds_per_micro_batch"], false));
    } else {
      VF_ASSIGN_OR_RETURN(dp.fixed_seconds, Positive(path, d, "fixed_seconds", 0.0, true));
      VF_ASSIGN_OR_RETURN(dp.samples_per_second, Positive(path, d, "samples_per_second", 0.0));
      if (dp.samples_per_second <= 0.0) {
        return InvalidArgument(Where(path, d,
                                     name + "." + type +
                                         ": needs steps_per_second, seconds_per_micro_batch or "
                                         "samples_per_second"));
      }
    }
    VF_ASSIGN_OR_RETURN(dp.per_step_seconds, Positive(path, d, "per_step_seconds", 0.0, true));
    if (dp.source.empty()) {
      return InvalidArgument(Where(path, d, name + "." + type + ": every number needs a source"));
    }
    p.devices[type] = std::move(dp);
  }
  return p;
}

}  // namespace

Result<double> WorkloadProfile::SecondsPerVirtualNode(const std::string& device,
                                                      double micro_batch) const {
  auto it = devices.find(device);
  if (it == devices.end()) {
    return NotFound("no throughput profile for workload " + name + " on " + device);
  }
  const DeviceProfile& d = it->second;
  if (d.batch_seconds.empty()) return d.fixed_seconds + micro_batch / d.samples_per_second;
  const auto& pts = d.batch_seconds;
  if (pts.size() == 1) return pts[0].second * micro_batch / pts[0].first;
  // Piecewise linear between measured micro-batches, continued along the end segments (a GPU's
  // step time is close to affine in the batch), never below a tenth of the smallest point.
  size_t k = 1;
  while (k + 1 < pts.size() && micro_batch > pts[k].first) ++k;
  const auto [b0, t0] = pts[k - 1];
  const auto [b1, t1] = pts[k];
  const double t = t0 + (micro_batch - b0) * (t1 - t0) / (b1 - b0);
  return std::max(t, 0.1 * pts.front().second);
}

double WorkloadProfile::PerStepSeconds(const std::string& device) const {
  auto it = devices.find(device);
  return it == devices.end() ? 0.0 : it->second.per_step_seconds;
}

Result<const WorkloadProfile*> Profiles::ForTrace(const std::string& workload,
                                                  const std::string& dataset) const {
  for (const auto& [name, p] : workloads) {
    if (p.trace_workload != workload) continue;
    if (p.datasets.empty() ||
        std::find(p.datasets.begin(), p.datasets.end(), dataset) != p.datasets.end()) {
      return &p;
    }
  }
  return NotFound("no throughput profile for workload '" + workload + "' on dataset '" + dataset +
                  "' in " + path);
}

// Defined in the source the build generates from operator/sim/data/throughput.yaml
// (embed_data.cmake), NUL-terminated.
extern const unsigned char kBuiltInProfilesYaml[];

const char* const kBuiltInProfilesName = "built-in operator/sim/data/throughput.yaml";

Result<Profiles> BuiltInProfiles() {
  return ParseProfiles(reinterpret_cast<const char*>(kBuiltInProfilesYaml), kBuiltInProfilesName);
}

Result<Profiles> LoadProfiles(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  return ParseProfiles(text.str(), path);
}

Result<Profiles> ParseProfiles(const std::string& yaml, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return YamlError(path, e);
  }
  Profiles out;
  out.path = path;
  try {
    if (!root.IsMap()) return InvalidArgument(path + ": expected a map at the top");
    for (const auto& kv : root["datasets"]) {
      const YAML::Node d = kv.second;
      const int64_t n = d.IsMap() ? d["samples"].as<int64_t>() : d.as<int64_t>();
      if (n <= 0) return InvalidArgument(Where(path, d, "dataset sizes must be positive"));
      out.dataset_samples[kv.first.as<std::string>()] = n;
    }
    for (const auto& kv : root["workloads"]) {
      const std::string name = kv.first.as<std::string>();
      VF_ASSIGN_OR_RETURN(out.workloads[name], ParseWorkload(path, name, kv.second));
    }
  } catch (const YAML::Exception& e) {
    return YamlError(path, e);
  }
  if (out.workloads.empty()) return InvalidArgument(path + ": no workloads");
  return out;
}

int Cluster::TotalGpus() const {
  int n = 0;
  for (const auto& [t, c] : gpus) n += c;
  return n;
}

Result<Cluster> LoadCluster(const std::string& path) {
  VF_ASSIGN_OR_RETURN(YAML::Node root, LoadYaml(path));
  Cluster c;
  try {
    if (!root.IsMap()) return InvalidArgument(path + ": expected a map at the top");
    c.name = root["name"] ? root["name"].as<std::string>() : path;
    if (root["description"]) c.description = root["description"].as<std::string>();
    const YAML::Node gpus = root["gpus"];
    if (!gpus || !gpus.IsMap() || gpus.size() == 0) {
      return InvalidArgument(path + ": needs gpus: {TYPE: COUNT, ...}");
    }
    for (const auto& kv : gpus) {
      const int n = kv.second.as<int>();
      if (n < 0) return InvalidArgument(Where(path, kv.second, "GPU counts must be >= 0"));
      c.gpus[kv.first.as<std::string>()] = n;
    }
    if (const YAML::Node net = root["network"]) {
      VF_ASSIGN_OR_RETURN(c.latency_seconds, Positive(path, net, "latency_seconds", 0.0, true));
      VF_ASSIGN_OR_RETURN(c.bandwidth_bytes_per_second,
                          Positive(path, net, "bandwidth_bytes_per_second", 1e10));
      if (const YAML::Node m = net["measured_allreduce"]) {
        const YAML::Node seconds = m["seconds"];
        if (!m.IsMap() || !seconds || !seconds.IsMap() || seconds.size() == 0) {
          return InvalidArgument(Where(
              path, m, "measured_allreduce needs bytes: B and seconds: {WORKERS: SECONDS, ...}"));
        }
        VF_ASSIGN_OR_RETURN(c.measured_allreduce_bytes, Positive(path, m, "bytes", 0.0));
        for (const auto& kv : seconds) {
          const int n = kv.first.as<int>();
          const double s = kv.second.as<double>();
          if (n < 2 || !(s > 0.0 && s < 1e6)) {
            return InvalidArgument(Where(path, kv.second,
                                         "measured_allreduce seconds are for 2 or more workers "
                                         "and must be positive"));
          }
          c.measured_allreduce_seconds[n] = s;
        }
      }
    }
    if (const YAML::Node r = root["resize"]) {
      VF_ASSIGN_OR_RETURN(c.resize_fixed_seconds, Positive(path, r, "fixed_seconds", 2.0, true));
      VF_ASSIGN_OR_RETURN(c.state_bandwidth_bytes_per_second,
                          Positive(path, r, "state_bandwidth_bytes_per_second", 1e10));
    }
    VF_ASSIGN_OR_RETURN(c.start_seconds, Positive(path, root, "start_seconds", 0.0, true));
    for (const auto& kv : root["shared_cores"]) {
      const int n = kv.second.as<int>();
      if (n <= 0) return InvalidArgument(Where(path, kv.second, "shared_cores must be positive"));
      c.shared_cores[kv.first.as<std::string>()] = n;
    }
    for (const auto& kv : root["core_contention"]) {
      const double f = kv.second.as<double>();
      if (!(f >= 0.0 && f < 10.0)) {
        return InvalidArgument(
            Where(path, kv.second, "core_contention must be a fraction in [0, 10), e.g. 0.15"));
      }
      const std::string type = kv.first.as<std::string>();
      if (!root["shared_cores"] || !root["shared_cores"][type]) {
        return InvalidArgument(Where(path, kv.second,
                                     "core_contention of '" + type +
                                         "' needs shared_cores for it: only workers that share "
                                         "cores contend for them"));
      }
      c.core_contention[type] = f;
    }
    for (const auto& kv : root["speed_hints"]) {
      c.speed_hints[kv.first.as<std::string>()] = kv.second.as<double>();
    }
  } catch (const YAML::Exception& e) {
    return YamlError(path, e);
  }
  return c;
}

Cluster RestrictTypes(const Cluster& cluster, const std::vector<std::string>& types) {
  Cluster c = cluster;
  c.gpus.clear();
  for (const auto& t : types) {
    auto it = cluster.gpus.find(t);
    if (it != cluster.gpus.end()) c.gpus[t] = it->second;
  }
  return c;
}

const char* SplitModeName(SplitMode mode) {
  return mode == SplitMode::kProportional ? "proportional" : "even";
}

double RingAllReduceSeconds(const Cluster& cluster, int workers, double bytes) {
  if (workers <= 1) return 0.0;
  const double steps = 2.0 * (workers - 1);
  return steps * cluster.latency_seconds +
         steps / workers * bytes / cluster.bandwidth_bytes_per_second;
}

Result<StepPrediction> PredictStep(const WorkloadProfile& workload, const Cluster& cluster,
                                   const policy::Allocation& workers, int virtual_nodes,
                                   int64_t global_batch, SplitMode split) {
  const int n = policy::TotalWorkers(workers);
  if (n < 1 || n > virtual_nodes) {
    return InvalidArgument("cannot run " + std::to_string(virtual_nodes) + " virtual nodes on " +
                           std::to_string(n) + " workers");
  }
  if (virtual_nodes < 1 || global_batch % virtual_nodes != 0) {
    return InvalidArgument("global batch " + std::to_string(global_batch) +
                           " is not divisible by " + std::to_string(virtual_nodes) +
                           " virtual nodes");
  }
  const double micro_batch = static_cast<double>(global_batch) / virtual_nodes;  // exact: divisible
  StepPrediction p;
  // Workers fastest first, so an even split gives its remainder to the fastest.
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [type, count] : workers) {
    VF_ASSIGN_OR_RETURN(double t, workload.SecondsPerVirtualNode(type, micro_batch));
    for (int i = 0; i < count; ++i) order.emplace_back(t, type);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [t, type] : order) {
    p.worker_types.push_back(type);
    p.seconds_per_virtual_node.push_back(t);
  }
  p.virtual_nodes = SplitVirtualNodes(virtual_nodes, split == SplitMode::kProportional
                                                         ? p.seconds_per_virtual_node
                                                         : EqualTimes(n));
  // Per type: each worker's busy time; shared-core types cannot run more than `cores` workers'
  // worth at once (work-conserving sharing with migration, McNaughton's bound).
  std::map<std::string, std::pair<double, double>> by_type;  // type -> (max, sum)
  for (int i = 0; i < n; ++i) {
    const std::string& type = p.worker_types[static_cast<size_t>(i)];
    const double busy = p.virtual_nodes[static_cast<size_t>(i)] *
                            p.seconds_per_virtual_node[static_cast<size_t>(i)] +
                        workload.PerStepSeconds(type);
    auto& [mx, sum] = by_type[type];
    mx = std::max(mx, busy);
    sum += busy;
  }
  for (const auto& [type, ms] : by_type) {
    double t = ms.first;
    auto cores = cluster.shared_cores.find(type);
    if (cores != cluster.shared_cores.end()) {
      t = std::max(t, ms.second / cores->second);
      auto contention = cluster.core_contention.find(type);
      auto count = workers.find(type);
      if (contention != cluster.core_contention.end() && count != workers.end() &&
          count->second >= 2) {
        t *= 1.0 + contention->second;
      }
    }
    p.compute_seconds = std::max(p.compute_seconds, t);
  }
  const double bytes = workload.parameters * workload.gradient_bytes_per_parameter;
  if (auto m = cluster.measured_allreduce_seconds.find(n);
      m != cluster.measured_allreduce_seconds.end()) {
    // Measured with this many workers on these cores: sharing is already in it.
    p.allreduce_seconds = m->second * bytes / cluster.measured_allreduce_bytes;
  } else {
    p.allreduce_seconds = RingAllReduceSeconds(cluster, n, bytes);
    // On shared cores the all-reduce is CPU work too (copies, integer sums, loopback TCP): n
    // workers doing equal shares on fewer cores take n / cores times as long.
    double sharing = 1.0;
    for (const auto& [type, count] : workers) {
      auto cores = cluster.shared_cores.find(type);
      if (cores != cluster.shared_cores.end()) {
        sharing = std::max(sharing, static_cast<double>(count) / cores->second);
      }
    }
    p.allreduce_seconds *= sharing;
  }
  p.step_seconds = p.compute_seconds + p.allreduce_seconds;
  return p;
}

double ResizePauseSeconds(const WorkloadProfile& workload, const Cluster& cluster) {
  return cluster.resize_fixed_seconds +
         workload.StateBytes() / cluster.state_bandwidth_bytes_per_second;
}

}  // namespace vf::sim
