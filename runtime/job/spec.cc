#include "runtime/job/spec.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

namespace vf {
namespace {

using Names = std::span<const std::string_view>;

constexpr std::string_view kApiVersion = kJobApiVersion;
constexpr std::string_view kKind = kJobKind;

constexpr std::array<std::string_view, 1> kModels = {"mlp"};
constexpr std::array<std::string_view, 2> kDatasets = {"fashion-mnist", "synthetic"};
constexpr std::array<std::string_view, 2> kOptimizers = {"sgd", "adamw"};
constexpr std::array<std::string_view, 2> kReductions = {"exact", "fast"};

// `status` is accepted (and ignored) so that `kubectl get -o yaml` output can be run as is.
constexpr std::array<std::string_view, 5> kTopFields = {"apiVersion", "kind", "metadata", "spec",
                                                        "status"};
constexpr std::array<std::string_view, 17> kSpecFields = {
    "virtualNodes", "globalBatchSize", "replicas",  "gpusPerWorker", "model",    "dataset",
    "optimizer",    "steps",           "epochs",    "reduction",     "seed",     "elasticity",
    "checkpoint",   "template",        "runPolicy", "suspend",       "managedBy"};
constexpr std::array<std::string_view, 3> kReplicasFields = {"min", "max", "desired"};
constexpr std::array<std::string_view, 2> kModelFields = {"name", "hiddenSizes"};
constexpr std::array<std::string_view, 4> kDatasetFields = {"name", "path", "trainSamples",
                                                            "testSamples"};
constexpr std::array<std::string_view, 8> kOptimizerFields = {
    "name", "learningRate", "momentum", "nesterov", "weightDecay", "beta1", "beta2", "epsilon"};
constexpr std::array<std::string_view, 2> kElasticityFields = {"policy", "cooldownSeconds"};
constexpr std::array<std::string_view, 2> kCheckpointFields = {"path", "everySteps"};
constexpr std::array<std::string_view, 5> kRunPolicyFields = {
    "backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished", "cleanPodPolicy",
    "podFailurePolicy"};
constexpr std::array<std::string_view, 3> kCleanPodPolicies = {"None", "Running", "All"};
constexpr std::array<std::string_view, 1> kPodFailurePolicyFields = {"rules"};
constexpr std::array<std::string_view, 3> kPodFailureRuleFields = {"action", "onExitCodes",
                                                                   "onPodConditions"};
constexpr std::array<std::string_view, 3> kPodFailureActions = {"FailJob", "Ignore", "Count"};
constexpr std::array<std::string_view, 3> kExitCodeFields = {"containerName", "operator", "values"};
constexpr std::array<std::string_view, 2> kExitCodeOperators = {"In", "NotIn"};
constexpr std::array<std::string_view, 2> kPodConditionFields = {"type", "status"};
constexpr std::array<std::string_view, 3> kConditionStatuses = {"True", "False", "Unknown"};
// batch/v1's bounds for a pod failure policy.
constexpr size_t kMaxPodFailureRules = 20;
constexpr size_t kMaxExitCodeValues = 255;
constexpr size_t kMaxPodConditionPatterns = 20;

constexpr int kMaxHiddenSize = 65536;
constexpr int kMaxNameLength = 63;
// Far above any real manifest (the API server itself stops near 1.5 MB); keeps a mistaken
// path such as a dataset file from being read into memory whole.
constexpr size_t kMaxFileBytes = size_t{16} << 20;
// Keeps a pasted blob of text from turning an error into a screenful.
constexpr size_t kMaxQuotedLength = 80;

// ---------------------------------------------------------------------------------------------
// Message helpers. Every piece of user text goes through Printable so that an error stays on
// one line whatever the file holds.

std::string Printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= kMaxQuotedLength) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string Quote(std::string_view s) { return "'" + Printable(s) + "'"; }

std::string FormatDouble(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::general);
  if (ec != std::errc()) return "?";
  return std::string(buf, end);
}

std::string JoinNames(Names names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

// Optimal string alignment distance: Levenshtein plus adjacent transpositions, the usual typo.
size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// " (did you mean 'x'?)" for the closest candidate within two edits, or "" when none is close.
std::string Suggestion(std::string_view word, Names candidates) {
  constexpr size_t kMaxDistance = 2;
  std::string_view best;
  size_t best_distance = kMaxDistance + 1;
  for (std::string_view c : candidates) {
    const size_t length_gap =
        c.size() > word.size() ? c.size() - word.size() : word.size() - c.size();
    if (length_gap > kMaxDistance) continue;  // the distance is at least the length gap
    const size_t d = EditDistance(word, c);
    // A two-letter word is two edits from every two-letter name; only suggest real near-misses.
    if (d < best_distance && d < word.size()) {
      best = c;
      best_distance = d;
    }
  }
  if (best.empty()) return "";
  return " (did you mean '" + std::string(best) + "'?)";
}

bool Contains(Names names, std::string_view s) {
  return std::find(names.begin(), names.end(), s) != names.end();
}

// "unknown optimizer 'adam' (did you mean 'adamw'?); known: sgd, adamw"
std::string UnknownName(std::string_view what, std::string_view value, Names known) {
  return "unknown " + std::string(what) + " " + Quote(value) + Suggestion(value, known) +
         "; known: " + JoinNames(known);
}

std::string Join(std::string_view path, std::string_view key) {
  if (path.empty()) return std::string(key);
  return std::string(path) + "." + std::string(key);
}

// ---------------------------------------------------------------------------------------------
// Scalars are typed the way the API server's YAML decoder (YAML 1.1 via sigs.k8s.io/yaml) types
// them, so that a file `vf run` accepts is also accepted by `kubectl apply`, and vice versa.

enum class Kind { kNull, kBool, kInt, kFloat, kString, kList, kMap };

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool ParseBoolWord(std::string_view s, bool* value) {
  static constexpr std::array<std::string_view, 11> kTrue = {
      "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE"};
  static constexpr std::array<std::string_view, 11> kFalse = {
      "n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE"};
  if (Contains(kTrue, s)) {
    *value = true;
    return true;
  }
  if (Contains(kFalse, s)) {
    *value = false;
    return true;
  }
  return false;
}

// [-+]?[0-9]+
bool LooksLikeInt(std::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return !s.empty() && std::all_of(s.begin(), s.end(), IsDigit);
}

bool IsInfWord(std::string_view s) { return s == ".inf" || s == ".Inf" || s == ".INF"; }
bool IsNanWord(std::string_view s) { return s == ".nan" || s == ".NaN" || s == ".NAN"; }

// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)? or one of the .inf / .nan spellings.
bool LooksLikeFloat(std::string_view s) {
  if (IsNanWord(s)) return true;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (IsInfWord(s)) return true;
  size_t i = 0;
  size_t int_digits = 0;
  while (i < s.size() && IsDigit(s[i])) ++i, ++int_digits;
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && IsDigit(s[i])) ++i, ++frac_digits;
  }
  if (int_digits == 0 && frac_digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    size_t exp_digits = 0;
    while (i < s.size() && IsDigit(s[i])) ++i, ++exp_digits;
    if (exp_digits == 0) return false;
  }
  return i == s.size();
}

// Quoted scalars ('x', "x", block scalars) and explicit !!str are text whatever they contain.
bool IsQuoted(const YAML::Node& node) {
  const std::string& tag = node.Tag();
  return tag == "!" || tag == "tag:yaml.org,2002:str";
}

Kind KindOf(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return Kind::kNull;
  if (node.IsSequence()) return Kind::kList;
  if (node.IsMap()) return Kind::kMap;
  if (IsQuoted(node)) return Kind::kString;
  const std::string& s = node.Scalar();
  bool unused;
  if (ParseBoolWord(s, &unused)) return Kind::kBool;
  if (LooksLikeInt(s)) return Kind::kInt;
  if (LooksLikeFloat(s)) return Kind::kFloat;
  return Kind::kString;
}

// How a value reads in "expected X, got <this>".
std::string Describe(const YAML::Node& node) {
  switch (KindOf(node)) {
    case Kind::kNull:
      return "null";
    case Kind::kList:
      return "a list";
    case Kind::kMap:
      return "a map";
    case Kind::kString: {
      std::string out = Quote(node.Scalar());
      const std::string& s = node.Scalar();
      bool unused;
      if (LooksLikeInt(s) || LooksLikeFloat(s) || ParseBoolWord(s, &unused)) {
        out += " (a quoted string; remove the quotes)";
      }
      return out;
    }
    case Kind::kBool:
    case Kind::kInt:
    case Kind::kFloat:
      return Quote(node.Scalar());
  }
  return "?";
}

Status TypeError(const std::string& path, std::string_view expected, const YAML::Node& node) {
  return InvalidArgument(path + ": expected " + std::string(expected) + ", got " + Describe(node));
}

Status ParseInt64(const YAML::Node& node, const std::string& path, int64_t lo, int64_t hi,
                  int64_t* out) {
  if (KindOf(node) != Kind::kInt) return TypeError(path, "an integer", node);
  std::string_view s = node.Scalar();
  if (s[0] == '+') s.remove_prefix(1);  // from_chars takes no '+'
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size() || v < lo || v > hi) {
    return InvalidArgument(path + ": " + Printable(node.Scalar()) +
                           " is out of range (must be between " + std::to_string(lo) + " and " +
                           std::to_string(hi) + ")");
  }
  *out = v;
  return Status::Ok();
}

template <typename T>
Status ParseInt(const YAML::Node& node, const std::string& path, T* out) {
  // Every integer in the schema is int64 on the API server; no field may exceed that.
  constexpr int64_t kLo = std::numeric_limits<T>::min();
  constexpr int64_t kHi = static_cast<uint64_t>(std::numeric_limits<T>::max()) >
                                  static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                              ? std::numeric_limits<int64_t>::max()
                              : static_cast<int64_t>(std::numeric_limits<T>::max());
  int64_t v = 0;
  VF_RETURN_IF_ERROR(ParseInt64(node, path, kLo, kHi, &v));
  *out = static_cast<T>(v);
  return Status::Ok();
}

Status ParseDouble(const YAML::Node& node, const std::string& path, double* out) {
  const Kind kind = KindOf(node);
  if (kind != Kind::kInt && kind != Kind::kFloat) return TypeError(path, "a number", node);
  std::string_view s = node.Scalar();
  if (IsNanWord(s)) {
    *out = std::numeric_limits<double>::quiet_NaN();
    return Status::Ok();
  }
  bool negative = false;
  if (s[0] == '-' || s[0] == '+') {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  double v = 0;
  if (IsInfWord(s)) {
    v = std::numeric_limits<double>::infinity();
  } else {
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || ptr != s.data() + s.size()) {
      return InvalidArgument(path + ": " + Printable(node.Scalar()) +
                             " is out of range for a number");
    }
  }
  *out = negative ? -v : v;
  return Status::Ok();
}

Status ParseBool(const YAML::Node& node, const std::string& path, bool* out) {
  if (KindOf(node) != Kind::kBool) return TypeError(path, "a boolean (true or false)", node);
  ParseBoolWord(node.Scalar(), out);
  return Status::Ok();
}

Status ParseString(const YAML::Node& node, const std::string& path, std::string* out) {
  const Kind kind = KindOf(node);
  if (kind == Kind::kBool || kind == Kind::kInt || kind == Kind::kFloat) {
    return InvalidArgument(path + ": expected a string, got " + Quote(node.Scalar()) +
                           " (not text in YAML; put it in quotes)");
  }
  if (kind != Kind::kString) return TypeError(path, "a string", node);
  *out = node.Scalar();
  return Status::Ok();
}

// The fields of one YAML map, keyed by name; null values count as absent, as they do for the
// API server. A value type; thread-compatible.
class Fields {
 public:
  // Fails on a non-map, a non-text or duplicate key, and (when `strict`) a key not in `allowed`.
  static Result<Fields> Open(const YAML::Node& node, std::string path, Names allowed, bool strict) {
    if (KindOf(node) != Kind::kMap) {
      return TypeError(path.empty() ? "the manifest" : path, "a map", node);
    }
    Fields f;
    f.path_ = std::move(path);
    for (auto it = node.begin(); it != node.end(); ++it) {
      if (KindOf(it->first) == Kind::kList || KindOf(it->first) == Kind::kMap) {
        return InvalidArgument((f.path_.empty() ? std::string("the manifest") : f.path_) +
                               ": field names must be text, got " + Describe(it->first));
      }
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : std::string();
      const std::string key_path = Join(f.path_, key.empty() ? "''" : Printable(key));
      if (strict && !Contains(allowed, key)) {
        return InvalidArgument(key_path + ": unknown field" + Suggestion(key, allowed));
      }
      if (f.seen_.count(key) != 0) return InvalidArgument(key_path + ": duplicate field");
      f.seen_.insert(key);
      if (KindOf(it->second) != Kind::kNull) f.values_.emplace(key, it->second);
    }
    return f;
  }

  bool Has(std::string_view key) const { return values_.find(key) != values_.end(); }
  const YAML::Node& Get(std::string_view key) const { return values_.find(key)->second; }
  std::string PathOf(std::string_view key) const { return Join(path_, key); }

  // Each Read* leaves *out untouched when the field is absent.
  template <typename T>
  Status ReadInt(std::string_view key, T* out) const {
    return Has(key) ? ParseInt(Get(key), PathOf(key), out) : Status::Ok();
  }
  Status ReadDouble(std::string_view key, double* out) const {
    return Has(key) ? ParseDouble(Get(key), PathOf(key), out) : Status::Ok();
  }
  Status ReadBool(std::string_view key, bool* out) const {
    return Has(key) ? ParseBool(Get(key), PathOf(key), out) : Status::Ok();
  }
  Status ReadString(std::string_view key, std::string* out) const {
    return Has(key) ? ParseString(Get(key), PathOf(key), out) : Status::Ok();
  }
  // An absent or null sub-map reads as an empty one, so its defaults apply.
  Result<Fields> Sub(std::string_view key, Names allowed) const {
    if (!Has(key)) {
      Fields empty;
      empty.path_ = PathOf(key);
      return empty;
    }
    return Open(Get(key), PathOf(key), allowed, /*strict=*/true);
  }

 private:
  std::string path_;
  std::map<std::string, YAML::Node, std::less<>> values_;
  std::set<std::string, std::less<>> seen_;
};

// A list of strings (command and args, as in a Pod).
Status ParseStringList(const Fields& f, std::string_view key, std::vector<std::string>* out) {
  if (!f.Has(key)) return Status::Ok();
  const YAML::Node& list = f.Get(key);
  const std::string path = f.PathOf(key);
  if (KindOf(list) != Kind::kList) return TypeError(path, "a list of strings", list);
  out->clear();
  for (const YAML::Node& item : list) {
    std::string v;
    VF_RETURN_IF_ERROR(ParseString(item, path + "[" + std::to_string(out->size()) + "]", &v));
    out->push_back(std::move(v));
  }
  return Status::Ok();
}

// A whole count of an extended resource, as a number or a string of digits ("1").
Status ParseResourceCount(const YAML::Node& node, const std::string& path, int* out) {
  const Kind kind = KindOf(node);
  if (kind == Kind::kInt) return ParseInt(node, path, out);
  const std::string s = kind == Kind::kString ? node.Scalar() : std::string();
  if (s.empty() || s.size() > 9 ||
      !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return InvalidArgument(path + ": an extended resource is counted in whole units (got " +
                           Describe(node) + ")");
  }
  *out = std::stoi(s);
  return Status::Ok();
}

// An extended resource: a name with a domain outside kubernetes.io (nvidia.com/gpu, amd.com/gpu);
// cpu, memory, ephemeral-storage and hugepages-* have none.
bool IsExtendedResource(std::string_view name) {
  const size_t slash = name.find('/');
  if (slash == std::string_view::npos || name.rfind("requests.", 0) == 0) return false;
  const std::string_view domain = name.substr(0, slash);
  return domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io");
}

// The accelerator of the worker container `c` (its resources' one extended resource) and how
// many a worker asks for; with spec.gpusPerWorker (`gpus_given`) they must agree.
Status ParseAccelerator(const Fields& c, bool gpus_given, JobSpec* job) {
  if (!c.Has("resources")) return Status::Ok();
  VF_ASSIGN_OR_RETURN(Fields res, Fields::Open(c.Get("resources"), c.PathOf("resources"), {},
                                               /*strict=*/false));
  std::map<std::string, std::pair<std::string, YAML::Node>> named;  // name -> (path, count)
  for (const char* part : {"requests", "limits"}) {                 // limits last: they win
    if (!res.Has(part)) continue;
    VF_ASSIGN_OR_RETURN(Fields counts,
                        Fields::Open(res.Get(part), res.PathOf(part), {}, /*strict=*/false));
    for (auto it = res.Get(part).begin(); it != res.Get(part).end(); ++it) {
      const std::string name = it->first.Scalar();
      if (!IsExtendedResource(name) || !counts.Has(name)) continue;
      auto [known, fresh] = named.try_emplace(name, counts.PathOf(name), counts.Get(name));
      if (!fresh && known->second.second.Scalar() != counts.Get(name).Scalar()) {
        return InvalidArgument(counts.PathOf(name) +
                               ": an extended resource's request must equal its limit");
      }
    }
  }
  if (named.empty()) return Status::Ok();
  if (named.size() > 1) {
    std::string names;
    for (const auto& [name, where] : named) names += (names.empty() ? "" : ", ") + name;
    return InvalidArgument(res.PathOf("limits") + ": names several extended resources (" + names +
                           "); a worker asks for one kind of accelerator");
  }
  const auto& [name, where] = *named.begin();
  int count = 0;
  VF_RETURN_IF_ERROR(ParseResourceCount(where.second, where.first, &count));
  if (gpus_given && job->gpus_per_worker != count) {
    return InvalidArgument("spec.gpusPerWorker (" + std::to_string(job->gpus_per_worker) +
                           ") disagrees with " + where.first + " (" + std::to_string(count) +
                           "): leave spec.gpusPerWorker out; the container's resources say it");
  }
  job->gpus_per_worker = count;
  if (count > 0) job->worker_template.accelerator = name;
  return Status::Ok();
}

// The flattened template of earlier versions: its fields sat at spec.template's top level.
constexpr std::array<std::string_view, 20> kOldTemplateFields = {"image",
                                                                 "imagePullPolicy",
                                                                 "command",
                                                                 "args",
                                                                 "workingDir",
                                                                 "env",
                                                                 "envFrom",
                                                                 "volumeMounts",
                                                                 "resources",
                                                                 "securityContext",
                                                                 "volumes",
                                                                 "affinity",
                                                                 "tolerations",
                                                                 "nodeSelector",
                                                                 "priorityClassName",
                                                                 "schedulerName",
                                                                 "serviceAccountName",
                                                                 "imagePullSecrets",
                                                                 "runtimeClassName",
                                                                 "podSecurityContext"};
constexpr std::array<std::string_view, 2> kTemplateFields = {"metadata", "spec"};
// The CRD's rule on spec.template says the same (scripts/crd_pod_template.py).
constexpr char kOldTemplateMessage[] =
    "spec.template is a pod template now: write image, command, args, env, resources, "
    "volumeMounts and securityContext under spec.template.spec.containers (one container "
    "named worker), and volumes, affinity, tolerations, nodeSelector and the other pod fields "
    "under spec.template.spec (podSecurityContext as spec.template.spec.securityContext)";

// The worker container of spec.template.spec.containers: the one named kWorkerContainer, else
// the first; nullopt when there is none.
Result<std::optional<Fields>> WorkerContainer(const Fields& pod) {
  if (!pod.Has("containers")) return std::optional<Fields>();
  const YAML::Node& list = pod.Get("containers");
  const std::string path = pod.PathOf("containers");
  if (KindOf(list) != Kind::kList) return TypeError(path, "a list of containers", list);
  std::optional<Fields> first;
  for (size_t i = 0; i < list.size(); ++i) {
    VF_ASSIGN_OR_RETURN(Fields c, Fields::Open(list[i], path + "[" + std::to_string(i) + "]", {},
                                               /*strict=*/false));
    std::string name;
    VF_RETURN_IF_ERROR(c.ReadString("name", &name));
    if (name == kWorkerContainer) return std::optional<Fields>(std::move(c));
    if (!first) first = std::move(c);
  }
  return first;
}

// spec.template is a core/v1 PodTemplateSpec that the operator reads (and the API server
// checks); `vf run` reads only the worker container's program and accelerator, and refuses the
// flattened form of earlier versions.
Status ParseTemplate(const Fields& spec, JobSpec* job) {
  if (!spec.Has("template")) return Status::Ok();
  VF_ASSIGN_OR_RETURN(Fields f, Fields::Open(spec.Get("template"), spec.PathOf("template"), {},
                                             /*strict=*/false));
  for (std::string_view old : kOldTemplateFields) {
    if (f.Has(old)) return InvalidArgument(f.PathOf(old) + ": " + kOldTemplateMessage);
  }
  VF_ASSIGN_OR_RETURN(f, Fields::Open(spec.Get("template"), spec.PathOf("template"),
                                      kTemplateFields, /*strict=*/true));
  if (!f.Has("spec")) return Status::Ok();
  VF_ASSIGN_OR_RETURN(Fields pod, Fields::Open(f.Get("spec"), f.PathOf("spec"), {},
                                               /*strict=*/false));
  VF_ASSIGN_OR_RETURN(std::optional<Fields> c, WorkerContainer(pod));
  if (!c) return Status::Ok();
  TemplateSpec* t = &job->worker_template;
  VF_RETURN_IF_ERROR(ParseStringList(*c, "command", &t->command));
  VF_RETURN_IF_ERROR(ParseStringList(*c, "args", &t->args));
  if (t->command.empty() && !t->args.empty()) {
    return InvalidArgument(c->PathOf("args") + ": needs " + c->PathOf("command") +
                           " (the program)");
  }
  if (!t->command.empty() && t->command.front().empty()) {
    return InvalidArgument(c->PathOf("command") + "[0]: the program must not be empty");
  }
  return ParseAccelerator(*c, spec.Has("gpusPerWorker"), job);
}

Status ParseReplicas(const Fields& spec, JobSpec* job) {
  if (spec.Has("replicas") && KindOf(spec.Get("replicas")) != Kind::kMap) {
    return TypeError(spec.PathOf("replicas"), "a map with min and max", spec.Get("replicas"));
  }
  VF_ASSIGN_OR_RETURN(Fields replicas, spec.Sub("replicas", kReplicasFields));
  VF_RETURN_IF_ERROR(replicas.ReadInt("min", &job->replicas_min));
  VF_RETURN_IF_ERROR(replicas.ReadInt("max", &job->replicas_max));
  if (replicas.Has("desired")) {
    int desired = 0;
    VF_RETURN_IF_ERROR(replicas.ReadInt("desired", &desired));
    job->replicas_desired = desired;
  }
  // A lone min is a fixed size; a lone max lets the job start small.
  if (replicas.Has("min") && !replicas.Has("max")) job->replicas_max = job->replicas_min;
  return Status::Ok();
}

Status ParseModel(const Fields& spec, ModelSpec* model) {
  VF_ASSIGN_OR_RETURN(Fields f, spec.Sub("model", kModelFields));
  VF_RETURN_IF_ERROR(f.ReadString("name", &model->name));
  if (f.Has("hiddenSizes")) {
    const YAML::Node& list = f.Get("hiddenSizes");
    const std::string path = f.PathOf("hiddenSizes");
    if (KindOf(list) != Kind::kList) return TypeError(path, "a list of integers", list);
    model->hidden_sizes.clear();
    for (const YAML::Node& item : list) {
      int v = 0;
      const std::string item_path = path + "[" + std::to_string(model->hidden_sizes.size()) + "]";
      VF_RETURN_IF_ERROR(ParseInt(item, item_path, &v));
      model->hidden_sizes.push_back(v);
    }
  }
  return Status::Ok();
}

Status ParseDataset(const Fields& spec, DatasetSpec* dataset) {
  VF_ASSIGN_OR_RETURN(Fields f, spec.Sub("dataset", kDatasetFields));
  VF_RETURN_IF_ERROR(f.ReadString("name", &dataset->name));
  VF_RETURN_IF_ERROR(f.ReadString("path", &dataset->path));
  VF_RETURN_IF_ERROR(f.ReadInt("trainSamples", &dataset->train_samples));
  VF_RETURN_IF_ERROR(f.ReadInt("testSamples", &dataset->test_samples));
  return Status::Ok();
}

Status ParseOptimizer(const Fields& spec, OptimizerSpec* opt) {
  VF_ASSIGN_OR_RETURN(Fields f, spec.Sub("optimizer", kOptimizerFields));
  VF_RETURN_IF_ERROR(f.ReadString("name", &opt->name));
  VF_RETURN_IF_ERROR(f.ReadDouble("learningRate", &opt->learning_rate));
  VF_RETURN_IF_ERROR(f.ReadDouble("momentum", &opt->momentum));
  VF_RETURN_IF_ERROR(f.ReadBool("nesterov", &opt->nesterov));
  VF_RETURN_IF_ERROR(f.ReadDouble("weightDecay", &opt->weight_decay));
  VF_RETURN_IF_ERROR(f.ReadDouble("beta1", &opt->beta1));
  VF_RETURN_IF_ERROR(f.ReadDouble("beta2", &opt->beta2));
  VF_RETURN_IF_ERROR(f.ReadDouble("epsilon", &opt->epsilon));
  return Status::Ok();
}

// The items of the list at `key` (absent: none), each with its path ("...rules[2]").
Result<std::vector<std::pair<YAML::Node, std::string>>> ListItems(const Fields& f,
                                                                  std::string_view key,
                                                                  std::string_view expected,
                                                                  size_t max_items) {
  std::vector<std::pair<YAML::Node, std::string>> out;
  if (!f.Has(key)) return out;
  const YAML::Node& list = f.Get(key);
  const std::string path = f.PathOf(key);
  if (KindOf(list) != Kind::kList) return TypeError(path, expected, list);
  if (list.size() > max_items) {
    return InvalidArgument(path + ": at most " + std::to_string(max_items) + " items (got " +
                           std::to_string(list.size()) + ")");
  }
  for (const YAML::Node& item : list) {
    out.emplace_back(item, path + "[" + std::to_string(out.size()) + "]");
  }
  return out;
}

// One of "In"/"NotIn"-style names: the field is required and must be one of `known`.
Status ReadRequiredName(const Fields& f, std::string_view key, std::string_view what, Names known,
                        std::string* out) {
  if (!f.Has(key)) return InvalidArgument(f.PathOf(key) + ": required field is missing");
  VF_RETURN_IF_ERROR(f.ReadString(key, out));
  if (!Contains(known, *out)) {
    return InvalidArgument(f.PathOf(key) + ": " + UnknownName(what, *out, known));
  }
  return Status::Ok();
}

Status ParseExitCodes(const Fields& rule, ExitCodeRequirement* req) {
  VF_ASSIGN_OR_RETURN(Fields f, rule.Sub("onExitCodes", kExitCodeFields));
  VF_RETURN_IF_ERROR(f.ReadString("containerName", &req->container_name));
  std::string op;
  VF_RETURN_IF_ERROR(ReadRequiredName(f, "operator", "operator", kExitCodeOperators, &op));
  req->in = op == "In";
  if (!f.Has("values")) return InvalidArgument(f.PathOf("values") + ": required field is missing");
  VF_ASSIGN_OR_RETURN(auto items,
                      ListItems(f, "values", "a list of exit codes", kMaxExitCodeValues));
  if (items.empty()) return InvalidArgument(f.PathOf("values") + ": must list at least one code");
  for (const auto& [item, path] : items) {
    int code = 0;
    VF_RETURN_IF_ERROR(ParseInt(item, path, &code));
    if (std::find(req->values.begin(), req->values.end(), code) != req->values.end()) {
      return InvalidArgument(path + ": duplicate exit code " + std::to_string(code));
    }
    // As batch/v1: a container that exited 0 never matches, so In [0] would be a rule that
    // never applies.
    if (req->in && code == 0) {
      return InvalidArgument(path + ": 0 cannot be used with operator In (a container that " +
                             "exited 0 did not fail)");
    }
    req->values.push_back(code);
  }
  return Status::Ok();
}

Status ParsePodConditions(const Fields& rule, std::vector<PodConditionPattern>* out) {
  VF_ASSIGN_OR_RETURN(auto items, ListItems(rule, "onPodConditions", "a list of conditions",
                                            kMaxPodConditionPatterns));
  if (items.empty()) {
    return InvalidArgument(rule.PathOf("onPodConditions") + ": must list at least one condition");
  }
  for (const auto& [item, path] : items) {
    VF_ASSIGN_OR_RETURN(Fields f, Fields::Open(item, path, kPodConditionFields, /*strict=*/true));
    PodConditionPattern pattern;
    if (!f.Has("type")) return InvalidArgument(f.PathOf("type") + ": required field is missing");
    VF_RETURN_IF_ERROR(f.ReadString("type", &pattern.type));
    if (pattern.type.empty()) return InvalidArgument(f.PathOf("type") + ": must not be empty");
    if (f.Has("status")) {
      VF_RETURN_IF_ERROR(
          ReadRequiredName(f, "status", "condition status", kConditionStatuses, &pattern.status));
    }
    out->push_back(std::move(pattern));
  }
  return Status::Ok();
}

Status ParsePodFailureRule(const YAML::Node& node, const std::string& path, PodFailureRule* rule) {
  VF_ASSIGN_OR_RETURN(Fields f, Fields::Open(node, path, kPodFailureRuleFields, /*strict=*/true));
  std::string action;
  VF_RETURN_IF_ERROR(ReadRequiredName(f, "action", "action", kPodFailureActions, &action));
  rule->action = action == "FailJob"  ? PodFailureAction::kFailJob
                 : action == "Ignore" ? PodFailureAction::kIgnore
                                      : PodFailureAction::kCount;
  if (f.Has("onExitCodes") == f.Has("onPodConditions")) {
    return InvalidArgument(path + ": set exactly one of onExitCodes and onPodConditions");
  }
  if (f.Has("onExitCodes")) {
    rule->on_exit_codes.emplace();
    return ParseExitCodes(f, &*rule->on_exit_codes);
  }
  return ParsePodConditions(f, &rule->on_pod_conditions);
}

// Absent fields keep their defaults; ValidateRun checks the ranges.
Status ParseRunPolicy(const Fields& spec, RunPolicySpec* policy) {
  VF_ASSIGN_OR_RETURN(Fields run, spec.Sub("runPolicy", kRunPolicyFields));
  auto read = [&run]<typename T>(std::string_view key, std::optional<T>* out) -> Status {
    if (!run.Has(key)) return Status::Ok();
    T value{};
    VF_RETURN_IF_ERROR(run.ReadInt(key, &value));
    *out = value;
    return Status::Ok();
  };
  VF_RETURN_IF_ERROR(run.ReadInt("backoffLimit", &policy->backoff_limit));
  VF_RETURN_IF_ERROR(read("activeDeadlineSeconds", &policy->active_deadline_seconds));
  VF_RETURN_IF_ERROR(read("ttlSecondsAfterFinished", &policy->ttl_seconds_after_finished));
  if (run.Has("cleanPodPolicy")) {
    std::string clean;
    VF_RETURN_IF_ERROR(
        ReadRequiredName(run, "cleanPodPolicy", "cleanPodPolicy", kCleanPodPolicies, &clean));
    policy->clean_pod_policy = clean == "All"       ? CleanPodPolicy::kAll
                               : clean == "Running" ? CleanPodPolicy::kRunning
                                                    : CleanPodPolicy::kNone;
  }
  VF_ASSIGN_OR_RETURN(Fields failure, run.Sub("podFailurePolicy", kPodFailurePolicyFields));
  if (run.Has("podFailurePolicy") && !failure.Has("rules")) {
    return InvalidArgument(failure.PathOf("rules") + ": required field is missing");
  }
  VF_ASSIGN_OR_RETURN(auto rules,
                      ListItems(failure, "rules", "a list of rules", kMaxPodFailureRules));
  for (const auto& [item, path] : rules) {
    PodFailureRule rule;
    VF_RETURN_IF_ERROR(ParsePodFailureRule(item, path, &rule));
    policy->pod_failure_rules.push_back(std::move(rule));
  }
  return Status::Ok();
}

Status ParseSpec(const YAML::Node& node, JobSpec* job) {
  VF_ASSIGN_OR_RETURN(Fields spec, Fields::Open(node, "spec", kSpecFields, /*strict=*/true));
  for (std::string_view required : {"virtualNodes", "globalBatchSize"}) {
    if (!spec.Has(required)) {
      return InvalidArgument(spec.PathOf(required) + ": required field is missing");
    }
  }
  VF_RETURN_IF_ERROR(spec.ReadInt("virtualNodes", &job->virtual_nodes));
  VF_RETURN_IF_ERROR(spec.ReadInt("globalBatchSize", &job->global_batch_size));
  VF_RETURN_IF_ERROR(ParseReplicas(spec, job));
  VF_RETURN_IF_ERROR(spec.ReadInt("gpusPerWorker", &job->gpus_per_worker));
  VF_RETURN_IF_ERROR(ParseModel(spec, &job->model));
  VF_RETURN_IF_ERROR(ParseDataset(spec, &job->dataset));
  VF_RETURN_IF_ERROR(ParseOptimizer(spec, &job->optimizer));

  // In JobSpec 0 means "not set", so an explicit 0 has to be caught here.
  for (auto [key, field] : {std::pair{"steps", &job->steps}, std::pair{"epochs", &job->epochs}}) {
    VF_RETURN_IF_ERROR(spec.ReadInt(key, field));
    if (spec.Has(key) && *field <= 0) {
      return InvalidArgument(spec.PathOf(key) + ": must be a positive integer (got " +
                             std::to_string(*field) + ")");
    }
  }

  if (spec.Has("reduction")) {
    std::string reduction;
    VF_RETURN_IF_ERROR(spec.ReadString("reduction", &reduction));
    if (reduction == "exact") {
      job->reduction = Reduction::kExact;
    } else if (reduction == "fast") {
      job->reduction = Reduction::kFast;
    } else {
      return InvalidArgument(spec.PathOf("reduction") + ": " +
                             UnknownName("reduction", reduction, kReductions));
    }
  }

  VF_RETURN_IF_ERROR(spec.ReadInt("seed", &job->seed));

  VF_ASSIGN_OR_RETURN(Fields elasticity, spec.Sub("elasticity", kElasticityFields));
  VF_RETURN_IF_ERROR(elasticity.ReadString("policy", &job->elasticity.policy));
  VF_RETURN_IF_ERROR(elasticity.ReadInt("cooldownSeconds", &job->elasticity.cooldown_seconds));

  VF_ASSIGN_OR_RETURN(Fields checkpoint, spec.Sub("checkpoint", kCheckpointFields));
  VF_RETURN_IF_ERROR(checkpoint.ReadString("path", &job->checkpoint.path));
  VF_RETURN_IF_ERROR(checkpoint.ReadInt("everySteps", &job->checkpoint.every_steps));

  VF_RETURN_IF_ERROR(ParseRunPolicy(spec, &job->run_policy));
  VF_RETURN_IF_ERROR(spec.ReadBool("suspend", &job->suspend));
  VF_RETURN_IF_ERROR(spec.ReadString("managedBy", &job->managed_by));
  return ParseTemplate(spec, job);
}

Status ExpectConstant(const Fields& top, std::string_view key, std::string_view expected) {
  if (!top.Has(key)) {
    return InvalidArgument(std::string(key) + ": required field is missing (expected " +
                           Quote(expected) + ")");
  }
  std::string value;
  VF_RETURN_IF_ERROR(top.ReadString(key, &value));
  if (value != expected) {
    return InvalidArgument(std::string(key) + ": expected " + Quote(expected) + ", got " +
                           Quote(value));
  }
  return Status::Ok();
}

// The manifest's top level: apiVersion, kind, metadata and spec.
Status ParseRoot(const YAML::Node& root, JobSpec* job) {
  if (KindOf(root) != Kind::kMap) {
    return InvalidArgument(
        "expected a VirtualFlowJob manifest (a map with apiVersion, kind, metadata and spec), "
        "got " +
        Describe(root));
  }
  VF_ASSIGN_OR_RETURN(Fields top, Fields::Open(root, "", kTopFields, /*strict=*/true));
  VF_RETURN_IF_ERROR(ExpectConstant(top, "apiVersion", kApiVersion));
  VF_RETURN_IF_ERROR(ExpectConstant(top, "kind", kKind));

  if (!top.Has("metadata")) return InvalidArgument("metadata.name: required field is missing");
  // labels, annotations and the fields the API server adds are not ours to judge.
  VF_ASSIGN_OR_RETURN(Fields metadata,
                      Fields::Open(top.Get("metadata"), "metadata", {}, /*strict=*/false));
  if (!metadata.Has("name")) return InvalidArgument("metadata.name: required field is missing");
  VF_RETURN_IF_ERROR(metadata.ReadString("name", &job->name));
  std::string ns;
  VF_RETURN_IF_ERROR(metadata.ReadString("namespace", &ns));
  if (!ns.empty()) job->namespace_name = ns;  // as kubectl, an empty namespace is the default

  if (!top.Has("spec")) return InvalidArgument("spec: required field is missing");
  return ParseSpec(top.Get("spec"), job);
}

// Debian 12's yaml-cpp (0.7) never returns from LoadAll on a flow indicator outside a flow
// collection (a file holding only ",", or "!tag ,"): every document it starts there consumes
// nothing, so it makes empty documents without end, and memory grows with them. Found by
// runtime/job/spec_fuzz.cc. This pass reads the documents' events alone (no nodes are built)
// and stops at the first document that starts where the one before it did.
class DocumentProgress : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (started_ && mark.pos == last_start_.pos) stuck_ = true;
    started_ = true;
    last_start_ = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  bool stuck() const { return stuck_; }
  const YAML::Mark& last_start() const { return last_start_; }

 private:
  bool started_ = false;
  bool stuck_ = false;
  YAML::Mark last_start_;
};

// Throws YAML::ParserException at the character yaml-cpp would loop on.
void CheckDocumentsAdvance(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentProgress progress;
  while (parser.HandleNextDocument(progress)) {
    if (progress.stuck()) {
      const YAML::Mark& at = progress.last_start();
      std::string what = "unexpected character";
      if (at.pos >= 0 && static_cast<size_t>(at.pos) < text.size()) {
        what = std::string("unexpected '") + text[static_cast<size_t>(at.pos)] + "'";
      }
      throw YAML::ParserException(at, what + " outside a flow collection");
    }
  }
}

Status ParseManifest(const std::string& text, JobSpec* job) {
  std::vector<YAML::Node> documents;
  try {
    CheckDocumentsAdvance(text);
    for (YAML::Node& doc : YAML::LoadAll(text)) {
      if (KindOf(doc) != Kind::kNull) documents.push_back(doc);  // as kubectl skips empty ones
    }
  } catch (const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null()) {
      where = " at line " + std::to_string(e.mark.line + 1) + ", column " +
              std::to_string(e.mark.column + 1);
    }
    return InvalidArgument("malformed YAML" + where + ": " + Printable(e.msg));
  }
  if (documents.empty()) {
    return InvalidArgument("the file is empty; expected a VirtualFlowJob manifest");
  }
  if (documents.size() > 1) {
    return InvalidArgument("expected one YAML document (one VirtualFlowJob), found " +
                           std::to_string(documents.size()));
  }
  return ParseRoot(documents[0], job);
}

// ---------------------------------------------------------------------------------------------
// Semantic checks.

Status CheckName(std::string_view path, const std::string& name) {
  if (name.empty()) return InvalidArgument(std::string(path) + ": required field is missing");
  std::string problem;
  if (name.size() > static_cast<size_t>(kMaxNameLength)) {
    problem = "it is " + std::to_string(name.size()) + " characters long";
  } else {
    for (char c : name) {
      if (c >= 'A' && c <= 'Z') {
        problem = "it has an uppercase letter";
        break;
      }
      if (!(c >= 'a' && c <= 'z') && !IsDigit(c) && c != '-') {
        problem = "it has the character " + Quote(std::string(1, c));
        break;
      }
    }
    if (problem.empty() && (name.front() == '-' || name.back() == '-')) {
      problem = "it starts or ends with '-'";
    }
  }
  if (problem.empty()) return Status::Ok();
  return InvalidArgument(std::string(path) + ": " + Quote(name) + " is not a valid name (" +
                         problem +
                         "): use at most 63 lowercase letters, digits and '-', "
                         "starting and ending with a letter or digit (a DNS-1123 label)");
}

Status CheckKnown(std::string_view path, std::string_view what, const std::string& value,
                  Names known) {
  if (Contains(known, value)) return Status::Ok();
  return InvalidArgument(std::string(path) + ": " + UnknownName(what, value, known));
}

Status CheckAtLeast(std::string_view path, int64_t value, int64_t min) {
  if (value >= min) return Status::Ok();
  return InvalidArgument(std::string(path) + ": must be at least " + std::to_string(min) +
                         " (got " + std::to_string(value) + ")");
}

// The comparisons are written so that NaN fails them.
Status CheckPositiveFinite(std::string_view path, double v) {
  if (std::isfinite(v) && v > 0) return Status::Ok();
  return InvalidArgument(std::string(path) + ": must be a finite number greater than 0 (got " +
                         FormatDouble(v) + ")");
}

Status CheckNonNegativeFinite(std::string_view path, double v) {
  if (std::isfinite(v) && v >= 0) return Status::Ok();
  return InvalidArgument(std::string(path) + ": must be a finite number of at least 0 (got " +
                         FormatDouble(v) + ")");
}

Status CheckUnitInterval(std::string_view path, double v) {
  if (v >= 0 && v < 1) return Status::Ok();
  return InvalidArgument(std::string(path) + ": must be in [0, 1) (got " + FormatDouble(v) + ")");
}

Status ValidateShape(const JobSpec& job) {
  if (job.virtual_nodes < 1 || job.virtual_nodes > kMaxVirtualNodes) {
    return InvalidArgument("spec.virtualNodes: must be between 1 and " +
                           std::to_string(kMaxVirtualNodes) + " (got " +
                           std::to_string(job.virtual_nodes) + ")");
  }
  VF_RETURN_IF_ERROR(CheckAtLeast("spec.globalBatchSize", job.global_batch_size, 1));
  if (job.global_batch_size % job.virtual_nodes != 0) {
    return InvalidArgument("spec.globalBatchSize (" + std::to_string(job.global_batch_size) +
                           ") must be divisible by spec.virtualNodes (" +
                           std::to_string(job.virtual_nodes) +
                           "): every virtual node takes an equal micro-batch");
  }
  VF_RETURN_IF_ERROR(CheckAtLeast("spec.replicas.min", job.replicas_min, 1));
  if (job.replicas_min > job.replicas_max) {
    return InvalidArgument("spec.replicas.min (" + std::to_string(job.replicas_min) +
                           ") must not exceed spec.replicas.max (" +
                           std::to_string(job.replicas_max) + ")");
  }
  if (job.replicas_desired &&
      (*job.replicas_desired < job.replicas_min || *job.replicas_desired > job.replicas_max)) {
    return InvalidArgument("spec.replicas.desired (" + std::to_string(*job.replicas_desired) +
                           ") must be between spec.replicas.min (" +
                           std::to_string(job.replicas_min) + ") and spec.replicas.max (" +
                           std::to_string(job.replicas_max) + ")");
  }
  if (job.replicas_max > job.virtual_nodes) {
    return InvalidArgument("spec.replicas.max (" + std::to_string(job.replicas_max) +
                           ") must not exceed spec.virtualNodes (" +
                           std::to_string(job.virtual_nodes) +
                           "): a worker holds at least one virtual node");
  }
  if (job.gpus_per_worker < 0) {
    return InvalidArgument("spec.gpusPerWorker: must be at least 0 (0 runs on CPUs; got " +
                           std::to_string(job.gpus_per_worker) + ")");
  }
  if (job.steps < 0 || job.epochs < 0) {
    const bool steps = job.steps < 0;
    return InvalidArgument(std::string(steps ? "spec.steps" : "spec.epochs") +
                           ": must be a positive integer (got " +
                           std::to_string(steps ? job.steps : job.epochs) + ")");
  }
  if ((job.steps > 0) == (job.epochs > 0)) {
    return InvalidArgument(std::string("set exactly one of spec.steps and spec.epochs (") +
                           (job.steps > 0 ? "both are set" : "neither is set") + ")");
  }
  return Status::Ok();
}

Status ValidateModelAndData(const JobSpec& job) {
  VF_RETURN_IF_ERROR(CheckKnown("spec.model.name", "model", job.model.name, kModels));
  if (job.model.hidden_sizes.empty()) {
    return InvalidArgument("spec.model.hiddenSizes: must list at least one hidden layer size");
  }
  for (size_t i = 0; i < job.model.hidden_sizes.size(); ++i) {
    const int h = job.model.hidden_sizes[i];
    if (h < 1 || h > kMaxHiddenSize) {
      return InvalidArgument("spec.model.hiddenSizes[" + std::to_string(i) +
                             "]: must be between 1 and " + std::to_string(kMaxHiddenSize) +
                             " (got " + std::to_string(h) + ")");
    }
  }

  const DatasetSpec& data = job.dataset;
  VF_RETURN_IF_ERROR(CheckKnown("spec.dataset.name", "dataset", data.name, kDatasets));
  if (data.name == "fashion-mnist" && data.path.empty()) {
    return InvalidArgument("spec.dataset.path: required for dataset 'fashion-mnist'");
  }
  if (data.name == "synthetic") {
    VF_RETURN_IF_ERROR(CheckAtLeast("spec.dataset.trainSamples", data.train_samples, 1));
    VF_RETURN_IF_ERROR(CheckAtLeast("spec.dataset.testSamples", data.test_samples, 1));
    // The sharder drops the tail that does not fill a step; a smaller set has no step at all.
    if (data.train_samples < job.global_batch_size) {
      return InvalidArgument("spec.dataset.trainSamples (" + std::to_string(data.train_samples) +
                             ") must be at least spec.globalBatchSize (" +
                             std::to_string(job.global_batch_size) +
                             "): one step takes that many samples");
    }
  }
  return Status::Ok();
}

Status ValidateOptimizer(const OptimizerSpec& opt) {
  VF_RETURN_IF_ERROR(CheckKnown("spec.optimizer.name", "optimizer", opt.name, kOptimizers));
  VF_RETURN_IF_ERROR(CheckPositiveFinite("spec.optimizer.learningRate", opt.learning_rate));
  VF_RETURN_IF_ERROR(CheckUnitInterval("spec.optimizer.momentum", opt.momentum));
  VF_RETURN_IF_ERROR(CheckNonNegativeFinite("spec.optimizer.weightDecay", opt.weight_decay));
  VF_RETURN_IF_ERROR(CheckUnitInterval("spec.optimizer.beta1", opt.beta1));
  VF_RETURN_IF_ERROR(CheckUnitInterval("spec.optimizer.beta2", opt.beta2));
  VF_RETURN_IF_ERROR(CheckPositiveFinite("spec.optimizer.epsilon", opt.epsilon));
  return Status::Ok();
}

Status ValidateRun(const JobSpec& job) {
  if (job.reduction != Reduction::kExact && job.reduction != Reduction::kFast) {
    return InvalidArgument("spec.reduction: must be one of exact, fast");
  }
  constexpr auto kMaxSeed = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (job.seed > kMaxSeed) {
    return InvalidArgument("spec.seed: must be between 0 and " + std::to_string(kMaxSeed) +
                           " (got " + std::to_string(job.seed) + ")");
  }
  // Which names are policies is the operator's registry's to say (operator/policy/registry.cc):
  // the operator and `vf run` check the name against it; a worker has no use for it.
  if (job.elasticity.policy.empty()) {
    return InvalidArgument("spec.elasticity.policy: must name a scheduling policy");
  }
  VF_RETURN_IF_ERROR(
      CheckAtLeast("spec.elasticity.cooldownSeconds", job.elasticity.cooldown_seconds, 0));
  VF_RETURN_IF_ERROR(CheckAtLeast("spec.checkpoint.everySteps", job.checkpoint.every_steps, 0));
  if (job.checkpoint.every_steps > 0 && job.checkpoint.path.empty()) {
    return InvalidArgument("spec.checkpoint.everySteps (" +
                           std::to_string(job.checkpoint.every_steps) +
                           ") requires spec.checkpoint.path: there is nowhere to write them");
  }
  const RunPolicySpec& run = job.run_policy;
  VF_RETURN_IF_ERROR(CheckAtLeast("spec.runPolicy.backoffLimit", run.backoff_limit, 0));
  if (run.active_deadline_seconds) {
    VF_RETURN_IF_ERROR(
        CheckAtLeast("spec.runPolicy.activeDeadlineSeconds", *run.active_deadline_seconds, 1));
  }
  if (run.ttl_seconds_after_finished) {
    VF_RETURN_IF_ERROR(
        CheckAtLeast("spec.runPolicy.ttlSecondsAfterFinished", *run.ttl_seconds_after_finished, 0));
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------

Status ReadWholeFile(const std::string& path, std::string* out) {
  auto cannot_read = [](int err) {
    std::string m = "cannot read file: " + std::generic_category().message(err);
    return err == ENOENT || err == ENOTDIR ? NotFound(std::move(m)) : InvalidArgument(std::move(m));
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cannot_read(errno);
  struct stat st {};
  Status status;
  if (::fstat(fd, &st) != 0) {
    status = cannot_read(errno);
  } else if (S_ISDIR(st.st_mode)) {
    status = cannot_read(EISDIR);
  } else {
    char buf[65536];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = cannot_read(errno);
        break;
      }
      if (n == 0) break;
      out->append(buf, static_cast<size_t>(n));
      if (out->size() > kMaxFileBytes) {
        status =
            InvalidArgument("cannot read file: larger than " + std::to_string(kMaxFileBytes >> 20) +
                            " MiB; a job manifest is a few KiB");
        break;
      }
    }
  }
  ::close(fd);
  return status;
}

Status WithSource(const Status& status, const std::string& source) {
  return source.empty() ? status : status.WithContext(Printable(source));
}

std::string Sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    std::abort();  // only fails on allocation failure inside OpenSSL
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < size; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 0xf];
  }
  return out;
}

}  // namespace

const char* ReductionName(Reduction r) {
  switch (r) {
    case Reduction::kExact:
      return "exact";
    case Reduction::kFast:
      return "fast";
  }
  return "unknown";
}

std::string AcceleratorResource(const JobSpec& job) {
  if (job.gpus_per_worker <= 0) return "";
  return job.worker_template.accelerator.empty() ? kNvidiaGpu : job.worker_template.accelerator;
}

std::string JobSpec::Fingerprint() const {
  // Canonical text: fixed field order, one "key=value" per line, doubles with 17 significant
  // digits (enough to round-trip). The first line versions the format itself.
  std::string text = "virtualflow job fingerprint v1\n";
  auto add = [&text](std::string_view key, std::string_view value) {
    text += key;
    text += '=';
    for (char c : value) {  // escaped so that no value can forge a line of its own
      if (c == '\\' || c == '\n') text += '\\';
      text += c;
    }
    text += '\n';
  };
  auto add_double = [&add](std::string_view key, double v) {
    if (v == 0) v = 0;  // -0 and 0 train identically
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    add(key, buf);
  };
  add("virtualNodes", std::to_string(virtual_nodes));
  add("globalBatchSize", std::to_string(global_batch_size));
  add("model.name", model.name);
  std::string hidden;
  for (int h : model.hidden_sizes) {
    if (!hidden.empty()) hidden += ',';
    hidden += std::to_string(h);
  }
  add("model.hiddenSizes", hidden);
  // The path is where the data lives, not what it is: moving it must not split a job.
  add("dataset.name", dataset.name);
  if (dataset.name == "synthetic") {
    add("dataset.trainSamples", std::to_string(dataset.train_samples));
    add("dataset.testSamples", std::to_string(dataset.test_samples));
  }
  add("optimizer.name", optimizer.name);
  add_double("optimizer.learningRate", optimizer.learning_rate);
  add_double("optimizer.momentum", optimizer.momentum);
  add("optimizer.nesterov", optimizer.nesterov ? "true" : "false");
  add_double("optimizer.weightDecay", optimizer.weight_decay);
  add_double("optimizer.beta1", optimizer.beta1);
  add_double("optimizer.beta2", optimizer.beta2);
  add_double("optimizer.epsilon", optimizer.epsilon);
  add("reduction", ReductionName(reduction));
  add("seed", std::to_string(seed));
  // Only a user's program adds lines, so built-in jobs keep their fingerprints (and checkpoints).
  for (const std::string& word : worker_template.command) add("template.command", word);
  for (const std::string& word : worker_template.args) add("template.args", word);
  return Sha256Hex(text);
}

Status ValidateJob(const JobSpec& job) {
  VF_RETURN_IF_ERROR(CheckName("metadata.name", job.name));
  VF_RETURN_IF_ERROR(CheckName("metadata.namespace", job.namespace_name));
  VF_RETURN_IF_ERROR(ValidateShape(job));
  VF_RETURN_IF_ERROR(ValidateModelAndData(job));
  VF_RETURN_IF_ERROR(ValidateOptimizer(job.optimizer));
  return ValidateRun(job);
}

int64_t TotalSteps(const JobSpec& job, int64_t train_samples) {
  if (job.steps > 0) return job.steps;
  if (job.global_batch_size <= 0 || train_samples <= 0) return 0;
  return job.epochs * (train_samples / job.global_batch_size);
}

namespace {

// Parses with `parse` (text or tree), then validates; errors name `source`.
template <typename Parse>
Result<JobSpec> ParseAndValidate(Parse parse, const std::string& source) {
  JobSpec job;
  Status status;
  try {
    status = parse(&job);
  } catch (const YAML::Exception& e) {
    // Loading already succeeded, so this is a yaml-cpp surprise rather than a bad file.
    status = Internal("unexpected YAML error: " + Printable(e.what()));
  }
  if (status.ok()) status = ValidateJob(job);
  if (!status.ok()) return WithSource(status, source);
  return job;
}

}  // namespace

Result<JobSpec> ParseJobYaml(const std::string& text, const std::string& source) {
  return ParseAndValidate([&](JobSpec* job) { return ParseManifest(text, job); }, source);
}

Result<JobSpec> ParseJobNode(const YAML::Node& manifest, const std::string& source) {
  return ParseAndValidate([&](JobSpec* job) { return ParseRoot(manifest, job); }, source);
}

Result<JobSpec> LoadJobFile(const std::string& path) {
  std::string text;
  Status status = ReadWholeFile(path, &text);
  if (!status.ok()) return WithSource(status, path);
  return ParseJobYaml(text, path);
}

}  // namespace vf
