#include "operator/controller/kueue_contract.h"

#include <gtest/gtest.h>

namespace vf::controller {
namespace {

using nlohmann::json;

const json* Find(const json& workload, const std::string& type) {
  for (const json& c : workload["status"]["conditions"]) {
    if (c["type"] == type) return &c;
  }
  return nullptr;
}

// A Workload Kueue admitted: quota reserved in cluster queue `cq`, flavor `gpu-a` for GPUs
// and `default` for CPU.
json AdmittedWorkload() {
  return json::parse(R"({
    "metadata": {"name": "mnist-vf-0a1b2c3d", "namespace": "team", "generation": 3},
    "spec": {"podSets": [{"name": "workers", "count": 2}]},
    "status": {
      "conditions": [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
         "message": "Quota reserved in ClusterQueue cq", "lastTransitionTime": "T0"},
        {"type": "Admitted", "status": "True", "reason": "Admitted",
         "message": "The workload is admitted", "lastTransitionTime": "T0"}],
      "admission": {"clusterQueue": "cq", "podSetAssignments": [
        {"name": "workers", "count": 2,
         "flavors": {"nvidia.com/gpu": "gpu-a", "cpu": "default", "memory": "default"}}]}}})");
}

void Evict(json& workload, const std::string& reason) {
  workload["status"]["conditions"].push_back({{"type", "Evicted"},
                                              {"status", "True"},
                                              {"reason", reason},
                                              {"message", "Preempted to accommodate a job"},
                                              {"lastTransitionTime", "T1"}});
}

TEST(SetStatusCondition, KeepsTransitionTimeWhileTheStatusStays) {
  json conditions = json::array();
  EXPECT_TRUE(SetStatusCondition(
      conditions, {{"type", "PodsReady"}, {"status", "False"}, {"reason", "A"}}, "T1"));
  EXPECT_EQ(conditions[0]["lastTransitionTime"], "T1");
  // Same status, new reason: changed, but the transition time stays.
  EXPECT_TRUE(SetStatusCondition(
      conditions, {{"type", "PodsReady"}, {"status", "False"}, {"reason", "B"}}, "T2"));
  EXPECT_EQ(conditions[0]["lastTransitionTime"], "T1");
  EXPECT_EQ(conditions[0]["reason"], "B");
  // Nothing new: unchanged.
  EXPECT_FALSE(SetStatusCondition(
      conditions, {{"type", "PodsReady"}, {"status", "False"}, {"reason", "B"}}, "T3"));
  // A new status moves the transition time.
  EXPECT_TRUE(SetStatusCondition(
      conditions, {{"type", "PodsReady"}, {"status", "True"}, {"reason", "B"}}, "T4"));
  EXPECT_EQ(conditions[0]["lastTransitionTime"], "T4");
  EXPECT_EQ(conditions.size(), 1u);
}

TEST(WithPodsReady, FollowsKueuesStateMachine) {
  json workload = AdmittedWorkload();
  WorkloadUpdate u = WithPodsReady(workload, false, "1 of 2 workers train", "T1");
  ASSERT_TRUE(u.changed);
  const json* c = Find(u.workload, "PodsReady");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], "WaitForStart");
  EXPECT_EQ((*c)["message"], "1 of 2 workers train");
  EXPECT_EQ((*c)["observedGeneration"], 3);

  u = WithPodsReady(u.workload, true, "", "T2");
  c = Find(u.workload, "PodsReady");
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_EQ((*c)["reason"], "Started");
  EXPECT_EQ((*c)["lastTransitionTime"], "T2");
  EXPECT_FALSE(WithPodsReady(u.workload, true, "", "T3").changed);

  // Ready, then a plan being rebuilt: waiting for recovery; ready again: recovered.
  u = WithPodsReady(u.workload, false, "a new plan is being agreed", "T4");
  c = Find(u.workload, "PodsReady");
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], "WaitForRecovery");
  u = WithPodsReady(u.workload, false, "still agreeing", "T5");
  EXPECT_EQ((*Find(u.workload, "PodsReady"))["reason"], "WaitForRecovery");
  u = WithPodsReady(u.workload, true, "", "T6");
  c = Find(u.workload, "PodsReady");
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_EQ((*c)["reason"], "Recovered");
}

TEST(WithPodsReady, AnEvictedWorkloadWaitsForStart) {
  json workload = AdmittedWorkload();
  workload = WithPodsReady(workload, true, "", "T1").workload;
  Evict(workload, "Preempted");
  WorkloadUpdate u = WithPodsReady(workload, true, "evicted", "T2");
  const json* c = Find(u.workload, "PodsReady");
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], "WaitForStart");
}

TEST(RequeuedAfterEviction, ClearsTheReservationAsTheJobFrameworkDoes) {
  json workload = AdmittedWorkload();
  EXPECT_FALSE(RequeuedAfterEviction(workload, "T1").changed) << "not evicted";
  Evict(workload, "Preempted");
  EXPECT_EQ(EvictionReason(workload), "Preempted");
  WorkloadUpdate u = RequeuedAfterEviction(workload, "T2");
  ASSERT_TRUE(u.changed);
  EXPECT_FALSE(u.workload["status"].contains("admission"));
  EXPECT_EQ((*Find(u.workload, "QuotaReserved"))["status"], "False");
  EXPECT_EQ((*Find(u.workload, "QuotaReserved"))["reason"], "Pending");
  EXPECT_EQ((*Find(u.workload, "QuotaReserved"))["lastTransitionTime"], "T2");
  EXPECT_EQ((*Find(u.workload, "Admitted"))["status"], "False");
  const json* requeued = Find(u.workload, "Requeued");
  ASSERT_NE(requeued, nullptr);
  EXPECT_EQ((*requeued)["status"], "True");
  EXPECT_EQ((*requeued)["reason"], "Preempted");
  EXPECT_EQ((*requeued)["message"], "Preempted to accommodate a job");
  // The eviction itself is Kueue's to clear, and a second pass changes nothing.
  EXPECT_EQ((*Find(u.workload, "Evicted"))["status"], "True");
  EXPECT_FALSE(RequeuedAfterEviction(u.workload, "T3").changed);
}

TEST(RequeuedAfterEviction, OtherEvictionsAreNotRequeued) {
  json workload = AdmittedWorkload();
  Evict(workload, "PodsReadyTimeout");
  WorkloadUpdate u = RequeuedAfterEviction(workload, "T2");
  ASSERT_TRUE(u.changed);
  EXPECT_EQ((*Find(u.workload, "Requeued"))["status"], "False");
  EXPECT_EQ((*Find(u.workload, "Requeued"))["reason"], "PodsReadyTimeout");
}

TEST(Priority, TheJobsLabelBeforeThePodsClass) {
  json job = {{"metadata", {{"labels", {{"kueue.x-k8s.io/priority-class", "batch-high"}}}}}};
  json pod = {{"spec", {{"priorityClassName", "node-critical-ish"}}}};
  EXPECT_EQ(PriorityClassOf(job, pod),
            (PriorityClassRef{"kueue.x-k8s.io", "WorkloadPriorityClass", "batch-high"}));
  EXPECT_EQ(PriorityClassOf(json::object(), pod),
            (PriorityClassRef{"scheduling.k8s.io", "PriorityClass", "node-critical-ish"}));
  EXPECT_FALSE(PriorityClassOf(json::object(), json::object()).has_value());

  Result<int32_t> value =
      PriorityValueOf({{"metadata", {{"name", "batch-high"}}}, {"value", 1000}});
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(value.value(), 1000);
  EXPECT_FALSE(PriorityValueOf({{"metadata", {{"name", "x"}}}}).ok());
  EXPECT_FALSE(PriorityValueOf({{"value", int64_t{1} << 40}}).ok());

  json workload = AdmittedWorkload();
  SetWorkloadPriority(workload, {"kueue.x-k8s.io", "WorkloadPriorityClass", "batch-high"}, -5);
  EXPECT_EQ(workload["spec"]["priority"], -5);
  EXPECT_EQ(workload["spec"]["priorityClassRef"]["kind"], "WorkloadPriorityClass");
  EXPECT_EQ(workload["spec"]["podSets"][0]["count"], 2) << "the rest of the spec is kept";
}

std::map<std::string, json> Flavors() {
  return {{"gpu-a", json::parse(R"({"spec": {"nodeLabels": {"pool": "a100"},
             "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}})")},
          {"default", json::parse(R"({"spec": {}})")}};
}

TEST(Placement, FlavorsAndPodSetUpdates) {
  json workload = AdmittedWorkload();
  // Each once, in the order of the resources' names (cpu, memory, nvidia.com/gpu).
  EXPECT_EQ(AdmittedFlavors(workload, "workers"), (std::vector<std::string>{"default", "gpu-a"}));
  EXPECT_TRUE(AdmittedFlavors(workload, "other").empty());
  workload["status"]["admissionChecks"] = json::parse(R"([{"name": "prov", "state": "Ready",
      "podSetUpdates": [{"name": "workers", "labels": {"zone-pinned": "yes"},
                         "annotations": {"prov/request": "r1"},
                         "nodeSelector": {"zone": "z1"},
                         "tolerations": [{"key": "gpu", "operator": "Exists",
                                          "effect": "NoSchedule"},
                                         {"key": "spot", "operator": "Exists"}]},
                        {"name": "not-workers", "labels": {"ignored": "x"}}]}])");
  Result<PodSetPlacement> placement = PlacementOf(workload, "workers", Flavors());
  ASSERT_TRUE(placement.ok()) << placement.status().message();
  const PodSetPlacement& p = placement.value();
  EXPECT_EQ(p.node_selector,
            (std::map<std::string, std::string>{{"pool", "a100"}, {"zone", "z1"}}));
  EXPECT_EQ(p.labels, (std::map<std::string, std::string>{{"zone-pinned", "yes"}}));
  EXPECT_EQ(p.annotations.at("prov/request"), "r1");
  ASSERT_EQ(p.tolerations.size(), 2u) << p.tolerations.dump();  // the repeat once

  json pod = json::parse(R"({"metadata": {"labels": {"virtualflow.io/job": "mnist"}},
      "spec": {"nodeSelector": {"kubernetes.io/arch": "amd64"},
               "tolerations": [{"key": "spot", "operator": "Exists"}]}})");
  ASSERT_TRUE(ApplyPlacement(p, pod).ok());
  EXPECT_EQ(pod["spec"]["nodeSelector"]["pool"], "a100");
  EXPECT_EQ(pod["spec"]["nodeSelector"]["kubernetes.io/arch"], "amd64");
  EXPECT_EQ(pod["metadata"]["labels"]["zone-pinned"], "yes");
  EXPECT_EQ(pod["metadata"]["labels"]["virtualflow.io/job"], "mnist");
  EXPECT_EQ(pod["metadata"]["annotations"]["prov/request"], "r1");
  EXPECT_EQ(pod["spec"]["tolerations"].size(), 2u) << pod["spec"]["tolerations"].dump();

  EXPECT_TRUE(NodeMatchesPlacement(p, {{"pool", "a100"}, {"zone", "z1"}, {"other", "x"}}));
  EXPECT_FALSE(NodeMatchesPlacement(p, {{"pool", "h100"}, {"zone", "z1"}}));
  EXPECT_FALSE(NodeMatchesPlacement(p, {{"zone", "z1"}}));
  EXPECT_FALSE(NodeMatchesPlacement(p, json()));
}

TEST(Placement, ConflictsAndMissingFlavorsAreErrors) {
  json workload = AdmittedWorkload();
  std::map<std::string, json> flavors = Flavors();
  flavors.erase("gpu-a");
  Result<PodSetPlacement> missing = PlacementOf(workload, "workers", flavors);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("gpu-a"), std::string::npos);

  workload["status"]["admissionChecks"] = json::parse(
      R"([{"name": "prov", "podSetUpdates": [{"name": "workers",
          "nodeSelector": {"pool": "h100"}}]}])");
  Result<PodSetPlacement> conflict = PlacementOf(workload, "workers", Flavors());
  ASSERT_FALSE(conflict.ok());
  EXPECT_NE(conflict.status().message().find("pool"), std::string::npos);
  EXPECT_NE(conflict.status().message().find("prov"), std::string::npos);

  PodSetPlacement p;
  p.node_selector = {{"pool", "a100"}};
  json pod = {{"spec", {{"nodeSelector", {{"pool", "cpu"}}}}}};
  Status applied = ApplyPlacement(p, pod);
  ASSERT_FALSE(applied.ok());
  EXPECT_NE(applied.message().find("pool"), std::string::npos);
}

}  // namespace
}  // namespace vf::controller
