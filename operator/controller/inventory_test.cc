#include "operator/controller/inventory.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace vf::controller {
namespace {

using nlohmann::json;

json Node(const std::string& name, int gpus, const std::string& product, bool cordoned = false,
          const std::string& ready = "True") {
  json node = {{"metadata", {{"name", name}, {"labels", json::object()}}},
               {"spec", json::object()},
               {"status",
                {{"allocatable", {{"cpu", "8"}, {"nvidia.com/gpu", std::to_string(gpus)}}},
                 {"conditions", {{{"type", "Ready"}, {"status", ready}}}}}}};
  if (!product.empty()) node["metadata"]["labels"]["nvidia.com/gpu.product"] = product;
  if (cordoned) node["spec"]["unschedulable"] = true;
  return node;
}

json Pod(const std::string& node, int gpus, bool worker, const std::string& phase = "Running") {
  json pod = {{"metadata", {{"name", "p"}, {"labels", json::object()}}},
              {"spec",
               {{"nodeName", node},
                {"containers",
                 {{{"name", "c"},
                   {"resources", {{"limits", {{"nvidia.com/gpu", std::to_string(gpus)}}}}}}}}}},
              {"status", {{"phase", phase}}}};
  if (worker) pod["metadata"]["labels"]["virtualflow.io/job"] = "j";
  return pod;
}

TEST(InventoryTest, CountsSchedulableNodesByProductMinusPods) {
  std::vector<json> nodes = {Node("a", 4, "V100"),
                             Node("b", 2, "V100"),
                             Node("c", 8, "A100"),
                             Node("d", 8, "A100", /*cordoned=*/true),
                             Node("e", 8, "A100", false, "False"),
                             Node("f", 1, "")};
  std::vector<json> pods = {Pod("a", 1, false), Pod("a", 2, true),
                            Pod("c", 3, false), Pod("c", 5, false, "Succeeded"),
                            Pod("d", 1, false), Pod("", 1, false)};
  ClusterGpus gpus = CountGpus(nodes, pods);
  EXPECT_EQ(gpus.products["V100"].total, 6);
  EXPECT_EQ(gpus.products["V100"].allocated, 3);
  EXPECT_EQ(gpus.products["V100"].free(), 3);
  EXPECT_EQ(gpus.products["A100"].total, 8);
  EXPECT_EQ(gpus.products["A100"].allocated, 3);
  EXPECT_EQ(gpus.products["unknown"].total, 1);
  EXPECT_EQ(gpus.held_by_others["V100"], 1);
  EXPECT_EQ(gpus.held_by_others["A100"], 3);
  EXPECT_EQ(gpus.node_product.count("d"), 0u);
  EXPECT_EQ(gpus.node_product.count("e"), 0u);
}

TEST(InventoryTest, PodsOfOtherWorkloadsWaitingForGpusAreDemand) {
  std::vector<json> nodes = {Node("a", 4, "V100"), Node("b", 8, "A100")};
  json waiting = Pod("", 2, false, "Pending");
  json pinned = Pod("", 1, false, "Pending");
  pinned["spec"]["nodeSelector"] = {{"nvidia.com/gpu.product", "V100"}};
  json gated = Pod("", 4, false, "Pending");
  gated["spec"]["schedulingGates"] = {{{"name", "kueue.x-k8s.io/admission"}}};
  json too_big = Pod("", 16, false, "Pending");  // no node has 16: it waits whatever we do
  json deleted = Pod("", 1, false, "Pending");
  deleted["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  json ours = Pod("", 3, true, "Pending");  // a VirtualFlow worker is the policy's own
  EXPECT_TRUE(WaitsForScheduler(waiting));
  EXPECT_FALSE(WaitsForScheduler(gated));
  EXPECT_FALSE(WaitsForScheduler(deleted));
  EXPECT_FALSE(WaitsForScheduler(ours));
  EXPECT_FALSE(WaitsForScheduler(Pod("a", 1, false, "Pending")));  // bound: it holds, not waits
  const ClusterGpus gpus =
      CountGpus(nodes, {Pod("b", 2, false), waiting, pinned, gated, too_big, deleted, ours});
  // The unpinned request goes where most is left (A100: 8 - 2 held); the pinned one to V100.
  EXPECT_EQ(gpus.pending_demand.at("A100"), 2);
  EXPECT_EQ(gpus.pending_demand.at("V100"), 1);
  EXPECT_EQ(gpus.held_by_others.at("A100"), 2);  // held and waiting are counted apart
}

TEST(InventoryTest, QuantitiesParseOrCountAsZero) {
  EXPECT_EQ(ParseGpuQuantity(json("2")), 2);
  EXPECT_EQ(ParseGpuQuantity(json("2000m")), 2);
  EXPECT_EQ(ParseGpuQuantity(json(3)), 3);
  EXPECT_EQ(ParseGpuQuantity(json("x")), 0);
  EXPECT_EQ(ParseGpuQuantity(json("-1")), 0);
  EXPECT_EQ(ParseGpuQuantity(json("2Gi")), 0);
  EXPECT_EQ(ParseGpuQuantity(json(nullptr)), 0);
}

TEST(InventoryTest, CpuQuantitiesAreMillicores) {
  EXPECT_EQ(ParseCpuMillis(json("500m")), 500);
  EXPECT_EQ(ParseCpuMillis(json("2")), 2000);
  EXPECT_EQ(ParseCpuMillis(json("1.5")), 1500);
  EXPECT_EQ(ParseCpuMillis(json("0.125")), 125);
  EXPECT_EQ(ParseCpuMillis(json(".5")), 500);
  EXPECT_EQ(ParseCpuMillis(json(4)), 4000);
  EXPECT_EQ(ParseCpuMillis(json("1.2345")), -1);
  EXPECT_EQ(ParseCpuMillis(json("1.5m")), -1);
  EXPECT_EQ(ParseCpuMillis(json("-1")), -1);
  EXPECT_EQ(ParseCpuMillis(json("2Ki")), -1);
  EXPECT_EQ(ParseCpuMillis(json("")), -1);
  EXPECT_EQ(ParseCpuMillis(json(nullptr)), -1);
}

// A pod template (spec.template) whose pod spec is `pod_spec`.
json Template(const json& pod_spec) { return {{"spec", pod_spec}}; }

TEST(InventoryTest, EligibilityFollowsSelectorAffinityAndTaints) {
  json node = Node("a", 4, "H100");
  node["metadata"]["labels"]["pool"] = "train";
  node["metadata"]["labels"]["zone"] = "z1";
  EXPECT_TRUE(NodeEligible(node, json::object()));
  EXPECT_TRUE(NodeEligible(node, Template({{"nodeSelector", {{"pool", "train"}}}})));
  EXPECT_FALSE(NodeEligible(node, Template({{"nodeSelector", {{"pool", "serve"}}}})));
  json affinity = Template(json::parse(R"({"affinity": {"nodeAffinity": {
      "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z3"]},
                              {"key": "spot", "operator": "DoesNotExist"}]}]}}}})"));
  EXPECT_TRUE(NodeEligible(node, affinity));  // the second term matches
  node["metadata"]["labels"]["spot"] = "true";
  EXPECT_FALSE(NodeEligible(node, affinity));
  json by_name = Template(json::parse(R"({"affinity": {"nodeAffinity": {
      "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}})"));
  EXPECT_FALSE(NodeEligible(node, by_name));
  node["spec"]["taints"] = json::parse(R"([{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                                           {"key": "soft", "effect": "PreferNoSchedule"}])");
  EXPECT_FALSE(NodeEligible(node, json::object()));
  EXPECT_TRUE(NodeEligible(
      node, Template(json::parse(
                R"({"tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes"}]})"))));
  EXPECT_FALSE(NodeEligible(
      node, Template(json::parse(R"({"tolerations": [{"key": "gpu", "value": "no"}]})"))));
  EXPECT_TRUE(
      NodeEligible(node, Template(json::parse(R"({"tolerations": [{"operator": "Exists"}]})"))));
  node["spec"]["unschedulable"] = true;
  EXPECT_FALSE(
      NodeEligible(node, Template(json::parse(R"({"tolerations": [{"operator": "Exists"}]})"))));
}

TEST(InventoryTest, EligibleWorkersCountOnlyTheNodesATemplateAllows) {
  std::vector<json> nodes = {Node("a", 4, "H100"), Node("b", 2, "A100"), Node("c", 0, "")};
  nodes[0]["metadata"]["labels"]["pool"] = "train";
  nodes[2]["status"]["allocatable"].erase("nvidia.com/gpu");
  // Something else holds 1 GPU and 3 CPUs on node a.
  json other = Pod("a", 1, false);
  other["spec"]["containers"][0]["resources"]["requests"] = {{"cpu", "3"}};
  ClusterGpus cluster = CountGpus(nodes, {other});
  EXPECT_EQ(EligibleWorkers(cluster, json::object(), 1, 0), 3 + 2);
  EXPECT_EQ(EligibleWorkers(cluster, json::object(), 2, 0), 1 + 1);
  const json train = Template({{"nodeSelector", {{"pool", "train"}}}});
  EXPECT_EQ(EligibleWorkers(cluster, train, 1, 0), 3);
  EXPECT_EQ(EligibleProducts(cluster, train), std::vector<std::string>{"H100"});
  EXPECT_EQ(EligibleProducts(cluster, json::object()), (std::vector<std::string>{"A100", "H100"}));
  // CPU-only: every node's free CPU (8 each, 3 held on a), 2 CPUs a worker.
  EXPECT_EQ(EligibleWorkers(cluster, json::object(), 0, 2000), 2 + 4 + 4);
  EXPECT_EQ(EligibleWorkers(cluster, train, 0, 2000), 2);
  EXPECT_EQ(cluster.cpu_held_by_others["a"], 3000);
}

TEST(InventoryTest, AnyExtendedResourceIsAnAcceleratorCountedByItsName) {
  // Node a: 7 MIG slices of one profile and no whole GPU; node b: 4 GPUs and 2 MIG slices of
  // another profile; node c: AMD GPUs.
  std::vector<json> nodes = {Node("a", 0, "A100"), Node("b", 4, "H100"), Node("c", 0, "")};
  nodes[0]["status"]["allocatable"].erase("nvidia.com/gpu");
  nodes[0]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7";
  nodes[1]["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] = "2";
  nodes[2]["status"]["allocatable"].erase("nvidia.com/gpu");
  nodes[2]["status"]["allocatable"]["amd.com/gpu"] = "8";
  nodes[2]["status"]["allocatable"]["hugepages-2Mi"] = "1Gi";
  // Another workload holds 2 slices on a; a worker holds 1 GPU on b.
  json other = Pod("a", 0, false);
  other["spec"]["containers"][0]["resources"]["limits"] = {{"nvidia.com/mig-1g.10gb", "2"}};
  const ClusterGpus cluster = CountGpus(nodes, {other, Pod("b", 1, true)});
  EXPECT_EQ(cluster.products.at("nvidia.com/mig-1g.10gb").total, 7);
  EXPECT_EQ(cluster.products.at("nvidia.com/mig-1g.10gb").allocated, 2);
  EXPECT_EQ(cluster.held_by_others.at("nvidia.com/mig-1g.10gb"), 2);
  EXPECT_EQ(cluster.products.at("H100").total, 4);
  EXPECT_EQ(cluster.products.at("H100").allocated, 1);
  EXPECT_EQ(cluster.products.at("nvidia.com/mig-3g.40gb").total, 2);
  EXPECT_EQ(cluster.products.at("amd.com/gpu").total, 8);
  EXPECT_EQ(cluster.products.count("hugepages-2Mi"), 0u);
  EXPECT_EQ(cluster.products.count("cpu"), 0u);
  EXPECT_EQ(TypeOnNode(cluster, "b", "nvidia.com/gpu"), "H100");
  EXPECT_EQ(TypeOnNode(cluster, "b", "nvidia.com/mig-3g.40gb"), "nvidia.com/mig-3g.40gb");
  EXPECT_EQ(TypeOnNode(cluster, "a", "nvidia.com/gpu"), "");
  // A template whose worker container asks for a MIG slice fits where that profile is free.
  const json mig = json::parse(R"({"spec": {"containers": [
      {"name": "sidecar", "resources": {"limits": {"amd.com/gpu": 1}}},
      {"name": "worker", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]}})");
  EXPECT_EQ(TemplateAccelerator(mig), "nvidia.com/mig-1g.10gb");
  EXPECT_EQ(EligibleWorkers(cluster, mig, 1, 0), 5);
  EXPECT_EQ(EligibleProducts(cluster, mig), std::vector<std::string>{"nvidia.com/mig-1g.10gb"});
  // gpusPerWorker alone asks for whole NVIDIA GPUs.
  EXPECT_EQ(TemplateAccelerator(Template({{"containers", {{{"name", "worker"}}}}})),
            "nvidia.com/gpu");
  EXPECT_EQ(EligibleProducts(cluster, json::object()), std::vector<std::string>{"H100"});
  EXPECT_EQ(PodGpus(other), 2);
  EXPECT_EQ(PodGpus(other, "nvidia.com/gpu"), 0);
}

TEST(InventoryTest, NodeSchedulingFactsIgnoreHeartbeatsAndSeeWhatPlacesWorkers) {
  json node = Node("a", 8, "H100");
  node["metadata"]["resourceVersion"] = "10";
  node["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-02T03:04:05Z";
  const json facts = NodeSchedulingFacts(node);
  // A heartbeat: new times, a new resourceVersion, new images.
  json beat = node;
  beat["metadata"]["resourceVersion"] = "11";
  beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-01-02T03:04:15Z";
  beat["status"]["images"] = json::array({{{"names", {"agent:1"}}}});
  EXPECT_EQ(NodeSchedulingFacts(beat), facts);
  // What changes where workers go.
  json cordoned = Node("a", 8, "H100", /*cordoned=*/true);
  json not_ready = Node("a", 8, "H100", false, "False");
  json smaller = Node("a", 4, "H100");
  json relabelled = Node("a", 8, "A100");
  json tainted = node;
  tainted["spec"]["taints"] = json::array({{{"key", "gpu"}, {"effect", "NoSchedule"}}});
  for (const json& other : {cordoned, not_ready, smaller, relabelled, tainted}) {
    EXPECT_NE(NodeSchedulingFacts(other), facts) << other.dump();
  }
  // A node that comes or goes.
  EXPECT_NE(NodeSchedulingFacts(json()), facts);
}

TEST(InventoryTest, OddObjectsDoNotThrow) {
  std::vector<json> nodes = {json::object(), {{"metadata", {{"name", "x"}}}}};
  std::vector<json> pods = {json::object(), {{"spec", {{"containers", json::array()}}}}};
  ClusterGpus gpus = CountGpus(nodes, pods);
  EXPECT_TRUE(gpus.products.empty());
}

}  // namespace
}  // namespace vf::controller
