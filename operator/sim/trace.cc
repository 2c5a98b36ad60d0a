#include "operator/sim/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "operator/policy/policy.h"

namespace vf::sim {
namespace {

using Json = nlohmann::json;

Result<int64_t> Int(const Json& o, const char* key, const std::string& where, bool required) {
  if (!o.contains(key)) {
    if (required) return InvalidArgument(where + ": missing \"" + key + "\"");
    return int64_t{0};
  }
  const Json& v = o[key];
  if (!v.is_number_integer() &&
      !(v.is_number() && std::floor(v.get<double>()) == v.get<double>())) {
    return InvalidArgument(where + ": \"" + key + "\" must be a whole number");
  }
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
}

// SplitMix64: a small counter-based generator whose output is specified bit for bit, unlike the
// standard library's distributions, so a seed means the same trace everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1).
  double Uniform() { return (static_cast<double>(Next() >> 11) + 0.5) * 0x1.0p-53; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(Next() % v.size())];
  }

 private:
  uint64_t state_;
};

}  // namespace

Result<std::vector<TraceJob>> ParseTrace(const std::string& text, const std::string& name) {
  Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument(name + ": not valid JSON");
  if (!root.is_array()) return InvalidArgument(name + ": expected a JSON array of jobs");
  std::vector<TraceJob> jobs;
  for (size_t i = 0; i < root.size(); ++i) {
    const Json& o = root[i];
    const std::string where = name + ": job " + std::to_string(i);
    if (!o.is_object()) return InvalidArgument(where + ": not an object");
    TraceJob j;
    if (!o.contains("arrival_time") || !o["arrival_time"].is_number()) {
      return InvalidArgument(where + ": missing numeric \"arrival_time\"");
    }
    j.arrival_time = o["arrival_time"].get<double>();
    if (!std::isfinite(j.arrival_time) || j.arrival_time < 0.0) {
      return InvalidArgument(where + ": \"arrival_time\" must be >= 0");
    }
    if (!o.contains("workload") || !o["workload"].is_string()) {
      return InvalidArgument(where + ": missing \"workload\"");
    }
    j.workload = o["workload"].get<std::string>();
    VF_ASSIGN_OR_RETURN(int64_t priority, Int(o, "priority", where, false));
    j.priority = o.contains("priority") ? static_cast<int>(priority) : 1;
    VF_ASSIGN_OR_RETURN(int64_t demand, Int(o, "gpu_demand", where, true));
    if (demand < 1 || demand > 1 << 16) {
      return InvalidArgument(where + ": \"gpu_demand\" must be at least 1");
    }
    j.gpu_demand = static_cast<int>(demand);
    VF_ASSIGN_OR_RETURN(j.batch_size, Int(o, "batch_size", where, true));
    if (j.batch_size < 1) return InvalidArgument(where + ": \"batch_size\" must be at least 1");
    VF_ASSIGN_OR_RETURN(j.num_epochs, Int(o, "num_epochs", where, false));
    VF_ASSIGN_OR_RETURN(j.num_steps, Int(o, "num_steps", where, false));
    if ((j.num_epochs > 0) == (j.num_steps > 0)) {
      return InvalidArgument(where + ": needs exactly one of \"num_epochs\" and \"num_steps\"");
    }
    if (j.num_epochs < 0 || j.num_steps < 0) {
      return InvalidArgument(where + ": job length must be positive");
    }
    VF_ASSIGN_OR_RETURN(int64_t vnpd, Int(o, "num_virtual_nodes_per_device", where, false));
    j.virtual_nodes_per_device = vnpd > 0 ? static_cast<int>(vnpd) : 1;
    if (o.contains("num_virtual_nodes_per_device") && vnpd < 1) {
      return InvalidArgument(where + ": \"num_virtual_nodes_per_device\" must be at least 1");
    }
    if (o.contains("dataset") && o["dataset"].is_string()) {
      j.dataset = o["dataset"].get<std::string>();
    } else if (o.contains("glue_task") && o["glue_task"].is_string()) {
      j.dataset = o["glue_task"].get<std::string>();
      j.glue_task = true;
    }
    if (o.contains("policy")) {
      if (!o["policy"].is_string()) {
        return InvalidArgument(where + ": \"policy\" must be a policy's name");
      }
      j.policy = o["policy"].get<std::string>();
      VF_RETURN_IF_ERROR(policy::CheckPolicyName(where + ": \"policy\"", j.policy));
    }
    if (j.batch_size % j.VirtualNodes() != 0) {
      return InvalidArgument(where + ": \"batch_size\" " + std::to_string(j.batch_size) +
                             " is not divisible by its " + std::to_string(j.VirtualNodes()) +
                             " virtual nodes");
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

Result<std::vector<TraceJob>> LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseTrace(ss.str(), path);
}

std::string TraceToJson(const std::vector<TraceJob>& jobs) {
  std::string out = "[\n";
  for (size_t i = 0; i < jobs.size(); ++i) {
    const TraceJob& j = jobs[i];
    auto field = [](const std::string& key, const Json& v) {
      return "\"" + key + "\": " + v.dump();
    };
    const double t = j.arrival_time;
    const Json arrival = std::floor(t) == t ? Json(static_cast<int64_t>(t)) : Json(t);
    std::string line = "{" + field("arrival_time", arrival) + ", " + field("workload", j.workload) +
                       ", " + field("priority", j.priority) + ", " +
                       field("gpu_demand", j.gpu_demand) + ", " +
                       field("batch_size", j.batch_size) + ", ";
    line += j.num_epochs > 0 ? field("num_epochs", j.num_epochs) : field("num_steps", j.num_steps);
    if (j.virtual_nodes_per_device != 1) {
      line += ", " + field("num_virtual_nodes_per_device", j.virtual_nodes_per_device);
    }
    if (!j.dataset.empty()) line += ", " + field(j.glue_task ? "glue_task" : "dataset", j.dataset);
    if (!j.policy.empty()) line += ", " + field("policy", j.policy);
    line += "}";
    out += "  " + line + (i + 1 < jobs.size() ? ",\n" : "\n");
  }
  out += "]\n";
  return out;
}

Result<std::map<std::string, double>> ParseMix(const std::string& text) {
  std::map<std::string, double> mix;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return InvalidArgument("--mix: expected NAME=WEIGHT, got '" + item + "'");
    }
    const std::string name = item.substr(0, eq);
    char* end = nullptr;
    const std::string num = item.substr(eq + 1);
    const double w = std::strtod(num.c_str(), &end);
    if (end == num.c_str() || *end != '\0' || !(w >= 0.0) || !std::isfinite(w)) {
      return InvalidArgument("--mix: weight of " + name + " must be a non-negative number");
    }
    mix[name] = w;
  }
  return mix;
}

Result<std::vector<TraceJob>> GenerateTrace(const TraceGeneratorOptions& o) {
  if (o.jobs < 1) return InvalidArgument("--jobs must be at least 1");
  if (!(o.jobs_per_hour > 0.0) || !std::isfinite(o.jobs_per_hour)) {
    return InvalidArgument("--jobs-per-hour must be positive");
  }
  std::vector<std::pair<std::string, double>> mix;
  double total = 0.0;
  for (const auto& [name, w] : o.mix) {
    if (name != "resnet" && name != "bert" && name != "transformer") {
      return InvalidArgument("--mix: unknown workload '" + name +
                             "' (known: resnet, bert, transformer)");
    }
    if (w > 0.0) mix.emplace_back(name, w);
    total += w;
  }
  if (!(total > 0.0)) return InvalidArgument("--mix: weights must not all be zero");

  Rng rng(o.seed);
  std::vector<TraceJob> jobs;
  double t = 0.0;
  for (int i = 0; i < o.jobs; ++i) {
    t += -std::log(rng.Uniform()) * 3600.0 / o.jobs_per_hour;
    TraceJob j;
    j.arrival_time = std::max(1.0, std::round(t));
    double pick = rng.Uniform() * total;
    j.workload = mix.back().first;
    for (const auto& [name, w] : mix) {
      if (pick < w) {
        j.workload = name;
        break;
      }
      pick -= w;
    }
    j.priority = rng.Pick(std::vector<int>{1, 5, 10});
    if (j.workload == "resnet") {
      if (rng.Uniform() < 0.5) {
        j.dataset = "cifar10";
        j.gpu_demand = 1;
        j.batch_size = rng.Pick(std::vector<int64_t>{64, 128});
        j.num_epochs = rng.Pick(std::vector<int64_t>{1, 10, 20});
      } else {
        j.dataset = "imagenet";
        j.gpu_demand = rng.Pick(std::vector<int>{1, 2, 4, 8});
        j.virtual_nodes_per_device = rng.Pick(std::vector<int>{1, 2, 4});
        j.batch_size = rng.Pick(std::vector<int64_t>{32, 64, 128}) * j.VirtualNodes();
        j.num_epochs = rng.Pick(std::vector<int64_t>{1, 2, 3});
      }
    } else if (j.workload == "bert") {
      j.glue_task = true;
      j.dataset = rng.Pick(std::vector<std::string>{"SST-2", "CoLA", "MRPC"});
      j.gpu_demand = rng.Pick(std::vector<int>{1, 2, 4, 8});
      j.virtual_nodes_per_device = rng.Pick(std::vector<int>{1, 2});
      j.batch_size = rng.Pick(std::vector<int64_t>{4, 8}) * j.VirtualNodes();
      j.num_epochs = j.dataset == "SST-2" ? 1 : rng.Pick(std::vector<int64_t>{10, 20});
    } else {
      j.gpu_demand = rng.Pick(std::vector<int>{2, 4, 8});
      j.virtual_nodes_per_device = rng.Pick(std::vector<int>{1, 2, 4});
      j.batch_size = rng.Pick(std::vector<int64_t>{2048, 4096, 8192, 16384, 32768});
      j.num_steps = rng.Pick(std::vector<int64_t>{500, 1000, 4000});
    }
    jobs.push_back(std::move(j));
  }
  return jobs;
}

}  // namespace vf::sim
