// The reconciler against an API server stand-in and a real coordinator (reconciler_test_fixture.h):
// The job's NetworkPolicy: made before any pod, made again when deleted, written back when
// changed, and a policy of its name that is not the operator's.
#include <gtest/gtest.h>

#include "operator/controller/reconciler_test_fixture.h"

namespace vf::controller::reconciler_fixture {
namespace {

TEST_F(ReconcilerTest, EachJobGetsANetworkPolicyThatAdmitsOnlyItsOwnPodsBeforeItHasAny) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)}, NetworkPolicySettings{kScrapers});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> policies = api_->created_policies();
  ASSERT_EQ(policies.size(), 1u);
  const json& policy = policies[0];
  EXPECT_EQ(policy["metadata"]["name"], "mnist-vf-workers");
  EXPECT_EQ(policy["metadata"]["namespace"], "team");
  // Owned by the job, so that it goes with it.
  ASSERT_EQ(policy["metadata"]["ownerReferences"].size(), 1u);
  EXPECT_EQ(policy["metadata"]["ownerReferences"][0]["uid"], kUid);
  EXPECT_EQ(policy["metadata"]["ownerReferences"][0]["kind"], "VirtualFlowJob");
  EXPECT_EQ(policy["metadata"]["ownerReferences"][0]["controller"], true);
  EXPECT_EQ(policy["metadata"]["labels"][kManagedByLabel], kManagedBy);
  // It selects the job's worker pods by the labels they carry...
  const json own = {{"matchLabels", {{kJobLabel, "mnist"}, {kManagedByLabel, kManagedBy}}}};
  EXPECT_EQ(policy["spec"]["podSelector"], own);
  const json pod_labels = api_->created_pods().at(0)["metadata"]["labels"];
  EXPECT_EQ(pod_labels[kJobLabel], "mnist");
  EXPECT_EQ(pod_labels[kManagedByLabel], kManagedBy);
  EXPECT_EQ(policy["spec"]["policyTypes"], json({"Ingress"}));
  // ... admits on every port only the pods of the same job, in the job's namespace (no
  // namespaceSelector) ...
  const json& ingress = policy["spec"]["ingress"];
  ASSERT_EQ(ingress.size(), 2u);
  EXPECT_EQ(ingress[0], json({{"from", {{{"podSelector", own}}}}}));
  // ... and the scrapers on the metrics port only.
  EXPECT_EQ(ingress[1]["ports"], json({{{"port", 9090}, {"protocol", "TCP"}}}));
  EXPECT_EQ(ingress[1]["from"], kScrapers);
  // Made before the first pod.
  const std::vector<std::string> writes = api_->writes();
  const auto first_policy = std::find(writes.begin(), writes.end(),
                                      "POST /apis/networking.k8s.io/v1/namespaces/team/"
                                      "networkpolicies");
  const auto first_pod =
      std::find(writes.begin(), writes.end(), "POST /api/v1/namespaces/team/pods");
  ASSERT_NE(first_pod, writes.end());
  EXPECT_LT(first_policy, first_pod);
  // The cache has not seen it yet: it is not made twice.
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_policies().size(), 1u);
}

TEST_F(ReconcilerTest, ANetworkPolicyDeletedOnceTheCacheHadItIsMadeAgainAtOnce) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)}, NetworkPolicySettings{kScrapers});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->created_policies().size(), 1u);
  json made = api_->created_policies()[0];
  made["metadata"]["resourceVersion"] = "2";
  api_->PolicyWatchEvent("ADDED", made);
  const std::string name = "team/mnist-vf-workers";
  ASSERT_TRUE(WaitFor([&] { return policies_->Get(name).has_value(); }));
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_policies().size(), 1u);
  // Someone deletes it: the next pass makes it again, not only once the wait for the cache to
  // see a policy just made (a minute) has run out.
  made["metadata"]["resourceVersion"] = "3";
  api_->PolicyWatchEvent("DELETED", made);
  ASSERT_TRUE(WaitFor([&] { return !policies_->Get(name).has_value(); }));
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_policies().size(), 2u);
}

TEST_F(ReconcilerTest, AChangedNetworkPolicyIsWrittenBackAtTheVersionRead) {
  json changed = BuildNetworkPolicy(EpochJob(), 9090, NetworkPolicySettings{kScrapers});
  changed["metadata"]["resourceVersion"] = "7";
  changed["spec"]["ingress"] = json::array({json::object()});  // someone let everyone in
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)}, NetworkPolicySettings{kScrapers}, {changed});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_policies().empty());
  const std::vector<json> replaced = api_->replaced_policies();
  ASSERT_EQ(replaced.size(), 1u);
  EXPECT_EQ(replaced[0]["metadata"]["resourceVersion"], "7");
  EXPECT_EQ(replaced[0]["spec"],
            BuildNetworkPolicy(EpochJob(), 9090, NetworkPolicySettings{kScrapers})["spec"]);
}

TEST_F(ReconcilerTest, ANetworkPolicyAsBuiltIsLeftAlone) {
  json same = BuildNetworkPolicy(EpochJob(), 9090, NetworkPolicySettings{kScrapers});
  same["metadata"]["resourceVersion"] = "7";
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)}, NetworkPolicySettings{kScrapers}, {same});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_policies().empty());
  EXPECT_TRUE(api_->replaced_policies().empty());
  EXPECT_EQ(api_->created_pods().size(), 2u);
}

TEST_F(ReconcilerTest, WithoutNetworkPoliciesNoneIsMade) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 2u);
  EXPECT_TRUE(api_->created_policies().empty());
}

}  // namespace
}  // namespace vf::controller::reconciler_fixture
