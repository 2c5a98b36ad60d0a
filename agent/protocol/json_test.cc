// The wire format both sides of the coordinator's API use.
#include "agent/protocol/json.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace vf::protocol {
namespace {

using nlohmann::json;

TEST(ProtocolJson, PlanRoundTrips) {
  Plan plan;
  plan.epoch = 7;
  plan.store_prefix = "epoch-7";
  plan.members = {{"w-a", 0, {0, 1, 2}}, {"w-b", 1, {3}}};
  Result<Plan> back = PlanFromJson(ParseObject(Dump(PlanToJson(plan))).value());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->epoch, 7);
  EXPECT_EQ(back->store_prefix, "epoch-7");
  ASSERT_EQ(back->members.size(), 2u);
  EXPECT_EQ(back->members[0].worker, "w-a");
  EXPECT_EQ(back->members[1].rank, 1);
  EXPECT_EQ(back->members[0].virtual_nodes, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(back->members[1].virtual_nodes, (std::vector<int>{3}));
}

TEST(ProtocolJson, PlanWithANegativeRankIsRefusedNamingTheField) {
  json plan = {{"epoch", 1},
               {"storePrefix", "epoch-1"},
               {"members", {{{"worker", "w"}, {"rank", -1}, {"virtualNodes", {0}}}}}};
  Result<Plan> parsed = PlanFromJson(plan);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("rank"), std::string::npos);
}

TEST(ProtocolJson, ReportRoundTripsWithNonFiniteNumbersAsNull) {
  Report r;
  r.epoch = 3;
  r.step = 41;
  r.loss = std::nan("");
  r.samples_per_second = 1234.5;
  r.seconds_per_virtual_node = 0.25;
  r.pause_seconds = 1.5;
  r.has_state = true;
  r.finished = true;
  r.weights_sha256 = std::string(64, 'e');
  r.test_accuracy = 0.875;
  r.total_steps = 1872;
  r.checkpoint_step = 1800;
  r.checkpoint_error = "checkpoint /ckpt/job.state: No space left on device";
  const json wire = ReportToJson(r);
  EXPECT_TRUE(wire.at("loss").is_null());
  Result<Report> back = ReportFromJson(ParseObject(Dump(wire)).value());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->epoch, 3);
  EXPECT_EQ(back->step, 41);
  EXPECT_TRUE(std::isnan(back->loss));
  EXPECT_EQ(back->samples_per_second, 1234.5);
  EXPECT_EQ(back->seconds_per_virtual_node, 0.25);
  EXPECT_EQ(back->pause_seconds, 1.5);
  EXPECT_TRUE(back->has_state);
  EXPECT_TRUE(back->finished);
  EXPECT_EQ(back->weights_sha256, std::string(64, 'e'));
  EXPECT_EQ(back->test_accuracy, 0.875);
  EXPECT_EQ(back->total_steps, 1872);
  EXPECT_EQ(back->checkpoint_step, 1800);
  EXPECT_EQ(back->checkpoint_error, "checkpoint /ckpt/job.state: No space left on device");
}

TEST(ProtocolJson, ReportWithANegativeCheckpointStepOrAnOverlongErrorIsRefused) {
  Report r;
  r.checkpoint_step = -1;
  Result<Report> back = ReportFromJson(ParseObject(Dump(ReportToJson(r))).value());
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("checkpointStep"), std::string::npos);
  r.checkpoint_step = 5;
  r.checkpoint_error = std::string(kMaxCheckpointError + 1, 'x');
  back = ReportFromJson(ParseObject(Dump(ReportToJson(r))).value());
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("checkpointError"), std::string::npos);
}

TEST(ProtocolJson, ReportWithSomethingElseThanADigestIsRefused) {
  Report r;
  r.finished = true;
  for (const std::string& bad : {std::string("ab12"), std::string(64, 'E'),
                                 std::string(63, 'a') + "g", std::string(65, 'a')}) {
    r.weights_sha256 = bad;
    Result<Report> back = ReportFromJson(ParseObject(Dump(ReportToJson(r))).value());
    ASSERT_FALSE(back.ok()) << bad;
    EXPECT_NE(back.status().message().find("weightsSha256"), std::string::npos);
  }
}

TEST(ProtocolJson, ReportFromAnOlderAgentLacksTheOptionalFields) {
  const json old = {{"epoch", 1},
                    {"step", 2},
                    {"loss", 0.5},
                    {"samplesPerSecond", 10.0},
                    {"secondsPerVirtualNode", 0.1},
                    {"hasState", false}};
  Result<Report> r = ReportFromJson(old);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->finished);
  EXPECT_TRUE(r->weights_sha256.empty());
  EXPECT_TRUE(std::isnan(r->test_accuracy));
  EXPECT_EQ(r->pause_seconds, 0.0);
  EXPECT_EQ(r->total_steps, 0);
  EXPECT_EQ(r->checkpoint_step, 0);
  EXPECT_TRUE(r->checkpoint_error.empty());
}

TEST(ProtocolJson, ReportMissingARequiredFieldNamesIt) {
  const json report = {{"epoch", 1},
                       {"loss", 0.5},
                       {"samplesPerSecond", 10.0},
                       {"secondsPerVirtualNode", 0.1},
                       {"hasState", true}};
  Result<Report> r = ReportFromJson(report);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'step'"), std::string::npos) << r.status().message();
}

TEST(ProtocolJson, ReportWithAWrongTypeNamesTheField) {
  json report = ReportToJson(Report{});
  report["hasState"] = "yes";
  Result<Report> r = ReportFromJson(report);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'hasState'"), std::string::npos) << r.status().message();
}

TEST(ProtocolJson, DeeplyNestedBodiesAreRefused) {
  std::string body = "{\"a\":";
  for (int i = 0; i < kMaxJsonDepth + 2; ++i) body += "[";
  for (int i = 0; i < kMaxJsonDepth + 2; ++i) body += "]";
  body += "}";
  Result<json> parsed = ParseObject(body);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("deeper"), std::string::npos);
}

TEST(ProtocolJson, AFinalReportLeftAsATerminationMessageReadsBack) {
  Report r;
  r.epoch = 4;
  r.step = 600;
  r.loss = 0.25;
  r.has_state = true;
  r.weights_sha256 = std::string(64, 'c');
  r.test_accuracy = 0.5;
  r.total_steps = 600;
  const std::string message = FinalReportMessage("job-worker-a", r);
  EXPECT_LT(message.size(), 1024u);  // the kubelet keeps 4096 bytes
  auto back = FinalReportFromMessage(message);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->first, "job-worker-a");
  EXPECT_TRUE(back->second.finished);  // written as finished whatever the caller set
  EXPECT_EQ(back->second.step, 600);
  EXPECT_EQ(back->second.epoch, 4);
  EXPECT_EQ(back->second.weights_sha256, std::string(64, 'c'));
  EXPECT_EQ(back->second.test_accuracy, 0.5);
}

TEST(ProtocolJson, AnotherTerminationMessageIsNoFinalReport) {
  for (const char* other :
       {"", "Error: out of memory\n", "[1, 2]", "{\"kind\": \"Other\"}", "{\"kind\": 7}"}) {
    EXPECT_EQ(FinalReportFromMessage(other).status().code(), StatusCode::kNotFound) << other;
  }
  const json unfinished = {
      {"kind", kFinalReportKind}, {"worker", "w"}, {"report", ReportToJson({})}};
  auto back = FinalReportFromMessage(Dump(unfinished));
  EXPECT_EQ(back.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find("finished"), std::string::npos);
  const json bad = {{"kind", kFinalReportKind}, {"worker", "w"}, {"report", {{"epoch", "x"}}}};
  EXPECT_EQ(FinalReportFromMessage(Dump(bad)).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vf::protocol
