// The CRD (crds/virtualflowjob.yaml and its copy in the Helm chart) restates the job defaults of
// spec.h for the API server: as OpenAPI `default:`s, as fallbacks in its CEL rules
// ("has(self.x) ? self.x : 8192") and in its field descriptions ("Default 0.9."). spec.h is
// their one home; these tests fail when any restatement drifts from it.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/job/spec.h"

namespace vf {
namespace {

const char* const kCrdFiles[] = {"crds/virtualflowjob.yaml",
                                 "charts/virtualflow/files/virtualflowjob.yaml"};

YAML::Node SpecSchema(const std::string& file) {
  const YAML::Node crd = YAML::LoadFile(std::string(VF_SOURCE_DIR) + "/" + file);
  return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
}

// A minimal valid job, as the tests of spec.cc write one.
YAML::Node MinimalManifest() {
  return YAML::Load(
      "apiVersion: virtualflow.io/v1alpha1\n"
      "kind: VirtualFlowJob\n"
      "metadata: {name: defaults}\n"
      "spec: {virtualNodes: 8, globalBatchSize: 256, steps: 10}\n");
}

// One value the CRD states for a field the job leaves out. `path` is relative to spec, e.g.
// {"optimizer", "learningRate"}. Value type.
struct Restated {
  std::vector<std::string> path;
  YAML::Node value;
  std::string where;  // for failure messages
};

std::string Dotted(const std::vector<std::string>& path) {
  std::string out = "spec";
  for (const auto& p : path) out += "." + p;
  return out;
}

// The manifest with `value` at `path` under spec (objects on the way created as needed).
YAML::Node With(const YAML::Node& manifest, const Restated& r) {
  YAML::Node copy = YAML::Clone(manifest);
  YAML::Node node = copy["spec"];
  for (size_t i = 0; i + 1 < r.path.size(); ++i) {
    if (!node[r.path[i]]) node[r.path[i]] = YAML::Node(YAML::NodeType::Map);
    node.reset(node[r.path[i]]);  // moves the handle; `=` would overwrite what it refers to
  }
  node[r.path.back()] = YAML::Clone(r.value);
  return copy;
}

// A CEL or description literal as the YAML scalar it stands for: 'text' is a string.
YAML::Node Literal(const std::string& text) {
  if (text.size() >= 2 && text.front() == '\'' && text.back() == '\'') {
    YAML::Node node(text.substr(1, text.size() - 2));
    node.SetTag("tag:yaml.org,2002:str");
    return node;
  }
  return YAML::Load(text);
}

void CollectDefaults(const YAML::Node& schema, const std::vector<std::string>& path,
                     std::vector<Restated>& out) {
  if (schema["default"] && !path.empty()) {
    out.push_back({path, schema["default"], Dotted(path) + " default:"});
  }
  for (const auto& property : schema["properties"]) {
    std::vector<std::string> sub = path;
    sub.push_back(property.first.as<std::string>());
    CollectDefaults(property.second, sub, out);
  }
}

// "0.9", "-1", "1e-8": the characters a number literal is made of.
bool IsNumberText(std::string_view s) {
  return !s.empty() && s.find_first_not_of("+-.0123456789eE") == std::string_view::npos;
}

// The fallbacks of the form `has(self.a.b) ? self.a.b : LITERAL` in `text`: (a.b, LITERAL).
// Scanned by hand: GCC 12's <regex> does not build warning-free under the sanitizers.
std::vector<std::pair<std::string, std::string>> CelFallbacks(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string open = "has(self.";
  for (size_t at = text.find(open); at != std::string::npos; at = text.find(open, at + 1)) {
    const size_t start = at + open.size();
    const size_t close = text.find(')', start);
    if (close == std::string::npos) break;
    const std::string field = text.substr(start, close - start);
    const std::string then = ") ? self." + field + " : ";
    if (text.compare(close, then.size(), then) != 0) continue;
    const size_t value = close + then.size();
    size_t end = 0;
    if (value < text.size() && text[value] == '\'') {
      end = text.find('\'', value + 1);
      if (end == std::string::npos) break;
      ++end;  // keep the quotes: they say it is a string
    } else {
      end = text.find_first_not_of("+-.0123456789eE", value);
      if (end == std::string::npos) end = text.size();
    }
    const std::string literal = text.substr(value, end - value);
    if (literal.size() > 1 || IsNumberText(literal)) out.emplace_back(field, literal);
  }
  return out;
}

// The fallbacks of the CEL rules and messages of the schema at `path` and below (self is the
// object the rule sits on).
void CollectCelFallbacks(const YAML::Node& schema, const std::vector<std::string>& path,
                         std::vector<Restated>& out) {
  for (const auto& rule : schema["x-kubernetes-validations"]) {
    for (const char* key : {"rule", "messageExpression"}) {
      if (!rule[key]) continue;
      for (const auto& [dotted, literal] : CelFallbacks(rule[key].as<std::string>())) {
        std::vector<std::string> field = path;
        for (size_t start = 0, dot = 0; dot != std::string::npos; start = dot + 1) {
          dot = dotted.find('.', start);
          field.push_back(dotted.substr(start, dot - start));
        }
        out.push_back({field, Literal(literal),
                       Dotted(path) + " CEL: self." + dotted + " defaults to " + literal});
      }
    }
  }
  for (const auto& property : schema["properties"]) {
    std::vector<std::string> sub = path;
    sub.push_back(property.first.as<std::string>());
    CollectCelFallbacks(property.second, sub, out);
  }
}

// "Default 0.9." in a field's description, where the value is a literal (a number, true or
// false, a path), not "Default min", which names the field it copies (ReplicasMaxDefaultsToMin).
void CollectDescribedDefaults(const YAML::Node& schema, const std::vector<std::string>& path,
                              std::vector<Restated>& out) {
  if (schema["description"] && !path.empty()) {
    const std::string text = schema["description"].as<std::string>();
    const std::string word = "Default ";
    const size_t at = text.find(word);
    if (at != std::string::npos) {
      const size_t start = at + word.size();
      const size_t end = text.find_first_of(" \n", start);
      std::string value = text.substr(start, end == std::string::npos ? end : end - start);
      if (!value.empty() && value.back() == '.') value.pop_back();  // the sentence's full stop
      if (IsNumberText(value) || value == "true" || value == "false" ||
          (!value.empty() && value.front() == '/')) {
        out.push_back({path, Literal(value), Dotted(path) + " description: Default " + value});
      }
    }
  }
  for (const auto& property : schema["properties"]) {
    std::vector<std::string> sub = path;
    sub.push_back(property.first.as<std::string>());
    CollectDescribedDefaults(property.second, sub, out);
  }
}

// Stating `r` changes nothing the parser decides: the value is spec.h's default.
void ExpectSpecHDefault(const Restated& r, const std::string& file) {
  const JobSpec base = ParseJobNode(MinimalManifest(), "minimal").value();
  Result<JobSpec> stated = ParseJobNode(With(MinimalManifest(), r), r.where);
  ASSERT_TRUE(stated.ok()) << file << ": " << stated.status().message();
  EXPECT_TRUE(stated.value() == base)
      << file << ": " << r.where << " differs from runtime/job/spec.h's default";
}

TEST(CrdDefaults, EveryOpenApiDefaultIsSpecHs) {
  for (const char* file : kCrdFiles) {
    std::vector<Restated> defaults;
    CollectDefaults(SpecSchema(file), {}, defaults);
    // The fields the API server defaults; a new default: in the CRD makes this list longer.
    std::set<std::string> paths;
    for (const auto& d : defaults) {
      paths.insert(Dotted(d.path));
      ExpectSpecHDefault(d, file);
    }
    EXPECT_GE(paths.size(), 13u) << file;
    EXPECT_TRUE(paths.count("spec.optimizer.learningRate")) << file;
    EXPECT_TRUE(paths.count("spec.elasticity.cooldownSeconds")) << file;
  }
}

TEST(CrdDefaults, AllOpenApiDefaultsTogetherAreSpecHs) {
  // As the API server applies them to a job that names every object but sets nothing in it.
  for (const char* file : kCrdFiles) {
    std::vector<Restated> defaults;
    CollectDefaults(SpecSchema(file), {}, defaults);
    YAML::Node manifest = MinimalManifest();
    for (const auto& d : defaults) manifest.reset(With(manifest, d));
    EXPECT_TRUE(ParseJobNode(manifest, file).value() ==
                ParseJobNode(MinimalManifest(), "minimal").value())
        << file;
  }
}

TEST(CrdDefaults, EveryCelFallbackIsSpecHs) {
  for (const char* file : kCrdFiles) {
    std::vector<Restated> fallbacks;
    CollectCelFallbacks(SpecSchema(file), {}, fallbacks);
    std::set<std::string> paths;
    for (const auto& f : fallbacks) {
      paths.insert(Dotted(f.path));
      ExpectSpecHDefault(f, file);
    }
    EXPECT_TRUE(paths.count("spec.dataset.trainSamples")) << file;
    EXPECT_TRUE(paths.count("spec.dataset.name")) << file;
  }
}

TEST(CrdDefaults, EveryDefaultADescriptionNamesIsSpecHs) {
  for (const char* file : kCrdFiles) {
    std::vector<Restated> described;
    CollectDescribedDefaults(SpecSchema(file), {}, described);
    std::set<std::string> paths;
    for (const auto& d : described) {
      paths.insert(Dotted(d.path));
      ExpectSpecHDefault(d, file);
    }
    EXPECT_TRUE(paths.count("spec.optimizer.momentum")) << file;
    EXPECT_TRUE(paths.count("spec.dataset.path")) << file;
    EXPECT_TRUE(paths.count("spec.dataset.testSamples")) << file;
  }
}

TEST(CrdDefaults, BackoffLimitIsBatchV1sAndSpecHs) {
  // batch/v1's 6, stated once in spec.h; the CRD shows it on every job the API server stores.
  for (const char* file : kCrdFiles) {
    const YAML::Node run = SpecSchema(file)["properties"]["runPolicy"]["properties"];
    ASSERT_TRUE(run["backoffLimit"]["default"]) << file;
    EXPECT_EQ(run["backoffLimit"]["default"].as<int>(), kDefaultBackoffLimit) << file;
    ASSERT_TRUE(run["cleanPodPolicy"]["default"]) << file;
    EXPECT_EQ(run["cleanPodPolicy"]["default"].as<std::string>(), "None") << file;
  }
  EXPECT_EQ(ParseJobNode(MinimalManifest(), "minimal").value().run_policy.clean_pod_policy,
            CleanPodPolicy::kNone);
}

TEST(CrdScale, TheScaleSubresourceDrivesReplicasDesired) {
  for (const char* file : kCrdFiles) {
    const YAML::Node crd = YAML::LoadFile(std::string(VF_SOURCE_DIR) + "/" + file);
    const YAML::Node scale = crd["spec"]["versions"][0]["subresources"]["scale"];
    ASSERT_TRUE(scale) << file;
    EXPECT_EQ(scale["specReplicasPath"].as<std::string>(), ".spec.replicas.desired") << file;
    EXPECT_EQ(scale["statusReplicasPath"].as<std::string>(), ".status.workers") << file;
    EXPECT_EQ(scale["labelSelectorPath"].as<std::string>(), ".status.selector") << file;
    const YAML::Node desired = SpecSchema(file)["properties"]["replicas"]["properties"]["desired"];
    EXPECT_EQ(desired["type"].as<std::string>(), "integer") << file;
    EXPECT_EQ(desired["format"].as<std::string>(), "int32") << file;
  }
}

TEST(CrdDefaults, ReplicasMaxDefaultsToMin) {
  // "Default min." in the CRD's description of replicas.max.
  for (const char* file : kCrdFiles) {
    const std::string description =
        SpecSchema(file)["properties"]["replicas"]["properties"]["max"]["description"]
            .as<std::string>();
    EXPECT_NE(description.find("Default min."), std::string::npos) << file;
  }
  YAML::Node manifest = MinimalManifest();
  manifest["spec"]["replicas"]["min"] = 3;
  const JobSpec job = ParseJobNode(manifest, "job").value();
  EXPECT_EQ(job.replicas_max, 3);
}

}  // namespace
}  // namespace vf
