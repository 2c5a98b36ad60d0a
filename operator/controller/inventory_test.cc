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

TEST(InventoryTest, EligibilityFollowsSelectorAffinityAndTaints) {
  json node = Node("a", 4, "H100");
  node["metadata"]["labels"]["pool"] = "train";
  node["metadata"]["labels"]["zone"] = "z1";
  EXPECT_TRUE(NodeEligible(node, json::object()));
  EXPECT_TRUE(NodeEligible(node, {{"nodeSelector", {{"pool", "train"}}}}));
  EXPECT_FALSE(NodeEligible(node, {{"nodeSelector", {{"pool", "serve"}}}}));
  json affinity = json::parse(R"({"affinity": {"nodeAffinity": {
      "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["z3"]},
                              {"key": "spot", "operator": "DoesNotExist"}]}]}}}})");
  EXPECT_TRUE(NodeEligible(node, affinity));  // the second term matches
  node["metadata"]["labels"]["spot"] = "true";
  EXPECT_FALSE(NodeEligible(node, affinity));
  json by_name = json::parse(R"({"affinity": {"nodeAffinity": {
      "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}}})");
  EXPECT_FALSE(NodeEligible(node, by_name));
  node["spec"]["taints"] = json::parse(R"([{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                                           {"key": "soft", "effect": "PreferNoSchedule"}])");
  EXPECT_FALSE(NodeEligible(node, json::object()));
  EXPECT_TRUE(NodeEligible(
      node,
      json::parse(R"({"tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes"}]})")));
  EXPECT_FALSE(
      NodeEligible(node, json::parse(R"({"tolerations": [{"key": "gpu", "value": "no"}]})")));
  EXPECT_TRUE(NodeEligible(node, json::parse(R"({"tolerations": [{"operator": "Exists"}]})")));
  node["spec"]["unschedulable"] = true;
  EXPECT_FALSE(NodeEligible(node, json::parse(R"({"tolerations": [{"operator": "Exists"}]})")));
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
  const json train = {{"nodeSelector", {{"pool", "train"}}}};
  EXPECT_EQ(EligibleWorkers(cluster, train, 1, 0), 3);
  EXPECT_EQ(EligibleProducts(cluster, train), std::vector<std::string>{"H100"});
  EXPECT_EQ(EligibleProducts(cluster, json::object()), (std::vector<std::string>{"A100", "H100"}));
  // CPU-only: every node's free CPU (8 each, 3 held on a), 2 CPUs a worker.
  EXPECT_EQ(EligibleWorkers(cluster, json::object(), 0, 2000), 2 + 4 + 4);
  EXPECT_EQ(EligibleWorkers(cluster, train, 0, 2000), 2);
  EXPECT_EQ(cluster.cpu_held_by_others["a"], 3000);
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
