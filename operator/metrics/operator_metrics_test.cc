#include "operator/metrics/operator_metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/metrics/build_info.h"
#include "agent/metrics/promtool.h"
#include "agent/metrics/test_util.h"

namespace vf {
namespace {

using metrics::ExportedChildren;
using metrics::Exposition;
using prometheus::MetricType;

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

// The sample lines of the job ns/job: those with both labels, wherever they stand.
int SeriesOf(const std::string& text, const std::string& ns, const std::string& job) {
  int n = 0;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const bool labelled = line.find("job_namespace=\"" + ns + "\"") != std::string::npos &&
                          line.find("job_name=\"" + job + "\"") != std::string::npos;
    if (!line.empty() && line[0] != '#' && labelled) ++n;
  }
  return n;
}

TEST(OperatorMetrics, RegistersTheFixedFamilies) {
  OperatorMetrics m;
  std::map<std::string, std::pair<MetricType, std::vector<std::string>>> got;
  for (const metrics::FamilyInfo& f : m.Describe()) {
    got[f.name] = {f.type, f.label_names};
  }
  using V = std::vector<std::string>;
  const std::map<std::string, std::pair<MetricType, V>> want = {
      {"vf_operator_jobs", {MetricType::Gauge, V{"phase"}}},
      {"vf_operator_job_workers", {MetricType::Gauge, V{"job_namespace", "job_name", "kind"}}},
      {"vf_operator_resizes_total",
       {MetricType::Counter, V{"job_namespace", "job_name", "reason"}}},
      {"vf_operator_resize_pause_seconds", {MetricType::Histogram, V{"job_namespace", "job_name"}}},
      {"vf_operator_job_checkpoint_failures_total",
       {MetricType::Counter, V{"job_namespace", "job_name"}}},
      {"vf_operator_job_step", {MetricType::Gauge, V{"job_namespace", "job_name"}}},
      {"vf_operator_job_total_steps", {MetricType::Gauge, V{"job_namespace", "job_name"}}},
      {"vf_operator_job_samples_per_second", {MetricType::Gauge, V{"job_namespace", "job_name"}}},
      {"vf_operator_reconcile_duration_seconds", {MetricType::Histogram, V{}}},
      {"vf_operator_reconcile_errors_total", {MetricType::Counter, V{}}},
      {"vf_operator_workqueue_depth", {MetricType::Gauge, V{}}},
      {"vf_operator_api_request_duration_seconds", {MetricType::Histogram, V{"verb"}}},
      {"vf_operator_api_request_errors_total", {MetricType::Counter, V{"verb", "code"}}},
      {"vf_operator_gpus", {MetricType::Gauge, V{"product", "state"}}},
      {"vf_operator_is_leader", {MetricType::Gauge, V{}}},
      {"vf_build_info", {MetricType::Gauge, V{"version"}}},
  };
  EXPECT_EQ(got, want);
}

TEST(OperatorMetrics, FreshExportShowsPhasesLoopAndLeadershipAtZero) {
  OperatorMetrics m;
  const std::string text = Exposition(m.registry());
  for (const char* phase : {"Pending", "Running", "Resizing", "Suspended", "Succeeded", "Failed"}) {
    EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"" + std::string(phase) + "\"} 0")) << text;
  }
  EXPECT_TRUE(Contains(text, "vf_operator_is_leader 0"));
  EXPECT_TRUE(Contains(text, "vf_operator_workqueue_depth 0"));
  EXPECT_TRUE(Contains(text, "vf_operator_reconcile_errors_total 0"));
  EXPECT_TRUE(Contains(text, "vf_operator_reconcile_duration_seconds_count 0"));
  // No job, GPU or API series before there is something to say.
  EXPECT_EQ(text.find("vf_operator_job_workers"), std::string::npos);
  EXPECT_EQ(text.find("vf_operator_gpus"), std::string::npos);
}

TEST(OperatorMetrics, SetJobsByPhaseZeroesMissingPhasesAndDropsStaleUnknownOnes) {
  OperatorMetrics m;
  m.SetJobsByPhase({{"Running", 3}, {"Pending", 1}, {"Mystery", 2}});
  std::string text = Exposition(m.registry());
  EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"Running\"} 3"));
  EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"Pending\"} 1"));
  EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"Mystery\"} 2"));
  m.SetJobsByPhase({{"Succeeded", 4}});
  text = Exposition(m.registry());
  EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"Running\"} 0"));
  EXPECT_TRUE(Contains(text, "vf_operator_jobs{phase=\"Succeeded\"} 4"));
  EXPECT_EQ(text.find("Mystery"), std::string::npos);
}

TEST(OperatorMetrics, JobSeriesCarryNamespaceJobAndTheirKindOrReason) {
  OperatorMetrics m;
  m.SetJobWorkers("team", "mnist", {.current = 2, .desired = 3, .ready = 2, .min = 1, .max = 4});
  m.OnResize("team", "mnist", ResizeReason::kGrow);
  m.OnResize("team", "mnist", ResizeReason::kGrow);
  m.OnResize("team", "mnist", ResizeReason::kRebalance);
  m.ObserveResizePause("team", "mnist", 0.3);
  m.SetJobProgress("team", "mnist", 1200, 5120.5, 1872);
  const std::string text = Exposition(m.registry());
  EXPECT_TRUE(Contains(
      text,
      "vf_operator_job_workers{job_name=\"mnist\",job_namespace=\"team\",kind=\"current\"} 2"));
  EXPECT_TRUE(Contains(
      text,
      "vf_operator_job_workers{job_name=\"mnist\",job_namespace=\"team\",kind=\"desired\"} 3"));
  EXPECT_TRUE(Contains(
      text, "vf_operator_job_workers{job_name=\"mnist\",job_namespace=\"team\",kind=\"max\"} 4"));
  EXPECT_TRUE(Contains(
      text,
      "vf_operator_resizes_total{job_name=\"mnist\",job_namespace=\"team\",reason=\"grow\"} 2"));
  EXPECT_TRUE(Contains(text,
                       "vf_operator_resizes_total{job_name=\"mnist\",job_namespace=\"team\",reason="
                       "\"rebalance\"} 1"));
  EXPECT_TRUE(Contains(text,
                       "vf_operator_resize_pause_seconds_bucket{job_name=\"mnist\",job_namespace="
                       "\"team\",le=\"0.5\"} 1"));
  EXPECT_TRUE(Contains(text,
                       "vf_operator_resize_pause_seconds_bucket{job_name=\"mnist\",job_namespace="
                       "\"team\",le=\"0.25\"} 0"));
  EXPECT_TRUE(
      Contains(text, "vf_operator_job_step{job_name=\"mnist\",job_namespace=\"team\"} 1200"));
  EXPECT_TRUE(Contains(
      text, "vf_operator_job_total_steps{job_name=\"mnist\",job_namespace=\"team\"} 1872"));
  EXPECT_TRUE(Contains(
      text,
      "vf_operator_job_samples_per_second{job_name=\"mnist\",job_namespace=\"team\"} 5120.5"));
}

TEST(OperatorMetrics, JobSeriesAvoidTheLabelsPrometheusSetsFromTheTarget) {
  for (const metrics::FamilyInfo& f : OperatorMetrics().Describe()) {
    for (const std::string& label : f.label_names) {
      EXPECT_NE(label, "job") << f.name;
      EXPECT_NE(label, "namespace") << f.name;
      EXPECT_NE(label, "instance") << f.name;
      EXPECT_NE(label, "pod") << f.name;
    }
  }
}

TEST(OperatorMetrics, TotalStepsHasNoSeriesUntilKnown) {
  OperatorMetrics m;
  m.SetJobProgress("team", "mnist", 0, 0, 0);
  EXPECT_EQ(ExportedChildren(m.registry(), "vf_operator_job_total_steps"), 0u);
  m.SetJobProgress("team", "mnist", 3, 10, 30);
  EXPECT_TRUE(
      Contains(Exposition(m.registry()),
               "vf_operator_job_total_steps{job_name=\"mnist\",job_namespace=\"team\"} 30"));
  // A length that becomes unknown again (never in practice) leaves no stale series.
  m.SetJobProgress("team", "mnist", 3, 10, 0);
  EXPECT_EQ(ExportedChildren(m.registry(), "vf_operator_job_total_steps"), 0u);
}

TEST(OperatorMetrics, BuildInfoIsOneWithTheBuildsVersion) {
  OperatorMetrics m;
  EXPECT_TRUE(
      Contains(Exposition(m.registry()),
               "vf_build_info{version=\"" + std::string(metrics::BuildVersion()) + "\"} 1"));
}

TEST(OperatorMetrics, AJobsResizeSeriesStartAtZero) {
  OperatorMetrics m;
  m.SetJobWorkers("team", "mnist", {.current = 1, .desired = 1, .ready = 0, .min = 1, .max = 4});
  const std::string text = Exposition(m.registry());
  for (const char* reason : {"grow", "shrink", "failure", "leave", "rebalance"}) {
    EXPECT_TRUE(Contains(
        text, std::string("vf_operator_resizes_total{job_name=\"mnist\",job_namespace=\"team\","
                          "reason=\"") +
                  reason + "\"} 0"))
        << reason << "\n"
        << text;
  }
  EXPECT_TRUE(Contains(
      text, "vf_operator_resize_pause_seconds_count{job_name=\"mnist\",job_namespace=\"team\"} 0"));
  m.OnResize("team", "mnist", ResizeReason::kGrow);
  EXPECT_TRUE(Contains(
      Exposition(m.registry()),
      "vf_operator_resizes_total{job_name=\"mnist\",job_namespace=\"team\",reason=\"grow\"} 1"));
}

TEST(OperatorMetrics, AJobsCheckpointFailuresStartAtZeroAndCountEachFailure) {
  OperatorMetrics m;
  m.SetJobWorkers("team", "mnist", {.current = 1, .desired = 1, .ready = 0, .min = 1, .max = 4});
  const std::string series =
      "vf_operator_job_checkpoint_failures_total{job_name=\"mnist\",job_namespace=\"team\"}";
  EXPECT_TRUE(Contains(Exposition(m.registry()), series + " 0"));
  m.OnCheckpointFailure("team", "mnist");
  m.OnCheckpointFailure("team", "mnist");
  EXPECT_TRUE(Contains(Exposition(m.registry()), series + " 2"));
}

TEST(OperatorMetrics, ResizeReasonsHaveTheirLabelNames) {
  EXPECT_EQ(ResizeReasonName(ResizeReason::kGrow), "grow");
  EXPECT_EQ(ResizeReasonName(ResizeReason::kShrink), "shrink");
  EXPECT_EQ(ResizeReasonName(ResizeReason::kFailure), "failure");
  EXPECT_EQ(ResizeReasonName(ResizeReason::kLeave), "leave");
  EXPECT_EQ(ResizeReasonName(ResizeReason::kRebalance), "rebalance");
}

TEST(OperatorMetrics, RemoveJobDropsEveryJobSeriesAndOnlyThatJobs) {
  OperatorMetrics m;
  for (const char* job : {"a", "b"}) {
    m.SetJobWorkers("team", job, {.current = 1, .desired = 1, .ready = 1, .min = 1, .max = 1});
    m.OnResize("team", job, ResizeReason::kShrink);
    m.ObserveResizePause("team", job, 1);
    m.SetJobProgress("team", job, 10, 1, 100);
    m.OnCheckpointFailure("team", job);
  }
  m.SetJobProgress("other", "a", 10, 1, 100);
  m.RemoveJob("team", "a");
  const std::string text = Exposition(m.registry());
  EXPECT_EQ(SeriesOf(text, "team", "a"), 0) << text;
  EXPECT_EQ(SeriesOf(text, "team", "b"), 5 + 5 + (15 + 1 + 2) + 1 + 1 + 1 + 1) << text;
  EXPECT_EQ(SeriesOf(text, "other", "a"), 3) << text;
  EXPECT_NE(text.find("vf_operator_job_workers{job_name=\"b\",job_namespace=\"team\",kind="),
            std::string::npos);
  EXPECT_NE(text.find("vf_operator_resizes_total{job_name=\"b\",job_namespace=\"team\""),
            std::string::npos);
  EXPECT_NE(
      text.find("vf_operator_resize_pause_seconds_count{job_name=\"b\",job_namespace=\"team\"}"),
      std::string::npos);
  EXPECT_TRUE(Contains(text, "vf_operator_job_step{job_name=\"a\",job_namespace=\"other\"} 10"));
}

TEST(OperatorMetrics, ReconcilesAndApiRequestsCountErrorsApart) {
  OperatorMetrics m;
  m.OnReconcile(0.002, false);
  m.OnReconcile(0.5, true);
  m.SetWorkqueueDepth(7);
  m.OnApiRequest("get", 0.003);
  m.OnApiRequest("patch", 0.02, "409");
  m.OnApiRequest("patch", 0.01, "409");
  m.OnApiRequest("list", 2, "Transport");
  const std::string text = Exposition(m.registry());
  EXPECT_TRUE(Contains(text, "vf_operator_reconcile_duration_seconds_count 2"));
  EXPECT_TRUE(Contains(text, "vf_operator_reconcile_errors_total 1"));
  EXPECT_TRUE(Contains(text, "vf_operator_workqueue_depth 7"));
  EXPECT_TRUE(Contains(text, "vf_operator_api_request_duration_seconds_count{verb=\"patch\"} 2"));
  EXPECT_TRUE(Contains(text, "vf_operator_api_request_duration_seconds_count{verb=\"get\"} 1"));
  EXPECT_TRUE(
      Contains(text, "vf_operator_api_request_errors_total{code=\"409\",verb=\"patch\"} 2"));
  EXPECT_TRUE(
      Contains(text, "vf_operator_api_request_errors_total{code=\"Transport\",verb=\"list\"} 1"));
  // (prometheus-cpp writes label names sorted: {code, verb}.)
  EXPECT_EQ(text.find(",verb=\"get\"}"), std::string::npos);
}

TEST(OperatorMetrics, GpuInventoryReplacesProducts) {
  OperatorMetrics m;
  m.SetGpuInventory({{"NVIDIA-A100-SXM4-80GB", {.free = 2, .allocated = 6, .total = 8}},
                     {"Tesla-T4", {.free = 1, .allocated = 0, .total = 1}}});
  std::string text = Exposition(m.registry());
  EXPECT_TRUE(
      Contains(text, "vf_operator_gpus{product=\"NVIDIA-A100-SXM4-80GB\",state=\"allocated\"} 6"));
  EXPECT_TRUE(Contains(text, "vf_operator_gpus{product=\"Tesla-T4\",state=\"total\"} 1"));
  m.SetGpuInventory({{"Tesla-T4", {.free = 0, .allocated = 1, .total = 1}}});
  text = Exposition(m.registry());
  EXPECT_EQ(text.find("A100"), std::string::npos);
  EXPECT_TRUE(Contains(text, "vf_operator_gpus{product=\"Tesla-T4\",state=\"free\"} 0"));
}

TEST(OperatorMetrics, LeadershipIsOneOrZero) {
  OperatorMetrics m;
  m.SetLeader(true);
  EXPECT_EQ(m.is_leader().Value(), 1);
  m.SetLeader(false);
  EXPECT_EQ(m.is_leader().Value(), 0);
}

void Populate(OperatorMetrics& m) {
  m.SetJobsByPhase({{"Running", 2}, {"Resizing", 1}});
  m.SetJobWorkers("team-a", "mnist \"big\"",
                  {.current = 3, .desired = 4, .ready = 3, .min = 1, .max = 8});
  m.OnResize("team-a", "mnist \"big\"", ResizeReason::kFailure);
  m.ObserveResizePause("team-a", "mnist \"big\"", 12.5);
  m.ObserveResizePause("team-a", "mnist \"big\"", 0.004);
  m.OnCheckpointFailure("team-a", "mnist \"big\"");
  m.SetJobProgress("team-a", "mnist \"big\"", 123456, 20480.25, 200000);
  m.OnReconcile(0.0123, true);
  m.SetWorkqueueDepth(3);
  m.OnApiRequest("create", 0.05, "422");
  m.OnApiRequest("get", 0.001);
  m.SetGpuInventory({{"NVIDIA-H100-80GB-HBM3", {.free = 1, .allocated = 7, .total = 8}}});
  m.SetLeader(true);
}

TEST(OperatorMetrics, ExportsEveryFamilyAsRegistered) {
  OperatorMetrics m;
  Populate(m);
  const std::vector<metrics::FamilyInfo> declared = m.Describe();
  const std::vector<std::string> problems = metrics::ExportMismatches(m.registry(), declared);
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
  for (const metrics::FamilyInfo& f : declared) {
    EXPECT_GT(ExportedChildren(m.registry(), f.name), 0u) << f.name << " is not populated";
  }
}

TEST(OperatorMetrics, FullExpositionPassesPromtool) {
  const std::optional<std::string> promtool = metrics::FindPromtool();
  if (!promtool) {
    GTEST_SKIP() << "promtool not found on PATH (it comes with the Debian package 'prometheus'; "
                    "scripts/setup.sh installs it): the exposition was not checked by Prometheus";
  }
  OperatorMetrics m;
  Populate(m);
  const std::string text = Exposition(m.registry());
  Result<metrics::PromtoolReport> report = metrics::PromtoolCheckMetrics(*promtool, text);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->clean()) << "promtool exit " << report->exit_code << ":\n"
                               << report->output << "\nexposition:\n"
                               << text;
}

// Reconcile workers, the GPU watcher and a scraper at once: under TSan, the check that the
// replace-the-family methods and job removal are safe to call from any thread.
TEST(OperatorMetrics, ConcurrentUpdatesAndScrapes) {
  OperatorMetrics m;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      const std::string text = Exposition(m.registry());
      ASSERT_NE(text.find("vf_operator_jobs{phase=\"Pending\"}"), std::string::npos);
    }
  });
  // A job deleted over and over while reports about it keep coming in (from the coordinator's
  // threads): its series must come and go without a use after free.
  std::thread deleter([&] {
    while (!done.load()) m.RemoveJob("ns", "shared");
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < 4; ++t) {
    workers.emplace_back([&m, t] {
      const std::string job = "job-" + std::to_string(t);
      for (int i = 0; i < 500; ++i) {
        m.SetJobsByPhase({{"Running", i}, {"Extra" + std::to_string(i % 3), 1}});
        m.SetJobWorkers("ns", job, {.current = i, .desired = i, .ready = i, .min = 1, .max = 9});
        m.OnResize("ns", job, ResizeReason::kGrow);
        m.ObserveResizePause("ns", job, 0.1);
        m.OnReconcile(0.001, i % 7 == 0);
        m.OnApiRequest("patch", 0.002, i % 5 == 0 ? "409" : "");
        m.SetGpuInventory(
            {{"gpu-" + std::to_string(i % 2), {.free = 1, .allocated = 1, .total = 2}}});
        m.SetJobProgress("ns", "shared", i, 100, 1000);
        m.OnResize("ns", "shared", ResizeReason::kLeave);
        m.ObserveResizePause("ns", "shared", 0.2);
        m.OnCheckpointFailure("ns", "shared");
        m.SetJobWorkers("ns", "shared",
                        {.current = 1, .desired = 1, .ready = 1, .min = 1, .max = 1});
        if (i % 10 == 9) m.RemoveJob("ns", job);
      }
    });
  }
  for (std::thread& w : workers) w.join();
  done = true;
  scraper.join();
  deleter.join();
  m.RemoveJob("ns", "shared");
  EXPECT_EQ(m.reconcile_duration_seconds().Collect().histogram.sample_count, 2000u);
  // Each job was removed last after its 500th round: nothing of it is left.
  EXPECT_EQ(ExportedChildren(m.registry(), "vf_operator_job_workers"), 0u);
  EXPECT_EQ(ExportedChildren(m.registry(), "vf_operator_resizes_total"), 0u);
  EXPECT_EQ(ExportedChildren(m.registry(), "vf_operator_resize_pause_seconds"), 0u);
  EXPECT_EQ(ExportedChildren(m.registry(), "vf_operator_job_checkpoint_failures_total"), 0u);
  EXPECT_EQ(ExportedChildren(m.registry(), "vf_operator_gpus"), 3u);
}

}  // namespace
}  // namespace vf
