#include "operator/controller/worker_pod.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "agent/protocol/messages.h"
#include "operator/controller/inventory.h"
#include "operator/controller/job_spec.h"
#include "operator/controller/job_spec_test_util.h"
#include "operator/controller/run_policy.h"

namespace vf::controller {
namespace {

using nlohmann::json;

json Job() {
  return json::parse(R"({
    "apiVersion": "virtualflow.io/v1alpha1", "kind": "VirtualFlowJob",
    "metadata": {"name": "mnist", "namespace": "team", "uid": "u-1"},
    "spec": {"virtualNodes": 8, "globalBatchSize": 256, "steps": 10, "gpusPerWorker": 2,
             "template": {"spec": {"nodeSelector": {"pool": "gpu"}, "containers": [
                 {"name": "worker", "image": "example/agent:1",
                  "env": [{"name": "X", "value": "1"}]}]}}},
    "status": {"phase": "Running"}})");
}

// The worker container of Job()'s template, and the template's pod spec.
json& Worker(json& job) { return job["spec"]["template"]["spec"]["containers"][0]; }
json& TemplatePod(json& job) { return job["spec"]["template"]["spec"]; }

TEST(WorkerPodTest, BuildsAPodTheAgentCanRun) {
  PodSettings s;
  s.coordinator_url = "http://op:7070";
  s.default_image = "default/agent:0";
  json pod = BuildWorkerPod(Job(), SpecOf(Job()), "mnist-worker-abc", s);
  EXPECT_EQ(pod["metadata"]["name"], "mnist-worker-abc");
  EXPECT_EQ(pod["metadata"]["namespace"], "team");
  EXPECT_EQ(pod["metadata"]["labels"][kJobLabel], "mnist");
  EXPECT_EQ(pod["metadata"]["ownerReferences"][0]["uid"], "u-1");
  EXPECT_TRUE(pod["metadata"]["ownerReferences"][0]["controller"].get<bool>());
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_FALSE(pod["spec"]["automountServiceAccountToken"].get<bool>());
  EXPECT_EQ(pod["spec"]["nodeSelector"]["pool"], "gpu");
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["image"], "example/agent:1");
  EXPECT_EQ(c["resources"]["limits"]["nvidia.com/gpu"], "2");
  const std::vector<std::string> args = c["args"];
  const std::vector<std::string> want = {
      "--coordinator",    "http://op:7070", "--job-id", "team/mnist",     "--worker",
      "mnist-worker-abc", "--token-file",   kTokenFile, "--metrics-port", "9090"};
  EXPECT_EQ(args, want);
  // The template's env first, then the operator's.
  ASSERT_EQ(c["env"].size(), 4u);
  EXPECT_EQ(c["env"][0]["name"], "X");
  EXPECT_EQ(c["env"][1]["name"], "VF_JOB_SPEC");
  json manifest = json::parse(c["env"][1]["value"].get<std::string>());
  EXPECT_EQ(manifest["spec"]["virtualNodes"], 8);
  EXPECT_FALSE(manifest.contains("status"));
  EXPECT_EQ(c["env"][2]["name"], "VF_POD_IP");
  EXPECT_EQ(c["env"][2]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP");
  // Where the agent leaves its final report: the container's termination message.
  EXPECT_EQ(c["env"][3]["name"], "VF_TERMINATION_MESSAGE_PATH");
  EXPECT_EQ(c["env"][3]["value"], kTerminationMessagePath);
  EXPECT_EQ(c["terminationMessagePath"], kTerminationMessagePath);
  // The worker's own credential is a file from the pod's own Secret, never an environment
  // variable, and never the job's secret.
  const json& volumes = pod["spec"]["volumes"];
  ASSERT_EQ(volumes.size(), 2u);
  EXPECT_EQ(volumes[0]["secret"]["secretName"], "mnist-worker-abc-vf-credential");
  EXPECT_EQ(volumes[0]["secret"]["items"][0]["key"], kTokenKey);
  EXPECT_EQ(volumes[1]["emptyDir"]["medium"], "Memory");
  EXPECT_EQ(c["volumeMounts"][0]["mountPath"], kTokenDir);
  EXPECT_EQ(c["volumeMounts"][1]["mountPath"], "/dev/shm");
  EXPECT_EQ(c["readinessProbe"]["httpGet"]["path"], "/readyz");
  EXPECT_EQ(c["livenessProbe"]["httpGet"]["path"], "/healthz");
}

TEST(WorkerPodTest, TheCredentialSecretIsThePodsOwnAndGoesWithIt) {
  json pod = BuildWorkerPod(Job(), SpecOf(Job()), "mnist-worker-abc", PodSettings{});
  pod["metadata"]["uid"] = "pod-uid-1";  // as the API server returns it
  const json secret = BuildCredentialSecret(Job(), pod, "c0ffee");
  EXPECT_EQ(secret["kind"], "Secret");
  EXPECT_EQ(secret["metadata"]["name"], CredentialSecretName("mnist-worker-abc"));
  EXPECT_EQ(secret["metadata"]["name"],
            pod["spec"]["volumes"][0]["secret"]["secretName"].get<std::string>());
  EXPECT_EQ(secret["metadata"]["namespace"], "team");
  EXPECT_EQ(secret["metadata"]["labels"][kJobLabel], "mnist");
  const json& owner = secret["metadata"]["ownerReferences"][0];
  EXPECT_EQ(owner["kind"], "Pod");
  EXPECT_EQ(owner["name"], "mnist-worker-abc");
  EXPECT_EQ(owner["uid"], "pod-uid-1");
  EXPECT_FALSE(owner.contains("controller"));
  EXPECT_FALSE(owner.contains("blockOwnerDeletion"));
  EXPECT_EQ(secret["stringData"][kTokenKey], "c0ffee");
}

TEST(WorkerPodTest, TheNetworkPolicyAdmitsScrapersOnlyOnAKnownMetricsPort) {
  const json scrapers = json::array({{{"podSelector", json::object()}}});
  // No fixed port (0 picks a free one, -1 serves none), or no scrapers: no rule for them.
  for (int port : {0, -1}) {
    const json policy = BuildNetworkPolicy(Job(), port, NetworkPolicySettings{scrapers});
    EXPECT_EQ(policy["spec"]["ingress"].size(), 1u) << port;
  }
  EXPECT_EQ(BuildNetworkPolicy(Job(), 9090, NetworkPolicySettings{})["spec"]["ingress"].size(), 1u);
  const json policy = BuildNetworkPolicy(Job(), 9102, NetworkPolicySettings{scrapers});
  ASSERT_EQ(policy["spec"]["ingress"].size(), 2u);
  EXPECT_EQ(policy["spec"]["ingress"][1]["ports"][0]["port"], 9102);
  // The job's pods are admitted on every port: Gloo's and state transfer's are picked at run
  // time.
  EXPECT_FALSE(policy["spec"]["ingress"][0].contains("ports"));
  // Its name is the job's own, and no pod or Secret the operator makes takes it.
  EXPECT_EQ(policy["metadata"]["name"], NetworkPolicyName("mnist"));
  EXPECT_NE(NetworkPolicyName("a-worker-x"), CredentialSecretName("a-worker-x"));
}

TEST(WorkerPodTest, WithTlsTheCoordinatorsCaIsInTheCredentialSecretAndMounted) {
  PodSettings s;
  s.coordinator_url = "https://op.ops.svc:7070";
  s.coordinator_ca = "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n";
  json pod = BuildWorkerPod(Job(), SpecOf(Job()), "mnist-worker-abc", s);
  pod["metadata"]["uid"] = "pod-uid-1";
  const json secret = BuildCredentialSecret(Job(), pod, "c0ffee", s.coordinator_ca);
  EXPECT_EQ(secret["stringData"][kCaKey], s.coordinator_ca);
  EXPECT_EQ(secret["stringData"].size(), 2u);  // the credential and the CA's certificate only
  const json& items = pod["spec"]["volumes"][0]["secret"]["items"];
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[1]["key"], kCaKey);
  EXPECT_EQ(std::string(kTokenDir) + "/" + items[1]["path"].get<std::string>(), kCaFile);
  const std::vector<std::string> args = pod["spec"]["containers"][0]["args"];
  const auto ca = std::find(args.begin(), args.end(), "--ca-file");
  ASSERT_NE(ca, args.end());
  EXPECT_EQ(*(ca + 1), kCaFile);
  // A user's program gets the same file through its environment.
  json job = Job();
  Worker(job)["command"] = {"python3", "train.py"};
  pod = BuildWorkerPod(job, SpecOf(job), "mnist-worker-x", s);
  std::map<std::string, std::string> env;
  for (const json& e : pod["spec"]["containers"][0]["env"]) env[e["name"]] = e.value("value", "");
  EXPECT_EQ(env["VF_COORDINATOR_CA_FILE"], kCaFile);
  // Without TLS, neither.
  EXPECT_FALSE(BuildCredentialSecret(Job(), pod, "c0ffee")["stringData"].contains(kCaKey));
  EXPECT_EQ(env.count("VF_COORDINATOR_CA_FILE"), 1u);
  pod = BuildWorkerPod(job, SpecOf(job), "mnist-worker-x", PodSettings{});
  for (const json& e : pod["spec"]["containers"][0]["env"]) {
    EXPECT_NE(e["name"], "VF_COORDINATOR_CA_FILE");
  }
}

// What the restricted Pod Security Standard asks of every pod and container.
TEST(WorkerPodTest, PassesTheRestrictedPodSecurityStandardByDefault) {
  json pod = BuildWorkerPod(Job(), SpecOf(Job()), "w", PodSettings{});
  const json& psc = pod["spec"]["securityContext"];
  EXPECT_TRUE(psc["runAsNonRoot"].get<bool>());
  EXPECT_EQ(psc["seccompProfile"]["type"], "RuntimeDefault");
  const json& sc = pod["spec"]["containers"][0]["securityContext"];
  EXPECT_FALSE(sc["allowPrivilegeEscalation"].get<bool>());
  EXPECT_EQ(sc["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_TRUE(sc["runAsNonRoot"].get<bool>());
  // The template's own fields win, key by key.
  json job = Job();
  Worker(job)["securityContext"] = {{"runAsUser", 1000},
                                    {"capabilities", {{"add", {"NET_BIND_SERVICE"}}}}};
  TemplatePod(job)["securityContext"] = {{"fsGroup", 2000}};
  pod = BuildWorkerPod(job, SpecOf(job), "w", PodSettings{});
  const json& merged = pod["spec"]["containers"][0]["securityContext"];
  EXPECT_EQ(merged["runAsUser"], 1000);
  EXPECT_EQ(merged["capabilities"]["drop"], json::array({"ALL"}));
  EXPECT_EQ(merged["capabilities"]["add"], json::array({"NET_BIND_SERVICE"}));
  EXPECT_EQ(pod["spec"]["securityContext"]["fsGroup"], 2000);
  EXPECT_TRUE(pod["spec"]["securityContext"]["runAsNonRoot"].get<bool>());
}

TEST(WorkerPodTest, TheTemplatesPodIsKeptAsWrittenAroundWhatTheOperatorOwns) {
  json job = Job();
  json& t = job["spec"]["template"];
  t["metadata"] = {{"labels", {{"team", "vision"}, {kJobLabel, "spoofed"}}},
                   {"annotations", {{"a", "b"}}}};
  Worker(job)["workingDir"] = "/work";
  Worker(job)["ports"] = json::parse(R"([{"name": "dash", "containerPort": 8265}])");
  Worker(job)["volumeMounts"] = json::parse(R"([{"name": "data", "mountPath": "/data"}])");
  json& pod_spec = TemplatePod(job);
  pod_spec["volumes"] =
      json::parse(R"([{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}])");
  pod_spec["affinity"] = {{"nodeAffinity", json::object()}};
  pod_spec["priorityClassName"] = "high";
  pod_spec["schedulerName"] = "volcano";
  pod_spec["serviceAccountName"] = "trainer";
  pod_spec["imagePullSecrets"] = json::parse(R"([{"name": "registry"}])");
  pod_spec["hostNetwork"] = true;
  pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet";
  pod_spec["terminationGracePeriodSeconds"] = 5;
  pod_spec["restartPolicy"] = "Always";
  pod_spec["schedulingGates"] = json::parse(R"([{"name": "example.com/wait"}])");
  pod_spec["resourceClaims"] = json::parse(R"([{"name": "gpu", "resourceClaimName": "rc"}])");
  pod_spec["topologySpreadConstraints"] = json::parse(
      R"([{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}])");
  pod_spec["initContainers"] = json::parse(R"([{"name": "fetch", "image": "busybox"},
      {"name": "log-shipper", "image": "shipper", "restartPolicy": "Always"}])");
  // A sidecar before the worker: the worker is found by its name and goes first.
  pod_spec["containers"].insert(pod_spec["containers"].begin(),
                                json::parse(R"({"name": "proxy", "image": "envoy"})"));
  const json written = pod_spec;
  json pod = BuildWorkerPod(job, SpecOf(job), "w", PodSettings{}, "NVIDIA-H100");
  EXPECT_EQ(pod["metadata"]["labels"]["team"], "vision");
  EXPECT_EQ(pod["metadata"]["labels"][kJobLabel], "mnist");  // the operator's label wins
  EXPECT_EQ(pod["metadata"]["annotations"]["a"], "b");
  EXPECT_EQ(pod["metadata"]["annotations"][kDefaultContainerAnnotation], "worker");
  const json& spec = pod["spec"];
  ASSERT_EQ(spec["containers"].size(), 2u);
  EXPECT_EQ(spec["containers"][0]["name"], "worker");
  EXPECT_EQ(spec["containers"][1], written["containers"][0]);  // the sidecar, untouched
  EXPECT_EQ(spec["initContainers"], written["initContainers"]);
  EXPECT_EQ(spec["containers"][0]["workingDir"], "/work");
  EXPECT_EQ(spec["containers"][0]["ports"][0]["name"], "dash");
  EXPECT_EQ(spec["containers"][0]["ports"][1]["name"], "metrics");
  EXPECT_EQ(spec["volumes"][0]["name"], "data");
  EXPECT_EQ(spec["containers"][0]["volumeMounts"][0]["mountPath"], "/data");
  for (const char* kept :
       {"priorityClassName", "schedulerName", "serviceAccountName", "imagePullSecrets",
        "hostNetwork", "dnsPolicy", "schedulingGates", "resourceClaims",
        "topologySpreadConstraints", "affinity", "terminationGracePeriodSeconds"}) {
    EXPECT_EQ(spec[kept], written[kept]) << kept;
  }
  EXPECT_EQ(spec["restartPolicy"], "Never");                    // the operator's
  EXPECT_FALSE(spec.contains("automountServiceAccountToken"));  // the account decides
  EXPECT_EQ(spec["nodeSelector"]["pool"], "gpu");
  EXPECT_EQ(spec["nodeSelector"]["nvidia.com/gpu.product"], "NVIDIA-H100");
  // Without a grace period of its own, the operator's.
  TemplatePod(job).erase("terminationGracePeriodSeconds");
  PodSettings s;
  s.termination_grace_seconds = 77;
  EXPECT_EQ(BuildWorkerPod(job, SpecOf(job), "w", s)["spec"]["terminationGracePeriodSeconds"], 77);
}

TEST(WorkerPodTest, TheAcceleratorIsTheWorkerContainersExtendedResource) {
  json job = Job();
  job["spec"].erase("gpusPerWorker");
  Worker(job)["resources"] = {{"limits", {{"nvidia.com/mig-1g.10gb", 1}, {"memory", "8Gi"}}}};
  json pod = BuildWorkerPod(job, SpecOf(job), "w", PodSettings{}, "NVIDIA-H100");
  const json& limits = pod["spec"]["containers"][0]["resources"]["limits"];
  EXPECT_EQ(limits, json({{"nvidia.com/mig-1g.10gb", "1"}, {"memory", "8Gi"}}));
  // A MIG slice is no whole GPU of a product: no product pin.
  EXPECT_FALSE(pod["spec"]["nodeSelector"].contains("nvidia.com/gpu.product"));
  // gpusPerWorker that agrees is the same job; one that disagrees is no job.
  job["spec"]["gpusPerWorker"] = 1;
  EXPECT_TRUE(JobSpecOf(job).ok());
  job["spec"]["gpusPerWorker"] = 2;
  EXPECT_FALSE(JobSpecOf(job).ok());
}

TEST(WorkerPodTest, AUserProgramGetsTheJobInItsEnvironment) {
  json job = Job();
  // A knob of the worker's own passes through; the job's facts are the operator's.
  Worker(job)["env"] =
      json::parse(R"([{"name": "VF_VNODE_DELAY_MS", "value": "8"}, {"name": "X", "value": "1"}])");
  Worker(job)["command"] = {"python3", "train.py"};
  Worker(job)["args"] = {"--lr", "0.1"};
  PodSettings s;
  s.coordinator_url = "http://op:7070";
  json pod = BuildWorkerPod(job, SpecOf(job), "mnist-worker-x", s);
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["command"], json::array({"python3", "train.py"}));
  EXPECT_EQ(c["args"], json::array({"--lr", "0.1"}));
  std::map<std::string, std::string> env;
  for (const json& e : c["env"]) env[e["name"]] = e.value("value", "(ref)");
  EXPECT_EQ(env["VF_COORDINATOR"], "http://op:7070");
  EXPECT_EQ(env["VF_JOB_ID"], "team/mnist");
  EXPECT_EQ(env["VF_WORKER"], "mnist-worker-x");
  EXPECT_EQ(env["VF_JOB_TOKEN_FILE"], kTokenFile);
  EXPECT_EQ(env["VF_METRICS_PORT"], "9090");
  EXPECT_EQ(env["VF_POD_IP"], "(ref)");
  EXPECT_EQ(env["VF_TERMINATION_MESSAGE_PATH"], kTerminationMessagePath);
  EXPECT_EQ(env["VF_VNODE_DELAY_MS"], "8");
  EXPECT_EQ(env["X"], "1");
  EXPECT_EQ(env.count("VF_JOB_TOKEN"), 0u);
}

// The test-only protocol a posing operator hands its workers reaches every pod it creates, and
// no pod template can set it: it is the operator's, never a job's.
TEST(WorkerPodTest, OnlyAPosingOperatorSetsTheTestProtocolOfItsWorkers) {
  json job = Job();
  Worker(job)["env"] = json::parse(
      R"([{"name": "VF_TEST_AGENT_PROTOCOL", "value": "7"}, {"name": "X", "value": "1"}])");
  auto env_of = [&](const PodSettings& s) {
    const json pod = BuildWorkerPod(job, SpecOf(job), "w", s);
    std::map<std::string, std::string> env;
    for (const json& e : pod["spec"]["containers"][0]["env"]) env[e["name"]] = e.value("value", "");
    return env;
  };
  PodSettings s;
  EXPECT_EQ(env_of(s).count(kTestAgentProtocolEnv), 0u);
  EXPECT_EQ(env_of(s)["X"], "1");
  s.test_agent_protocol = 2;
  EXPECT_EQ(env_of(s)[kTestAgentProtocolEnv], "2");
  Worker(job)["command"] = {"python3", "train.py"};
  EXPECT_EQ(env_of(s)[kTestAgentProtocolEnv], "2");
}

TEST(WorkerPodTest, ACpuOnlyWorkerAsksForCpuAndNoGpu) {
  json job = Job();
  job["spec"]["gpusPerWorker"] = 0;
  json pod = BuildWorkerPod(job, SpecOf(job), "w", PodSettings{}, "NVIDIA-H100");
  const json& res = pod["spec"]["containers"][0]["resources"];
  EXPECT_FALSE(res.value("limits", json::object()).contains("nvidia.com/gpu"));
  EXPECT_EQ(res["requests"]["cpu"], kDefaultWorkerCpu);
  EXPECT_FALSE(pod["spec"]["nodeSelector"].contains("nvidia.com/gpu.product"));
  EXPECT_EQ(WorkerCpuMillis(job), 1000);
  Worker(job)["resources"] = {{"requests", {{"cpu", "1500m"}}}};
  EXPECT_EQ(WorkerCpuMillis(job), 1500);
  pod = BuildWorkerPod(job, SpecOf(job), "w", PodSettings{});
  EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"], "1500m");
}

TEST(WorkerPodTest, TemplatesThatCollideWithTheOperatorAreRefused) {
  EXPECT_TRUE(ValidateTemplate(Job()).ok());
  auto refused = [](const char* worker, const char* says) {
    json job = Job();
    json container = json::parse(worker);
    TemplatePod(job)["volumes"] = container["volumes"];
    container.erase("volumes");
    container["name"] = "worker";
    Worker(job) = container;
    Status s = ValidateTemplate(job);
    EXPECT_FALSE(s.ok()) << worker;
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  };
  refused(R"({"volumes": [{"name": "vf-token", "emptyDir": {}}]})",
          "spec.template.spec.volumes: the name vf-token");
  refused(R"({"volumes": [], "volumeMounts": [{"name": "nope", "mountPath": "/x"}]})",
          "spec.template.spec.containers[worker].volumeMounts: /x mounts volume \"nope\"");
  refused(R"({"volumes": [{"name": "m", "emptyDir": {}}],
              "volumeMounts": [{"name": "m", "mountPath": "/dev/shm"}]})",
          "/dev/shm");
  refused(R"({"volumes": [], "env": [{"name": "VF_WORKER", "value": "me"}]})",
          "spec.template.spec.containers[worker].env: VF_WORKER");
  json job = Job();
  Worker(job)["env"] = json::parse(R"([{"name": "VF_THREADS", "value": "2"}])");
  EXPECT_TRUE(ValidateTemplate(job).ok());  // the library's knobs are the user's
}

TEST(WorkerPodTest, TheFinalCheckpointIsFoundOnItsVolume) {
  json job = Job();
  EXPECT_TRUE(FinalCheckpointLocation(job, SpecOf(job)).is_null());
  job["spec"]["checkpoint"] = {{"path", "/ckpt/runs/cnn.ckpt"}};
  json where = FinalCheckpointLocation(job, SpecOf(job));
  EXPECT_EQ(where, json({{"path", "/ckpt/runs/cnn.ckpt"}}));  // on no volume: said so by absence
  TemplatePod(job)["volumes"] =
      json::parse(R"([{"name": "store", "persistentVolumeClaim": {"claimName": "train"}}])");
  Worker(job)["volumeMounts"] =
      json::parse(R"([{"name": "store", "mountPath": "/ckpt/", "subPath": "team"}])");
  where = FinalCheckpointLocation(job, SpecOf(job));
  EXPECT_EQ(where["volume"], "store");
  EXPECT_EQ(where["claimName"], "train");
  EXPECT_EQ(where["subPath"], "team/runs/cnn.ckpt");
}

TEST(WorkerPodTest, DefaultImageAndNoMetricsPort) {
  PodSettings s;
  s.default_image = "default/agent:0";
  s.metrics_port = -1;
  json job = Job();
  Worker(job).erase("image");
  json pod = BuildWorkerPod(job, SpecOf(job), "w", s);
  EXPECT_EQ(pod["spec"]["containers"][0]["image"], "default/agent:0");
  for (const auto& a : pod["spec"]["containers"][0]["args"]) EXPECT_NE(a, "--metrics-port");
  EXPECT_FALSE(pod["spec"]["containers"][0].contains("readinessProbe"));  // nothing to probe
}

json PodOfImage(const std::string& name, const std::string& image, const std::string& phase,
                const std::string& created) {
  return {{"metadata", {{"name", name}, {"creationTimestamp", created}}},
          {"spec", {{"containers", {{{"name", "agent"}, {"image", image}}}}}},
          {"status", {{"phase", phase}}}};
}

// A job without pods starts on what its spec asks for now: its template's image, else the
// operator's default.
TEST(WorkerImageTest, ANewJobStartsOnItsTemplatesImageElseTheDefault) {
  json job = Job();
  job.erase("status");
  EXPECT_EQ(WorkerImage(job, {}, {}, "default/agent:2"), "example/agent:1");
  Worker(job).erase("image");
  EXPECT_EQ(WorkerImage(job, {}, {}, "default/agent:2"), "default/agent:2");
  Worker(job)["image"] = "";
  EXPECT_EQ(StartingImage(job, "default/agent:2"), "default/agent:2");
}

// After an upgrade the default is another image: a running job keeps the one it recorded, and
// so does a job whose template names another image now.
TEST(WorkerImageTest, ARunningJobKeepsItsRecordedImageWhateverTheDefaultBecame) {
  json job = Job();
  Worker(job).erase("image");
  job["status"]["workerImage"] = "default/agent:1";
  const std::vector<json> pods = {
      PodOfImage("mnist-worker-a", "default/agent:1", "Running", "2026-01-02T03:04:05Z")};
  EXPECT_EQ(WorkerImage(job, pods, {"mnist-worker-a"}, "default/agent:2"), "default/agent:1");
  EXPECT_EQ(WorkerImage(job, {}, {"mnist-worker-a"}, "default/agent:2"), "default/agent:1");
  Worker(job)["image"] = "example/agent:3";
  EXPECT_EQ(WorkerImage(job, pods, {"mnist-worker-a"}, "default/agent:2"), "default/agent:1");
  EXPECT_EQ(StartingImage(job, "default/agent:2"), "example/agent:3");
  // No member left to keep a build for (none trains yet, or the job was resumed): a corrected
  // template is taken.
  EXPECT_EQ(WorkerImage(job, pods, {}, "default/agent:2"), "example/agent:3");
}

// A training job whose pods an operator without status.workerImage created: its workers' image
// is read from its pods, a member's first, else the oldest live one; a pod that ended outside
// the plan (refused, say, for running another image) does not count.
TEST(WorkerImageTest, AJobStartedBeforeTheImageWasRecordedKeepsItsPodsImage) {
  json job = Job();
  Worker(job).erase("image");
  const json refused =
      PodOfImage("mnist-worker-r", "default/agent:2", "Failed", "2026-01-02T03:04:01Z");
  const json joiner =
      PodOfImage("mnist-worker-j", "default/agent:2", "Pending", "2026-01-02T03:04:09Z");
  const json older =
      PodOfImage("mnist-worker-o", "default/agent:1", "Running", "2026-01-02T03:04:03Z");
  const json member =
      PodOfImage("mnist-worker-m", "default/agent:0", "Failed", "2026-01-02T03:04:07Z");
  EXPECT_EQ(
      WorkerImage(job, {refused, joiner, older, member}, {"mnist-worker-m"}, "default/agent:2"),
      "default/agent:0");
  // A member whose pod is gone from the cache: the oldest live pod tells.
  EXPECT_EQ(WorkerImage(job, {refused, joiner, older}, {"mnist-worker-x"}, "default/agent:2"),
            "default/agent:1");
  EXPECT_EQ(WorkerImage(job, {refused}, {"mnist-worker-x"}, "default/agent:2"), "default/agent:2");
  EXPECT_EQ(PodImage(json::object()), "");
}

TEST(WorkerPodTest, LifeFollowsPhaseAndDeletion) {
  json pod = {{"metadata", json::object()}, {"status", {{"phase", "Pending"}}}};
  EXPECT_EQ(PodLifeOf(pod), PodLife::kStarting);
  pod["status"]["phase"] = "Running";
  EXPECT_EQ(PodLifeOf(pod), PodLife::kRunning);
  pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  EXPECT_EQ(PodLifeOf(pod), PodLife::kTerminating);
  pod["status"]["phase"] = "Failed";
  pod["status"]["containerStatuses"] =
      json::parse(R"([{"state": {"terminated": {"exitCode": 3, "message": "a\nlast line\n"}}}])");
  EXPECT_EQ(PodLifeOf(pod), PodLife::kFailed);
  EXPECT_EQ(PodExitCode(pod), 3);
  EXPECT_EQ(PodTerminationMessage(pod), "last line");
  EXPECT_EQ(PodExitCode(json::object()), -1);
  pod["status"]["containerStatuses"] = json::parse("[null]");
  EXPECT_EQ(PodExitCode(pod), -1);
}

TEST(WorkerPodTest, MembershipSeesTerminatingPodsLeavingAndSucceededOnesExited) {
  EXPECT_EQ(WorkerLifeOf(PodLife::kStarting), policy::WorkerLife::kStarting);
  EXPECT_EQ(WorkerLifeOf(PodLife::kRunning), policy::WorkerLife::kRunning);
  EXPECT_EQ(WorkerLifeOf(PodLife::kTerminating), policy::WorkerLife::kLeaving);
  EXPECT_EQ(WorkerLifeOf(PodLife::kSucceeded), policy::WorkerLife::kExited);
  EXPECT_EQ(WorkerLifeOf(PodLife::kFailed), policy::WorkerLife::kFailed);
}

TEST(WorkerPodTest, GpuLimitDefaultsToTheJobSpecsOneGpuPerWorker) {
  json job = Job();
  job["spec"].erase("gpusPerWorker");
  json pod = BuildWorkerPod(job, SpecOf(job), "w", PodSettings{});
  EXPECT_EQ(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
            std::to_string(JobSpec{}.gpus_per_worker));
}

TEST(WorkerPodTest, WorkerPodNamesAreTheJobsWithFiveCharactersOfTheAlphabet) {
  EXPECT_TRUE(IsWorkerPodName("mnist", "mnist-worker-b2c4d"));
  EXPECT_TRUE(IsWorkerPodName("mnist-x", "mnist-x-worker-zzzzz"));
  for (const char* name : {"mnist-worker-a", "mnist-worker-bcdfgh", "mnist-worker-bcdf",
                           "mnist-worker-BCDFG", "mnist-worker-bcdfa", "other-worker-bcdfg",
                           "mnist-workerbcdfgh", "xmnist-worker-bcdfg", ""}) {
    EXPECT_FALSE(IsWorkerPodName("mnist", name)) << name;
  }
  EXPECT_FALSE(IsWorkerPodName("", "-worker-bcdfg"));
}

TEST(WorkerPodTest, OnlyAControllerReferenceToTheUidControls) {
  json pod = BuildWorkerPod(Job(), SpecOf(Job()), "mnist-worker-bcdfg", PodSettings{});
  EXPECT_TRUE(ControlledBy(pod, "u-1"));
  EXPECT_FALSE(ControlledBy(pod, "u-2"));
  EXPECT_FALSE(ControlledBy(pod, ""));
  pod["metadata"]["ownerReferences"][0]["controller"] = false;
  EXPECT_FALSE(ControlledBy(pod, "u-1"));
  pod["metadata"]["ownerReferences"][0]["controller"] = "true";
  EXPECT_FALSE(ControlledBy(pod, "u-1"));
  pod["metadata"]["ownerReferences"][0].erase("controller");
  EXPECT_FALSE(ControlledBy(pod, "u-1"));
  EXPECT_FALSE(ControlledBy(json::object(), "u-1"));
}

// A pod as the API server sends it, with much the operator never reads.
json FullPod() {
  return json::parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "mnist-worker-bcdfg", "namespace": "team", "uid": "p-1",
                 "resourceVersion": "42", "creationTimestamp": "2026-01-02T03:04:05Z",
                 "deletionTimestamp": "2026-01-02T03:05:05Z",
                 "labels": {"virtualflow.io/job": "mnist"},
                 "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                 "ownerReferences": [{"uid": "u-1", "controller": true}],
                 "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
                 "generateName": "mnist-worker-", "finalizers": ["x"]},
    "spec": {"nodeName": "gpu-a", "nodeSelector": {"nvidia.com/gpu.product": "V100"},
             "serviceAccountName": "default", "tolerations": [{"key": "k"}],
             "volumes": [{"name": "vf-token", "secret": {"secretName": "s"}}],
             "containers": [{"name": "agent", "image": "virtualflow/agent:1",
                             "resources": {"limits": {"nvidia.com/gpu": "2"},
                                           "requests": {"cpu": "3"}},
                             "env": [{"name": "VF_JOB_SPEC", "value": "{...}"}],
                             "args": ["--worker", "mnist-worker-bcdfg"],
                             "readinessProbe": {"httpGet": {"path": "/readyz"}}}]},
    "status": {"phase": "Failed", "reason": "Evicted", "message": "node pressure",
               "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "False"}],
               "containerStatuses": [{"name": "agent", "restartCount": 0, "imageID": "sha",
                                      "state": {"terminated": {"exitCode": 3,
                                                               "message": "a\nlast"}}}]}})");
}

TEST(WorkerPodTest, ThePodCacheKeepsTheAllowListAndNothingElse) {
  json pod = FullPod();
  TrimPodForCache(pod);
  const json want = json::parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "mnist-worker-bcdfg", "namespace": "team", "uid": "p-1",
                 "creationTimestamp": "2026-01-02T03:04:05Z",
                 "deletionTimestamp": "2026-01-02T03:05:05Z",
                 "labels": {"virtualflow.io/job": "mnist"},
                 "ownerReferences": [{"uid": "u-1", "controller": true}]},
    "spec": {"nodeName": "gpu-a", "nodeSelector": {"nvidia.com/gpu.product": "V100"},
             "containers": [{"name": "agent", "image": "virtualflow/agent:1",
                             "resources": {"limits": {"nvidia.com/gpu": "2"},
                                           "requests": {"cpu": "3"}}}]},
    "status": {"phase": "Failed", "reason": "Evicted", "message": "node pressure",
               "conditions": [{"type": "Ready", "status": "False"}],
               "containerStatuses": [{"name": "agent",
                                      "state": {"terminated": {"exitCode": 3,
                                                               "message": "a\nlast"}}}]}})");
  EXPECT_EQ(pod, want) << pod.dump(2);
  TrimPodForCache(pod);  // trimming twice changes nothing
  EXPECT_EQ(pod, want);
  json odd = json::parse(R"({"metadata": null, "spec": {"containers": [null, 3]}})");
  TrimPodForCache(odd);  // malformed parts are left alone, not thrown on
  EXPECT_TRUE(odd["metadata"].is_null());
}

TEST(WorkerPodTest, WhatTheOperatorReadsOfAPodIsTheSameTrimmed) {
  json full = FullPod();
  json trimmed = full;
  TrimPodForCache(trimmed);
  for (int variant = 0; variant < 2; ++variant) {
    EXPECT_EQ(PodLifeOf(trimmed), PodLifeOf(full));
    EXPECT_EQ(PodExitCode(trimmed), PodExitCode(full));
    EXPECT_EQ(PodTerminationMessage(trimmed), PodTerminationMessage(full));
    EXPECT_EQ(PodImage(trimmed), PodImage(full));
    EXPECT_EQ(PodGpus(trimmed), PodGpus(full));
    EXPECT_EQ(PodHoldsResources(trimmed), PodHoldsResources(full));
    EXPECT_EQ(IsWorkerPod(trimmed), IsWorkerPod(full));
    EXPECT_EQ(ControlledBy(trimmed, "u-1"), ControlledBy(full, "u-1"));
    for (const char* rule : {"{action: Ignore, onPodConditions: [{type: Ready, status: 'False'}]}",
                             "{action: FailJob, onExitCodes: {operator: In, values: [3]}}"}) {
      const JobSpec spec = ParseJobYaml(
                               "apiVersion: virtualflow.io/v1alpha1\nkind: VirtualFlowJob\n"
                               "metadata: {name: j}\nspec: {virtualNodes: 1, globalBatchSize: 1, "
                               "steps: 1, runPolicy: {podFailurePolicy: {rules: [" +
                                   std::string(rule) + "]}}}\n",
                               "job.yaml")
                               .value();
      EXPECT_EQ(MatchPodFailurePolicy(spec.run_policy, trimmed).rule,
                MatchPodFailurePolicy(spec.run_policy, full).rule)
          << rule;
    }
    const std::vector<json> nodes = {json::parse(R"({
      "metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.product": "V100"}},
      "status": {"allocatable": {"nvidia.com/gpu": "4", "cpu": "8"}}})")};
    const ClusterGpus a = CountGpus(nodes, {trimmed});
    const ClusterGpus b = CountGpus(nodes, {full});
    EXPECT_EQ(a.held_by_others, b.held_by_others);
    EXPECT_EQ(a.cpu_held_by_others, b.cpu_held_by_others);
    // Alive and not a worker's, the other way round.
    for (json* pod : {&full, &trimmed}) {
      (*pod)["status"]["phase"] = "Running";
      (*pod)["metadata"].erase("deletionTimestamp");
      (*pod)["metadata"]["labels"].erase("virtualflow.io/job");
    }
  }
}

}  // namespace
}  // namespace vf::controller
