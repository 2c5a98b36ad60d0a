// The pod status the runner writes through pods/status, built from what happened to the
// container's process: Running, Succeeded / Failed with the exit, Failed with
// ContainerCannotRun, Pending with a waiting reason. Pure, so every shape is unit-tested.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace vf::podrunner {

using TimePoint = std::chrono::system_clock::time_point;

// The pod-level facts every status carries. Value type; thread-compatible.
struct PodFacts {
  std::string pod_ip = "127.0.0.1";  // "" before the pod has an address: none is reported
  std::string host_ip = "127.0.0.1";
  TimePoint start_time;   // when the runner first acted on the pod (status.startTime)
  std::string container;  // the container's name
  std::string image;      // its image (reported, never pulled)
};

// A container process that started. Value type; thread-compatible.
struct ContainerRun {
  int64_t pid = 0;
  TimePoint started_at;
};

// How it ended. Value type; thread-compatible.
struct ContainerExit {
  int exit_code = 0;  // the process's exit status when it exited
  int signal = 0;     // the signal that killed it, 0 when it exited
  TimePoint finished_at;
  std::string log_tail;  // the end of its log, for the message of a failure
  // What it wrote to its terminationMessagePath (at most 4096 bytes); "" when nothing.
  std::string termination_message;
};

// The bytes of the termination message: the last 80 lines and at most 2048 bytes of
// `log_tail` (what FallbackToLogsOnError gives), as valid UTF-8.
std::string TerminationMessage(std::string_view log_tail);

// `text` with every byte that is not part of a valid UTF-8 sequence replaced by U+FFFD, so that
// it can be sent as JSON.
std::string SanitizeUtf8(std::string_view text);

// The exit code a container status reports: the exit status, or 128 + signal.
int ReportedExitCode(const ContainerExit& exit);

// The status of a pod whose container runs: phase Running, every condition True, the container
// running, ready and started.
nlohmann::json RunningStatus(const PodFacts& pod, const ContainerRun& run, TimePoint now);

// The status of a pod whose container ended (restartPolicy Never): Succeeded for exit 0,
// Failed otherwise; state.terminated with exitCode, signal, reason Completed / Error, startedAt,
// finishedAt, and the message: what the container wrote to its terminationMessagePath, else,
// when the exit code is not 0, the end of its log (as FallbackToLogsOnError, for every
// container).
nlohmann::json ExitedStatus(const PodFacts& pod, const ContainerRun& run,
                            const ContainerExit& exit);

// The status of a pod whose command could not be started: Failed, state.terminated with reason
// ContainerCannotRun, exit code 128 and `message`.
nlohmann::json CannotRunStatus(const PodFacts& pod, std::string_view message, TimePoint now);

// The status of a pod that is not started yet because of `reason` (CreateContainerConfigError):
// Pending, state.waiting with the reason and `message`.
nlohmann::json WaitingStatus(const PodFacts& pod, std::string_view reason, std::string_view message,
                             TimePoint now);

// The status of a pod that a previous runner started and this one cannot find the process of
// (it died with that runner): Failed, state.terminated with reason ContainerStatusUnknown and
// exit code 137, as the kubelet reports a container it lost.
nlohmann::json LostStatus(const PodFacts& pod, TimePoint now);

}  // namespace vf::podrunner
