#include "operator/controller/run_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace vf::controller {
namespace {

using nlohmann::json;

// A failed pod whose containers `codes` (name -> exit code) terminated, with `conditions`.
json FailedPod(const json& codes, const json& conditions = json::array()) {
  json statuses = json::array();
  for (const auto& [name, code] : codes.items()) {
    statuses.push_back({{"name", name}, {"state", {{"terminated", {{"exitCode", code}}}}}});
  }
  return {{"metadata", {{"name", "job-worker-abcde"}}},
          {"status",
           {{"phase", "Failed"}, {"containerStatuses", statuses}, {"conditions", conditions}}}};
}

RunPolicySpec Policy(const std::string& rules_yaml) {
  const std::string text =
      "apiVersion: virtualflow.io/v1alpha1\nkind: VirtualFlowJob\nmetadata: {name: j}\n"
      "spec:\n  virtualNodes: 4\n  globalBatchSize: 64\n  steps: 1\n"
      "  runPolicy:\n    podFailurePolicy:\n      rules:\n" +
      rules_yaml;
  Result<JobSpec> job = ParseJobYaml(text, "job.yaml");
  EXPECT_TRUE(job.ok()) << job.status().message();
  return job.ok() ? job->run_policy : RunPolicySpec{};
}

TEST(MatchPodFailurePolicy, NoRulesCountsEveryFailure) {
  const PodFailureVerdict v = MatchPodFailurePolicy(RunPolicySpec{}, FailedPod({{"worker", 1}}));
  EXPECT_EQ(v.action, PodFailureAction::kCount);
  EXPECT_EQ(v.rule, -1);
}

TEST(MatchPodFailurePolicy, ExitCodeInAListFailsTheJob) {
  const RunPolicySpec p = Policy(
      "      - action: FailJob\n"
      "        onExitCodes: {operator: In, values: [42, 43]}\n");
  const PodFailureVerdict v = MatchPodFailurePolicy(p, FailedPod({{"worker", 43}}));
  EXPECT_EQ(v.action, PodFailureAction::kFailJob);
  EXPECT_EQ(v.rule, 0);
  EXPECT_EQ(v.what, "container worker exited 43");
  EXPECT_EQ(MatchPodFailurePolicy(p, FailedPod({{"worker", 1}})).action, PodFailureAction::kCount);
}

TEST(MatchPodFailurePolicy, NotInMatchesEveryOtherNonZeroCode) {
  const RunPolicySpec p = Policy(
      "      - action: Ignore\n"
      "        onExitCodes: {operator: NotIn, values: [1]}\n");
  EXPECT_EQ(MatchPodFailurePolicy(p, FailedPod({{"worker", 137}})).action,
            PodFailureAction::kIgnore);
  EXPECT_EQ(MatchPodFailurePolicy(p, FailedPod({{"worker", 1}})).action, PodFailureAction::kCount);
  // A container that exited 0 did not fail, whatever the operator says.
  EXPECT_EQ(MatchPodFailurePolicy(p, FailedPod({{"worker", 0}})).action, PodFailureAction::kCount);
}

TEST(MatchPodFailurePolicy, ContainerNameRestrictsTheRuleToThatContainer) {
  const RunPolicySpec p = Policy(
      "      - action: FailJob\n"
      "        onExitCodes: {containerName: worker, operator: In, values: [42]}\n");
  EXPECT_EQ(MatchPodFailurePolicy(p, FailedPod({{"sidecar", 42}, {"worker", 1}})).action,
            PodFailureAction::kCount);
  EXPECT_EQ(MatchPodFailurePolicy(p, FailedPod({{"sidecar", 1}, {"worker", 42}})).action,
            PodFailureAction::kFailJob);
}

TEST(MatchPodFailurePolicy, InitContainersAreLookedAtToo) {
  const RunPolicySpec p = Policy(
      "      - action: FailJob\n"
      "        onExitCodes: {operator: In, values: [7]}\n");
  json pod = FailedPod(json::object());
  pod["status"]["initContainerStatuses"] = {
      {{"name", "fetch"}, {"state", {{"terminated", {{"exitCode", 7}}}}}}};
  const PodFailureVerdict v = MatchPodFailurePolicy(p, pod);
  EXPECT_EQ(v.action, PodFailureAction::kFailJob);
  EXPECT_EQ(v.what, "container fetch exited 7");
}

TEST(MatchPodFailurePolicy, DisruptionTargetConditionIsIgnored) {
  const RunPolicySpec p = Policy(
      "      - action: Ignore\n"
      "        onPodConditions: [{type: DisruptionTarget}]\n");
  const json disrupted = json::array({{{"type", "Ready"}, {"status", "False"}},
                                      {{"type", "DisruptionTarget"}, {"status", "True"}}});
  const PodFailureVerdict v = MatchPodFailurePolicy(p, FailedPod({{"worker", 137}}, disrupted));
  EXPECT_EQ(v.action, PodFailureAction::kIgnore);
  EXPECT_EQ(v.what, "condition DisruptionTarget=True");
  // The pattern's status (default True) must match too.
  const json not_disrupted = json::array({{{"type", "DisruptionTarget"}, {"status", "False"}}});
  EXPECT_EQ(MatchPodFailurePolicy(p, FailedPod({{"worker", 137}}, not_disrupted)).action,
            PodFailureAction::kCount);
}

TEST(MatchPodFailurePolicy, TheFirstMatchingRuleDecides) {
  const RunPolicySpec p = Policy(
      "      - action: Count\n"
      "        onExitCodes: {operator: In, values: [42]}\n"
      "      - action: FailJob\n"
      "        onExitCodes: {operator: NotIn, values: [1]}\n");
  const PodFailureVerdict counted = MatchPodFailurePolicy(p, FailedPod({{"worker", 42}}));
  EXPECT_EQ(counted.action, PodFailureAction::kCount);
  EXPECT_EQ(counted.rule, 0);
  const PodFailureVerdict failed = MatchPodFailurePolicy(p, FailedPod({{"worker", 2}}));
  EXPECT_EQ(failed.action, PodFailureAction::kFailJob);
  EXPECT_EQ(failed.rule, 1);
}

TEST(MatchPodFailurePolicy, APodWithoutStatusMatchesNothing) {
  const RunPolicySpec p = Policy(
      "      - action: FailJob\n"
      "        onExitCodes: {operator: NotIn, values: [1]}\n");
  EXPECT_EQ(MatchPodFailurePolicy(p, json::object()).rule, -1);
  EXPECT_EQ(MatchPodFailurePolicy(p, json{{"status", {{"containerStatuses", "x"}}}}).rule, -1);
}

TEST(FailureBackoff, DoublesFromTenSecondsUpToSixMinutesAsTheJobControllers) {
  EXPECT_EQ(FailureBackoffSeconds(0), 0);
  EXPECT_EQ(FailureBackoffSeconds(1), 10);
  EXPECT_EQ(FailureBackoffSeconds(2), 20);
  EXPECT_EQ(FailureBackoffSeconds(3), 40);
  EXPECT_EQ(FailureBackoffSeconds(6), 320);
  EXPECT_EQ(FailureBackoffSeconds(7), 360);
  EXPECT_EQ(FailureBackoffSeconds(1000000), 360);
}

TEST(FailureBackoff, CountsFromTheLastFailure) {
  EXPECT_EQ(FailureBackoffLeft(1, 100, 104), 6);
  EXPECT_EQ(FailureBackoffLeft(2, 100, 104), 16);
  EXPECT_EQ(FailureBackoffLeft(1, 100, 110), 0);
  EXPECT_EQ(FailureBackoffLeft(1, 100, 500), 0);
  EXPECT_EQ(FailureBackoffLeft(0, 100, 100), 0);
  EXPECT_EQ(FailureBackoffLeft(3, std::numeric_limits<double>::quiet_NaN(), 100), 0);
}

}  // namespace
}  // namespace vf::controller
