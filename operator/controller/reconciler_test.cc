// The reconciler against an API server stand-in (operator/kube/test_util.h) that serves a fixed
// set of objects and records every write, with a real coordinator: what one Reconcile of a job
// writes for the spec, the job length and the membership plan.
#include "operator/controller/reconciler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "agent/protocol/json.h"
#include "operator/controller/job_key.h"
#include "operator/controller/job_spec.h"
#include "operator/kube/client.h"
#include "operator/kube/test_util.h"

namespace vf::controller {
namespace {

using kube::testing::Connection;
using kube::testing::FakeServer;
using kube::testing::HoldUntil;
using kube::testing::Request;
using nlohmann::json;

constexpr char kKey[] = "team/mnist";
constexpr char kUid[] = "u-1";
constexpr char kJobKey[] = "0123456789abcdef0123456789abcdef";

// Lists the objects it was given, holds watches open, and records
// status patches, created pods, events, deletions and writes of NetworkPolicies. Thread-safe.
class FakeApi {
 public:
  FakeApi(std::vector<json> jobs, std::vector<json> pods, std::vector<json> nodes,
          std::vector<json> policies = {})
      : lists_{{"/apis/virtualflow.io/v1alpha1/virtualflowjobs", std::move(jobs)},
               {"/api/v1/pods", std::move(pods)},
               {"/api/v1/nodes", std::move(nodes)},
               {"/apis/networking.k8s.io/v1/networkpolicies", std::move(policies)}},
        server_(
            [this](const Request& r, Connection& c, std::stop_token stop) { Serve(r, c, stop); }) {
    // The pods it starts with have their credential Secrets.
    std::lock_guard<std::mutex> lock(mu_);
    for (const json& pod : lists_.at("/api/v1/pods")) {
      secret_names_.insert(pod["metadata"].value("name", "") + "-vf-credential");
    }
  }

  std::string url() const { return server_.url(); }
  std::vector<json> status_patches() {
    std::lock_guard<std::mutex> lock(mu_);
    return patches_;
  }
  std::vector<json> created_pods() {
    std::lock_guard<std::mutex> lock(mu_);
    return pods_;
  }
  std::vector<json> created_secrets() {
    std::lock_guard<std::mutex> lock(mu_);
    return secrets_;
  }
  std::vector<std::string> event_reasons() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  std::vector<std::string> event_messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return event_messages_;
  }
  // Method and path of every POST and PUT, in order.
  std::vector<std::string> writes() {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_;
  }
  // Body of every POST (created) and PUT (replaced) of a NetworkPolicy.
  std::vector<json> created_policies() {
    std::lock_guard<std::mutex> lock(mu_);
    return created_policies_;
  }
  std::vector<json> replaced_policies() {
    std::lock_guard<std::mutex> lock(mu_);
    return replaced_policies_;
  }
  // Sends a watch event of NetworkPolicies (type ADDED, MODIFIED or DELETED) to the informers
  // watching them, as the API server does once an object changes.
  void PolicyWatchEvent(const std::string& type, const json& object) {
    std::lock_guard<std::mutex> lock(mu_);
    policy_events_.push_back(json({{"type", type}, {"object", object}}).dump() + "\n");
  }
  // While set, creating a NetworkPolicy answers 409 AlreadyExists, as for a name already taken.
  void PolicyNameTaken(bool taken) {
    std::lock_guard<std::mutex> lock(mu_);
    policy_name_taken_ = taken;
  }
  // Path of every GET of a Secret (there should be none: a job's secret is derived).
  std::vector<std::string> secret_reads() {
    std::lock_guard<std::mutex> lock(mu_);
    return secret_reads_;
  }
  // Path and body of every DELETE.
  std::vector<std::pair<std::string, json>> deletions() {
    std::lock_guard<std::mutex> lock(mu_);
    return deletions_;
  }
  // Path and body of every PATCH of an Event (a repeat aggregated into it).
  std::vector<std::pair<std::string, json>> event_patches() {
    std::lock_guard<std::mutex> lock(mu_);
    return event_patches_;
  }
  // While set, pod creation is refused as a ResourceQuota refuses it: 403 Forbidden naming the
  // pod.
  void RefusePods(bool refuse) {
    std::lock_guard<std::mutex> lock(mu_);
    refuse_pods_ = refuse;
  }
  // The credential Secret of pod `pod` is gone (deleted, or never made).
  void LoseSecret(const std::string& pod) {
    std::lock_guard<std::mutex> lock(mu_);
    secret_names_.erase(pod + "-vf-credential");
  }
  // While set, every name is taken: creating a Secret, or a pod, answers 409 AlreadyExists.
  void SecretNamesTaken(bool taken) {
    std::lock_guard<std::mutex> lock(mu_);
    secret_names_taken_ = taken;
  }
  void PodNamesTaken(bool taken) {
    std::lock_guard<std::mutex> lock(mu_);
    pod_names_taken_ = taken;
  }

 private:
  void Serve(const Request& r, Connection& c, std::stop_token stop) {
    const std::string path = r.Path();
    if (r.method == "GET" && r.Query().find("watch=true") != std::string::npos) {
      c.StartChunked();
      if (path != "/apis/networking.k8s.io/v1/networkpolicies") {
        HoldUntil(stop, [] { return false; });
        return;
      }
      for (size_t sent = 0; !stop.stop_requested(); ++sent) {
        std::string event;
        HoldUntil(stop, [&] {
          std::lock_guard<std::mutex> lock(mu_);
          if (sent < policy_events_.size()) event = policy_events_[sent];
          return !event.empty();
        });
        if (event.empty() || !c.Chunk(event)) return;
      }
      return;
    }
    if (r.method == "GET" && lists_.count(path) != 0) {
      json list = {{"metadata", {{"resourceVersion", "1"}}}, {"items", lists_.at(path)}};
      c.Respond(200, list.dump());
      return;
    }
    if (r.method == "GET" && path.starts_with("/api/v1/namespaces/team/secrets/")) {
      std::lock_guard<std::mutex> lock(mu_);
      secret_reads_.push_back(path);
      c.Respond(404, R"({"kind": "Status", "reason": "NotFound", "code": 404})");
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    const json body = r.body.empty() ? json() : json::parse(r.body);
    if (r.method == "POST" || r.method == "PUT") writes_.push_back(r.method + " " + path);
    constexpr char kPolicies[] = "/apis/networking.k8s.io/v1/namespaces/team/networkpolicies";
    const auto already_exists = [&c](const std::string& what) {
      const json taken = {{"kind", "Status"},          {"apiVersion", "v1"},
                          {"status", "Failure"},       {"message", what + " already exists"},
                          {"reason", "AlreadyExists"}, {"code", 409}};
      c.Respond(409, taken.dump());
    };
    if (r.method == "POST" && path == kPolicies && policy_name_taken_) {
      already_exists("networkpolicies \"mnist-vf-workers\"");
      return;
    }
    if (r.method == "POST" && path == "/api/v1/namespaces/team/secrets") {
      const std::string name = body["metadata"].value("name", "");
      if (secret_names_taken_ || !secret_names_.insert(name).second) {
        already_exists("secrets \"" + name + "\"");
        return;
      }
    }
    if (r.method == "POST" && path == "/api/v1/namespaces/team/pods" && pod_names_taken_) {
      already_exists("pods \"" + body["metadata"].value("name", "") + "\"");
      return;
    }
    if (r.method == "POST" && path == kPolicies) {
      created_policies_.push_back(body);
    } else if (r.method == "PUT" && path.starts_with(kPolicies)) {
      replaced_policies_.push_back(body);
    } else if (r.method == "PATCH" && path.ends_with("/status")) {
      patches_.push_back(body["status"]);
    } else if (r.method == "POST" && path == "/api/v1/namespaces/team/pods" && refuse_pods_) {
      const std::string name = body["metadata"].value("name", "");
      const json refusal = {{"kind", "Status"},
                            {"apiVersion", "v1"},
                            {"status", "Failure"},
                            {"message", "pods \"" + name +
                                            "\" is forbidden: exceeded quota: gpus, requested: "
                                            "requests.nvidia.com/gpu=1, used: "
                                            "requests.nvidia.com/gpu=0, limited: "
                                            "requests.nvidia.com/gpu=0"},
                            {"reason", "Forbidden"},
                            {"code", 403}};
      c.Respond(403, refusal.dump());
      return;
    } else if (r.method == "POST" && path == "/api/v1/namespaces/team/pods") {
      pods_.push_back(body);
    } else if (r.method == "POST" && path == "/api/v1/namespaces/team/secrets") {
      secrets_.push_back(body);
    } else if (r.method == "POST" && path.ends_with("/events")) {
      events_.push_back(body.value("reason", ""));
      event_messages_.push_back(body.value("message", ""));
    } else if (r.method == "PATCH" && path.starts_with("/api/v1/namespaces/team/events/")) {
      event_patches_.emplace_back(path, body);
    } else if (r.method == "DELETE") {
      deletions_.emplace_back(path, body);
    }
    c.Respond(200, r.body.empty() ? "{}" : r.body);
  }

  const std::map<std::string, std::vector<json>> lists_;
  std::mutex mu_;
  std::vector<json> patches_;
  std::vector<json> pods_;
  std::vector<json> secrets_;
  std::vector<std::string> events_;
  std::vector<std::string> event_messages_;
  std::vector<std::pair<std::string, json>> deletions_;
  std::vector<std::pair<std::string, json>> event_patches_;
  std::vector<std::string> writes_;
  std::vector<std::string> secret_reads_;
  std::vector<json> created_policies_;
  std::vector<json> replaced_policies_;
  bool refuse_pods_ = false;
  bool policy_name_taken_ = false;
  bool secret_names_taken_ = false;
  bool pod_names_taken_ = false;
  std::set<std::string> secret_names_;      // the Secrets there are
  std::vector<std::string> policy_events_;  // watch events of NetworkPolicies, in order
  FakeServer server_;                       // last: it stops serving before the rest goes away
};

json Job(const json& spec) {
  return {{"apiVersion", "virtualflow.io/v1alpha1"},
          {"kind", "VirtualFlowJob"},
          {"metadata",
           {{"name", "mnist"},
            {"namespace", "team"},
            {"uid", kUid},
            {"generation", 1},
            {"creationTimestamp", "2026-01-02T03:04:05Z"}}},
          {"spec", spec}};
}

json EpochJob() {
  return Job({{"virtualNodes", 4},
              {"globalBatchSize", 64},
              {"epochs", 2},
              {"replicas", {{"min", 1}, {"max", 2}}}});
}

json GpuNode(const std::string& name, int gpus) {
  return {{"metadata", {{"name", name}, {"labels", {{"nvidia.com/gpu.product", "V100"}}}}},
          {"spec", json::object()},
          {"status",
           {{"allocatable", {{"nvidia.com/gpu", std::to_string(gpus)}}},
            {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
}

json RunningPod(const std::string& name) {
  return {{"metadata",
           {{"name", name},
            {"namespace", "team"},
            {"uid", "pod-" + name},
            {"creationTimestamp", "2026-01-02T03:04:06Z"},
            {"labels", {{kJobLabel, "mnist"}}},
            {"ownerReferences",
             {{{"apiVersion", "virtualflow.io/v1alpha1"},
               {"kind", "VirtualFlowJob"},
               {"name", "mnist"},
               {"uid", kUid},
               {"controller", true}}}}}},
          {"spec",
           {{"nodeName", "gpu-a"},
            {"containers", {{{"resources", {{"limits", {{"nvidia.com/gpu", "1"}}}}}}}}}},
          {"status", {{"phase", "Running"}}}};
}

// Informers over the fake API server, a coordinator and the reconciler under test.
class ReconcilerTest : public testing::Test {
 protected:
  // With `network_policy`, the reconciler keeps each job's NetworkPolicy, starting from
  // `policies` in the API server.
  void Start(std::vector<json> jobs, std::vector<json> pods, std::vector<json> nodes,
             std::optional<NetworkPolicySettings> network_policy = std::nullopt,
             std::vector<json> policies = {}) {
    api_ = std::make_unique<FakeApi>(std::move(jobs), std::move(pods), std::move(nodes),
                                     std::move(policies));
    kube::Config config;
    config.server = api_->url();
    client_ = kube::Client::Create(config).value();
    jobs_ = NewInformer(kube::kVirtualFlowJobs);
    pods_ = NewInformer(kube::kPods, TrimPodForCache);  // as the controller keeps them
    nodes_ = NewInformer(kube::kNodes);
    ReconcilerOptions options;
    options.pods.coordinator_url = "http://operator:7070";
    options.pods.default_image = default_image_;
    options.job_key = kJobKey;
    options.network_policy = std::move(network_policy);
    options.require_queue = require_queue_;
    if (options.network_policy) policies_ = NewInformer(kube::kNetworkPolicies);
    reconciler_ = Reconciler::Create(*client_, *jobs_, *pods_, *nodes_, coordinator_, options,
                                     hooks_, nullptr, policies_.get())
                      .value();
  }

  void TearDown() override {
    for (Informer* i : {jobs_.get(), pods_.get(), nodes_.get(), policies_.get()}) {
      if (i != nullptr) i->Stop();
    }
  }

  std::unique_ptr<Informer> NewInformer(const kube::Resource& resource,
                                        Informer::Transform transform = nullptr) {
    auto informer = std::make_unique<Informer>(
        *client_, resource, "", kube::ReflectorOptions{}, [](const json&, const json&) {},
        transform);
    informer->Start();
    std::stop_source never;
    EXPECT_TRUE(informer->WaitForSync(never.get_token()));
    return informer;
  }

  // Back to nothing, in the order things depend on each other, so that Start can show the
  // reconciler a later moment of the cluster (as a fresh reconciler, with the same coordinator).
  void Reset() {
    reconciler_.reset();
    TearDown();
    policies_.reset();
    nodes_.reset();
    pods_.reset();
    jobs_.reset();
    client_.reset();
    api_.reset();
  }

  // The workers register and warm up, as their agents would.
  void Ready(const std::vector<std::string>& workers) {
    const JobView view = coordinator_.GetJob(kKey).value();
    for (const std::string& w : workers) {
      ASSERT_TRUE(coordinator_.RegisterWorker(kKey, w, view.fingerprint, view.build, true).ok());
    }
  }

  std::unique_ptr<FakeApi> api_;
  std::unique_ptr<kube::Client> client_;
  std::unique_ptr<Informer> jobs_;
  std::unique_ptr<Informer> pods_;
  std::unique_ptr<Informer> nodes_;
  std::unique_ptr<Informer> policies_;
  Coordinator coordinator_;
  std::unique_ptr<Reconciler> reconciler_;
  std::string default_image_ = "virtualflow/agent:1";  // the operator's --agent-image
  ReconcilerHooks hooks_;                              // set before Start
  bool require_queue_ = false;                         // --require-kueue-queue, before Start
};

TEST_F(ReconcilerTest, SpecTheParserRejectsFailsTheJobWithItsMessage) {
  Start({Job({{"virtualNodes", 8}, {"globalBatchSize", 250}, {"steps", 10}})}, {}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> patches = api_->status_patches();
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0]["phase"], "Failed");
  EXPECT_EQ(patches[0]["message"],
            "team/mnist: spec.globalBatchSize (250) must be divisible by spec.virtualNodes (8): "
            "every virtual node takes an equal micro-batch");
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"InvalidSpec"}));
}

TEST_F(ReconcilerTest, CreatesThePodsThePolicyWantsWithTheSpecsGpus) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 2u);  // replicas.max, with 4 GPUs free
  EXPECT_EQ(pods[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"], "1");
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Pending");
  EXPECT_EQ(status["desiredWorkers"], 2);
}

TEST_F(ReconcilerTest, UnderRequireQueueAJobWithoutAQueueLabelGetsNoPodsAndSaysWhy) {
  require_queue_ = true;
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_pods().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Pending");
  EXPECT_EQ(status["desiredWorkers"], 0);
  json admitted;
  for (const json& c : status["conditions"]) {
    if (c["type"] == "Admitted") admitted = c;
  }
  ASSERT_FALSE(admitted.is_null()) << status.dump();
  EXPECT_EQ(admitted["status"], "False");
  EXPECT_EQ(admitted["reason"], "QueueNameMissing");
  EXPECT_NE(admitted["message"].get<std::string>().find("kueue.x-k8s.io/queue-name"),
            std::string::npos);
  EXPECT_EQ(status["message"], admitted["message"]);
}

TEST_F(ReconcilerTest, AStatusTheCacheHasNotSeenYetIsNotWrittenTwice) {
  // The fake's cache never sees the reconciler's writes: the job stays at resourceVersion 7,
  // as a job does between a status write and its watch event.
  json job = EpochJob();
  job["metadata"]["resourceVersion"] = "7";
  Start({job}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->status_patches().size(), 1u);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().size(), 1u);
}

TEST_F(ReconcilerTest, EachWorkerPodGetsACredentialOfItsOwnThatTheCoordinatorAccepts) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  const std::vector<json> secrets = api_->created_secrets();
  ASSERT_EQ(pods.size(), 2u);
  ASSERT_EQ(secrets.size(), 2u);
  for (size_t i = 0; i < pods.size(); ++i) {
    const std::string pod = pods[i]["metadata"]["name"];
    EXPECT_EQ(secrets[i]["metadata"]["name"], pod + "-vf-credential");
    EXPECT_EQ(pods[i]["spec"]["volumes"][0]["secret"]["secretName"], pod + "-vf-credential");
    const std::string credential = secrets[i]["stringData"]["token"];
    // Derived from the job's secret, which is derived from the operator's key and the job's UID.
    EXPECT_EQ(credential, WorkerCredential(DeriveJobSecret(kJobKey, kUid).value(), pod).value());
    EXPECT_TRUE(coordinator_.CheckCredential(kKey, pod, credential).ok());
    const std::string other = pods[1 - i]["metadata"]["name"];
    EXPECT_EQ(coordinator_.CheckCredential(kKey, other, credential).code(),
              StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(api_->secret_reads(), std::vector<std::string>{});
  // replicas.max is 2: the coordinator registers at most twice that (live workers and their
  // replacements); one more is told to wait for room (Unavailable), not refused for good.
  const JobView view = coordinator_.GetJob(kKey).value();
  for (int w = 0; w < 4; ++w) {
    ASSERT_TRUE(
        coordinator_
            .RegisterWorker(kKey, "w-" + std::to_string(w), view.fingerprint, view.build, true)
            .ok());
  }
  EXPECT_EQ(coordinator_.RegisterWorker(kKey, "w-4", view.fingerprint, view.build, true).code(),
            StatusCode::kUnavailable);
}

// ---------------------------------------------------------------- the job's NetworkPolicy

const json kScrapers =
    json::array({{{"namespaceSelector", json::object()},
                  {"podSelector", {{"matchLabels", {{"app.kubernetes.io/name", "prometheus"}}}}}}});

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

// True once `done` holds, polling for up to 10 s.
bool WaitFor(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
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

TEST_F(ReconcilerTest, APolicyOfTheJobsNameThatIsNotTheOperatorsBlocksTheJobAndSaysSo) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)}, NetworkPolicySettings{kScrapers});
  api_->PolicyNameTaken(true);
  Result<ReconcileResult> r = reconciler_->Reconcile(kKey);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("team/mnist-vf-workers exists and is not the operator's"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"FailedNetworkPolicy"}));
  EXPECT_TRUE(api_->created_pods().empty());  // no pod that the policy would not isolate
}

TEST_F(ReconcilerTest, WithoutNetworkPoliciesNoneIsMade) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 2u);
  EXPECT_TRUE(api_->created_policies().empty());
}

TEST_F(ReconcilerTest, AnotherReconcilerWithTheSameKeyDerivesTheSameCredentials) {
  // An operator restarted (or its standby leading) reads the same key: the workers' credentials
  // still hold, without any Secret of the job's being read.
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> secrets = api_->created_secrets();
  ASSERT_EQ(secrets.size(), 2u);
  // The restarted operator's cache shows the pods (a worker whose pod it does not see has no
  // credential it accepts).
  std::vector<json> pods;
  for (json pod : api_->created_pods()) {
    pod["metadata"]["uid"] = "pod-" + pod["metadata"].value("name", "");
    pod["status"] = {{"phase", "Running"}};
    pods.push_back(pod);
  }
  Reset();
  Start({EpochJob()}, pods, {GpuNode("gpu-a", 4)});
  Coordinator restarted;
  ReconcilerOptions options;
  options.job_key = kJobKey;
  auto again = Reconciler::Create(*client_, *jobs_, *pods_, *nodes_, restarted, options).value();
  ASSERT_TRUE(again->Reconcile(kKey).ok());
  for (const json& secret : secrets) {
    const std::string pod = secret["metadata"]["ownerReferences"][0]["name"];
    const std::string credential = secret["stringData"]["token"];
    EXPECT_TRUE(restarted.CheckCredential(kKey, pod, credential).ok()) << pod;
  }
}

TEST_F(ReconcilerTest, AReconcilerWithoutAKeyIsRefused) {
  Start({}, {}, {});
  ReconcilerOptions options;
  options.job_key = "short";
  EXPECT_EQ(
      Reconciler::Create(*client_, *jobs_, *pods_, *nodes_, coordinator_, options).status().code(),
      StatusCode::kInvalidArgument);
}

TEST_F(ReconcilerTest, EpochJobLengthIsUnknownUntilAnAgentReportsIt) {
  Start({EpochJob()}, {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b")},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_FALSE(api_->status_patches().back().contains("totalSteps"));

  Ready({"mnist-worker-a", "mnist-worker-b"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json started = api_->status_patches().back();
  EXPECT_EQ(started["epoch"], 1);
  ASSERT_EQ(started["assignment"].size(), 2u);
  EXPECT_EQ(started["assignment"][0]["virtualNodes"], json({0, 1}));
  EXPECT_EQ(coordinator_.GetPlan(kKey)->members.size(), 2u);
  EXPECT_FALSE(started.contains("totalSteps"));

  // The agents loaded a training set of 1000 samples: 15 steps an epoch, 30 in all.
  Report report;
  report.epoch = 1;
  report.step = 3;
  report.total_steps = 30;
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json known = api_->status_patches().back();
  EXPECT_EQ(known["totalSteps"], 30);
  EXPECT_EQ(known["step"], 3);
}

TEST_F(ReconcilerTest, StepJobLengthIsKnownFromItsSpec) {
  Start({Job({{"virtualNodes", 4}, {"globalBatchSize", 64}, {"steps", 25}})}, {},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["totalSteps"], 25);
}

json CpuOnlyJob() {
  json job = EpochJob();
  job["spec"]["gpusPerWorker"] = 0;
  job["spec"]["replicas"]["max"] = 4;
  job["spec"]["template"]["spec"] = {
      {"nodeSelector", {{"pool", "cpu"}}},
      {"containers", {{{"name", "worker"}, {"resources", {{"requests", {{"cpu", "1500m"}}}}}}}}};
  return job;
}

json CpuNode(const std::string& name, const std::string& cpu, const std::string& pool) {
  return {{"metadata", {{"name", name}, {"labels", {{"pool", pool}}}}},
          {"spec", json::object()},
          {"status",
           {{"allocatable", {{"cpu", cpu}}},
            {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
}

TEST_F(ReconcilerTest, ACpuOnlyJobGetsTheWorkersItsNodesCpusFit) {
  // 4 CPUs on the node its selector allows fit two workers of 1.5 CPUs, whatever replicas.max
  // and the other node (and the GPU node) would allow.
  Start({CpuOnlyJob()}, {},
        {CpuNode("cpu-a", "4", "cpu"), CpuNode("cpu-b", "64", "other"), GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 2u);
  const json& resources = pods[0]["spec"]["containers"][0]["resources"];
  EXPECT_EQ(resources["requests"]["cpu"], "1500m");
  EXPECT_FALSE(resources.value("limits", json::object()).contains("nvidia.com/gpu"));
  EXPECT_EQ(api_->status_patches().back()["desiredWorkers"], 2);
}

TEST_F(ReconcilerTest, ACpuOnlyJobsWorkersOnACpuNodeStartTraining) {
  json a = RunningPod("mnist-worker-a");
  json b = RunningPod("mnist-worker-b");
  for (json* pod : {&a, &b}) (*pod)["spec"]["nodeName"] = "cpu-a";
  Start({CpuOnlyJob()}, {a, b}, {CpuNode("cpu-a", "4", "cpu")});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a", "mnist-worker-b"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["epoch"], 1);
  EXPECT_EQ(coordinator_.GetPlan(kKey)->members.size(), 2u);
}

TEST_F(ReconcilerTest, AGpuJobWhoseSelectorMatchesNoNodeWaits) {
  json job = EpochJob();
  job["spec"]["template"]["spec"] = {{"nodeSelector", {{"pool", "nowhere"}}},
                                     {"containers", {{{"name", "worker"}}}}};
  Start({job}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_pods().empty());
  EXPECT_EQ(api_->status_patches().back()["desiredWorkers"], 0);
}

TEST_F(ReconcilerTest, NewPodsArePinnedToTheProductThePolicyChose) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& pod : api_->created_pods()) {
    EXPECT_EQ(pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"], "V100");
  }
}

// ---------------------------------------------------------------- spec.runPolicy and times

constexpr char kJobPath[] = "/apis/virtualflow.io/v1alpha1/namespaces/team/virtualflowjobs/mnist";

std::string SecondsAgo(int seconds) {
  return kube::FormatTime(std::chrono::system_clock::now() - std::chrono::seconds(seconds));
}

json StepJob(const json& run_policy, const json& status) {
  json job = Job({{"virtualNodes", 4}, {"globalBatchSize", 64}, {"steps", 25}});
  if (!run_policy.is_null()) job["spec"]["runPolicy"] = run_policy;
  if (!status.is_null()) {
    job["status"] = status;
    job["status"]["observedGeneration"] = 1;
  }
  return job;
}

json FailedPod(const std::string& name, int exit_code) {
  json pod = RunningPod(name);
  pod["status"] = {
      {"phase", "Failed"},
      {"containerStatuses",
       {{{"state", {{"terminated", {{"exitCode", exit_code}, {"message", "out of memory"}}}}}}}}};
  return pod;
}

const json* Condition(const json& status, const std::string& type) {
  for (const json& c : status["conditions"]) {
    if (c["type"] == type) return &c;
  }
  return nullptr;
}

TEST_F(ReconcilerTest, MoreWorkerFailuresThanTheBackoffLimitFailTheJob) {
  Start({StepJob({{"backoffLimit", 1}}, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 1), FailedPod("mnist-worker-b", 137)}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Failed");
  EXPECT_EQ(status["message"],
            "2 worker failures, more than spec.runPolicy.backoffLimit (1) allows");
  EXPECT_EQ(status["restarts"]["failure"], 2);
  const json* failed = Condition(status, "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["reason"], "BackoffLimitExceeded");
  EXPECT_EQ(status["failed"], 2);
  // batch/v1: a failed job has no completionTime; its Failed condition says when.
  EXPECT_FALSE(status.contains("completionTime"));
  const std::vector<std::string> events = api_->event_reasons();
  EXPECT_EQ(events.back(), "BackoffLimitExceeded");
  EXPECT_FALSE(coordinator_.GetJob(kKey).ok());  // its workers stop
  EXPECT_TRUE(api_->created_pods().empty());     // and none replaces them
}

TEST_F(ReconcilerTest, WorkerFailuresUpToTheBackoffLimitAreRetried) {
  Start({StepJob({{"backoffLimit", 2}}, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 1), FailedPod("mnist-worker-b", 1)}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_NE(status["phase"], "Failed");
  EXPECT_EQ(status["restarts"]["failure"], 2);
  EXPECT_FALSE(status.contains("completionTime"));
}

TEST_F(ReconcilerTest, AJobPastItsActiveDeadlineFailsWithDeadlineExceeded) {
  const std::string start = SecondsAgo(120);
  Start({StepJob({{"activeDeadlineSeconds", 60}}, {{"phase", "Running"}, {"startTime", start}})},
        {RunningPod("mnist-worker-a")}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> patches = api_->status_patches();
  ASSERT_EQ(patches.size(), 1u);
  EXPECT_EQ(patches[0]["phase"], "Failed");
  const json* failed = Condition(patches[0], "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["reason"], "DeadlineExceeded");
  EXPECT_NE(patches[0]["message"].get<std::string>().find(
                "past spec.runPolicy.activeDeadlineSeconds (60)"),
            std::string::npos)
      << patches[0]["message"];
  EXPECT_EQ(patches[0]["startTime"], start);
  EXPECT_FALSE(patches[0].contains("completionTime"));
  EXPECT_EQ(api_->event_reasons().back(), "DeadlineExceeded");
  EXPECT_FALSE(coordinator_.GetJob(kKey).ok());
}

TEST_F(ReconcilerTest, AJobBeforeItsActiveDeadlineRunsOn) {
  Start({StepJob({{"activeDeadlineSeconds", 3600}},
                 {{"phase", "Running"}, {"startTime", SecondsAgo(120)}})},
        {}, {GpuNode("gpu-a", 1)});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_NE(api_->status_patches().back()["phase"], "Failed");
  EXPECT_GT(result->requeue_after.count(), 0);
  EXPECT_FALSE(api_->created_pods().empty());
}

TEST_F(ReconcilerTest, AFinishedJobPastItsTtlIsDeleted) {
  Start({StepJob({{"ttlSecondsAfterFinished", 60}}, {{"phase", "Succeeded"},
                                                     {"startTime", SecondsAgo(600)},
                                                     {"completionTime", SecondsAgo(120)}})},
        {}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 1u);
  EXPECT_EQ(deletions[0].first, kJobPath);
  EXPECT_EQ(deletions[0].second["preconditions"]["uid"], kUid);  // this incarnation only
  EXPECT_TRUE(api_->status_patches().empty());
}

TEST_F(ReconcilerTest, AFinishedJobBeforeItsTtlIsLookedAtAgainWhenItRunsOut) {
  const std::string completed = SecondsAgo(10);
  Start({StepJob(
            {{"ttlSecondsAfterFinished", 3600}},
            {{"phase", "Failed"}, {"startTime", SecondsAgo(600)}, {"completionTime", completed}})},
        {}, {});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(api_->deletions().empty());
  EXPECT_TRUE(api_->status_patches().empty());  // completionTime stays as it was
  EXPECT_GT(result->requeue_after, std::chrono::seconds(3580));
  EXPECT_LE(result->requeue_after, std::chrono::seconds(3591));
}

TEST_F(ReconcilerTest, WorkerFailuresDefaultToBatchV1sBackoffLimitOfSix) {
  std::vector<json> pods;
  for (const char* name : {"a", "b", "c", "d", "e", "f"}) {
    pods.push_back(FailedPod(std::string("mnist-worker-") + name, 1));
  }
  Start({StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})}, pods,
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_NE(api_->status_patches().back()["phase"], "Failed");
  EXPECT_EQ(api_->status_patches().back()["failed"], 6);
}

TEST_F(ReconcilerTest, FailuresTheStatusCountedAreNotCountedAgainByARestartedOperator) {
  // As an operator that restarted finds the job: one failure counted, its pod not yet deleted.
  const json counted = {{"phase", "Running"},
                        {"startTime", SecondsAgo(600)},
                        {"failed", 1},
                        {"lastFailureTime", SecondsAgo(300)},
                        {"countedFailedPods", {"mnist-worker-a"}}};
  Start({StepJob({{"backoffLimit", 1}}, counted)}, {FailedPod("mnist-worker-a", 1)},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_NE(status["phase"], "Failed");
  EXPECT_EQ(status["failed"], 1);
  const std::vector<std::string> events = api_->event_reasons();
  EXPECT_EQ(std::count(events.begin(), events.end(), "WorkerFailed"), 0);
}

TEST_F(ReconcilerTest, ASecondFailureAfterARestartFailsTheJobAtItsBackoffLimit) {
  // The count lives in the status: a new failure adds to it, whatever the operator forgot.
  const json counted = {{"phase", "Running"},
                        {"startTime", SecondsAgo(600)},
                        {"failed", 1},
                        {"lastFailureTime", SecondsAgo(300)}};
  Start({StepJob({{"backoffLimit", 1}}, counted)}, {FailedPod("mnist-worker-b", 1)},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Failed");
  EXPECT_EQ(status["failed"], 2);
  EXPECT_EQ((*Condition(status, "Failed"))["reason"], "BackoffLimitExceeded");
}

TEST_F(ReconcilerTest, AFailureIsRecordedInStatusBeforeItsPodIsDeleted) {
  Start({StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 1)}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json first = api_->status_patches().front();
  EXPECT_EQ(first["failed"], 1);
  EXPECT_EQ(first["countedFailedPods"], json::array({"mnist-worker-a"}));
  EXPECT_TRUE(first.contains("lastFailureTime"));
  bool deleted = false;
  for (const auto& [path, body] : api_->deletions()) {
    deleted = deleted || path.find("/pods/mnist-worker-a") != std::string::npos;
  }
  EXPECT_TRUE(deleted);
}

TEST_F(ReconcilerTest, AReplacementWaitsOutTheBackoffAfterAFailure) {
  const json recent = {{"phase", "Running"},
                       {"startTime", SecondsAgo(600)},
                       {"failed", 2},
                       {"lastFailureTime", SecondsAgo(5)}};
  Start({StepJob(nullptr, recent)}, {}, {GpuNode("gpu-a", 1)});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(api_->created_pods().empty());  // 20 s after the second failure
  EXPECT_GT(result->requeue_after.count(), 0);
}

TEST_F(ReconcilerTest, AReplacementIsCreatedOnceTheBackoffIsOver) {
  const json past = {{"phase", "Running"},
                     {"startTime", SecondsAgo(600)},
                     {"failed", 2},
                     {"lastFailureTime", SecondsAgo(21)}};
  Start({StepJob(nullptr, past)}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
}

TEST_F(ReconcilerTest, APodFailurePolicyRuleFailsTheJobAtOnce) {
  const json rules = json::parse(R"({"backoffLimit": 5, "podFailurePolicy": {"rules": [
      {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]}})");
  Start({StepJob(rules, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 42)}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Failed");
  const json* failed = Condition(status, "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ((*failed)["reason"], "PodFailurePolicy");
  EXPECT_NE(
      (*failed)["message"].get<std::string>().find("worker mnist-worker-a failed (exit code 42)"),
      std::string::npos)
      << (*failed)["message"];
  EXPECT_NE((*failed)["message"].get<std::string>().find(
                "matches spec.runPolicy.podFailurePolicy.rules[0], which fails the job"),
            std::string::npos)
      << (*failed)["message"];
  EXPECT_EQ(api_->event_reasons().back(), "PodFailurePolicy");
}

TEST_F(ReconcilerTest, AFailureAPodFailurePolicyIgnoresIsNotCountedNorBackedOff) {
  const json rules = json::parse(R"({"backoffLimit": 0, "podFailurePolicy": {"rules": [
      {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}}]}})");
  Start({StepJob(rules, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {FailedPod("mnist-worker-a", 42)}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_NE(status["phase"], "Failed");
  EXPECT_FALSE(status.contains("failed")) << status;
  EXPECT_EQ(status["restarts"]["failure"], 1);
  EXPECT_FALSE(api_->created_pods().empty());  // replaced at once
}

json FinishedJob(const json& run_policy) {
  return StepJob(run_policy, {{"phase", "Failed"}, {"startTime", SecondsAgo(600)}});
}

std::vector<std::string> DeletedPods(const std::vector<std::pair<std::string, json>>& deletions) {
  std::vector<std::string> out;
  for (const auto& [path, body] : deletions) {
    if (path.find("/pods/") != std::string::npos) out.push_back(path.substr(path.rfind('/') + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(ReconcilerTest, CleanPodPolicyRunningDeletesAFinishedJobsRunningPodsOnly) {
  Start({FinishedJob({{"cleanPodPolicy", "Running"}})},
        {RunningPod("mnist-worker-a"), FailedPod("mnist-worker-b", 1)}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(DeletedPods(api_->deletions()), (std::vector<std::string>{"mnist-worker-a"}));
}

TEST_F(ReconcilerTest, CleanPodPolicyAllDeletesEveryPodOfAFinishedJob) {
  Start({FinishedJob({{"cleanPodPolicy", "All"}})},
        {RunningPod("mnist-worker-a"), FailedPod("mnist-worker-b", 1)}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(DeletedPods(api_->deletions()),
            (std::vector<std::string>{"mnist-worker-a", "mnist-worker-b"}));
}

TEST_F(ReconcilerTest, AFinishedJobKeepsItsPodsByDefault) {
  Start({FinishedJob(nullptr)}, {RunningPod("mnist-worker-a"), FailedPod("mnist-worker-b", 1)}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->deletions().empty());
}

TEST_F(ReconcilerTest, AFailedJobsTtlCountsFromItsFailedCondition) {
  json status = {{"phase", "Failed"},
                 {"startTime", SecondsAgo(600)},
                 {"conditions",
                  {{{"type", "Failed"},
                    {"status", "True"},
                    {"reason", "BackoffLimitExceeded"},
                    {"message", "x"},
                    {"lastTransitionTime", SecondsAgo(120)}}}}};
  Start({StepJob({{"ttlSecondsAfterFinished", 60}}, status)}, {}, {});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->deletions().size(), 1u);
  EXPECT_EQ(api_->deletions()[0].first, kJobPath);
  EXPECT_TRUE(api_->status_patches().empty());  // no completionTime is made up for it
}

TEST_F(ReconcilerTest, ReplicasDesiredCapsTheWorkersAndTheStatusNamesTheSelector) {
  json job = Job({{"virtualNodes", 8},
                  {"globalBatchSize", 256},
                  {"steps", 10},
                  {"replicas", {{"min", 1}, {"max", 4}, {"desired", 2}}}});
  Start({job}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 2u);
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["desiredWorkers"], 2);
  EXPECT_EQ(status["selector"], "virtualflow.io/job=mnist");
}

TEST_F(ReconcilerTest, AFinishedJobWithoutTtlStays) {
  Start({StepJob(nullptr, {{"phase", "Succeeded"}, {"completionTime", SecondsAgo(99999)}})}, {},
        {});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(api_->deletions().empty());
  EXPECT_EQ(result->requeue_after.count(), 0);
}

TEST_F(ReconcilerTest, StartTimeIsSetOnTheFirstPassAndNeverMoves) {
  Start({StepJob(nullptr, nullptr)}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json first = api_->status_patches().back();
  ASSERT_TRUE(first.contains("startTime"));
  EXPECT_FALSE(first.contains("completionTime"));
  // The cache here never sees the write; a later pass still keeps the time it wrote.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["startTime"], first["startTime"]);
}

TEST_F(ReconcilerTest, StartTimeTheServerHoldsIsKept) {
  const std::string start = "2026-01-02T03:04:06Z";
  Start({StepJob(nullptr, {{"phase", "Pending"}, {"startTime", start}})}, {},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["startTime"], start);
}

TEST_F(ReconcilerTest, CompletionTimeIsSetOnceWhenTheJobSucceeds) {
  json a = RunningPod("mnist-worker-a");
  Start({StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})}, {a},
        {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Report report;
  report.epoch = 1;
  report.step = 25;
  report.finished = true;
  report.weights_sha256 = std::string(64, 'a');
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json done = api_->status_patches().back();
  ASSERT_EQ(done["phase"], "Succeeded");
  ASSERT_TRUE(done.contains("completionTime"));
  EXPECT_EQ(done["startTime"], api_->status_patches().front()["startTime"]);
  for (const json& patch : api_->status_patches()) {
    if (patch != done) {
      EXPECT_FALSE(patch.contains("completionTime")) << patch;
    }
  }
}

json SucceededPod(const std::string& name, const std::string& message) {
  json pod = RunningPod(name);
  pod["status"] = {{"phase", "Succeeded"},
                   {"containerStatuses",
                    {{{"state", {{"terminated", {{"exitCode", 0}, {"reason", "Completed"}}}}}}}}};
  if (!message.empty()) {
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = message;
  }
  return pod;
}

// Worker pods named as the operator names them (IsWorkerPodName), for the tests that need it.
constexpr char kRank0[] = "mnist-worker-bbbbb";
constexpr char kRank1[] = "mnist-worker-ccccc";

Report FinalReport(char digest) {
  Report final;
  final.epoch = 1;
  final.step = 25;
  final.loss = 0.5;
  final.test_accuracy = 0.75;
  final.weights_sha256 = std::string(64, digest);
  return final;
}

// A running job whose last plan, of epoch 1, has kRank0 at rank 0 and kRank1 at rank 1.
json TwoWorkerJobStatus() {
  return {{"phase", "Running"},
          {"startTime", SecondsAgo(60)},
          {"epoch", 1},
          {"assignment",
           {{{"worker", kRank0}, {"rank", 0}, {"virtualNodes", {0, 1}}},
            {{"worker", kRank1}, {"rank", 1}, {"virtualNodes", {2, 3}}}}}};
}

size_t Count(const std::vector<std::string>& all, const std::string& one) {
  return static_cast<size_t>(std::count(all.begin(), all.end(), one));
}

// An operator killed after rank 0's final report reached its coordinator and before it wrote
// the status: the new one (a new, empty coordinator) reads the outcome rank 0 left in its pod.
TEST_F(ReconcilerTest, AFinalReportLeftInASucceededPodEndsTheJobAfterARestart) {
  Start({StepJob(nullptr, TwoWorkerJobStatus())},
        {SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, FinalReport('b'))),
         SucceededPod(kRank1, "")},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json done = api_->status_patches().back();
  ASSERT_EQ(done["phase"], "Succeeded") << done;
  EXPECT_EQ(done["weightsSha256"], std::string(64, 'b'));
  EXPECT_EQ(done["step"], 25);
  EXPECT_EQ(done["testAccuracy"], 0.75);
  EXPECT_TRUE(api_->created_pods().empty());  // no worker is started again
  EXPECT_TRUE(api_->deletions().empty());
  EXPECT_EQ(api_->event_reasons().back(), "Succeeded");
  EXPECT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 0u);
}

// The report is left after the final weights were saved: a crash on the way out changes
// nothing of the outcome.
TEST_F(ReconcilerTest, AFinalReportLeftByAWorkerThatCrashedOnItsWayOutEndsTheJob) {
  json crashed = SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, FinalReport('c')));
  crashed["status"]["phase"] = "Failed";
  crashed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] = 139;
  Start({StepJob(nullptr, TwoWorkerJobStatus())}, {crashed}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json done = api_->status_patches().back();
  ASSERT_EQ(done["phase"], "Succeeded") << done;
  EXPECT_EQ(done["weightsSha256"], std::string(64, 'c'));
  EXPECT_TRUE(api_->created_pods().empty());
}

TEST_F(ReconcilerTest, ATerminationMessageThatIsNoFinalReportOfItsPodIsNotTaken) {
  Start({StepJob(nullptr, TwoWorkerJobStatus())},
        {SucceededPod(kRank0, "{\"kind\": \"something else\"}"),
         SucceededPod(kRank1, protocol::FinalReportMessage(kRank0, FinalReport('b')))},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& patch : api_->status_patches()) EXPECT_NE(patch.value("phase", ""), "Succeeded");
  const std::vector<std::string> messages = api_->event_messages();
  ASSERT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 1u);
  EXPECT_NE(std::find_if(messages.begin(), messages.end(),
                         [](const std::string& m) {
                           return m.find(
                                      "pod mnist-worker-ccccc is ignored: its report names "
                                      "another worker (mnist-worker-bbbbb)") != std::string::npos;
                         }),
            messages.end());
}

// A member that was not rank 0 has no outcome to report: its final report, however well formed,
// is ignored, and the job goes on.
TEST_F(ReconcilerTest, AFinalReportFromAWorkerThatWasNotRankZeroIsIgnoredWithAnEvent) {
  Start({StepJob(nullptr, TwoWorkerJobStatus())},
        {RunningPod(kRank0),
         SucceededPod(kRank1, protocol::FinalReportMessage(kRank1, FinalReport('f')))},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& patch : api_->status_patches()) {
    EXPECT_NE(patch.value("phase", ""), "Succeeded") << patch;
    EXPECT_FALSE(patch.contains("weightsSha256")) << patch;
  }
  ASSERT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 1u);
  const std::vector<std::string> reasons = api_->event_reasons();
  const std::string message = api_->event_messages().at(static_cast<size_t>(
      std::find(reasons.begin(), reasons.end(), "ForgedOutcomeIgnored") - reasons.begin()));
  EXPECT_EQ(message,
            "the final report in the termination message of pod mnist-worker-ccccc is ignored: "
            "it was not rank 0 of the job's last plan (mnist-worker-bbbbb was)");
  // Recorded once, not on every pass.
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 1u);
  EXPECT_TRUE(api_->event_patches().empty());
}

// Anyone who may create pods in the namespace can give one the job's label and a termination
// message naming itself, even rank 0's name: without the job's controller reference, or with a
// name the operator never gives, it ends nothing.
TEST_F(ReconcilerTest, AFinalReportFromAPodTheJobDoesNotControlIsIgnoredWithAnEvent) {
  json stranger = SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, FinalReport('e')));
  stranger["metadata"]["ownerReferences"] = json::array();
  json misnamed =
      SucceededPod("mnist-rank0", protocol::FinalReportMessage("mnist-rank0", FinalReport('e')));
  Start({StepJob(nullptr, TwoWorkerJobStatus())}, {stranger, misnamed}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& patch : api_->status_patches()) {
    EXPECT_NE(patch.value("phase", ""), "Succeeded") << patch;
  }
  EXPECT_EQ(Count(api_->event_reasons(), "ForgedOutcomeIgnored"), 2u);
  const std::vector<std::string> messages = api_->event_messages();
  const auto said = [&messages](const std::string& text) {
    return std::any_of(messages.begin(), messages.end(),
                       [&text](const std::string& m) { return m.find(text) != std::string::npos; });
  };
  EXPECT_TRUE(
      said("pod mnist-worker-bbbbb is ignored: the job does not control it (no owner "
           "reference with controller true to uid u-1)"));
  EXPECT_TRUE(
      said("pod mnist-rank0 is ignored: its name is not one the operator gives the "
           "job's worker pods"));
  // Neither counts as a worker of the job: no credential is accepted for them.
  const std::string secret = DeriveJobSecret(kJobKey, kUid).value();
  EXPECT_EQ(
      coordinator_.CheckCredential(kKey, kRank0, WorkerCredential(secret, kRank0).value()).code(),
      StatusCode::kUnauthenticated);
}

// The operator's own plan, newer than what the cache shows of the status (a plan published a
// moment ago), says who rank 0 is.
TEST_F(ReconcilerTest, RankZeroIsOfTheNewestPlanTheOperatorKnows) {
  Start({StepJob(nullptr, TwoWorkerJobStatus())}, {RunningPod(kRank0), RunningPod(kRank1)},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());  // restores the plan of epoch 1
  ASSERT_TRUE(
      coordinator_.PublishPlanWithEpoch(kKey, 5, {{kRank1, 0, {0, 1}}, {kRank0, 1, {2, 3}}}).ok());
  Reset();
  Start({StepJob(nullptr, TwoWorkerJobStatus())},
        {SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, FinalReport('d'))),
         RunningPod(kRank1)},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (const json& patch : api_->status_patches()) {
    EXPECT_NE(patch.value("phase", ""), "Succeeded") << patch;
  }
  const std::vector<std::string> messages = api_->event_messages();
  EXPECT_TRUE(std::any_of(messages.begin(), messages.end(), [](const std::string& m) {
    return m.find("not rank 0 of the job's last plan (mnist-worker-ccccc was)") !=
           std::string::npos;
  }));
}

// ---------------------------------------------------------------- errors and Events

TEST_F(ReconcilerTest, APodTheQuotaRefusesIsAConditionAndOneWarningEventCounted) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 4)});
  api_->RefusePods(true);
  Result<ReconcileResult> first = reconciler_->Reconcile(kKey);
  ASSERT_FALSE(first.ok());  // the work queue retries it, with backoff
  EXPECT_NE(first.status().message().find("exceeded quota"), std::string::npos);
  const json status = api_->status_patches().back();
  const json* blocked = Condition(status, "ReconcileError");
  ASSERT_NE(blocked, nullptr) << status;
  EXPECT_EQ((*blocked)["status"], "True");
  EXPECT_EQ((*blocked)["reason"], "FailedCreatePod");
  const std::string message = (*blocked)["message"];
  EXPECT_NE(message.find("Forbidden"), std::string::npos) << message;
  EXPECT_NE(message.find("exceeded quota: gpus"), std::string::npos) << message;
  // The random pod name is left out, so that every retry reads the same.
  EXPECT_NE(message.find("pods \"mnist-worker-*\" is forbidden"), std::string::npos) << message;
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"FailedCreatePod"}));
  EXPECT_TRUE(api_->event_patches().empty());

  // The retries: the same Event, its count going up, not a new one each time.
  ASSERT_FALSE(reconciler_->Reconcile(kKey).ok());
  ASSERT_FALSE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"FailedCreatePod"}));
  const auto patches = api_->event_patches();
  ASSERT_EQ(patches.size(), 2u);
  EXPECT_EQ(patches[0].first, patches[1].first);
  EXPECT_EQ(patches[0].second["count"], 2);
  EXPECT_EQ(patches[1].second["count"], 3);
  EXPECT_TRUE(patches[1].second.contains("lastTimestamp"));

  api_->RefusePods(false);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 2u);
}

TEST_F(ReconcilerTest, APassThatSucceedsClearsReconcileError) {
  json status = {{"phase", "Pending"},
                 {"conditions",
                  {{{"type", "ReconcileError"},
                    {"status", "True"},
                    {"reason", "FailedCreatePod"},
                    {"message", "exceeded quota"}}}}};
  Start({StepJob(nullptr, status)}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json after = api_->status_patches().back();
  const json* cleared = Condition(after, "ReconcileError");
  ASSERT_NE(cleared, nullptr);
  EXPECT_EQ((*cleared)["status"], "False");
  EXPECT_EQ((*cleared)["reason"], "Reconciled");
}

TEST_F(ReconcilerTest, AFailedCheckpointIsAConditionAndAWarningEventPerFailure) {
  int failures_counted = 0;  // the operator's vf_operator_job_checkpoint_failures_total
  hooks_.on_checkpoint_failure = [&](const std::string& job) {
    EXPECT_EQ(job, kKey);
    ++failures_counted;
  };
  Start({StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}})},
        {RunningPod("mnist-worker-a")}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(Condition(api_->status_patches().back(), "CheckpointFailing"), nullptr);
  const size_t events_before = api_->event_reasons().size();

  Report report;
  report.epoch = 1;
  report.step = 10;
  report.checkpoint_step = 10;
  report.checkpoint_error = "checkpoint /ckpt/job.state: No space left on device";
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json failing = api_->status_patches().back();
  EXPECT_EQ(failing["phase"], "Running");  // training goes on
  const json* c = Condition(failing, "CheckpointFailing");
  ASSERT_NE(c, nullptr) << failing;
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_EQ((*c)["reason"], "CheckpointWriteFailed");
  EXPECT_NE((*c)["message"].get<std::string>().find("step 10"), std::string::npos);
  EXPECT_NE((*c)["message"].get<std::string>().find("No space left on device"), std::string::npos);
  ASSERT_EQ(api_->event_reasons().size(), events_before + 1);
  EXPECT_EQ(api_->event_reasons().back(), "CheckpointFailed");
  EXPECT_EQ(failures_counted, 1);

  // The same failure seen again is not another Event; the next checkpoint's failure counts.
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->event_patches().empty());
  EXPECT_EQ(failures_counted, 1);
  report.step = report.checkpoint_step = 20;
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->event_reasons().size(), events_before + 1);
  ASSERT_EQ(api_->event_patches().size(), 1u);
  EXPECT_EQ(api_->event_patches()[0].second["count"], 2);
  EXPECT_EQ(failures_counted, 2);
}

// A plan made because a member reported a failure names, in its Recovered event, what was
// reported: a failure that recurs plan after plan (a communicator that cannot be built) shows
// its cause among the job's events, not only "a worker failed".
TEST_F(ReconcilerTest, ARecoveryEventNamesWhatTheMembersReported) {
  json job = StepJob(nullptr, {{"phase", "Running"}, {"startTime", SecondsAgo(60)}});
  job["spec"]["replicas"] = {{"min", 1}, {"max", 2}};
  std::vector<ResizeKind> resizes;  // Reconcile runs on this thread
  hooks_.on_resize = [&resizes](const std::string&, ResizeKind kind, int, int) {
    resizes.push_back(kind);
  };
  Start({job}, {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a", "mnist-worker-b"});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(coordinator_.GetPlan(kKey)->members.size(), 2u);
  const int64_t epoch = coordinator_.GetPlan(kKey)->epoch;
  ASSERT_TRUE(coordinator_
                  .RecordFailure(kKey, "mnist-worker-b", epoch, 0,
                                 "gloo rendezvous (rank 1 of 2): connection refused")
                  .ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(coordinator_.GetPlan(kKey)->epoch, epoch + 1);
  ASSERT_FALSE(api_->event_reasons().empty());
  EXPECT_EQ(api_->event_reasons().back(), "Recovered");
  // The first plan is no resize; the recovery is one, of its kind.
  EXPECT_EQ(resizes, std::vector<ResizeKind>{ResizeKind::kFailure});
  const std::string message = api_->event_messages().back();
  EXPECT_NE(message.find("a worker failed"), std::string::npos) << message;
  EXPECT_NE(message.find("mnist-worker-b reported: gloo rendezvous (rank 1 of 2): connection "
                         "refused"),
            std::string::npos)
      << message;
}

TEST_F(ReconcilerTest, ACheckpointWrittenAgainClearsCheckpointFailing) {
  json status = {{"phase", "Running"},
                 {"startTime", SecondsAgo(60)},
                 {"conditions",
                  {{{"type", "CheckpointFailing"},
                    {"status", "True"},
                    {"reason", "CheckpointWriteFailed"},
                    {"message", "checkpoint at step 10 not written"}}}}};
  Start({StepJob(nullptr, status)}, {RunningPod("mnist-worker-a")}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  Ready({"mnist-worker-a"});
  // Before any worker reported a checkpoint (a restarted operator), the condition stays.
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json before = api_->status_patches().back();
  const json* kept = Condition(before, "CheckpointFailing");
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ((*kept)["status"], "True");

  Report report;
  report.epoch = 1;
  report.step = report.checkpoint_step = 20;
  ASSERT_TRUE(coordinator_.RecordReport(kKey, "mnist-worker-a", report).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json after = api_->status_patches().back();
  const json* cleared = Condition(after, "CheckpointFailing");
  ASSERT_NE(cleared, nullptr);
  EXPECT_EQ((*cleared)["status"], "False");
  EXPECT_EQ((*cleared)["reason"], "CheckpointWritten");
  EXPECT_EQ(api_->event_reasons().back(), "CheckpointWritten");
}

// ---------------------------------------------------------------- spec.suspend

json Suspended(json job, bool suspend) {
  job["spec"]["suspend"] = suspend;
  return job;
}

TEST_F(ReconcilerTest, SuspendingARunningJobDeletesItsPodsAndSaysSo) {
  Start({Suspended(StepJob({{"activeDeadlineSeconds", 60}},
                           {{"phase", "Running"},
                            {"startTime", SecondsAgo(600)},  // past the deadline: not failed
                            {"epoch", 3},
                            {"assignment", {{{"worker", "mnist-worker-a"}, {"rank", 0}}}},
                            {"workerImage", "virtualflow/agent:1"},
                            {"workerBuild", "virtualflow 0.1.0"}}),
                   true)},
        {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(coordinator_.AddJob(kKey, "secret", "fp", "build").ok());
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_GT(result->requeue_after.count(), 0);  // counts the stopping pods down
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 2u);
  EXPECT_EQ(deletions[0].first, "/api/v1/namespaces/team/pods/mnist-worker-a");
  EXPECT_FALSE(deletions[0].second.contains("gracePeriodSeconds"));  // the pod's own
  EXPECT_EQ(deletions[1].first, "/api/v1/namespaces/team/pods/mnist-worker-b");
  EXPECT_TRUE(api_->created_pods().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Suspended");
  EXPECT_EQ(status["workers"], 0);
  EXPECT_EQ(status["assignment"], json::array());
  EXPECT_EQ(status["epoch"], 3);
  EXPECT_TRUE(status["startTime"].is_null());    // the deadline counts again from the resume
  EXPECT_TRUE(status["workerImage"].is_null());  // resumed, it starts on the image of then
  EXPECT_TRUE(status["workerBuild"].is_null());
  const json* suspended = Condition(status, "Suspended");
  ASSERT_NE(suspended, nullptr);
  EXPECT_EQ((*suspended)["status"], "True");
  EXPECT_EQ((*suspended)["reason"], "JobSuspended");
  EXPECT_EQ((*Condition(status, "Running"))["status"], "False");
  EXPECT_EQ(Condition(status, "Failed"), nullptr);
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Suspended"}));
  EXPECT_FALSE(coordinator_.GetJob(kKey).ok());  // its workers have no plan to follow
}

TEST_F(ReconcilerTest, AJobCreatedSuspendedGetsNoPodsAndNoStartTime) {
  Start({Suspended(StepJob(nullptr, nullptr), true)}, {}, {GpuNode("gpu-a", 1)});
  const Result<ReconcileResult> result = reconciler_->Reconcile(kKey);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->requeue_after.count(), 0);
  EXPECT_TRUE(api_->created_pods().empty());
  EXPECT_TRUE(api_->deletions().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Suspended");
  EXPECT_FALSE(status.contains("startTime") && !status["startTime"].is_null());
}

TEST_F(ReconcilerTest, ResumingAJobCreatesPodsAndRestartsItsStartTime) {
  const std::string old_start = SecondsAgo(600);
  json job = StepJob({{"activeDeadlineSeconds", 60}}, {{"phase", "Suspended"},
                                                       {"epoch", 3},
                                                       {"assignment", json::array()},
                                                       {"conditions",
                                                        {{{"type", "Suspended"},
                                                          {"status", "True"},
                                                          {"reason", "JobSuspended"},
                                                          {"message", "job suspended"},
                                                          {"lastTransitionTime", old_start}}}}});
  Start({Suspended(job, false)}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Pending");
  ASSERT_TRUE(status.contains("startTime"));
  EXPECT_GT(status["startTime"].get<std::string>(), old_start);
  const json* suspended = Condition(status, "Suspended");
  ASSERT_NE(suspended, nullptr);
  EXPECT_EQ((*suspended)["status"], "False");
  EXPECT_EQ((*suspended)["reason"], "JobResumed");
  const std::vector<std::string> events = api_->event_reasons();
  EXPECT_EQ(events.front(), "Resumed");
  // The coordinator continues the epochs the status counted.
  EXPECT_EQ(coordinator_.GetPlan(kKey)->epoch, 3);
}

TEST_F(ReconcilerTest, ASuspendedJobTakesNoGpusFromAnother) {
  json other = StepJob(nullptr, nullptr);
  other["metadata"]["name"] = "other";
  other["metadata"]["uid"] = "u-2";
  other["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z";  // first in line, but suspended
  other["spec"]["replicas"] = {{"min", 1}, {"max", 1}};
  json mine = StepJob(nullptr, nullptr);
  mine["spec"]["replicas"] = {{"min", 1}, {"max", 1}};
  Start({Suspended(other, true), mine}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
}

// ---------------------------------------------------------------- status.workerCounts

json PendingPod(const std::string& name) {
  json pod = RunningPod(name);
  pod["spec"].erase("nodeName");
  pod["status"] = {{"phase", "Pending"}};
  return pod;
}

json TerminatingPod(const std::string& name) {
  json pod = RunningPod(name);
  pod["metadata"]["deletionTimestamp"] = "2026-01-02T03:05:00Z";
  return pod;
}

TEST_F(ReconcilerTest, WorkerCountsSayWhereEachPodIs) {
  json job = EpochJob();
  job["spec"]["replicas"]["max"] = 4;
  Start({job},
        {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b"), RunningPod("mnist-worker-c"),
         PendingPod("mnist-worker-e"), TerminatingPod("mnist-worker-f"),
         FailedPod("mnist-worker-g", 1)},
        {GpuNode("gpu-a", 6)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());  // registers the job with the coordinator
  ASSERT_TRUE(coordinator_.GetJob(kKey).ok()) << api_->status_patches().back().dump();
  // a and b train; c is warming up outside the plan.
  Ready({"mnist-worker-a", "mnist-worker-b"});
  const Result<Plan> plan = coordinator_.PublishPlanWithEpoch(
      kKey, 1, {{"mnist-worker-a", 0, {0, 1}}, {"mnist-worker-b", 1, {2, 3}}});
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const size_t created_before = api_->created_pods().size();
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json counts = api_->status_patches().back()["workerCounts"];
  EXPECT_EQ(counts["training"], 2) << counts;
  EXPECT_EQ(counts["joining"], 1) << counts;
  EXPECT_EQ(counts["leaving"], 1) << counts;  // f, being deleted
  EXPECT_EQ(counts["failed"], 1) << counts;
  // e, and whatever the policy had created on top this pass.
  EXPECT_EQ(counts["pending"], 1 + static_cast<int>(api_->created_pods().size() - created_before))
      << counts;
}

// ---------------------------------------------------------------- what a new job costs

// A pod as the API server made it from `body` (what a reconcile created) a moment ago, pending.
json AsCreated(json body) {
  json& meta = body["metadata"];
  meta["namespace"] = "team";
  meta["uid"] = "pod-" + meta.value("name", "");
  meta["creationTimestamp"] = SecondsAgo(0);
  body["status"] = {{"phase", "Pending"}};
  return body;
}

TEST_F(ReconcilerTest, ANewJobsFirstPodsAreInItsCreatedConditionWithoutAnEvent) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->created_pods().size(), 2u);
  // The status says it, with the moment: no Event (a request for every job) says it again.
  EXPECT_EQ(api_->event_reasons(), std::vector<std::string>{});
  const json status = api_->status_patches().back();
  const json* created = Condition(status, "Created");
  ASSERT_NE(created, nullptr) << status;
  EXPECT_EQ((*created)["status"], "True");
  EXPECT_EQ((*created)["reason"], "PodsCreated");
  EXPECT_TRUE((*created)["lastTransitionTime"].is_string());
  EXPECT_EQ(status["workerCounts"]["pending"], 2);
  EXPECT_EQ(status["desiredWorkers"], 2);
}

TEST_F(ReconcilerTest, PodsCreatedForAJobThatHadSomeAreAnEvent) {
  json job = EpochJob();
  job["status"] = {{"phase", "Pending"},
                   {"conditions",
                    {{{"type", "Created"},
                      {"status", "True"},
                      {"reason", "PodsCreated"},
                      {"message", "worker pods were created"},
                      {"lastTransitionTime", SecondsAgo(60)}}}}};
  Start({job}, {PendingPod("mnist-worker-a")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
  EXPECT_EQ(api_->event_reasons(), std::vector<std::string>{"WorkersCreated"});
}

TEST_F(ReconcilerTest, ANewJobsStatusStaysAsWrittenOnceItsPodsAreSeen) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->status_patches().size(), 1u);
  json job = EpochJob();
  job["status"] = api_->status_patches().back();
  std::vector<json> pods;
  for (const json& body : api_->created_pods()) pods.push_back(AsCreated(body));
  ASSERT_EQ(pods.size(), 2u);
  // A moment later: the cache shows the status written and the pods, pending and warming up.
  Reset();
  Start({job}, pods, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 0u);
  EXPECT_EQ(api_->status_patches().size(), 0u) << api_->status_patches().back() << "\nover\n"
                                               << job["status"];
}

// ---------------------------------------------------------------- spec.elasticity.policy

TEST_F(ReconcilerTest, AJobThatNamesItsPolicyIsSizedByIt) {
  // The operator runs the elastic policy (its --policy); autoscale starts at the minimum.
  json job = EpochJob();
  job["spec"]["replicas"]["max"] = 4;
  job["spec"]["elasticity"] = {{"policy", "autoscale"}};
  Start({job}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 1u);
}

TEST_F(ReconcilerTest, AJobThatNamesNoPolicyGetsTheOperators) {
  json job = EpochJob();
  job["spec"]["replicas"]["max"] = 4;
  Start({job}, {}, {GpuNode("gpu-a", 4)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_pods().size(), 4u);  // elastic: the idle GPUs, lent
}

// ---------------------------------------------------------------- the workers' image

json PodOfImage(json pod, const std::string& image) {
  pod["spec"]["containers"][0]["image"] = image;
  return pod;
}

// A running job of two workers at most, one of them a member of plan 1, with `status` added.
json RunningJobOf(const json& status) {
  json job = StepJob(
      nullptr, {{"phase", "Running"},
                {"startTime", SecondsAgo(60)},
                {"epoch", 1},
                {"assignment",
                 {{{"worker", "mnist-worker-a"}, {"rank", 0}, {"virtualNodes", {0, 1, 2, 3}}}}}});
  job["spec"]["replicas"] = {{"min", 1}, {"max", 2}};
  for (const auto& [k, v] : status.items()) job["status"][k] = v;
  return job;
}

TEST_F(ReconcilerTest, ANewJobRecordsTheImageItsFirstPodsRun) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 2u);
  for (const json& pod : pods) {
    EXPECT_EQ(pod["spec"]["containers"][0]["image"], "virtualflow/agent:1");
  }
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["workerImage"], "virtualflow/agent:1");
  EXPECT_EQ(Condition(status, "ImageKept"), nullptr);
}

TEST_F(ReconcilerTest, AJobWithATemplateImageRunsItWhateverTheDefault) {
  json job = EpochJob();
  job["spec"]["template"]["spec"]["containers"] = {
      {{"name", "worker"}, {"image", "example/train:3"}}};
  default_image_ = "virtualflow/agent:2";
  Start({job}, {}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->created_pods().size(), 1u);
  EXPECT_EQ(api_->created_pods()[0]["spec"]["containers"][0]["image"], "example/train:3");
  EXPECT_EQ(api_->status_patches().back()["workerImage"], "example/train:3");
}

// An operator upgraded with a new default image: a running job's new pods (a joiner here) run
// the image its workers run, and the job says why it is not the default.
TEST_F(ReconcilerTest, ARunningJobsNewPodsRunItsImageAfterTheDefaultChanged) {
  default_image_ = "virtualflow/agent:2";
  Start({RunningJobOf({{"workerImage", "virtualflow/agent:1"}})},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0]["spec"]["containers"][0]["image"], "virtualflow/agent:1");
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["workerImage"], "virtualflow/agent:1");
  const json* kept = Condition(status, "ImageKept");
  ASSERT_NE(kept, nullptr) << status;
  EXPECT_EQ((*kept)["status"], "True");
  EXPECT_EQ((*kept)["reason"], "JobStartedOnIt");
  const std::string message = (*kept)["message"];
  EXPECT_NE(message.find("virtualflow/agent:1"), std::string::npos) << message;
  EXPECT_NE(message.find("virtualflow/agent:2"), std::string::npos) << message;
}

// The same job started by an operator that did not record the image: it is read from the
// member's pod.
TEST_F(ReconcilerTest, ARunningJobWithoutARecordedImageKeepsItsPodsImage) {
  default_image_ = "virtualflow/agent:2";
  Start({RunningJobOf(json::object())},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->created_pods().size(), 1u);
  EXPECT_EQ(api_->created_pods()[0]["spec"]["containers"][0]["image"], "virtualflow/agent:1");
  EXPECT_EQ(api_->status_patches().back()["workerImage"], "virtualflow/agent:1");
}

// A worker the coordinator refused for running another build (exit code kExitAnotherBuild)
// fails neither the job (even with backoffLimit 0) nor counts as a worker failure: its pod is
// replaced by one of the job's image, and an Event says so.
TEST_F(ReconcilerTest, AWorkerRefusedForAnotherBuildIsReplacedWithoutFailingTheJob) {
  default_image_ = "virtualflow/agent:2";
  json job = RunningJobOf({{"workerImage", "virtualflow/agent:1"}});
  job["spec"]["runPolicy"] = {{"backoffLimit", 0}};
  Start({job},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1"),
         PodOfImage(FailedPod("mnist-worker-r", kExitAnotherBuild), "virtualflow/agent:2")},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json status = api_->status_patches().back();
  EXPECT_NE(status["phase"], "Failed") << status;
  EXPECT_FALSE(status["restarts"].contains("failure")) << status;
  const std::vector<std::string> events = api_->event_reasons();
  EXPECT_NE(std::find(events.begin(), events.end(), "WorkerRefused"), events.end());
  EXPECT_EQ(std::find(events.begin(), events.end(), "WorkerFailed"), events.end());
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 1u);
  EXPECT_EQ(deletions[0].first, "/api/v1/namespaces/team/pods/mnist-worker-r");
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0]["spec"]["containers"][0]["image"], "virtualflow/agent:1");
}

// The build a member brings is the job's, recorded once one has registered.
TEST_F(ReconcilerTest, TheBuildOfTheMembersIsRecordedOnceOneRegistered) {
  Start({RunningJobOf({{"workerImage", "virtualflow/agent:1"}})},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 1)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_FALSE(api_->status_patches().back().contains("workerBuild"));
  const JobView view = coordinator_.GetJob(kKey).value();
  ASSERT_TRUE(
      coordinator_
          .RegisterWorker(kKey, "mnist-worker-a", view.fingerprint, "virtualflow 0.0.9", true)
          .ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->status_patches().back()["workerBuild"], "virtualflow 0.0.9");
}

// An operator that restarts (an upgrade: another build of its own) expects the recorded build
// from its first pass, so that a pod of that build registering before the members do again is
// taken.
TEST_F(ReconcilerTest, ARestartedOperatorExpectsTheBuildTheStatusRecorded) {
  Start({RunningJobOf(
            {{"workerImage", "virtualflow/agent:1"}, {"workerBuild", "virtualflow 0.0.9"}})},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const JobView view = coordinator_.GetJob(kKey).value();
  EXPECT_EQ(view.build, "virtualflow 0.0.9");
  EXPECT_TRUE(
      coordinator_
          .RegisterWorker(kKey, "mnist-worker-j", view.fingerprint, "virtualflow 0.0.9", false)
          .ok());
}

// ---------------------------------------------------------------- coordinator protocol drain

// A status as the cache shows it once the reconciler's patch is in: the fields it cleared
// (null in the patch) gone.
json Applied(json status) {
  for (auto it = status.begin(); it != status.end();) {
    it = it->is_null() ? status.erase(it) : std::next(it);
  }
  return status;
}

// An operator upgrade that changed the coordinator protocol under a running job: this
// coordinator cannot talk to its workers, so the job is drained on purpose, never failed. Its
// pods are deleted (rank 0 checkpoints its last step as it leaves, since the coordinator no
// longer knows the job), the status says why naming both protocols, and once no pod is left the
// job starts again from its checkpoint on the image a job started now gets, speaking this
// protocol.
TEST_F(ReconcilerTest, AJobOfWorkersOfAnotherProtocolIsDrainedThenStartsAgainFromItsCheckpoint) {
  default_image_ = "virtualflow/agent:2";
  const int64_t theirs = kProtocolVersion + 1;
  json job = RunningJobOf({{"workerImage", "virtualflow/agent:1"},
                           {"workerBuild", "virtualflow 0.0.9"},
                           {"workerProtocol", theirs},
                           {"step", 12}});
  job["spec"]["checkpoint"] = {{"path", "/ckpt/mnist.state"}, {"everySteps", 5}};
  Start({job}, {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")},
        {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_EQ(api_->deletions().size(), 1u);
  EXPECT_EQ(api_->deletions()[0].first, "/api/v1/namespaces/team/pods/mnist-worker-a");
  EXPECT_TRUE(api_->created_pods().empty());
  EXPECT_FALSE(coordinator_.GetJob(kKey).ok());  // forgotten: its workers leave untold
  const json draining = api_->status_patches().back();
  EXPECT_EQ(draining["phase"], "Pending") << draining;
  const json* c = Condition(draining, "Draining");
  ASSERT_NE(c, nullptr) << draining;
  EXPECT_EQ((*c)["status"], "True");
  EXPECT_EQ((*c)["reason"], "CoordinatorProtocolChanged");
  const std::string message = (*c)["message"];
  EXPECT_NE(message.find("the job's workers speak coordinator protocol " + std::to_string(theirs) +
                         " and this operator speaks protocol " + std::to_string(kProtocolVersion)),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("1 worker pod(s) stopping"), std::string::npos) << message;
  EXPECT_NE(message.find("on image virtualflow/agent:2 from its last checkpoint "
                         "(/ckpt/mnist.state)"),
            std::string::npos)
      << message;
  EXPECT_EQ(draining["workerProtocol"], theirs);
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Draining"}));

  // Its pod gone: drained. The job makes way for pods of now, and says so once.
  job["status"] = Applied(draining);
  Start({job}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_pods().empty());
  const json drained = api_->status_patches().back();
  c = Condition(drained, "Draining");
  ASSERT_NE(c, nullptr) << drained;
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], "RestartedFromCheckpoint");
  EXPECT_EQ(drained["workerProtocol"], kProtocolVersion);
  EXPECT_TRUE(drained["workerImage"].is_null()) << drained;
  EXPECT_TRUE(drained["workerBuild"].is_null()) << drained;
  EXPECT_EQ(drained["step"], 12);  // the checkpoint keeps it
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Restarted"}));
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());  // the cache has not seen the write yet
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Restarted"}));

  // Started again: pods of the image a job started now gets, under this protocol.
  job["status"] = Applied(drained);
  Start({job}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  ASSERT_FALSE(api_->created_pods().empty());
  EXPECT_EQ(api_->created_pods()[0]["spec"]["containers"][0]["image"], "virtualflow/agent:2");
  EXPECT_TRUE(api_->deletions().empty());
  const json started = api_->status_patches().back();
  EXPECT_EQ(started["workerImage"], "virtualflow/agent:2");
  EXPECT_EQ(started["workerProtocol"], kProtocolVersion);
  c = Condition(started, "Draining");
  ASSERT_NE(c, nullptr) << started;
  EXPECT_EQ((*c)["reason"], "RestartedFromCheckpoint");
  EXPECT_TRUE(coordinator_.GetJob(kKey).ok());
}

// Without spec.checkpoint.path there is nothing to resume from: the job starts again from step
// 0, and says so (a Warning, since its progress is lost).
TEST_F(ReconcilerTest, ADrainedJobWithoutACheckpointStartsAgainFromStepZeroSayingSo) {
  json job = RunningJobOf({{"workerProtocol", kProtocolVersion + 1}, {"step", 12}, {"loss", 0.5}});
  Start({job}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const json drained = api_->status_patches().back();
  EXPECT_EQ(drained["phase"], "Pending");
  EXPECT_EQ(drained["step"], 0);
  EXPECT_TRUE(drained["loss"].is_null()) << drained;
  const json* c = Condition(drained, "Draining");
  ASSERT_NE(c, nullptr) << drained;
  EXPECT_EQ((*c)["status"], "False");
  EXPECT_EQ((*c)["reason"], "RestartedFromStepZero");
  EXPECT_NE((*c)["message"].get<std::string>().find("from step 0: it has no spec.checkpoint.path"),
            std::string::npos)
      << (*c)["message"];
  EXPECT_EQ(api_->event_reasons(), (std::vector<std::string>{"Draining", "Restarted"}));
}

// A job an operator from before status.workerProtocol started: its workers speak protocol 1,
// the only one there was, so under an operator of protocol 1 they keep running, and the
// protocol is recorded.
TEST_F(ReconcilerTest, AJobStartedBeforeTheProtocolWasRecordedSpeaksOneAndIsKept) {
  static_assert(kProtocolVersion == 1, "a job without status.workerProtocol speaks 1");
  Start({RunningJobOf({{"workerImage", "virtualflow/agent:1"}})},
        {PodOfImage(RunningPod("mnist-worker-a"), "virtualflow/agent:1")}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->deletions().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["workerProtocol"], 1);
  EXPECT_EQ(Condition(status, "Draining"), nullptr);
  EXPECT_TRUE(coordinator_.GetJob(kKey).ok());
}

// Rank 0 finished the job before the upgrade and left its final report in its pod: the job
// succeeds with it; nothing is drained.
TEST_F(ReconcilerTest, AJobThatFinishedUnderItsOldWorkersSucceedsRatherThanDrains) {
  Report final;
  final.epoch = 1;
  final.step = 25;
  final.finished = true;
  final.weights_sha256 = std::string(64, 'a');
  const json assignment = {{{"worker", kRank0}, {"rank", 0}, {"virtualNodes", {0, 1, 2, 3}}}};
  Start({RunningJobOf({{"workerProtocol", kProtocolVersion + 1}, {"assignment", assignment}})},
        {SucceededPod(kRank0, protocol::FinalReportMessage(kRank0, final))}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->deletions().empty());
  const json status = api_->status_patches().back();
  EXPECT_EQ(status["phase"], "Succeeded") << status;
  EXPECT_EQ(Condition(status, "Draining"), nullptr);
}

// ---------------------------------------------------------------- credentials

// The credential of `worker` of the test's job, as the operator mints it.
std::string CredentialOf(const std::string& worker) {
  return WorkerCredential(DeriveJobSecret(kJobKey, kUid).value(), worker).value();
}

// A credential is a function of its worker's name: it is revoked by the coordinator refusing
// it once its worker has nothing left to say (its pod ended, or it acknowledged a plan without
// it).
TEST_F(ReconcilerTest, AWorkerWhosePodEndedOrThatLeftItsPlanLosesItsCredential) {
  json job = EpochJob();
  job["status"] = {{"phase", "Running"},
                   {"epoch", 1},
                   {"assignment",
                    {{{"worker", "mnist-worker-a"}, {"rank", 0}, {"virtualNodes", {0, 1}}},
                     {{"worker", "mnist-worker-b"}, {"rank", 1}, {"virtualNodes", {2, 3}}}}}};
  Start(
      {job},
      {RunningPod("mnist-worker-a"), RunningPod("mnist-worker-b"), FailedPod("mnist-worker-c", 1)},
      {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const auto check = [this](const std::string& worker) {
    return coordinator_.CheckCredential(kKey, worker, CredentialOf(worker)).code();
  };
  EXPECT_EQ(check("mnist-worker-a"), StatusCode::kOk);
  EXPECT_EQ(check("mnist-worker-b"), StatusCode::kOk);
  EXPECT_EQ(check("mnist-worker-c"), StatusCode::kUnauthenticated);  // its pod failed
  EXPECT_EQ(check("mnist-worker-x"), StatusCode::kUnauthenticated);  // no pod at all

  // b leaves: a plan without it, which it acknowledges on its way out.
  Ready({"mnist-worker-a", "mnist-worker-b"});
  ASSERT_TRUE(
      coordinator_.PublishPlanWithEpoch(kKey, 7, {{"mnist-worker-a", 0, {0, 1, 2, 3}}}).ok());
  ASSERT_TRUE(coordinator_.AckPlan(kKey, "mnist-worker-b", 7).ok());
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(check("mnist-worker-a"), StatusCode::kOk);
  EXPECT_EQ(check("mnist-worker-b"), StatusCode::kUnauthenticated);
}

TEST_F(ReconcilerTest, AWorkerWhosePodIsDeletedLosesItsCredential) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  const std::vector<json> created = api_->created_pods();
  ASSERT_EQ(created.size(), 2u);
  const std::string kept = created[0]["metadata"]["name"];
  const std::string deleted = created[1]["metadata"]["name"];
  EXPECT_TRUE(coordinator_.CheckCredential(kKey, deleted, CredentialOf(deleted)).ok());
  // A later moment, seen by the operator after a restart (same coordinator): one pod runs, the
  // other is gone.
  json running = created[0];
  running["metadata"]["uid"] = "pod-" + kept;
  running["status"] = {{"phase", "Running"}};
  Reset();
  Start({EpochJob()}, {running}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(coordinator_.CheckCredential(kKey, kept, CredentialOf(kept)).ok());
  EXPECT_EQ(coordinator_.CheckCredential(kKey, deleted, CredentialOf(deleted)).code(),
            StatusCode::kUnauthenticated);
}

// The operator died between creating a pod and its Secret, or someone deleted the Secret: the
// pod, which would wait for it forever, is replaced, and the replacement gets its credential.
TEST_F(ReconcilerTest, APodWhoseCredentialSecretIsMissingIsReplaced) {
  const std::string stuck = "mnist-worker-bbbbb";
  Start({EpochJob()}, {PendingPod(stuck)}, {GpuNode("gpu-a", 2)});
  api_->LoseSecret(stuck);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  // Asked for with a Secret that holds no credential, which was made: the Secret was missing.
  const std::vector<json> secrets = api_->created_secrets();
  ASSERT_FALSE(secrets.empty());
  EXPECT_EQ(secrets[0]["metadata"]["name"], stuck + "-vf-credential");
  EXPECT_FALSE(secrets[0].contains("stringData")) << secrets[0];
  EXPECT_FALSE(secrets[0].contains("data")) << secrets[0];
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 1u);
  EXPECT_EQ(deletions[0].first, "/api/v1/namespaces/team/pods/" + stuck);
  EXPECT_EQ(deletions[0].second["preconditions"]["uid"], "pod-" + stuck);
  const std::vector<std::string> reasons = api_->event_reasons();
  EXPECT_EQ(Count(reasons, "CredentialSecretMissing"), 1u);
  // It counts for nothing: both workers the policy wants are created, each with its credential.
  const std::vector<json> pods = api_->created_pods();
  ASSERT_EQ(pods.size(), 2u);
  ASSERT_EQ(secrets.size(), 3u);
  for (size_t i = 0; i < pods.size(); ++i) {
    const std::string name = pods[i]["metadata"]["name"];
    EXPECT_EQ(secrets[i + 1]["stringData"]["token"], CredentialOf(name));
  }
  EXPECT_EQ(coordinator_.CheckCredential(kKey, stuck, CredentialOf(stuck)).code(),
            StatusCode::kUnauthenticated);
}

TEST_F(ReconcilerTest, APendingPodWhoseCredentialSecretExistsIsLeftToStart) {
  const std::string pending = "mnist-worker-bbbbb";
  Start({EpochJob()}, {PendingPod(pending)}, {GpuNode("gpu-a", 2)});
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->deletions().empty());
  EXPECT_EQ(api_->created_pods().size(), 1u);  // the pending one counts
  EXPECT_TRUE(coordinator_.CheckCredential(kKey, pending, CredentialOf(pending)).ok());
  // Asked once: the next passes within kCredentialRecheck do not ask again.
  const size_t writes = api_->writes().size();
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  for (size_t i = writes; i < api_->writes().size(); ++i) {
    EXPECT_EQ(api_->writes()[i].find("/secrets"), std::string::npos) << api_->writes()[i];
  }
}

// A Secret of the name the operator gives a new pod's credential exists already: someone else
// made it (the pod's name was drawn a moment ago), and the pod would mount whatever it holds.
TEST_F(ReconcilerTest, ACredentialSecretTheOperatorDidNotMakeIsNotUsed) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  api_->SecretNamesTaken(true);
  Result<ReconcileResult> refused = reconciler_->Reconcile(kKey);
  ASSERT_FALSE(refused.ok());
  ASSERT_EQ(api_->created_pods().size(), 1u);
  const std::string pod = api_->created_pods()[0]["metadata"]["name"];
  EXPECT_TRUE(api_->created_secrets().empty());
  const auto deletions = api_->deletions();
  ASSERT_EQ(deletions.size(), 1u);  // the pod that would have mounted it
  EXPECT_EQ(deletions[0].first, "/api/v1/namespaces/team/pods/" + pod);
  const json status = api_->status_patches().back();
  const json* blocked = Condition(status, "ReconcileError");
  ASSERT_NE(blocked, nullptr) << status;
  EXPECT_EQ((*blocked)["reason"], "CredentialSecretNotOwned");
  EXPECT_NE((*blocked)["message"].get<std::string>().find(
                "Secret team/mnist-worker-*-vf-credential exists and was not made by the operator"),
            std::string::npos)
      << (*blocked)["message"];
  EXPECT_EQ(api_->event_reasons(), std::vector<std::string>{"CredentialSecretNotOwned"});

  api_->SecretNamesTaken(false);
  ASSERT_TRUE(reconciler_->Reconcile(kKey).ok());
  EXPECT_EQ(api_->created_secrets().size(), 2u);
}

TEST_F(ReconcilerTest, APodOfTheDrawnNameThatExistsIsNotAdopted) {
  Start({EpochJob()}, {}, {GpuNode("gpu-a", 2)});
  api_->PodNamesTaken(true);
  ASSERT_FALSE(reconciler_->Reconcile(kKey).ok());
  EXPECT_TRUE(api_->created_secrets().empty());  // no credential for a pod it did not make
  const json status = api_->status_patches().back();
  const json* blocked = Condition(status, "ReconcileError");
  ASSERT_NE(blocked, nullptr) << status;
  EXPECT_EQ((*blocked)["reason"], "WorkerPodNotOwned");
  EXPECT_EQ(api_->event_reasons(), std::vector<std::string>{"WorkerPodNotOwned"});
}

TEST(ResizeKindTest, EachKindOfMembershipChangeHasOneAndTheFirstPlanNone) {
  EXPECT_EQ(ResizeKindOf("grow"), ResizeKind::kGrow);
  EXPECT_EQ(ResizeKindOf("shrink"), ResizeKind::kShrink);
  EXPECT_EQ(ResizeKindOf("failure"), ResizeKind::kFailure);
  EXPECT_EQ(ResizeKindOf("leave"), ResizeKind::kLeave);
  EXPECT_EQ(ResizeKindOf("start"), std::nullopt);
  EXPECT_EQ(ResizeKindOf("worker-lost"), std::nullopt);
}

}  // namespace
}  // namespace vf::controller
