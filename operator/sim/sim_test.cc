#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "operator/policy/policy.h"
#include "operator/sim/model.h"
#include "operator/sim/simulator.h"
#include "operator/sim/trace.h"

namespace vf::sim {
namespace {

// A file in a folder of this process's own, removed when it exits: the plain and ASan builds of
// a test run at the same time, and one rewriting a file the other reads would fail it.
std::string TempFile(const std::string& name, const std::string& text) {
  static const struct Folder {
    std::string path;
    Folder() {
      std::string pattern = ::testing::TempDir() + "vf_sim_test_XXXXXX";
      path = mkdtemp(pattern.data()) != nullptr ? pattern : ::testing::TempDir();
    }
    ~Folder() {
      if (path != ::testing::TempDir()) std::filesystem::remove_all(path);
    }
  } folder;
  std::string path = folder.path + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// A profile whose numbers are easy to check by hand: 0.1 s per micro-batch of 32 on "fast",
// 0.2 s on "slow", 1M parameters.
WorkloadProfile SimpleWorkload() {
  WorkloadProfile w;
  w.name = "toy";
  w.trace_workload = "resnet";
  w.datasets = {"cifar10"};
  w.parameters = 1e6;
  DeviceProfile fast;
  fast.batch_seconds = {{32.0, 0.1}, {64.0, 0.18}};
  fast.source = "test";
  DeviceProfile slow;
  slow.fixed_seconds = 0.04;
  slow.samples_per_second = 200.0;  // 0.04 + 32/200 = 0.2 s at 32
  slow.source = "test";
  w.devices["fast"] = fast;
  w.devices["slow"] = slow;
  return w;
}

Cluster SimpleCluster(int fast, int slow) {
  Cluster c;
  c.name = "test";
  if (fast) c.gpus["fast"] = fast;
  if (slow) c.gpus["slow"] = slow;
  c.latency_seconds = 0.0;
  c.bandwidth_bytes_per_second = 1e9;
  c.resize_fixed_seconds = 1.0;
  c.state_bandwidth_bytes_per_second = 1e9;
  c.speed_hints = {{"fast", 2.0}, {"slow", 1.0}};
  return c;
}

// ---- profiles ------------------------------------------------------------------------------

TEST(Profiles, ShippedDataFileLoadsWithASourceForEveryDevice) {
  auto p = BuiltInProfiles();
  ASSERT_TRUE(p.ok()) << p.status().message();
  for (const char* w : {"resnet50-imagenet", "resnet-cifar10", "bert-base-glue", "transformer",
                        "fashion-mnist-mlp"}) {
    ASSERT_TRUE(p->workloads.count(w)) << w;
    for (const auto& [type, d] : p->workloads.at(w).devices) {
      EXPECT_FALSE(d.source.empty()) << w << " " << type;
    }
  }
  for (const char* gpu : {"V100", "P100"}) {
    for (const char* w : {"resnet50-imagenet", "resnet-cifar10", "bert-base-glue", "transformer"}) {
      EXPECT_TRUE(p->workloads.at(w).devices.count(gpu)) << w << " has no " << gpu;
    }
  }
}

// The profiles compiled into the binary are the data file's, byte for byte.
TEST(Profiles, BuiltInProfilesAreTheShippedDataFile) {
  auto built_in = BuiltInProfiles();
  auto file = LoadProfiles(std::string(VF_SIM_DATA_DIR) + "/throughput.yaml");
  ASSERT_TRUE(built_in.ok()) << built_in.status().message();
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(built_in->path, kBuiltInProfilesName);
  EXPECT_EQ(built_in->dataset_samples, file->dataset_samples);
  ASSERT_EQ(built_in->workloads.size(), file->workloads.size());
  for (const auto& [name, w] : file->workloads) {
    ASSERT_TRUE(built_in->workloads.count(name)) << name;
    const WorkloadProfile& b = built_in->workloads.at(name);
    EXPECT_EQ(b.parameters, w.parameters) << name;
    ASSERT_EQ(b.devices.size(), w.devices.size()) << name;
    for (const auto& [type, d] : w.devices) {
      EXPECT_EQ(b.devices.at(type).source, d.source) << name << " " << type;
      EXPECT_EQ(*b.SecondsPerVirtualNode(type, 32), *w.SecondsPerVirtualNode(type, 32))
          << name << " " << type;
    }
  }
}

TEST(Profiles, ShippedDataServesEveryWorkloadOfTheTraces) {
  auto p = BuiltInProfiles();
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->ForTrace("resnet", "imagenet").ok());
  EXPECT_TRUE(p->ForTrace("resnet", "cifar10").ok());
  for (const char* task : {"SST-2", "CoLA", "MRPC"}) {
    EXPECT_TRUE(p->ForTrace("bert", task).ok()) << task;
    EXPECT_TRUE(p->dataset_samples.count(task)) << task;
  }
  EXPECT_TRUE(p->ForTrace("transformer", "").ok());
  EXPECT_FALSE(p->ForTrace("gpt", "").ok());
}

TEST(Profiles, TraceHostProfilesServeTheTraces) {
  auto p = LoadProfiles(std::string(VF_SIM_DATA_DIR) + "/throughput-trace-author-v100.yaml");
  ASSERT_TRUE(p.ok()) << p.status().message();
  for (const auto& [workload, dataset] : std::vector<std::pair<std::string, std::string>>{
           {"resnet", "imagenet"}, {"resnet", "cifar10"}, {"bert", "SST-2"}, {"transformer", ""}}) {
    auto w = p->ForTrace(workload, dataset);
    ASSERT_TRUE(w.ok()) << workload;
    EXPECT_TRUE((*w)->devices.count("V100")) << workload;
  }
}

TEST(Profiles, MeasuredPointsAreUsedExactly) {
  auto p = BuiltInProfiles();
  ASSERT_TRUE(p.ok());
  auto t = p->workloads.at("resnet50-imagenet").SecondsPerVirtualNode("V100", 32);
  ASSERT_TRUE(t.ok());
  EXPECT_NEAR(*t, 1.0 / 7.7873, 1e-9);
}

TEST(Profiles, InterpolatesAndExtendsTheTable) {
  const WorkloadProfile w = SimpleWorkload();
  EXPECT_NEAR(*w.SecondsPerVirtualNode("fast", 48), 0.14, 1e-12);
  EXPECT_NEAR(*w.SecondsPerVirtualNode("fast", 128), 0.18 + 64 * 0.08 / 32, 1e-12);
  EXPECT_NEAR(*w.SecondsPerVirtualNode("fast", 16), 0.06, 1e-12);
  EXPECT_GT(*w.SecondsPerVirtualNode("fast", 1), 0.0);
  EXPECT_NEAR(*w.SecondsPerVirtualNode("slow", 32), 0.2, 1e-12);
  EXPECT_FALSE(w.SecondsPerVirtualNode("tpu", 32).ok());
}

TEST(Profiles, ANumberWithoutASourceIsRejected) {
  const std::string path = TempFile("nosource.yaml",
                                    "workloads:\n"
                                    "  w:\n"
                                    "    parameters: 10\n"
                                    "    devices:\n"
                                    "      V100: {fixed_seconds: 0.1, samples_per_second: 5}\n");
  auto p = LoadProfiles(path);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("source"), std::string::npos) << p.status().message();
  EXPECT_NE(p.status().message().find("nosource.yaml:"), std::string::npos);
}

TEST(Profiles, MalformedYamlNamesFileAndLine) {
  const std::string path = TempFile("broken.yaml", "workloads: [1, 2\n");
  auto p = LoadProfiles(path);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("broken.yaml:"), std::string::npos) << p.status().message();
}

// ---- clusters ------------------------------------------------------------------------------

TEST(Cluster, ShippedExamplesLoad) {
  for (const char* name :
       {"8-v100", "8-v100-trace-host", "hetero-2v100-8p100", "hetero-2v100-8k80", "local-2-core"}) {
    auto c = LoadCluster(std::string(VF_SOURCE_DIR) + "/examples/clusters/" + name + ".yaml");
    ASSERT_TRUE(c.ok()) << name << ": " << c.status().message();
    EXPECT_EQ(c->name, name);
    EXPECT_GT(c->TotalGpus(), 0);
  }
}

TEST(Cluster, RejectsNegativeCounts) {
  auto c = LoadCluster(TempFile("neg.yaml", "gpus: {V100: -1}\n"));
  EXPECT_FALSE(c.ok());
}

TEST(Cluster, RestrictTypesKeepsOnlyThoseListed) {
  const Cluster c = RestrictTypes(SimpleCluster(2, 8), {"fast"});
  EXPECT_EQ(c.gpus, (std::map<std::string, int>{{"fast", 2}}));
}

// ---- step model ----------------------------------------------------------------------------

TEST(StepModel, RingAllReduceFollowsLatencyPlusBandwidth) {
  Cluster c = SimpleCluster(4, 0);
  c.latency_seconds = 1e-3;
  EXPECT_EQ(RingAllReduceSeconds(c, 1, 1e9), 0.0);
  // 4 workers: 6 steps of latency and 6/4 of the bytes.
  EXPECT_NEAR(RingAllReduceSeconds(c, 4, 1e9), 6e-3 + 1.5, 1e-12);
}

TEST(StepModel, SlowestWorkerPlusAllReduce) {
  const auto p = PredictStep(SimpleWorkload(), SimpleCluster(4, 0), {{"fast", 4}}, 8, 256,
                             SplitMode::kProportional);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->virtual_nodes, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_NEAR(p->compute_seconds, 0.2, 1e-12);
  EXPECT_NEAR(p->allreduce_seconds, 1.5 * 4e6 / 1e9, 1e-12);
  EXPECT_NEAR(p->step_seconds, p->compute_seconds + p->allreduce_seconds, 1e-15);
}

TEST(StepModel, ProportionalSplitBeatsEvenOnMixedSpeeds) {
  const WorkloadProfile w = SimpleWorkload();
  const Cluster c = SimpleCluster(2, 2);
  const policy::Allocation a = {{"fast", 2}, {"slow", 2}};
  auto prop = PredictStep(w, c, a, 12, int64_t{12} * 32, SplitMode::kProportional);
  auto even = PredictStep(w, c, a, 12, int64_t{12} * 32, SplitMode::kEven);
  ASSERT_TRUE(prop.ok() && even.ok());
  EXPECT_EQ(prop->virtual_nodes, (std::vector<int>{4, 4, 2, 2}));
  EXPECT_EQ(even->virtual_nodes, (std::vector<int>{3, 3, 3, 3}));
  EXPECT_NEAR(prop->compute_seconds, 0.4, 1e-12);
  EXPECT_NEAR(even->compute_seconds, 0.6, 1e-12);
}

TEST(StepModel, SharedCoresBoundTheComputeOfTimeSharedWorkers) {
  Cluster c = SimpleCluster(4, 0);
  c.shared_cores["fast"] = 2;
  // 3 workers on 2 cores, 3/3/2 nodes of 0.1 s: busy 0.3, 0.3, 0.2; the cores need 0.8 / 2.
  auto p = PredictStep(SimpleWorkload(), c, {{"fast", 3}}, 8, 256, SplitMode::kProportional);
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p->compute_seconds, 0.4, 1e-12);
  // The all-reduce is CPU work on the same cores: 3 workers on 2 cores take 1.5 times as long.
  EXPECT_NEAR(p->allreduce_seconds, 1.5 * RingAllReduceSeconds(c, 3, 4e6), 1e-12);
  // With as many cores as workers the slowest worker sets the pace again.
  c.shared_cores["fast"] = 4;
  p = PredictStep(SimpleWorkload(), c, {{"fast", 3}}, 8, 256, SplitMode::kProportional);
  EXPECT_NEAR(p->compute_seconds, 0.3, 1e-12);
}

TEST(StepModel, CoreContentionSlowsComputeOnlyWhenWorkersShareTheCores) {
  Cluster c = SimpleCluster(4, 0);
  c.shared_cores["fast"] = 2;
  c.core_contention["fast"] = 0.25;
  // Alone, a worker has the cores to itself.
  auto p = PredictStep(SimpleWorkload(), c, {{"fast", 1}}, 8, 256, SplitMode::kProportional);
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p->compute_seconds, 0.8, 1e-12);
  // Two workers of 4 nodes each: 0.4 s, 25% slower side by side.
  p = PredictStep(SimpleWorkload(), c, {{"fast", 2}}, 8, 256, SplitMode::kProportional);
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p->compute_seconds, 0.5, 1e-12);
  // Three on two cores: the shared-core bound 0.4, then the contention.
  p = PredictStep(SimpleWorkload(), c, {{"fast", 3}}, 8, 256, SplitMode::kProportional);
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p->compute_seconds, 0.5, 1e-12);
  // The all-reduce is not scaled by it.
  EXPECT_NEAR(p->allreduce_seconds, 1.5 * RingAllReduceSeconds(c, 3, 4e6), 1e-12);
}

TEST(StepModel, CoreContentionNeedsSharedCoresAndAFraction) {
  auto c = LoadCluster(TempFile("contention.yaml",
                                "gpus: {cpu: 4}\nshared_cores: {cpu: 2}\n"
                                "core_contention: {cpu: 0.15}\n"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->core_contention.at("cpu"), 0.15);
  c = LoadCluster(
      TempFile("contention-alone.yaml", "gpus: {cpu: 4}\ncore_contention: {cpu: 0.15}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("needs shared_cores"), std::string::npos)
      << c.status().message();
  c = LoadCluster(TempFile("contention-negative.yaml",
                           "gpus: {cpu: 4}\nshared_cores: {cpu: 2}\n"
                           "core_contention: {cpu: -0.1}\n"));
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("core_contention must be"), std::string::npos)
      << c.status().message();
}

TEST(StepModel, MeasuredAllReduceReplacesTheRingForItsWorkerCounts) {
  auto c = LoadCluster(TempFile("measured.yaml",
                                "gpus: {fast: 4}\nshared_cores: {fast: 2}\n"
                                "network:\n  bandwidth_bytes_per_second: 1.0e9\n"
                                "  measured_allreduce:\n    bytes: 2.0e6\n"
                                "    seconds: {2: 0.01, 3: 0.03}\n"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->measured_allreduce_seconds.size(), 2u);
  // The toy workload has 4e6 gradient bytes: twice the measured size, twice the time, and
  // no shared-core stretch on top (the measurement has it).
  auto p = PredictStep(SimpleWorkload(), *c, {{"fast", 3}}, 8, 256, SplitMode::kProportional);
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p->allreduce_seconds, 0.06, 1e-12);
  p = PredictStep(SimpleWorkload(), *c, {{"fast", 2}}, 8, 256, SplitMode::kProportional);
  EXPECT_NEAR(p->allreduce_seconds, 0.02, 1e-12);
  // A worker count it has no measurement for falls back to the stretched ring; one worker has
  // no collective at all.
  p = PredictStep(SimpleWorkload(), *c, {{"fast", 4}}, 8, 256, SplitMode::kProportional);
  EXPECT_NEAR(p->allreduce_seconds, 2.0 * RingAllReduceSeconds(*c, 4, 4e6), 1e-12);
  p = PredictStep(SimpleWorkload(), *c, {{"fast", 1}}, 8, 256, SplitMode::kProportional);
  EXPECT_EQ(p->allreduce_seconds, 0.0);

  for (const char* bad :
       {"seconds: {1: 0.01}", "seconds: {2: -1}", "seconds: {}", "bytes: 1.0e6"}) {
    const std::string text =
        std::string("gpus: {fast: 4}\nnetwork:\n  measured_allreduce: ") +
        (std::string(bad).rfind("bytes", 0) == 0 ? std::string("{") + bad + "}"
                                                 : std::string("{bytes: 1.0e6, ") + bad + "}") +
        "\n";
    auto r = LoadCluster(TempFile("measured-bad.yaml", text));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("measured_allreduce"), std::string::npos)
        << r.status().message();
  }
}

TEST(StepModel, PerStepWorkCountsOncePerWorker) {
  WorkloadProfile w = SimpleWorkload();
  w.devices["fast"].per_step_seconds = 0.05;
  auto p = PredictStep(w, SimpleCluster(2, 0), {{"fast", 2}}, 8, 256, SplitMode::kProportional);
  ASSERT_TRUE(p.ok());
  EXPECT_NEAR(p->compute_seconds, 0.45, 1e-12);
}

TEST(StepModel, RejectsImpossibleConfigurations) {
  const WorkloadProfile w = SimpleWorkload();
  const Cluster c = SimpleCluster(4, 0);
  EXPECT_FALSE(PredictStep(w, c, {{"fast", 4}}, 2, 64, SplitMode::kEven).ok());
  EXPECT_FALSE(PredictStep(w, c, {{"fast", 2}}, 8, 100, SplitMode::kEven).ok());
  EXPECT_FALSE(PredictStep(w, c, {}, 8, 256, SplitMode::kEven).ok());
}

// ---- traces --------------------------------------------------------------------------------

TEST(Trace, ParsesThePublishedFormat) {
  auto t = ParseTrace(
      R"([{"arrival_time": 1, "workload": "bert", "priority": 5, "gpu_demand": 2,
           "batch_size": 16, "num_epochs": 1, "num_virtual_nodes_per_device": 2,
           "glue_task": "SST-2"},
          {"arrival_time": 9.5, "workload": "transformer", "gpu_demand": 8,
           "batch_size": 2048, "num_steps": 4000}])",
      "t.json");
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].VirtualNodes(), 4);
  EXPECT_EQ((*t)[0].dataset, "SST-2");
  EXPECT_TRUE((*t)[0].glue_task);
  EXPECT_EQ((*t)[1].priority, 1);
  EXPECT_EQ((*t)[1].num_steps, 4000);
  EXPECT_DOUBLE_EQ((*t)[1].arrival_time, 9.5);
}

TEST(Trace, ErrorsNameTheJob) {
  auto missing = ParseTrace(R"([{"arrival_time": 1, "workload": "bert", "batch_size": 4,
                                 "num_steps": 2}])",
                            "t.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("t.json: job 0: missing \"gpu_demand\""),
            std::string::npos)
      << missing.status().message();
  auto both = ParseTrace(R"([{"arrival_time": 1, "workload": "bert", "gpu_demand": 1,
                              "batch_size": 4, "num_steps": 2, "num_epochs": 1}])",
                         "t.json");
  EXPECT_FALSE(both.ok());
  auto indivisible = ParseTrace(R"([{"arrival_time": 1, "workload": "bert", "gpu_demand": 3,
                                     "batch_size": 4, "num_steps": 2}])",
                                "t.json");
  ASSERT_FALSE(indivisible.ok());
  EXPECT_NE(indivisible.status().message().find("divisible"), std::string::npos);
  EXPECT_FALSE(ParseTrace("{", "t.json").ok());
}

TEST(Trace, AJobMayNameItsOwnPolicy) {
  auto t = ParseTrace(R"([{"arrival_time": 0, "workload": "bert", "gpu_demand": 2,
                           "batch_size": 16, "num_steps": 10, "policy": "autoscale"}])",
                      "t.json");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ((*t)[0].policy, "autoscale");
  auto again = ParseTrace(TraceToJson(*t), "again");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ((*again)[0].policy, "autoscale");
  auto bad = ParseTrace(R"([{"arrival_time": 0, "workload": "bert", "gpu_demand": 2,
                             "batch_size": 16, "num_steps": 10, "policy": "fastest"}])",
                        "t.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(
                "job 0: \"policy\": unknown policy 'fastest' (known: static, elastic, autoscale)"),
            std::string::npos)
      << bad.status().message();
}

TEST(Trace, JsonRoundTrips) {
  TraceGeneratorOptions o;
  o.jobs = 30;
  auto jobs = GenerateTrace(o);
  ASSERT_TRUE(jobs.ok());
  auto again = ParseTrace(TraceToJson(*jobs), "generated");
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(TraceToJson(*again), TraceToJson(*jobs));
}

TEST(TraceGenerator, SameSeedSameTraceOtherSeedOtherTrace) {
  TraceGeneratorOptions o;
  o.seed = 42;
  const std::string a = TraceToJson(*GenerateTrace(o));
  EXPECT_EQ(a, TraceToJson(*GenerateTrace(o)));
  o.seed = 43;
  EXPECT_NE(a, TraceToJson(*GenerateTrace(o)));
}

TEST(TraceGenerator, ArrivalsArePoissonAtTheRequestedRate) {
  TraceGeneratorOptions o;
  o.jobs = 4000;
  o.jobs_per_hour = 10.0;
  auto jobs = GenerateTrace(o);
  ASSERT_TRUE(jobs.ok());
  const double mean_gap = jobs->back().arrival_time / static_cast<double>(jobs->size());
  EXPECT_NEAR(mean_gap, 360.0, 360.0 * 0.05);  // 4000 draws: ~1.6% standard error
  for (size_t i = 1; i < jobs->size(); ++i) {
    EXPECT_GE((*jobs)[i].arrival_time, (*jobs)[i - 1].arrival_time);
  }
}

TEST(TraceGenerator, FollowsTheMixAndProducesSimulatableJobs) {
  TraceGeneratorOptions o;
  o.jobs = 300;
  o.mix = {{"bert", 1.0}, {"resnet", 0.0}, {"transformer", 0.0}};
  auto jobs = GenerateTrace(o);
  ASSERT_TRUE(jobs.ok());
  std::set<int> priorities;
  for (const auto& j : *jobs) {
    EXPECT_EQ(j.workload, "bert");
    EXPECT_EQ(j.batch_size % j.VirtualNodes(), 0);
    priorities.insert(j.priority);
  }
  EXPECT_EQ(priorities, (std::set<int>{1, 5, 10}));
  o.mix = {};
  auto all = GenerateTrace({});
  ASSERT_TRUE(all.ok());
  auto profiles = BuiltInProfiles();
  ASSERT_TRUE(profiles.ok());
  EXPECT_TRUE(MakeJobs(*all, *profiles, MaxWorkers::kDemand).ok());
}

TEST(TraceGenerator, RejectsBadOptions) {
  TraceGeneratorOptions o;
  o.jobs = 0;
  EXPECT_FALSE(GenerateTrace(o).ok());
  o = {};
  o.mix = {{"gpt", 1.0}};
  EXPECT_FALSE(GenerateTrace(o).ok());
  EXPECT_FALSE(ParseMix("resnet").ok());
  EXPECT_FALSE(ParseMix("resnet=-1").ok());
  auto m = ParseMix("resnet=0.5,bert=0.5");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 2u);
}

// ---- simulator -----------------------------------------------------------------------------

SimJob Job(const WorkloadProfile& w, const std::string& id, double arrival, int demand,
           int64_t steps, int priority = 1, int max = 0) {
  SimJob j;
  j.id = id;
  j.workload = &w;
  j.label = "toy";
  j.priority = priority;
  j.arrival_time = arrival;
  j.virtual_nodes = 8;
  j.global_batch = 256;
  j.min_workers = 1;
  j.requested_workers = demand;
  j.max_workers = max > 0 ? max : demand;
  j.steps = steps;
  return j;
}

std::unique_ptr<policy::Policy> MakePolicy(const std::string& name) {
  return std::move(policy::CreatePolicy(name, {})).value();
}

TEST(Simulator, LoneJobTakesStartPlusStepsTimesStepTime) {
  const WorkloadProfile w = SimpleWorkload();
  Cluster c = SimpleCluster(4, 0);
  c.start_seconds = 5.0;
  auto r = Simulate({Job(w, "a", 10.0, 4, 100)}, c, *MakePolicy("static"), {});
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto step = PredictStep(w, c, {{"fast", 4}}, 8, 256, SplitMode::kProportional);
  ASSERT_EQ(r->jobs.size(), 1u);
  EXPECT_NEAR(r->jobs[0].finish_time, 10.0 + 5.0 + 100 * step->step_seconds, 1e-6);
  EXPECT_EQ(r->jobs[0].resizes, 0);
  EXPECT_NEAR(r->mean_jct, r->jobs[0].jct(), 1e-9);
}

TEST(Simulator, EveryJobFinishesUnderEveryPolicyAndNoGpuIsOverbooked) {
  const WorkloadProfile w = SimpleWorkload();
  const Cluster c = SimpleCluster(4, 4);
  std::vector<SimJob> jobs;
  for (int i = 0; i < 12; ++i) {
    jobs.push_back(Job(w, "j" + std::to_string(i), 37.0 * i, 1 + i % 4, 200 + 50 * (i % 3),
                       i % 3 == 0 ? 10 : 1, 8));
  }
  for (const auto& name : policy::KnownPolicyNames()) {
    auto r = Simulate(jobs, c, *MakePolicy(name), {});
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().message();
    EXPECT_EQ(r->unfinished, 0) << name;
    double gpu_seconds = 0.0;
    for (const auto& o : r->jobs) {
      EXPECT_TRUE(o.finished()) << name << " " << o.id;
      EXPECT_GE(o.start_time, o.arrival_time);
      EXPECT_GT(o.finish_time, o.start_time);
      EXPECT_LE(o.max_workers_seen, 8);
      gpu_seconds += o.gpu_seconds;
      if (name == "static") {
        EXPECT_EQ(o.resizes, 0) << o.id;
      }
    }
    EXPECT_LE(gpu_seconds, c.TotalGpus() * r->makespan + 1e-6) << name;
    EXPECT_LE(r->gpu_utilisation, 1.0 + 1e-9);
    EXPECT_GE(r->p99_jct, r->median_jct);
  }
}

TEST(Simulator, SameInputSameResult) {
  const WorkloadProfile w = SimpleWorkload();
  std::vector<SimJob> jobs;
  for (int i = 0; i < 8; ++i)
    jobs.push_back(Job(w, "j" + std::to_string(i), 20.0 * i, 2, 300, 1, 8));
  auto a = Simulate(jobs, SimpleCluster(4, 2), *MakePolicy("elastic"), {});
  auto b = Simulate(jobs, SimpleCluster(4, 2), *MakePolicy("elastic"), {});
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(a->jobs[i].finish_time, b->jobs[i].finish_time);
    EXPECT_EQ(a->jobs[i].resizes, b->jobs[i].resizes);
  }
}

TEST(Simulator, ElasticLendsIdleGpusToALoneJob) {
  const WorkloadProfile w = SimpleWorkload();
  const Cluster c = SimpleCluster(8, 0);
  const SimJob j = Job(w, "a", 0.0, 2, 1000, 1, 8);
  auto fixed = Simulate({j}, c, *MakePolicy("static"), {});
  auto elastic = Simulate({j}, c, *MakePolicy("elastic"), {});
  ASSERT_TRUE(fixed.ok() && elastic.ok());
  EXPECT_EQ(elastic->jobs[0].max_workers_seen, 8);
  EXPECT_LT(elastic->jobs[0].jct(), fixed->jobs[0].jct());
}

TEST(Simulator, ResizesPauseTheJob) {
  const WorkloadProfile w = SimpleWorkload();
  const Cluster c = SimpleCluster(8, 0);
  // b arrives while a holds all 8 GPUs: a shrinks (a resize) and pays the pause.
  auto r = Simulate({Job(w, "a", 0.0, 8, 4000, 1, 8), Job(w, "b", 50.0, 4, 200, 10, 8)}, c,
                    *MakePolicy("elastic"), {});
  ASSERT_TRUE(r.ok());
  EXPECT_GE(r->jobs[0].resizes, 1);
  EXPECT_GE(r->jobs[0].paused_seconds, ResizePauseSeconds(w, c) - 1e-9);
}

TEST(Simulator, RecordsEveryAllocationChangeWithThePolicysReason) {
  const WorkloadProfile w = SimpleWorkload();
  SimOptions o;
  o.record_events = true;
  auto r = Simulate({Job(w, "a", 0.0, 8, 4000, 1, 8), Job(w, "b", 50.0, 4, 200, 10, 8)},
                    SimpleCluster(8, 0), *MakePolicy("elastic"), o);
  ASSERT_TRUE(r.ok());
  ASSERT_GE(r->events.size(), 3u);
  EXPECT_NE(r->events[0].find("a: started"), std::string::npos) << r->events[0];
  bool shrank = false;
  for (const auto& e : r->events) shrank = shrank || e.find("a: shrank") != std::string::npos;
  EXPECT_TRUE(shrank);
}

// The operator's allocation path: each job by its own policy, whichever one is simulated.
TEST(Simulator, EachJobIsSizedByItsOwnPolicy) {
  const WorkloadProfile w = SimpleWorkload();
  SimJob fixed = Job(w, "fixed", 0.0, 2, 4000, 1, 8);
  fixed.policy = "static";
  SimJob shared = Job(w, "shared", 0.0, 2, 1000, 1, 8);
  shared.policy = "elastic";
  for (const auto& name : policy::KnownPolicyNames()) {
    auto r = Simulate({fixed, shared}, SimpleCluster(8, 0), *MakePolicy(name), {});
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().message();
    EXPECT_EQ(r->jobs[0].max_workers_seen, 2) << name;  // its request, never more
    EXPECT_EQ(r->jobs[0].resizes, 0) << name;
    EXPECT_EQ(r->jobs[1].max_workers_seen, 6) << name;  // the idle rest, lent
  }
  // The control: naming none, both are sized by the simulated policy.
  fixed.policy.clear();
  shared.policy.clear();
  auto r = Simulate({fixed, shared}, SimpleCluster(8, 0), *MakePolicy("elastic"), {});
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->jobs[0].max_workers_seen, 2);
}

TEST(Simulator, JobThatNeverFitsIsReportedUnfinished) {
  const WorkloadProfile w = SimpleWorkload();
  auto r = Simulate({Job(w, "small", 0.0, 2, 100), Job(w, "huge", 1.0, 8, 100, 1)},
                    SimpleCluster(4, 0), *MakePolicy("static"), {});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->unfinished, 1);
  EXPECT_TRUE(r->jobs[0].finished());
  EXPECT_FALSE(r->jobs[1].finished());
}

TEST(Simulator, MakeJobsTurnsEpochsIntoSteps) {
  auto profiles = BuiltInProfiles();
  ASSERT_TRUE(profiles.ok());
  auto trace = ParseTrace(R"([{"arrival_time": 1, "workload": "bert", "priority": 5,
                               "gpu_demand": 2, "batch_size": 16, "num_epochs": 3,
                               "num_virtual_nodes_per_device": 2, "glue_task": "MRPC"}])",
                          "t");
  ASSERT_TRUE(trace.ok());
  auto jobs = MakeJobs(*trace, *profiles, MaxWorkers::kDemand);
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  EXPECT_EQ((*jobs)[0].steps, 3 * (3668 / 16));
  EXPECT_EQ((*jobs)[0].virtual_nodes, 4);
  EXPECT_EQ((*jobs)[0].max_workers, 2);
  EXPECT_EQ((*jobs)[0].id, "trace/job-00");
  auto wide = MakeJobs(*trace, *profiles, MaxWorkers::kVirtualNodes);
  EXPECT_EQ((*wide)[0].max_workers, 4);
}

TEST(Simulator, SummaryStatistics) {
  SimResult r;
  for (double jct : {10.0, 20.0, 30.0, 100.0}) {
    JobOutcome o;
    o.arrival_time = 0.0;
    o.finish_time = jct;
    o.gpu_seconds = jct;
    r.jobs.push_back(o);
  }
  Summarize(r, SimpleCluster(4, 0));
  EXPECT_DOUBLE_EQ(r.mean_jct, 40.0);
  EXPECT_DOUBLE_EQ(r.median_jct, 25.0);
  EXPECT_DOUBLE_EQ(r.p99_jct, 100.0);
  EXPECT_DOUBLE_EQ(r.makespan, 100.0);
  EXPECT_DOUBLE_EQ(r.gpu_utilisation, 160.0 / 400.0);
}

}  // namespace
}  // namespace vf::sim
