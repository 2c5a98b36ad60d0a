// Fuzz target: the coordinator's requests. The input is what reaches the server: a request line
// ("METHOD /path?query"), the Authorization header's value, the X-VirtualFlow-Worker header's
// value and the body, one per line (the body takes the rest). It is read as the server reads it
// (request.h) and, when it is well formed, applied to a real in-memory coordinator holding a
// job with a plan of two workers, as the server applies it after checking the credential. Any
// bytes must give an answer or an error, never a crash, an uncaught exception or a coordinator
// whose plan breaks its invariants.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "operator/coordinator/coordinator.h"
#include "operator/coordinator/request.h"

namespace {

namespace c = vf::coordinator;

constexpr char kJob[] = "ns/job";

// The text up to the next newline (the rest of `input` if none), which is consumed.
std::string_view NextLine(std::string_view& input) {
  const size_t end = input.find('\n');
  const std::string_view line = input.substr(0, end);
  input = end == std::string_view::npos ? std::string_view() : input.substr(end + 1);
  return line;
}

void SetUpJob(vf::Coordinator& coordinator) {
  if (!coordinator.AddJob(kJob, "secret", "fp", "build").ok()) __builtin_trap();
  if (!coordinator.RegisterWorker(kJob, "w0", "fp", "build", true).ok()) __builtin_trap();
  if (!coordinator.RegisterWorker(kJob, "w1", "fp", "build", true).ok()) __builtin_trap();
  if (!coordinator.PublishPlan(kJob, {{"w0", 0, {0, 1}}, {"w1", 1, {2, 3}}}).ok()) {
    __builtin_trap();
  }
}

// A poll is started and cancelled at once: the fuzzer must not wait.
void Poll(vf::Coordinator& coordinator, const c::Route& route, std::string_view query_text) {
  vf::Result<std::map<std::string, std::string>> query = c::ParseQuery(query_text);
  if (!query.ok()) return;
  if (!c::QueryInt(*query, "after", 0).ok() || !c::PollTimeout(*query, vf::kMaxPlanPollMs).ok())
    return;
  vf::Result<vf::Coordinator::WatchId> id =
      route.action == c::Action::kPlan
          ? coordinator.WatchPlan(route.job, c::QueryInt(*query, "after", 0).value(),
                                  [](const vf::Result<vf::Plan>&) {})
          : coordinator.WatchKey(route.job, route.key, [](const vf::Result<std::string>&) {});
  if (id.ok() && *id != vf::Coordinator::kNoWatch) coordinator.CancelWatch(*id);
}

void Apply(vf::Coordinator& coordinator, const c::Route& route, const std::string& worker,
           std::string_view body_text) {
  vf::Result<c::Body> body = c::ParseBody(route.action, body_text, worker);
  if (!body.ok()) return;
  switch (route.action) {
    case c::Action::kRegister:
      (void)coordinator.RegisterWorker(route.job, body->worker, body->fingerprint, body->build,
                                       body->ready, body->protocol);
      break;
    case c::Action::kReport:
      (void)coordinator.RecordReport(route.job, body->worker, body->report);
      break;
    case c::Action::kLeave:
      (void)coordinator.RequestLeave(route.job, body->worker);
      break;
    case c::Action::kAck:
      (void)coordinator.AckPlan(route.job, body->worker, body->epoch);
      break;
    case c::Action::kFailure:
      (void)coordinator.RecordFailure(route.job, body->worker, body->epoch, body->step,
                                      body->message);
      break;
    default:
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string_view line = NextLine(input);
  const std::string_view authorization = NextLine(input);
  const std::string worker(NextLine(input));
  const size_t space = line.find(' ');
  if (space == std::string_view::npos) return 0;
  const std::string_view method = line.substr(0, space);
  const std::string_view target = line.substr(space + 1);
  const size_t question = target.find('?');
  const std::string_view path = target.substr(0, question);
  const std::string_view query =
      question == std::string_view::npos ? std::string_view() : target.substr(question + 1);

  vf::Result<c::Route> route = c::ParseRoute(path);
  if (!route.ok()) return 0;
  if (route->job.empty()) __builtin_trap();
  (void)c::AllowedMethods(route->action);
  if (!c::MethodAllowed(route->action, method)) return 0;
  if (c::BearerToken(authorization).empty() || worker.empty()) return 0;

  vf::Coordinator coordinator(/*memory_budget=*/1 << 20);
  SetUpJob(coordinator);
  coordinator.Heard(route->job, worker);
  if (route->action == c::Action::kPlan ||
      (route->action == c::Action::kStore && method == "GET")) {
    Poll(coordinator, *route, query);
  } else if (route->action == c::Action::kStore) {
    (void)coordinator.SetKey(route->job, route->key, input, worker);
  } else {
    Apply(coordinator, *route, worker, input);
  }
  coordinator.SweepSilent(std::chrono::hours(1));
  // Whatever was asked, the job's plan is still one the coordinator would publish.
  vf::Result<vf::Plan> plan = coordinator.GetPlan(kJob);
  if (!plan.ok() || plan->epoch < 1) __builtin_trap();
  return 0;
}
