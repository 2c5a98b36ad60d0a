#include "tests/e2e/pod_runner/pod_status.h"

#include <algorithm>

#include "operator/kube/client.h"

namespace vf::podrunner {
namespace {

using nlohmann::json;

constexpr size_t kMessageBytes = 2048;
constexpr int kMessageLines = 80;

std::string Time(TimePoint t) { return kube::FormatTime(t); }

json Condition(std::string_view type, bool status, TimePoint now, std::string_view reason = "",
               std::string_view message = "") {
  json c = {{"type", type},
            {"status", status ? "True" : "False"},
            {"lastProbeTime", nullptr},
            {"lastTransitionTime", Time(now)}};
  if (!reason.empty()) c["reason"] = reason;
  if (!message.empty()) c["message"] = message;
  return c;
}

// The pod-level fields of every status, with `phase` and the four conditions: PodScheduled
// (always True: the pod is bound), Initialized (no init containers run), and Ready /
// ContainersReady as `ready` says, with `not_ready_reason` when they are False.
json BaseStatus(const PodFacts& pod, std::string_view phase, bool ready,
                std::string_view not_ready_reason, bool sandbox, TimePoint now) {
  std::string not_ready_message;
  if (!ready && not_ready_reason == "ContainersNotReady") {
    not_ready_message = "containers with unready status: [" + pod.container + "]";
  }
  json conditions = json::array();
  conditions.push_back(Condition("PodReadyToStartContainers", sandbox, now));
  conditions.push_back(Condition("Initialized", true, now));
  conditions.push_back(Condition("Ready", ready, now, ready ? std::string_view() : not_ready_reason,
                                 not_ready_message));
  conditions.push_back(Condition("ContainersReady", ready, now,
                                 ready ? std::string_view() : not_ready_reason, not_ready_message));
  conditions.push_back(Condition("PodScheduled", true, now));
  json status = {{"phase", phase},
                 {"conditions", std::move(conditions)},
                 {"hostIP", pod.host_ip},
                 {"hostIPs", json::array({{{"ip", pod.host_ip}}})},
                 {"startTime", Time(pod.start_time)}};
  if (!pod.pod_ip.empty()) {
    status["podIP"] = pod.pod_ip;
    status["podIPs"] = json::array({{{"ip", pod.pod_ip}}});
  }
  return status;
}

json ContainerStatus(const PodFacts& pod, bool running, int64_t pid, json state) {
  json s = {{"name", pod.container},
            {"image", pod.image},
            {"imageID", "vf-pod-runner://" + pod.image},
            {"ready", running},
            {"started", running},
            {"restartCount", 0},
            {"state", std::move(state)},
            {"lastState", json::object()}};
  if (pid > 0) s["containerID"] = "vf-pod-runner://" + std::to_string(pid);
  return s;
}

// The length of the valid UTF-8 sequence at the start of `s`, or 0 when it is not one.
size_t Utf8SequenceLength(std::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  size_t n = 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
  }
  // Overlong forms, surrogates and code points past U+10FFFF.
  if (c == 0xE0 && b(1) < 0xA0) return 0;
  if (c == 0xED && b(1) > 0x9F) return 0;
  if (c == 0xF0 && b(1) < 0x90) return 0;
  if (c == 0xF4 && b(1) > 0x8F) return 0;
  return n;
}

}  // namespace

std::string SanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t n = Utf8SequenceLength(text);
    if (n == 0) {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      text.remove_prefix(1);
    } else {
      out.append(text.substr(0, n));
      text.remove_prefix(n);
    }
  }
  return out;
}

std::string TerminationMessage(std::string_view log_tail) {
  std::string_view tail = log_tail;
  if (tail.size() > kMessageBytes) {
    tail = tail.substr(tail.size() - kMessageBytes);
    // Do not start in the middle of a character.
    while (!tail.empty() && (static_cast<unsigned char>(tail.front()) & 0xC0) == 0x80) {
      tail.remove_prefix(1);
    }
  }
  // The last kMessageLines lines; a final newline does not start another line.
  size_t end = tail.size();
  if (end > 0 && tail[end - 1] == '\n') --end;
  int lines = 0;
  size_t start = 0;
  for (size_t i = end; i > 0; --i) {
    if (tail[i - 1] == '\n' && ++lines == kMessageLines) {
      start = i;
      break;
    }
  }
  return SanitizeUtf8(tail.substr(start));
}

int ReportedExitCode(const ContainerExit& exit) {
  return exit.signal != 0 ? 128 + exit.signal : exit.exit_code;
}

json RunningStatus(const PodFacts& pod, const ContainerRun& run, TimePoint now) {
  json status = BaseStatus(pod, "Running", true, "", true, now);
  status["containerStatuses"] = json::array(
      {ContainerStatus(pod, true, run.pid, {{"running", {{"startedAt", Time(run.started_at)}}}})});
  return status;
}

json ExitedStatus(const PodFacts& pod, const ContainerRun& run, const ContainerExit& exit) {
  const int code = ReportedExitCode(exit);
  json terminated = {{"exitCode", code},
                     {"reason", code == 0 ? "Completed" : "Error"},
                     {"startedAt", Time(run.started_at)},
                     {"finishedAt", Time(exit.finished_at)}};
  if (exit.signal != 0) terminated["signal"] = exit.signal;
  if (!exit.termination_message.empty()) {
    terminated["message"] = SanitizeUtf8(exit.termination_message);
  } else if (code != 0) {
    std::string message = TerminationMessage(exit.log_tail);
    if (!message.empty()) terminated["message"] = std::move(message);
  }
  json status = BaseStatus(pod, code == 0 ? "Succeeded" : "Failed", false, "PodCompleted", false,
                           exit.finished_at);
  status["containerStatuses"] =
      json::array({ContainerStatus(pod, false, run.pid, {{"terminated", std::move(terminated)}})});
  return status;
}

json CannotRunStatus(const PodFacts& pod, std::string_view message, TimePoint now) {
  json terminated = {{"exitCode", 128},
                     {"reason", "ContainerCannotRun"},
                     {"message", SanitizeUtf8(message)},
                     {"startedAt", Time(now)},
                     {"finishedAt", Time(now)}};
  json status = BaseStatus(pod, "Failed", false, "PodCompleted", false, now);
  status["containerStatuses"] =
      json::array({ContainerStatus(pod, false, 0, {{"terminated", std::move(terminated)}})});
  return status;
}

json WaitingStatus(const PodFacts& pod, std::string_view reason, std::string_view message,
                   TimePoint now) {
  json status = BaseStatus(pod, "Pending", false, "ContainersNotReady", true, now);
  status["containerStatuses"] = json::array({ContainerStatus(
      pod, false, 0, {{"waiting", {{"reason", reason}, {"message", SanitizeUtf8(message)}}}})});
  return status;
}

json LostStatus(const PodFacts& pod, TimePoint now) {
  json terminated = {{"exitCode", 137},
                     {"reason", "ContainerStatusUnknown"},
                     {"message",
                      "The container could not be located when the pod was "
                      "terminated (vf-pod-runner restarted)"},
                     {"startedAt", Time(pod.start_time)},
                     {"finishedAt", Time(now)}};
  json status = BaseStatus(pod, "Failed", false, "PodCompleted", false, now);
  status["containerStatuses"] =
      json::array({ContainerStatus(pod, false, 0, {{"terminated", std::move(terminated)}})});
  return status;
}

}  // namespace vf::podrunner
