#include "operator/controller/kueue.h"

#include <gtest/gtest.h>

#include "operator/controller/job_spec.h"
#include "operator/controller/job_spec_test_util.h"
#include "operator/controller/worker_pod.h"

namespace vf::controller {
namespace {

using nlohmann::json;

json Job(int min_workers, int max_workers, const std::string& policy = "elastic") {
  json job = json::parse(R"({
    "apiVersion": "virtualflow.io/v1alpha1", "kind": "VirtualFlowJob",
    "metadata": {"name": "mnist", "namespace": "team",
                 "uid": "0a1b2c3d-4e5f-6789-abcd-ef0123456789",
                 "labels": {"kueue.x-k8s.io/queue-name": "team-queue"}},
    "spec": {"virtualNodes": 8, "globalBatchSize": 256, "steps": 10, "gpusPerWorker": 2,
             "template": {"spec": {"nodeSelector": {"pool": "gpu"}, "containers": [
                 {"name": "worker", "image": "example/agent:1"}]}}}})");
  job["spec"]["replicas"] = {{"min", min_workers}, {"max", max_workers}};
  job["spec"]["elasticity"] = {{"policy", policy}};
  return job;
}

json Workload(const json& job) {
  return BuildWorkload(job, SpecOf(job),
                       BuildWorkerPod(job, SpecOf(job), "mnist-worker", PodSettings{}));
}

json WorkloadCondition(const std::string& type, const std::string& status,
                       const std::string& reason, const std::string& message) {
  return {{"type", type}, {"status", status}, {"reason", reason}, {"message", message}};
}

TEST(KueueTest, TheQueueComesFromKueuesOwnLabel) {
  EXPECT_EQ(QueueNameOf(Job(1, 4)), "team-queue");
  json plain = Job(1, 4);
  plain["metadata"].erase("labels");
  EXPECT_EQ(QueueNameOf(plain), "");
}

TEST(KueueTest, TheWorkloadNameIsTheJobsAndItsIncarnations) {
  EXPECT_EQ(WorkloadName(Job(1, 4)), "mnist-vf-0a1b2c3d");
  json again = Job(1, 4);
  again["metadata"]["uid"] = "ffff0000-0000-0000-0000-000000000000";
  EXPECT_NE(WorkloadName(again), WorkloadName(Job(1, 4)));
  json long_name = Job(1, 4);
  long_name["metadata"]["name"] = std::string(253, 'a');
  EXPECT_LE(WorkloadName(long_name).size(), 253u);
}

TEST(KueueTest, TheCoreWorkloadAsksForTheMinimumAndEachUnitForOneWorker) {
  const json w = Workload(Job(2, 4));
  EXPECT_EQ(w["apiVersion"], "kueue.x-k8s.io/v1beta2");
  EXPECT_EQ(w["kind"], "Workload");
  EXPECT_EQ(w["metadata"]["name"], "mnist-vf-0a1b2c3d");
  EXPECT_EQ(w["metadata"]["namespace"], "team");
  EXPECT_EQ(w["metadata"]["labels"][kJobLabel], "mnist");
  EXPECT_EQ(w["metadata"]["labels"][kManagedByLabel], kManagedBy);
  EXPECT_EQ(w["metadata"]["labels"][kWorkloadRoleLabel], kCoreRole);
  // Owned by the job: deleting the job deletes the Workload, which releases its quota.
  const json& owner = w["metadata"]["ownerReferences"][0];
  EXPECT_EQ(owner["kind"], "VirtualFlowJob");
  EXPECT_EQ(owner["uid"], "0a1b2c3d-4e5f-6789-abcd-ef0123456789");
  EXPECT_TRUE(owner["controller"].get<bool>());
  EXPECT_EQ(w["spec"]["queueName"], "team-queue");
  ASSERT_EQ(w["spec"]["podSets"].size(), 1u);
  const json& ps = w["spec"]["podSets"][0];
  EXPECT_EQ(ps["name"], kWorkersPodSet);
  EXPECT_EQ(ps["count"], 2);  // replicas.min: the rest are units Kueue can take back
  EXPECT_FALSE(ps.contains("minCount"));
  // Each worker's requests as its pod has them; the nodeSelector lets Kueue pick flavors.
  const json& container = ps["template"]["spec"]["containers"][0];
  EXPECT_EQ(container["resources"]["limits"]["nvidia.com/gpu"], "2");
  EXPECT_EQ(ps["template"]["spec"]["nodeSelector"]["pool"], "gpu");
  // Only labels (and annotations) may be in a pod set's template metadata.
  EXPECT_EQ(ps["template"]["metadata"].size(), 1u);
  EXPECT_EQ(ps["template"]["metadata"]["labels"][kJobLabel], "mnist");
}

TEST(KueueTest, UnitsAreTheWorkersAboveTheCore) {
  const json job = Job(2, 4);
  const JobSpec spec = SpecOf(job);
  EXPECT_EQ(CoreWorkers(spec), 2);
  EXPECT_EQ(UnitWorkloads(spec), 2);
  const json unit = BuildUnitWorkload(job, spec, BuildWorkerPod(job, spec, "w", PodSettings{}), 2);
  EXPECT_EQ(unit["metadata"]["name"], "mnist-vf-0a1b2c3d-2");
  EXPECT_EQ(unit["metadata"]["name"], UnitWorkloadName(job, 2));
  EXPECT_EQ(unit["metadata"]["labels"][kWorkloadRoleLabel], kUnitRole);
  EXPECT_EQ(unit["metadata"]["ownerReferences"][0]["kind"], "VirtualFlowJob");
  EXPECT_EQ(unit["spec"]["podSets"][0]["count"], 1);
  EXPECT_EQ(unit["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
                ["nvidia.com/gpu"],
            "2");
  // A job that cannot shrink is all core, all or nothing.
  EXPECT_EQ(UnitWorkloads(SpecOf(Job(4, 4))), 0);
  EXPECT_EQ(Workload(Job(1, 4, "static"))["spec"]["podSets"][0]["count"], 4);
  EXPECT_EQ(UnitWorkloads(SpecOf(Job(1, 4, "static"))), 0);
}

TEST(KueueTest, AWorkloadWithoutQuotaWaitsWithKueuesReason) {
  const JobSpec spec = SpecOf(Job(1, 4));
  json w = Workload(Job(1, 4));
  KueueAdmission fresh = AdmissionOf(w, spec);
  EXPECT_FALSE(fresh.admitted);
  EXPECT_EQ(fresh.workers, 0);
  EXPECT_EQ(fresh.reason, kNotSeenByKueue);
  EXPECT_EQ(fresh.message, "Kueue has not looked at the Workload yet");

  w["status"]["conditions"] = {
      WorkloadCondition("QuotaReserved", "False", "Pending",
                        "couldn't assign flavors to pod set workers: insufficient unused quota for "
                        "nvidia.com/gpu in flavor gpu, 2 more needed")};
  KueueAdmission pending = AdmissionOf(w, spec);
  EXPECT_FALSE(pending.admitted);
  EXPECT_EQ(pending.reason, "Pending");
  EXPECT_NE(pending.message.find("insufficient unused quota"), std::string::npos);
  EXPECT_EQ(KueueWorkerLimit(Job(1, 4), w, {}, spec), 0);
}

TEST(KueueTest, AnAdmittedWorkloadAllowsTheCountKueueAdmitted) {
  const JobSpec spec = SpecOf(Job(1, 4));
  json w = Workload(Job(1, 4));
  w["status"]["conditions"] = {
      WorkloadCondition("QuotaReserved", "True", "QuotaReserved", "reserved"),
      WorkloadCondition("Admitted", "True", "Admitted", "admitted")};
  w["status"]["admission"] = {
      {"clusterQueue", "gpus"},
      {"podSetAssignments", {{{"name", "workers"}, {"count", 3}, {"flavors", {}}}}}};
  KueueAdmission a = AdmissionOf(w, spec);
  EXPECT_TRUE(a.admitted);
  EXPECT_EQ(a.workers, 3);  // as the assignment says
  EXPECT_EQ(a.cluster_queue, "gpus");
  // Without a count, the whole pod set was admitted: the core's one worker.
  w["status"]["admission"]["podSetAssignments"][0].erase("count");
  EXPECT_EQ(AdmissionOf(w, spec).workers, 1);
  EXPECT_EQ(KueueWorkerLimit(Job(1, 4), w, {}, spec), 1);
}

json Admitted(json w) {
  w["status"]["conditions"] = {
      WorkloadCondition("QuotaReserved", "True", "QuotaReserved", "reserved"),
      WorkloadCondition("Admitted", "True", "Admitted", "admitted")};
  w["status"]["admission"] = {{"clusterQueue", "gpus"},
                              {"podSetAssignments", {{{"name", "workers"}, {"flavors", {}}}}}};
  return w;
}

TEST(KueueTest, EachAdmittedUnitAddsAWorkerAndAnEvictedOneIsToBeReleased) {
  const json job = Job(1, 4);
  const JobSpec spec = SpecOf(job);
  const json pod = BuildWorkerPod(job, spec, "w", PodSettings{});
  const json core = Admitted(Workload(job));
  json evicted = Admitted(BuildUnitWorkload(job, spec, pod, 2));
  evicted["status"]["conditions"].push_back(WorkloadCondition(
      "Evicted", "True", "Preempted", "Preempted to accommodate a higher priority"));
  // Unit 1 admitted, unit 2 evicted but still reserved, unit 3 pending.
  const std::vector<json> units = {Admitted(BuildUnitWorkload(job, spec, pod, 1)), evicted,
                                   BuildUnitWorkload(job, spec, pod, 3)};
  JobAdmission a = JobAdmissionOf(core, units, spec);
  EXPECT_TRUE(a.admission.admitted);
  EXPECT_EQ(a.admission.workers, 2);
  EXPECT_EQ(a.units_admitted, 1);
  EXPECT_EQ(a.units_evicted, std::vector<int>{2});
  EXPECT_EQ(KueueWorkerLimit(job, core, units, spec), 2);
  // A unit admitted while the core is not counts for nothing.
  EXPECT_EQ(KueueWorkerLimit(job, Workload(job), units, spec), 0);
  EXPECT_EQ(JobAdmissionOf(json(nullptr), units, spec).admission.reason, kNotSeenByKueue);
}

TEST(KueueTest, AnEvictedWorkloadIsNotAdmitted) {
  const JobSpec spec = SpecOf(Job(1, 4));
  json w = Workload(Job(1, 4));
  w["status"]["conditions"] = {
      WorkloadCondition("QuotaReserved", "True", "QuotaReserved", "reserved"),
      WorkloadCondition("Admitted", "True", "Admitted", "admitted"),
      WorkloadCondition("Evicted", "True", "Preempted",
                        "Preempted to accommodate a higher priority")};
  KueueAdmission a = AdmissionOf(w, spec);
  EXPECT_FALSE(a.admitted);
  EXPECT_EQ(a.reason, "Preempted");
  EXPECT_EQ(KueueWorkerLimit(Job(1, 4), w, {}, spec), 0);
}

TEST(KueueTest, WithoutAQueueLabelKueuePlaysNoPart) {
  json plain = Job(1, 4);
  plain["metadata"].erase("labels");
  EXPECT_EQ(KueueWorkerLimit(plain, json(nullptr), {}, SpecOf(plain)), 4);
  // With one and no Workload yet: nothing.
  EXPECT_EQ(KueueWorkerLimit(Job(1, 4), json(nullptr), {}, SpecOf(Job(1, 4))), 0);
}

TEST(KueueTest, FinishingKeepsKueuesConditionsAndReleasesTheWorkers) {
  const JobSpec spec = SpecOf(Job(1, 4));
  json w = Workload(Job(1, 4));
  w["metadata"]["generation"] = 1;
  w["status"]["conditions"] = {
      WorkloadCondition("QuotaReserved", "True", "QuotaReserved", "reserved"),
      WorkloadCondition("Admitted", "True", "Admitted", "admitted")};
  w["status"]["admission"] = {{"clusterQueue", "gpus"},
                              {"podSetAssignments", {{{"name", "workers"}, {"count", 4}}}}};
  const json done = FinishedWorkload(w, true, "training finished", "2026-01-02T03:04:05Z");
  ASSERT_EQ(done["status"]["conditions"].size(), 3u);
  EXPECT_EQ(done["status"]["conditions"][0]["type"], "QuotaReserved");
  const json& finished = done["status"]["conditions"][2];
  EXPECT_EQ(finished["type"], "Finished");
  EXPECT_EQ(finished["status"], "True");
  EXPECT_EQ(finished["reason"], "Succeeded");
  EXPECT_EQ(finished["lastTransitionTime"], "2026-01-02T03:04:05Z");
  EXPECT_EQ(finished["observedGeneration"], 1);
  EXPECT_TRUE(AdmissionOf(done, spec).finished);
  EXPECT_EQ(KueueWorkerLimit(Job(1, 4), done, {}, spec), 0);
  // Finishing twice changes nothing.
  EXPECT_EQ(FinishedWorkload(done, false, "x", "2027-01-01T00:00:00Z"), done);
  EXPECT_EQ(FinishedWorkload(w, false, "x", "t")["status"]["conditions"][2]["reason"], "Failed");
}

}  // namespace
}  // namespace vf::controller
