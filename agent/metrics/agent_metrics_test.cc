#include "agent/metrics/agent_metrics.h"

#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/metrics/build_info.h"
#include "agent/metrics/promtool.h"
#include "agent/metrics/test_util.h"

namespace vf {
namespace {

using metrics::Exposition;
using prometheus::MetricType;

bool Contains(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

// prometheus-cpp writes label names in sorted order.
constexpr char kJobLabels[] = "{job_name=\"mnist\",job_namespace=\"team\"}";

std::string Line(const std::string& name, const std::string& value) {
  return name + kJobLabels + " " + value;
}

TEST(AgentMetrics, RegistersTheFixedFamiliesLabelledByJobNamespaceAndJobNameOnly) {
  AgentMetrics m("team", "mnist");
  std::map<std::string, MetricType> got;
  for (const metrics::FamilyInfo& f : m.Describe()) {
    got[f.name] = f.type;
    if (f.name == "vf_build_info") continue;
    // Not `namespace` or `job`: Prometheus sets those from the scrape target.
    EXPECT_EQ(f.label_names, (std::vector<std::string>{"job_namespace", "job_name"})) << f.name;
  }
  const std::map<std::string, MetricType> want = {
      {"vf_build_info", MetricType::Gauge},
      {"vf_agent_steps_total", MetricType::Counter},
      {"vf_agent_step_duration_seconds", MetricType::Histogram},
      {"vf_agent_samples_per_second", MetricType::Gauge},
      {"vf_agent_loss", MetricType::Gauge},
      {"vf_agent_virtual_nodes", MetricType::Gauge},
      {"vf_agent_membership_epoch", MetricType::Gauge},
      {"vf_agent_allreduce_seconds_total", MetricType::Counter},
      {"vf_agent_communicator_rebuild_seconds", MetricType::Histogram},
      {"vf_agent_state_transfer_bytes_total", MetricType::Counter},
      {"vf_agent_state_transfer_seconds_total", MetricType::Counter},
      {"vf_agent_recoveries_total", MetricType::Counter},
      {"vf_agent_checkpoint_failures_total", MetricType::Counter},
  };
  EXPECT_EQ(got, want);
}

TEST(AgentMetrics, ExportsEveryFamilyAsRegistered) {
  AgentMetrics m("team", "mnist");
  m.OnStep(0.02, 0.75, 3200, 4);
  m.OnRebuild(1.5, 3);
  const std::vector<metrics::FamilyInfo> declared = m.Describe();
  const std::vector<std::string> problems = metrics::ExportMismatches(m.registry(), declared);
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
  for (const metrics::FamilyInfo& f : declared) {
    EXPECT_EQ(metrics::ExportedChildren(m.registry(), f.name), 1u) << f.name;
  }
}

TEST(AgentMetrics, HelpTextsAreTheDocumentedOnes) {
  std::map<std::string, std::string> help;
  for (const metrics::FamilyInfo& f : AgentMetrics("team", "mnist").Describe())
    help[f.name] = f.help;
  EXPECT_EQ(help["vf_agent_steps_total"], "Training steps this worker completed.");
  EXPECT_EQ(help["vf_agent_samples_per_second"],
            "Training samples per second of the whole job (global batch per step), as this "
            "worker measures it.");
  EXPECT_EQ(help["vf_agent_recoveries_total"],
            "Failed steps redone after the membership recovered.");
}

TEST(AgentMetrics, EverySeriesIsExportedFromTheStartAtZero) {
  AgentMetrics m("team", "mnist");
  const std::string text = Exposition(m.registry());
  EXPECT_TRUE(Contains(text, Line("vf_agent_steps_total", "0")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_recoveries_total", "0")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_checkpoint_failures_total", "0")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_membership_epoch", "0")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_step_duration_seconds_count", "0")));
  EXPECT_EQ(text.find("pod"), std::string::npos);
}

TEST(AgentMetrics, BuildInfoIsOneWithTheBuildsVersion) {
  AgentMetrics m("team", "mnist");
  const std::string text = Exposition(m.registry());
  EXPECT_FALSE(metrics::BuildVersion().empty());
  EXPECT_TRUE(
      Contains(text, "vf_build_info{version=\"" + std::string(metrics::BuildVersion()) + "\"} 1"))
      << text;
}

TEST(AgentMetrics, OnStepCountsTimesAndSetsTheGauges) {
  AgentMetrics m("team", "mnist");
  m.OnStep(0.02, 0.75, 3200, 4);
  m.OnStep(0.03, 0.5, 3300.5, 3);
  const std::string text = Exposition(m.registry());
  EXPECT_TRUE(Contains(text, Line("vf_agent_steps_total", "2")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_loss", "0.5")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_samples_per_second", "3300.5")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_virtual_nodes", "3")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_step_duration_seconds_count", "2")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_step_duration_seconds_sum", "0.05")));
  EXPECT_TRUE(Contains(text,
                       "vf_agent_step_duration_seconds_bucket{job_name=\"mnist\","
                       "job_namespace=\"team\",le=\"0.025\"} 1"));
}

TEST(AgentMetrics, CollectivesMembershipAndRecoveries) {
  AgentMetrics m("team", "mnist");
  m.OnAllReduce(0.25);
  m.OnAllReduce(0.5);
  m.OnRebuild(1.5, 3);
  m.OnStateTransfer(1 << 20, 0.125);
  m.OnStateTransfer(1 << 20, 0.125);
  m.OnRecovery();
  m.SetVirtualNodes(8);
  const std::string text = Exposition(m.registry());
  EXPECT_TRUE(Contains(text, Line("vf_agent_allreduce_seconds_total", "0.75")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_membership_epoch", "3")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_communicator_rebuild_seconds_count", "1")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_state_transfer_bytes_total", "2097152")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_state_transfer_seconds_total", "0.25")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_recoveries_total", "1")));
  EXPECT_TRUE(Contains(text, Line("vf_agent_virtual_nodes", "8")));
  m.SetMembershipEpoch(4);
  EXPECT_EQ(m.membership_epoch().Value(), 4);
}

TEST(AgentMetrics, EachFailedCheckpointWriteCounts) {
  AgentMetrics m("team", "mnist");
  m.OnCheckpointFailed();
  m.OnCheckpointFailed();
  EXPECT_TRUE(Contains(Exposition(m.registry()), Line("vf_agent_checkpoint_failures_total", "2")));
  EXPECT_EQ(m.checkpoint_failures_total().Value(), 2);
}

TEST(AgentMetrics, StepBucketsSpanMillisecondsToMinutes) {
  AgentMetrics m("team", "mnist");
  const std::vector<prometheus::ClientMetric::Bucket> buckets =
      m.step_duration_seconds().Collect().histogram.bucket;
  ASSERT_GE(buckets.size(), 2u);
  EXPECT_LE(buckets.front().upper_bound, 0.001);
  EXPECT_GE(buckets[buckets.size() - 2].upper_bound, 120);  // the last is +Inf
}

TEST(AgentMetrics, FullExpositionPassesPromtool) {
  const std::optional<std::string> promtool = metrics::FindPromtool();
  if (!promtool) {
    GTEST_SKIP() << "promtool not found on PATH (it comes with the Debian package 'prometheus'; "
                    "scripts/setup.sh installs it): the exposition was not checked by Prometheus";
  }
  AgentMetrics m("team-a", "job\\with \"odd\"\nname");
  m.OnStep(0.0123, 2.302585, 10240, 2);
  m.OnStep(95, std::numeric_limits<double>::quiet_NaN(), 0, 2);
  m.OnAllReduce(0.004);
  m.OnRebuild(0.8, 2);
  m.OnStateTransfer(123456789, 1.5);
  m.OnRecovery();
  m.OnCheckpointFailed();
  const std::string text = Exposition(m.registry());
  Result<metrics::PromtoolReport> report = metrics::PromtoolCheckMetrics(*promtool, text);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->clean()) << "promtool exit " << report->exit_code << ":\n"
                               << report->output << "\nexposition:\n"
                               << text;
}

// The training loop, the plan watcher and a scraper touch the metrics from different threads.
TEST(AgentMetrics, ConcurrentUpdatesAndScrapes) {
  AgentMetrics m("team", "mnist");
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) ASSERT_FALSE(Exposition(m.registry()).empty());
  });
  std::thread trainer([&] {
    for (int i = 0; i < 5000; ++i) {
      m.OnStep(0.01, 1.0 / (i + 1), 1000, 2);
      m.OnAllReduce(0.001);
    }
  });
  std::thread watcher([&] {
    for (int i = 0; i < 5000; ++i) {
      m.OnRebuild(0.1, i);
      m.OnStateTransfer(10, 0.01);
      if (i % 100 == 0) m.OnRecovery();
    }
  });
  trainer.join();
  watcher.join();
  done = true;
  scraper.join();
  EXPECT_EQ(m.steps_total().Value(), 5000);
  EXPECT_EQ(m.state_transfer_bytes_total().Value(), 50000);
  EXPECT_EQ(m.recoveries_total().Value(), 50);
}

}  // namespace
}  // namespace vf
