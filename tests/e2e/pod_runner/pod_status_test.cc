#include "tests/e2e/pod_runner/pod_status.h"

#include <gtest/gtest.h>

#include <string>

namespace vf::podrunner {
namespace {

using nlohmann::json;

TimePoint At(int64_t seconds) { return TimePoint(std::chrono::seconds(seconds)); }

PodFacts Facts() {
  PodFacts f;
  f.start_time = At(1700000000);
  f.container = "worker";
  f.image = "virtualflow/agent:e2e";
  return f;
}

const json& Condition(const json& status, const std::string& type) {
  for (const json& c : status["conditions"]) {
    if (c["type"] == type) return c;
  }
  static const json none;
  ADD_FAILURE() << "no condition " << type;
  return none;
}

TEST(RunningStatusTest, HasTheShapeAKubeletWrites) {
  const json s = RunningStatus(Facts(), ContainerRun{4242, At(1700000001)}, At(1700000002));
  EXPECT_EQ(s["phase"], "Running");
  EXPECT_EQ(s["podIP"], "127.0.0.1");
  EXPECT_EQ(s["podIPs"], json::parse(R"([{"ip": "127.0.0.1"}])"));
  EXPECT_EQ(s["hostIP"], "127.0.0.1");
  EXPECT_EQ(s["hostIPs"], json::parse(R"([{"ip": "127.0.0.1"}])"));
  EXPECT_EQ(s["startTime"], "2023-11-14T22:13:20Z");
  for (const char* type : {"PodScheduled", "Initialized", "ContainersReady", "Ready"}) {
    EXPECT_EQ(Condition(s, type)["status"], "True") << type;
    EXPECT_EQ(Condition(s, type)["lastTransitionTime"], "2023-11-14T22:13:22Z") << type;
  }
  ASSERT_EQ(s["containerStatuses"].size(), 1u);
  const json& c = s["containerStatuses"][0];
  EXPECT_EQ(c["name"], "worker");
  EXPECT_EQ(c["image"], "virtualflow/agent:e2e");
  EXPECT_FALSE(c["imageID"].get<std::string>().empty());
  EXPECT_EQ(c["containerID"], "vf-pod-runner://4242");
  EXPECT_EQ(c["ready"], true);
  EXPECT_EQ(c["started"], true);
  EXPECT_EQ(c["restartCount"], 0);
  EXPECT_EQ(c["state"], json::parse(R"({"running": {"startedAt": "2023-11-14T22:13:21Z"}})"));
}

TEST(ExitedStatusTest, ExitZeroSucceedsAsCompletedWithoutMessage) {
  ContainerExit exit;
  exit.finished_at = At(1700000010);
  exit.log_tail = "all good\n";
  const json s = ExitedStatus(Facts(), ContainerRun{7, At(1700000001)}, exit);
  EXPECT_EQ(s["phase"], "Succeeded");
  const json& t = s["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(t["exitCode"], 0);
  EXPECT_EQ(t["reason"], "Completed");
  EXPECT_EQ(t["startedAt"], "2023-11-14T22:13:21Z");
  EXPECT_EQ(t["finishedAt"], "2023-11-14T22:13:30Z");
  EXPECT_FALSE(t.contains("message"));
  EXPECT_FALSE(t.contains("signal"));
  EXPECT_EQ(s["containerStatuses"][0]["ready"], false);
  EXPECT_EQ(s["containerStatuses"][0]["started"], false);
  EXPECT_EQ(Condition(s, "Ready")["status"], "False");
  EXPECT_EQ(Condition(s, "Ready")["reason"], "PodCompleted");
  EXPECT_EQ(Condition(s, "ContainersReady")["status"], "False");
  EXPECT_EQ(Condition(s, "PodScheduled")["status"], "True");
}

TEST(ExitedStatusTest, NonZeroExitFailsWithTheLogTailAsMessage) {
  ContainerExit exit;
  exit.exit_code = 3;
  exit.finished_at = At(1700000010);
  exit.log_tail = "loading\nboom: out of cheese\n";
  const json s = ExitedStatus(Facts(), ContainerRun{7, At(1700000001)}, exit);
  EXPECT_EQ(s["phase"], "Failed");
  const json& t = s["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(t["exitCode"], 3);
  EXPECT_EQ(t["reason"], "Error");
  EXPECT_EQ(t["message"], "loading\nboom: out of cheese\n");
}

TEST(ExitedStatusTest, WhatTheContainerWroteToItsTerminationMessagePathIsTheMessage) {
  ContainerExit exit;
  exit.finished_at = At(1700000010);
  exit.log_tail = "all good\n";
  exit.termination_message = "{\"kind\": \"VirtualFlowFinalReport\"}";
  json s = ExitedStatus(Facts(), ContainerRun{7, At(1700000001)}, exit);
  EXPECT_EQ(s["phase"], "Succeeded");
  EXPECT_EQ(s["containerStatuses"][0]["state"]["terminated"]["message"],
            "{\"kind\": \"VirtualFlowFinalReport\"}");
  // It wins over the log tail of a failure too.
  exit.exit_code = 1;
  exit.termination_message = "disk full";
  s = ExitedStatus(Facts(), ContainerRun{7, At(1700000001)}, exit);
  EXPECT_EQ(s["containerStatuses"][0]["state"]["terminated"]["message"], "disk full");
}

TEST(ExitedStatusTest, KilledBySignalReports128PlusSignal) {
  ContainerExit exit;
  exit.signal = 9;
  exit.finished_at = At(1700000010);
  const json s = ExitedStatus(Facts(), ContainerRun{7, At(1700000001)}, exit);
  EXPECT_EQ(s["phase"], "Failed");
  const json& t = s["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(t["exitCode"], 137);
  EXPECT_EQ(t["signal"], 9);
  EXPECT_EQ(t["reason"], "Error");
  EXPECT_FALSE(t.contains("message"));  // nothing in the log
  EXPECT_EQ(ReportedExitCode(exit), 137);
}

TEST(CannotRunStatusTest, FailsWithContainerCannotRun) {
  const json s = CannotRunStatus(Facts(), "exec: \"nope\": executable file not found in $PATH",
                                 At(1700000003));
  EXPECT_EQ(s["phase"], "Failed");
  const json& t = s["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(t["reason"], "ContainerCannotRun");
  EXPECT_EQ(t["exitCode"], 128);
  EXPECT_EQ(t["message"], "exec: \"nope\": executable file not found in $PATH");
  EXPECT_FALSE(s["containerStatuses"][0].contains("containerID"));
}

TEST(WaitingStatusTest, StaysPendingWithReasonAndMessage) {
  const json s = WaitingStatus(Facts(), "CreateContainerConfigError", "secret \"db\" not found",
                               At(1700000003));
  EXPECT_EQ(s["phase"], "Pending");
  EXPECT_EQ(s["containerStatuses"][0]["state"],
            json::parse(R"({"waiting": {"reason": "CreateContainerConfigError",
                                        "message": "secret \"db\" not found"}})"));
  EXPECT_EQ(Condition(s, "Ready")["status"], "False");
  EXPECT_EQ(Condition(s, "Ready")["reason"], "ContainersNotReady");
  EXPECT_EQ(Condition(s, "Ready")["message"], "containers with unready status: [worker]");
}

TEST(WaitingStatusTest, ReportsNoPodIpBeforeThePodHasOne) {
  PodFacts facts = Facts();
  facts.pod_ip = "";
  const json s = WaitingStatus(facts, "ContainerCreating", "not yet", At(1700000003));
  EXPECT_FALSE(s.contains("podIP"));
  EXPECT_FALSE(s.contains("podIPs"));
  EXPECT_EQ(s["hostIP"], "127.0.0.1");
}

TEST(LostStatusTest, FailsWithContainerStatusUnknown) {
  const json s = LostStatus(Facts(), At(1700000003));
  EXPECT_EQ(s["phase"], "Failed");
  const json& t = s["containerStatuses"][0]["state"]["terminated"];
  EXPECT_EQ(t["reason"], "ContainerStatusUnknown");
  EXPECT_EQ(t["exitCode"], 137);
}

TEST(TerminationMessageTest, KeepsTheLast2KiB) {
  std::string log(5000, 'a');
  log += "THE END";
  const std::string m = TerminationMessage(log);
  EXPECT_EQ(m.size(), 2048u);
  EXPECT_EQ(m.substr(m.size() - 7), "THE END");
}

TEST(TerminationMessageTest, KeepsTheLast80Lines) {
  std::string log;
  for (int i = 0; i < 100; ++i) log += std::to_string(i) + "\n";
  const std::string m = TerminationMessage(log);
  EXPECT_EQ(m.substr(0, 3), "20\n");
  EXPECT_EQ(m.substr(m.size() - 3), "99\n");
}

TEST(TerminationMessageTest, NeverStartsInsideACharacterAndIsValidUtf8) {
  std::string log;
  for (int i = 0; i < 1500; ++i) log += "\xC3\xA9";  // é, two bytes each: the cut falls mid-way
  const std::string m = TerminationMessage(log + "\xFF");
  EXPECT_EQ(m.substr(0, 2), "\xC3\xA9");
  EXPECT_EQ(m.substr(m.size() - 3), "\xEF\xBF\xBD");
  EXPECT_NO_THROW(json(m).dump());
}

TEST(SanitizeUtf8Test, ReplacesOnlyInvalidBytes) {
  EXPECT_EQ(SanitizeUtf8("plain"), "plain");
  EXPECT_EQ(SanitizeUtf8("\xE2\x82\xAC \xF0\x9F\x98\x80"), "\xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(SanitizeUtf8("a\x80z"), "a\xEF\xBF\xBDz");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // overlong '/'
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(SanitizeUtf8("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");                  // truncated
  EXPECT_EQ(SanitizeUtf8(std::string("a\0b", 3)), std::string("a\0b", 3));
}

}  // namespace
}  // namespace vf::podrunner
