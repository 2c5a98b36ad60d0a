#include "tests/e2e/pod_runner/env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace vf::podrunner {
namespace {

using nlohmann::json;

json Pod() {
  return json::parse(R"j({
    "metadata": {"name": "worker-0", "namespace": "team", "uid": "u-123",
                 "labels": {"app": "vf"}, "annotations": {"note": "hi"}},
    "spec": {"nodeName": "gpu-1", "serviceAccountName": "trainer"}
  })j");
}

// Secrets and ConfigMaps by name, with a count of reads; "broken" fails as an API error would.
struct FakeApi {
  std::map<std::string, json> objects;  // "secret/name" or "configmap/name"
  int reads = 0;

  ObjectLookup Lookup() {
    return [this](SourceKind kind, const std::string& ns, const std::string& name) -> Result<json> {
      ++reads;
      EXPECT_EQ(ns, "team");
      if (name == "broken") return Unavailable("get secrets team/broken: Transport: refused");
      const std::string key = (kind == SourceKind::kSecret ? "secret/" : "configmap/") + name;
      auto it = objects.find(key);
      if (it == objects.end()) return NotFound("get: NotFound: " + key);
      return it->second;
    };
  }
};

EnvContext Context() {
  EnvContext c;
  c.path_prefix = "/build/bin";
  c.base_path = "/usr/bin:/bin";
  return c;
}

std::map<std::string, std::string> AsMap(const std::vector<EnvVar>& env) {
  std::map<std::string, std::string> m;
  for (const auto& v : env) m[v.name] = v.value;
  return m;
}

TEST(ResolveEnvTest, LiteralValuesKeepTheirOrderAndAddHostnameAndPath) {
  json c = json::parse(R"j({"env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"},
                                   {"name": "EMPTY"}]})j");
  FakeApi api;
  auto env = ResolveEnv(Pod(), c, api.Lookup(), Context());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ(*env, (std::vector<EnvVar>{{"B", "2"},
                                       {"A", "1"},
                                       {"EMPTY", ""},
                                       {"HOSTNAME", "worker-0"},
                                       {"PATH", "/build/bin:/usr/bin:/bin"}}));
  EXPECT_EQ(api.reads, 0);
}

TEST(ResolveEnvTest, ContainerPathReplacesTheRunnersButNotThePrefix) {
  json c = json::parse(R"j({"env": [{"name": "PATH", "value": "/opt/x"},
                                   {"name": "HOSTNAME", "value": "mine"}]})j");
  auto env = ResolveEnv(Pod(), c, FakeApi().Lookup(), Context());
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(AsMap(*env)["PATH"], "/build/bin:/opt/x");
  EXPECT_EQ(AsMap(*env)["HOSTNAME"], "mine");
  EnvContext no_prefix = Context();
  no_prefix.path_prefix = "";
  auto plain = ResolveEnv(Pod(), json::object(), FakeApi().Lookup(), no_prefix);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(AsMap(*plain)["PATH"], "/usr/bin:/bin");
}

TEST(ResolveEnvTest, LaterDefinitionReplacesEarlierInPlace) {
  json c = json::parse(R"j({"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"},
                                   {"name": "A", "value": "3"}]})j");
  auto env = ResolveEnv(Pod(), c, FakeApi().Lookup(), Context());
  ASSERT_TRUE(env.ok());
  EXPECT_EQ((*env)[0], (EnvVar{"A", "3"}));
  EXPECT_EQ((*env)[1], (EnvVar{"B", "2"}));
}

TEST(ResolveEnvTest, SecretKeyIsBase64Decoded) {
  FakeApi api;
  api.objects["secret/db"] = {{"data", {{"password", "c2VjcmV0dmFsdWU="}}}};
  json c = json::parse(R"j({"env": [{"name": "S", "valueFrom": {"secretKeyRef":
                                    {"name": "db", "key": "password"}}}]})j");
  auto env = ResolveEnv(Pod(), c, api.Lookup(), Context());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ(AsMap(*env)["S"], "secretvalue");
}

TEST(ResolveEnvTest, EachSourceIsReadOnce) {
  FakeApi api;
  api.objects["secret/db"] = {{"data", {{"a", "YQ=="}, {"b", "Yg=="}}}};
  json c = json::parse(R"j({"env": [
      {"name": "A", "valueFrom": {"secretKeyRef": {"name": "db", "key": "a"}}},
      {"name": "B", "valueFrom": {"secretKeyRef": {"name": "db", "key": "b"}}}]})j");
  auto env = ResolveEnv(Pod(), c, api.Lookup(), Context());
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(AsMap(*env)["A"], "a");
  EXPECT_EQ(AsMap(*env)["B"], "b");
  EXPECT_EQ(api.reads, 1);
}

TEST(ResolveEnvTest, MissingSecretFailsWithTheKubeletsMessage) {
  json c = json::parse(R"j({"env": [{"name": "S", "valueFrom": {"secretKeyRef":
                                    {"name": "db", "key": "password"}}}]})j");
  auto env = ResolveEnv(Pod(), c, FakeApi().Lookup(), Context());
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(env.status().message(), "secret \"db\" not found");
}

TEST(ResolveEnvTest, MissingKeyFailsNamingKeyAndSecret) {
  FakeApi api;
  api.objects["secret/db"] = {{"data", {{"user", "dQ=="}}}};
  json c = json::parse(R"j({"env": [{"name": "S", "valueFrom": {"secretKeyRef":
                                    {"name": "db", "key": "password"}}}]})j");
  auto env = ResolveEnv(Pod(), c, api.Lookup(), Context());
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(env.status().message(), "couldn't find key password in Secret team/db");
}

TEST(ResolveEnvTest, OptionalMissingSecretOrKeyLeavesTheVariableUnset) {
  FakeApi api;
  api.objects["configmap/cfg"] = {{"data", {{"x", "1"}}}};
  json c = json::parse(R"j({"env": [
      {"name": "S", "valueFrom": {"secretKeyRef": {"name": "db", "key": "p", "optional": true}}},
      {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "y",
                                                      "optional": true}}}]})j");
  auto env = ResolveEnv(Pod(), c, api.Lookup(), Context());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  EXPECT_EQ(AsMap(*env).count("S"), 0u);
  EXPECT_EQ(AsMap(*env).count("C"), 0u);
}

TEST(ResolveEnvTest, LookupFailureIsNotNotFoundAndHasContext) {
  json c = json::parse(R"j({"env": [{"name": "S", "valueFrom": {"secretKeyRef":
                                    {"name": "broken", "key": "k", "optional": true}}}]})j");
  auto env = ResolveEnv(Pod(), c, FakeApi().Lookup(), Context());
  ASSERT_FALSE(env.ok());  // optional covers absence, not an API server that cannot answer
  EXPECT_EQ(env.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(env.status().message().find("reading secret team/broken"), std::string::npos);
}

TEST(ResolveEnvTest, SecretDataThatIsNotBase64IsInvalid) {
  FakeApi api;
  api.objects["secret/db"] = {{"data", {{"k", "!!!"}}}};
  json c = json::parse(R"j({"env": [{"name": "S", "valueFrom": {"secretKeyRef":
                                    {"name": "db", "key": "k"}}}]})j");
  auto env = ResolveEnv(Pod(), c, api.Lookup(), Context());
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), StatusCode::kInvalidArgument);
}

TEST(ResolveEnvTest, ConfigMapKeyIsPlainText) {
  FakeApi api;
  api.objects["configmap/cfg"] = {{"data", {{"mode", "fast"}}}};
  json c = json::parse(R"j({"env": [{"name": "M", "valueFrom": {"configMapKeyRef":
                                    {"name": "cfg", "key": "mode"}}}]})j");
  auto env = ResolveEnv(Pod(), c, api.Lookup(), Context());
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(AsMap(*env)["M"], "fast");
  auto missing = ResolveEnv(Pod(), json::parse(R"j({"env": [{"name": "M", "valueFrom":
                                {"configMapKeyRef": {"name": "nope", "key": "mode"}}}]})j"),
                            api.Lookup(), Context());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "configmap \"nope\" not found");
}

TEST(ResolveEnvTest, FieldRefsResolveFromThePodAndTheRunner) {
  json c = json::parse(R"j({"env": [
      {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
      {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
      {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
      {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
      {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
      {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
      {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
      {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
      {"name": "NOTE", "valueFrom": {"fieldRef":
          {"apiVersion": "v1", "fieldPath": "metadata.annotations['note']"}}}]})j");
  auto env = ResolveEnv(Pod(), c, FakeApi().Lookup(), Context());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  auto m = AsMap(*env);
  EXPECT_EQ(m["N"], "worker-0");
  EXPECT_EQ(m["NS"], "team");
  EXPECT_EQ(m["UID"], "u-123");
  EXPECT_EQ(m["NODE"], "gpu-1");
  EXPECT_EQ(m["IP"], "127.0.0.1");
  EXPECT_EQ(m["HOST"], "127.0.0.1");
  EXPECT_EQ(m["SA"], "trainer");
  EXPECT_EQ(m["APP"], "vf");
  EXPECT_EQ(m["NOTE"], "hi");
}

TEST(ResolveEnvTest, UnsupportedSourcesAreInvalidAndNameTheVariable) {
  for (const char* var :
       {R"j({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}})j",
        R"j({"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}})j",
        R"j({"name": "X", "valueFrom": {}})j"}) {
    json c = {{"env", json::array({json::parse(var)})}};
    auto env = ResolveEnv(Pod(), c, FakeApi().Lookup(), Context());
    ASSERT_FALSE(env.ok()) << var;
    EXPECT_EQ(env.status().code(), StatusCode::kInvalidArgument) << var;
    EXPECT_NE(env.status().message().find("env X"), std::string::npos) << env.status().message();
  }
}

TEST(ResolveEnvTest, EnvFromWithPrefixThenEnvOverrides) {
  FakeApi api;
  api.objects["configmap/cfg"] = {{"data", {{"MODE", "fast"}, {"LEVEL", "3"}}}};
  api.objects["secret/tok"] = {{"data", {{"TOKEN", "dG9r"}}}};
  json c = json::parse(R"j({
    "envFrom": [{"configMapRef": {"name": "cfg"}},
                {"prefix": "S_", "secretRef": {"name": "tok"}},
                {"secretRef": {"name": "absent", "optional": true}}],
    "env": [{"name": "MODE", "value": "slow"}]})j");
  auto env = ResolveEnv(Pod(), c, api.Lookup(), Context());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  auto m = AsMap(*env);
  EXPECT_EQ(m["MODE"], "slow");
  EXPECT_EQ(m["LEVEL"], "3");
  EXPECT_EQ(m["S_TOKEN"], "tok");
}

TEST(ResolveEnvTest, OddShapesAreIgnoredNotFatal) {
  json c = json::parse(R"j({"env": [42, {"value": "no name"}, {"name": "A", "value": 7},
                                   {"name": "B", "value": "ok"}], "envFrom": "nope"})j");
  auto env = ResolveEnv(json::array(), c, FakeApi().Lookup(), Context());
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  auto m = AsMap(*env);
  EXPECT_EQ(m["A"], "");
  EXPECT_EQ(m["B"], "ok");
  EXPECT_EQ(m["HOSTNAME"], "");
}

TEST(ExpandReferencesTest, FollowsKubernetesRules) {
  auto lookup = [](std::string_view name) -> std::optional<std::string> {
    if (name == "A") return std::string("x");
    if (name == "EMPTY") return std::string();
    return std::nullopt;
  };
  EXPECT_EQ(ExpandReferences("$(A)", lookup), "x");
  EXPECT_EQ(ExpandReferences("pre-$(A)-$(A)-post", lookup), "pre-x-x-post");
  EXPECT_EQ(ExpandReferences("$(EMPTY)|", lookup), "|");
  EXPECT_EQ(ExpandReferences("$(UNDEFINED)", lookup), "$(UNDEFINED)");
  EXPECT_EQ(ExpandReferences("$$(A)", lookup), "$(A)");
  EXPECT_EQ(ExpandReferences("$$", lookup), "$");
  EXPECT_EQ(ExpandReferences("$A $", lookup), "$A $");
  EXPECT_EQ(ExpandReferences("$(A", lookup), "$(A");
  EXPECT_EQ(ExpandReferences("", lookup), "");
}

TEST(ResolveEnvTest, LiteralsExpandOnlyEarlierVariables) {
  json c = json::parse(R"j({"env": [{"name": "A", "value": "1"},
                                   {"name": "B", "value": "$(A)-$(C)"},
                                   {"name": "C", "value": "3"}]})j");
  auto env = ResolveEnv(Pod(), c, FakeApi().Lookup(), Context());
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(AsMap(*env)["B"], "1-$(C)");
}

TEST(ExpandCommandTest, CommandThenArgsExpanded) {
  json c = json::parse(R"j({"command": ["sh", "-c"], "args": ["echo $(NAME) $$(NAME)"]})j");
  std::vector<EnvVar> env = {{"NAME", "w0"}};
  EXPECT_EQ(ExpandCommand(c, env), (std::vector<std::string>{"sh", "-c", "echo w0 $(NAME)"}));
}

TEST(ExpandCommandTest, NoCommandMeansNothingToRun) {
  EXPECT_TRUE(ExpandCommand(json::parse(R"j({"args": ["x"]})j"), {}).empty());
  EXPECT_TRUE(ExpandCommand(json::parse(R"j({"command": []})j"), {}).empty());
  EXPECT_TRUE(ExpandCommand(json::parse(R"j({"command": "sh"})j"), {}).empty());
  EXPECT_TRUE(ExpandCommand(json(nullptr), {}).empty());
}

}  // namespace
}  // namespace vf::podrunner
