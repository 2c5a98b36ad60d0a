#include "operator/coordinator/server.h"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/http/listener.h"
#include "agent/protocol/json.h"
#include "operator/coordinator/request.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
using coordinator::Action;
using coordinator::Route;
using http::Request;
using http::Responder;
using http::Response;
using nlohmann::json;
namespace codes = http::codes;
namespace wire = protocol;

// Liveness, without a credential: the server reads and answers requests.
constexpr char kHealthPath[] = "/healthz";

// The error answer: {"error": "<one line>"}. Also the listener's own (400, 413, 503, 500).
Response JsonError(int code, const std::string& message) {
  return Response::With(code, wire::Dump(json{{"error", http::OneLine(message)}}),
                        "application/json");
}

Response StatusError(const Status& status) {
  return JsonError(http::HttpCode(status), status.message());
}

// A successful answer names the coordinator's incarnation (kIncarnationHeader): the worker
// that wrote rendezvous keys to an earlier one learns from it that they are gone.
void SendOk(const Responder& responder, Response response, const std::string& incarnation) {
  response.headers.Set(kIncarnationHeader, incarnation);
  responder.Send(std::move(response));
}

void SendEmpty(const Responder& responder, int code, const std::string& incarnation) {
  Response response;
  response.status = code;
  SendOk(responder, std::move(response), incarnation);
}

void SendJson(const Responder& responder, int code, const json& body,
              const std::string& incarnation) {
  SendOk(responder, Response::With(code, wire::Dump(body), "application/json"), incarnation);
}

void SendStatus(const Responder& responder, const Status& status) {
  responder.Send(StatusError(status));
}

void SendNoContentOr(const Responder& responder, const Status& status,
                     const std::string& incarnation) {
  if (status.ok()) {
    SendEmpty(responder, codes::kNoContent, incarnation);
  } else {
    SendStatus(responder, status);
  }
}

// The worker a request speaks for: the header the agent sends with every request.
std::string RequestWorker(const Request& request) {
  return request.headers.Get(kWorkerHeader).value_or("");
}

// The token of "Authorization: Bearer <token>", or empty.
std::string BearerToken(const Request& request) {
  const std::optional<std::string> value = request.headers.Get("Authorization");
  return value.has_value() ? coordinator::BearerToken(*value) : std::string();
}

// A long poll waiting for a plan or a key. The coordinator's callback owns it; the timer holds
// it weakly, so a poll that was answered costs nothing more than its timer entry.
struct Poll {
  Responder responder;
  bool is_key = false;
  std::string key;
  int64_t timeout_ms = 0;
  std::string incarnation;  // the coordinator's, for a successful answer
};

void SendTimeout(const Poll& poll) {
  if (poll.is_key) {
    poll.responder.Send(
        JsonError(codes::kRequestTimeout, "timed out after " + std::to_string(poll.timeout_ms) +
                                              "ms waiting for store key '" + poll.key + "'"));
  } else {
    SendEmpty(poll.responder, codes::kNoContent, poll.incarnation);
  }
}

}  // namespace

// The server's state: the listener, and the timers of the long polls. Thread-safe.
class CoordinatorServer::Impl {
 public:
  explicit Impl(Coordinator& coordinator) : coordinator_(coordinator) {}
  ~Impl() {
    if (timer_thread_.joinable()) timer_thread_.join();
  }

  const http::Listener& listener() const { return *listener_; }

  Status Start(const std::string& host, int port, std::shared_ptr<http::ServerCredentials> tls);
  void Stop();

 private:
  struct Timer {
    Coordinator::WatchId id;
    std::weak_ptr<Poll> poll;
  };

  // Everything decided from the request line and headers: the route, the method and the
  // credential, before the listener reads a body.
  std::optional<Response> Admit(const Request& head);
  void Handle(const Request& request, const Responder& responder);
  void StartPoll(const Responder& responder, const Route& route, int64_t after, int64_t timeout_ms);
  void TimerLoop();
  void Expire(const Timer& timer, bool shutting_down);
  void AnswerPendingPolls();

  Coordinator& coordinator_;
  // Set by Start. The handler it calls holds a plain pointer to this object: the listener calls
  // it only until its Stop returns, and Stop waits for every Responder.
  std::unique_ptr<http::Listener> listener_;
  std::thread timer_thread_;

  std::mutex mu_;  // guards everything below
  std::condition_variable timer_cv_;
  bool stopping_ = false;
  std::multimap<Clock::time_point, Timer> timers_;
};

Status CoordinatorServer::Impl::Start(const std::string& host, int port,
                                      std::shared_ptr<http::ServerCredentials> tls) {
  http::Listener::Options options;
  options.name = "coordinator";
  options.error_response = JsonError;
  options.admit = [this](const Request& head) { return Admit(head); };
  options.limits.max_body_bytes = kMaxBodyBytes;
  options.tls = std::move(tls);
  VF_ASSIGN_OR_RETURN(
      listener_, http::Listener::Start(host, port, std::move(options),
                                       [this](const Request& request, const Responder& responder) {
                                         Handle(request, responder);
                                       }));
  timer_thread_ = std::thread([this] { TimerLoop(); });
  return Status::Ok();
}

std::optional<Response> CoordinatorServer::Impl::Admit(const Request& head) {
  if (head.path == kHealthPath) {
    if (head.method == "GET") return std::nullopt;
    Response response = JsonError(codes::kMethodNotAllowed,
                                  "method " + head.method + " is not allowed here; use GET");
    response.headers.Set("Allow", "GET");
    return response;
  }
  Result<Route> route = coordinator::ParseRoute(head.path);
  if (!route.ok()) return StatusError(route.status());
  if (!coordinator::MethodAllowed(route->action, head.method)) {
    Response response =
        JsonError(codes::kMethodNotAllowed, "method " + head.method + " is not allowed here; use " +
                                                coordinator::AllowedMethods(route->action));
    response.headers.Set("Allow", coordinator::AllowedMethods(route->action));
    return response;
  }
  const std::string token = BearerToken(head);
  const std::string worker = RequestWorker(head);
  // An unknown job and a wrong credential get the same answer, so that nobody without a
  // credential of a job learns which jobs exist.
  if (token.empty()) return JsonError(codes::kUnauthorized, "request has no bearer token");
  if (worker.empty()) {
    return JsonError(codes::kUnauthorized,
                     std::string("request names no worker (header ") + kWorkerHeader + ")");
  }
  const Status auth = coordinator_.CheckCredential(route->job, worker, token);
  if (!auth.ok()) return StatusError(auth);
  // Any authenticated request, a plan poll above all (every agent polls each second), says the
  // worker runs and reaches us: what tells a hung or cut-off member from a live one.
  coordinator_.Heard(route->job, worker);
  return std::nullopt;
}

void CoordinatorServer::Impl::Handle(const Request& request, const Responder& responder) {
  if (request.path == kHealthPath) return responder.Send(Response::Text(codes::kOk, "ok"));
  // Admit checked the route, so it parses; the worker is the one whose credential it checked.
  Result<Route> parsed_route = coordinator::ParseRoute(request.path);
  if (!parsed_route.ok()) return SendStatus(responder, parsed_route.status());
  const Route& route = *parsed_route;
  const std::string caller = RequestWorker(request);
  const std::string& incarnation = coordinator_.incarnation();
  const bool is_get = request.method == "GET";
  if (route.action == Action::kPlan || (route.action == Action::kStore && is_get)) {
    Result<std::map<std::string, std::string>> query = coordinator::ParseQuery(request.query);
    if (!query.ok()) return SendStatus(responder, query.status());
    const bool plan = route.action == Action::kPlan;
    Result<int64_t> after = coordinator::QueryInt(*query, "after", 0);
    if (!after.ok()) return SendStatus(responder, after.status());
    Result<int64_t> timeout =
        coordinator::PollTimeout(*query, plan ? kMaxPlanPollMs : kMaxStorePollMs);
    if (!timeout.ok()) return SendStatus(responder, timeout.status());
    return StartPoll(responder, route, *after, *timeout);
  }
  if (route.action == Action::kStore) {
    return SendNoContentOr(
        responder, coordinator_.SetKey(route.job, route.key, request.body, caller), incarnation);
  }

  Result<coordinator::Body> parsed = coordinator::ParseBody(route.action, request.body, caller);
  if (!parsed.ok()) return SendStatus(responder, parsed.status());
  const coordinator::Body& fields = *parsed;
  switch (route.action) {
    case Action::kRegister: {
      const Status registered =
          coordinator_.RegisterWorker(route.job, fields.worker, fields.fingerprint, fields.build,
                                      fields.ready, fields.protocol);
      if (!registered.ok()) return SendStatus(responder, registered);
      return SendJson(responder, codes::kOk, json{{"ok", true}}, incarnation);
    }
    case Action::kReport:
      return SendNoContentOr(responder,
                             coordinator_.RecordReport(route.job, fields.worker, fields.report),
                             incarnation);
    case Action::kLeave:
      return SendNoContentOr(responder, coordinator_.RequestLeave(route.job, fields.worker),
                             incarnation);
    case Action::kAck:
      return SendNoContentOr(
          responder, coordinator_.AckPlan(route.job, fields.worker, fields.epoch), incarnation);
    case Action::kFailure:
      return SendNoContentOr(responder,
                             coordinator_.RecordFailure(route.job, fields.worker, fields.epoch,
                                                        fields.step, fields.message),
                             incarnation);
    default:
      return responder.Send(JsonError(codes::kInternalError, "unrouted request"));
  }
}

void CoordinatorServer::Impl::StartPoll(const Responder& responder, const Route& route,
                                        int64_t after, int64_t timeout_ms) {
  auto poll = std::make_shared<Poll>(Poll{responder, route.action == Action::kStore, route.key,
                                          timeout_ms, coordinator_.incarnation()});
  std::weak_ptr<Poll> weak = poll;

  Result<Coordinator::WatchId> id = Coordinator::kNoWatch;
  if (poll->is_key) {
    id = coordinator_.WatchKey(route.job, route.key, [poll](Result<std::string> value) {
      if (!value.ok()) return SendStatus(poll->responder, value.status());
      SendOk(poll->responder, Response::With(codes::kOk, *value, "application/octet-stream"),
             poll->incarnation);
    });
  } else {
    id = coordinator_.WatchPlan(route.job, after, [poll](Result<Plan> plan) {
      if (!plan.ok()) return SendStatus(poll->responder, plan.status());
      SendJson(poll->responder, codes::kOk, wire::PlanToJson(*plan), poll->incarnation);
    });
  }
  poll.reset();  // from here on the callback owns it
  if (!id.ok()) return SendStatus(responder, id.status());
  if (*id == Coordinator::kNoWatch) return;

  const Timer timer{*id, weak};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      timers_.emplace(Clock::now() + std::chrono::milliseconds(timeout_ms), timer);
      timer_cv_.notify_one();
      return;
    }
  }
  Expire(timer, /*shutting_down=*/true);
}

// Answers a poll whose time ran out, or that the server abandons, unless its callback got there
// first.
void CoordinatorServer::Impl::Expire(const Timer& timer, bool shutting_down) {
  // Locked before cancelling: a successful cancel destroys the callback, the poll's other owner.
  std::shared_ptr<Poll> poll = timer.poll.lock();
  if (poll == nullptr || !coordinator_.CancelWatch(timer.id)) return;
  if (shutting_down) {
    return poll->responder.Send(
        JsonError(codes::kServiceUnavailable, "coordinator is shutting down"));
  }
  SendTimeout(*poll);
}

void CoordinatorServer::Impl::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (timers_.empty()) {
      timer_cv_.wait(lock);
      continue;
    }
    const Clock::time_point next = timers_.begin()->first;
    if (Clock::now() < next) {
      timer_cv_.wait_until(lock, next);
      continue;
    }
    std::vector<Timer> due;
    while (!timers_.empty() && timers_.begin()->first <= Clock::now()) {
      due.push_back(timers_.begin()->second);
      timers_.erase(timers_.begin());
    }
    lock.unlock();
    for (const Timer& timer : due) Expire(timer, /*shutting_down=*/false);
    lock.lock();
  }
}

void CoordinatorServer::Impl::Stop() {
  if (listener_ != nullptr) listener_->Stop([this] { AnswerPendingPolls(); });
}

// Runs once, while the listener refuses new requests but still holds its connections: the
// listener then gives these answers a moment to go out before it closes the connections, so
// that pollers learn why.
void CoordinatorServer::Impl::AnswerPendingPolls() {
  std::multimap<Clock::time_point, Timer> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    pending.swap(timers_);
    timer_cv_.notify_all();
  }
  if (timer_thread_.joinable()) timer_thread_.join();
  for (const auto& entry : pending) Expire(entry.second, /*shutting_down=*/true);
}

Result<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    Coordinator& coordinator, const std::string& host, int port,
    std::shared_ptr<http::ServerCredentials> tls) {
  auto impl = std::make_shared<Impl>(coordinator);
  VF_RETURN_IF_ERROR(impl->Start(host, port, std::move(tls)));
  return std::unique_ptr<CoordinatorServer>(new CoordinatorServer(std::move(impl)));
}

CoordinatorServer::CoordinatorServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

int CoordinatorServer::port() const { return impl_->listener().port(); }

std::string CoordinatorServer::url() const { return impl_->listener().url(); }

void CoordinatorServer::Stop() { impl_->Stop(); }

}  // namespace vf
