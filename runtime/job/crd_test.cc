// The CRD (crds/virtualflowjob.yaml and its copy in the Helm chart) restates the job defaults of
// spec.h for the API server: as OpenAPI `default:`s, as fallbacks in its CEL rules
// ("has(self.x) ? self.x : 8192") and in its field descriptions ("Default 0.9."). spec.h is
// their one home; these tests fail when any restatement drifts from it.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/job/spec.h"

namespace vf {
namespace {

const char* const kCrdFiles[] = {"crds/virtualflowjob.yaml",
                                 "charts/virtualflow/crds/virtualflowjob.yaml"};

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
// {"optimizer", "learningRate"}.
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

void CollectDefaults(const YAML::Node& schema, std::vector<std::string> path,
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

// Fallbacks of the form `has(self.a.b) ? self.a.b : LITERAL` in the rules and messages of the
// schema at `path` and below (self is the object the rule sits on).
void CollectCelFallbacks(const YAML::Node& schema, const std::vector<std::string>& path,
                         std::vector<Restated>& out) {
  static const std::regex kFallback(
      R"(has\(self\.([A-Za-z.]+)\) \? self\.\1 : ('[^']*'|[-+0-9.eE]+))");
  for (const auto& rule : schema["x-kubernetes-validations"]) {
    for (const char* key : {"rule", "messageExpression"}) {
      if (!rule[key]) continue;
      const std::string text = rule[key].as<std::string>();
      for (std::sregex_iterator it(text.begin(), text.end(), kFallback), end; it != end; ++it) {
        std::vector<std::string> field = path;
        std::string dotted = (*it)[1];
        for (size_t start = 0, dot = 0; dot != std::string::npos; start = dot + 1) {
          dot = dotted.find('.', start);
          field.push_back(dotted.substr(start, dot - start));
        }
        out.push_back({field, Literal((*it)[2]), Dotted(path) + " CEL: " + it->str()});
      }
    }
  }
  for (const auto& property : schema["properties"]) {
    std::vector<std::string> sub = path;
    sub.push_back(property.first.as<std::string>());
    CollectCelFallbacks(property.second, sub, out);
  }
}

// "Default 0.9." in a field's description, where the value is a literal (not "Default min",
// which names the field it copies; see ReplicasMaxDefaultsToMin).
void CollectDescribedDefaults(const YAML::Node& schema, std::vector<std::string> path,
                              std::vector<Restated>& out) {
  static const std::regex kDefault(
      R"(Default ([-+0-9.eE]+?|true|false|/[-A-Za-z0-9_/.]+?)\.?(\s|$))");
  if (schema["description"] && !path.empty()) {
    const std::string text = schema["description"].as<std::string>();
    std::smatch m;
    if (std::regex_search(text, m, kDefault)) {
      out.push_back({path, Literal(m[1]), Dotted(path) + " description: " + m[0].str()});
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
