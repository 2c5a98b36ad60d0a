// The reconciler tests' stand-ins and fixture: an API server stand-in (operator/kube/test_util.h)
// that serves a fixed set of objects and records every write, a real coordinator, and the jobs,
// pods and nodes the tests start from. Included by the reconciler_*_test.cc files only.
#pragma once

// GCC's -Wnull-dereference misreads nlohmann::json's value() once inlined at -O2 (as
// operator/kube/leader_election.cc says), in whichever test file happens to inline it; the
// tests that include this header are not the place to work around it call by call.
#pragma GCC diagnostic ignored "-Wnull-dereference"

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
#include "operator/controller/reconciler.h"
#include "operator/kube/client.h"
#include "operator/kube/test_util.h"

namespace vf::controller::reconciler_fixture {

using kube::testing::Connection;
using kube::testing::FakeServer;
using kube::testing::HoldUntil;
using kube::testing::Request;
using nlohmann::json;

inline constexpr char kKey[] = "team/mnist";

inline constexpr char kUid[] = "u-1";

inline constexpr char kJobKey[] = "0123456789abcdef0123456789abcdef";

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

inline json Job(const json& spec) {
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

inline json EpochJob() {
  return Job({{"virtualNodes", 4},
              {"globalBatchSize", 64},
              {"epochs", 2},
              {"replicas", {{"min", 1}, {"max", 2}}}});
}

inline json GpuNode(const std::string& name, int gpus) {
  return {{"metadata", {{"name", name}, {"labels", {{"nvidia.com/gpu.product", "V100"}}}}},
          {"spec", json::object()},
          {"status",
           {{"allocatable", {{"nvidia.com/gpu", std::to_string(gpus)}}},
            {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
}

inline json RunningPod(const std::string& name) {
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

inline const json kScrapers =
    json::array({{{"namespaceSelector", json::object()},
                  {"podSelector", {{"matchLabels", {{"app.kubernetes.io/name", "prometheus"}}}}}}});

// True once `done` holds, polling for up to 10 s.
inline bool WaitFor(const std::function<bool()>& done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

inline json CpuOnlyJob() {
  json job = EpochJob();
  job["spec"]["gpusPerWorker"] = 0;
  job["spec"]["replicas"]["max"] = 4;
  job["spec"]["template"]["spec"] = {
      {"nodeSelector", {{"pool", "cpu"}}},
      {"containers", {{{"name", "worker"}, {"resources", {{"requests", {{"cpu", "1500m"}}}}}}}}};
  return job;
}

inline json CpuNode(const std::string& name, const std::string& cpu, const std::string& pool) {
  return {{"metadata", {{"name", name}, {"labels", {{"pool", pool}}}}},
          {"spec", json::object()},
          {"status",
           {{"allocatable", {{"cpu", cpu}}},
            {"conditions", {{{"type", "Ready"}, {"status", "True"}}}}}}};
}

inline constexpr char kJobPath[] =
    "/apis/virtualflow.io/v1alpha1/namespaces/team/virtualflowjobs/mnist";

inline std::string SecondsAgo(int seconds) {
  return kube::FormatTime(std::chrono::system_clock::now() - std::chrono::seconds(seconds));
}

inline json StepJob(const json& run_policy, const json& status) {
  json job = Job({{"virtualNodes", 4}, {"globalBatchSize", 64}, {"steps", 25}});
  if (!run_policy.is_null()) job["spec"]["runPolicy"] = run_policy;
  if (!status.is_null()) {
    job["status"] = status;
    job["status"]["observedGeneration"] = 1;
  }
  return job;
}

inline json FailedPod(const std::string& name, int exit_code) {
  json pod = RunningPod(name);
  pod["status"] = {
      {"phase", "Failed"},
      {"containerStatuses",
       {{{"state", {{"terminated", {{"exitCode", exit_code}, {"message", "out of memory"}}}}}}}}};
  return pod;
}

inline const json* Condition(const json& status, const std::string& type) {
  for (const json& c : status["conditions"]) {
    if (c["type"] == type) return &c;
  }
  return nullptr;
}

inline json FinishedJob(const json& run_policy) {
  return StepJob(run_policy, {{"phase", "Failed"}, {"startTime", SecondsAgo(600)}});
}

inline std::vector<std::string> DeletedPods(
    const std::vector<std::pair<std::string, json>>& deletions) {
  std::vector<std::string> out;
  for (const auto& [path, body] : deletions) {
    if (path.find("/pods/") != std::string::npos) out.push_back(path.substr(path.rfind('/') + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline json SucceededPod(const std::string& name, const std::string& message) {
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
inline constexpr char kRank0[] = "mnist-worker-bbbbb";

inline constexpr char kRank1[] = "mnist-worker-ccccc";

inline Report FinalReport(char digest) {
  Report final;
  final.epoch = 1;
  final.step = 25;
  final.loss = 0.5;
  final.test_accuracy = 0.75;
  final.weights_sha256 = std::string(64, digest);
  return final;
}

// A running job whose last plan, of epoch 1, has kRank0 at rank 0 and kRank1 at rank 1.
inline json TwoWorkerJobStatus() {
  return {{"phase", "Running"},
          {"startTime", SecondsAgo(60)},
          {"epoch", 1},
          {"assignment",
           {{{"worker", kRank0}, {"rank", 0}, {"virtualNodes", {0, 1}}},
            {{"worker", kRank1}, {"rank", 1}, {"virtualNodes", {2, 3}}}}}};
}

inline size_t Count(const std::vector<std::string>& all, const std::string& one) {
  return static_cast<size_t>(std::count(all.begin(), all.end(), one));
}

inline json Suspended(json job, bool suspend) {
  job["spec"]["suspend"] = suspend;
  return job;
}

inline json PendingPod(const std::string& name) {
  json pod = RunningPod(name);
  pod["spec"].erase("nodeName");
  pod["status"] = {{"phase", "Pending"}};
  return pod;
}

inline json TerminatingPod(const std::string& name) {
  json pod = RunningPod(name);
  pod["metadata"]["deletionTimestamp"] = "2026-01-02T03:05:00Z";
  return pod;
}

// A pod as the API server made it from `body` (what a reconcile created) a moment ago, pending.
inline json AsCreated(json body) {
  json& meta = body["metadata"];
  meta["namespace"] = "team";
  meta["uid"] = "pod-" + meta.value("name", "");
  meta["creationTimestamp"] = SecondsAgo(0);
  body["status"] = {{"phase", "Pending"}};
  return body;
}

inline json PodOfImage(json pod, const std::string& image) {
  pod["spec"]["containers"][0]["image"] = image;
  return pod;
}

// A running job of two workers at most, one of them a member of plan 1, with `status` added.
inline json RunningJobOf(const json& status) {
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

// A status as the cache shows it once the reconciler's patch is in: the fields it cleared
// (null in the patch) gone.
inline json Applied(json status) {
  for (auto it = status.begin(); it != status.end();) {
    it = it->is_null() ? status.erase(it) : std::next(it);
  }
  return status;
}

// The credential of `worker` of the test's job, as the operator mints it.
inline std::string CredentialOf(const std::string& worker) {
  return WorkerCredential(DeriveJobSecret(kJobKey, kUid).value(), worker).value();
}

}  // namespace vf::controller::reconciler_fixture
