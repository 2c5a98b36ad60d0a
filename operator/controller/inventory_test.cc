#include "operator/controller/inventory.h"

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

TEST(InventoryTest, OddObjectsDoNotThrow) {
  std::vector<json> nodes = {json::object(), {{"metadata", {{"name", "x"}}}}};
  std::vector<json> pods = {json::object(), {{"spec", {{"containers", json::array()}}}}};
  ClusterGpus gpus = CountGpus(nodes, pods);
  EXPECT_TRUE(gpus.products.empty());
}

}  // namespace
}  // namespace vf::controller
