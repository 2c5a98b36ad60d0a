#include "operator/coordinator/server.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <cpprest/uri.h>
#include <nlohmann/json.hpp>

#include "agent/http/listener.h"
#include "agent/protocol/json.h"
#include "operator/coordinator/request.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
using coordinator::Action;
using coordinator::Route;
using nlohmann::json;
using web::http::http_request;
using web::http::http_response;
using web::http::status_code;
using web::http::status_codes;
namespace wire = protocol;

constexpr std::chrono::seconds kStopFlushTime(2);

// The error answer: {"error": "<one line>"}. Also the listener's own (503, 500).
http_response JsonError(status_code code, const std::string& message) {
  http_response response(code);
  http::SetBody(response, wire::Dump(json{{"error", http::OneLine(message)}}), "application/json");
  return response;
}

// A successful answer names the coordinator's incarnation (kIncarnationHeader): the worker
// that wrote rendezvous keys to an earlier one learns from it that they are gone.
void SendOk(const http_request& request, http_response response, const std::string& incarnation) {
  response.headers().add(kIncarnationHeader, incarnation);
  http::Send(request, response);
}

void SendEmpty(const http_request& request, status_code code, const std::string& incarnation) {
  SendOk(request, http_response(code), incarnation);
}

void SendJson(const http_request& request, status_code code, const json& body,
              const std::string& incarnation) {
  http_response response(code);
  http::SetBody(response, wire::Dump(body), "application/json");
  SendOk(request, std::move(response), incarnation);
}

pplx::task<void> SendErrorTask(const http_request& request, status_code code,
                               const std::string& message) {
  return http::Send(request, JsonError(code, message));
}

void SendError(const http_request& request, status_code code, const std::string& message) {
  SendErrorTask(request, code, message);
}

void SendStatus(const http_request& request, const Status& status) {
  SendError(request, http::HttpCode(status), status.message());
}

void SendNoContentOr(const http_request& request, const Status& status,
                     const std::string& incarnation) {
  if (status.ok()) {
    SendEmpty(request, status_codes::NoContent, incarnation);
  } else {
    SendStatus(request, status);
  }
}

// The worker a request speaks for: the header the agent sends with every request.
std::string RequestWorker(const http_request& request) {
  std::string value;
  if (!request.headers().match(kWorkerHeader, value)) return {};
  return value;
}

// The token of "Authorization: Bearer <token>", or empty.
std::string BearerToken(const http_request& request) {
  std::string value;
  if (!request.headers().match(web::http::header_names::authorization, value)) return {};
  return coordinator::BearerToken(value);
}

// A long poll waiting for a plan or a key. The coordinator's callback owns it; the timer holds
// it weakly, so a poll that was answered costs nothing more than its timer entry.
struct Poll {
  http_request request;
  bool is_key = false;
  std::string key;
  int64_t timeout_ms = 0;
  std::string incarnation;  // the coordinator's, for a successful answer
};

void SendTimeout(const Poll& poll) {
  if (poll.is_key) {
    SendError(poll.request, status_codes::RequestTimeout,
              "timed out after " + std::to_string(poll.timeout_ms) + "ms waiting for store key '" +
                  poll.key + "'");
  } else {
    SendEmpty(poll.request, status_codes::NoContent, poll.incarnation);
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

  void Handle(const http_request& request, const http::InFlight& in_flight);
  // `worker` is the one the request's credential was checked for.
  void Dispatch(const http_request& request, const Route& route, const std::string& worker,
                const http::Body& body);
  void StartPoll(const http_request& request, const Route& route, int64_t after,
                 int64_t timeout_ms);
  void TimerLoop();
  pplx::task<void> Expire(const Timer& timer, bool shutting_down);
  void AnswerPendingPolls();

  Coordinator& coordinator_;
  // Set by Start. The handler it calls holds a plain pointer to this object: the listener calls
  // it only until its Stop returns, and so do the continuations that hold a request's InFlight.
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
  options.tls = std::move(tls);
  VF_ASSIGN_OR_RETURN(listener_, http::Listener::Start(host, port, std::move(options),
                                                       [this](const http_request& request,
                                                              const http::InFlight& in_flight) {
                                                         Handle(request, in_flight);
                                                       }));
  timer_thread_ = std::thread([this] { TimerLoop(); });
  return Status::Ok();
}

void CoordinatorServer::Impl::Handle(const http_request& request, const http::InFlight& in_flight) {
  // Everything decided from the request line and headers comes first; the body is read (and
  // dropped) after an early answer too.
  auto reject = [&](status_code code, const std::string& message) {
    SendError(request, code, message);
    http::DrainBody(request);
  };
  Result<Route> route = coordinator::ParseRoute(request.request_uri().path());
  if (!route.ok()) return reject(http::HttpCode(route.status()), route.status().message());
  if (!coordinator::MethodAllowed(route->action, request.method())) {
    http_response response = JsonError(status_codes::MethodNotAllowed,
                                       "method " + request.method() + " is not allowed here; use " +
                                           coordinator::AllowedMethods(route->action));
    response.headers().add(U("Allow"), coordinator::AllowedMethods(route->action));
    http::Send(request, response);
    http::DrainBody(request);
    return;
  }
  const std::string token = BearerToken(request);
  const std::string worker = RequestWorker(request);
  // An unknown job and a wrong credential get the same answer, so that nobody without a
  // credential of a job learns which jobs exist.
  if (token.empty()) return reject(status_codes::Unauthorized, "request has no bearer token");
  if (worker.empty()) {
    return reject(status_codes::Unauthorized,
                  std::string("request names no worker (header ") + kWorkerHeader + ")");
  }
  const Status auth = coordinator_.CheckCredential(route->job, worker, token);
  if (!auth.ok()) return reject(http::HttpCode(auth), auth.message());
  // Any authenticated request, a plan poll above all (every agent polls each second), says the
  // worker runs and reaches us: what tells a hung or cut-off member from a live one.
  coordinator_.Heard(route->job, worker);
  uint64_t declared = 0;
  if (request.headers().match(web::http::header_names::content_length, declared) &&
      declared > kMaxBodyBytes) {
    return reject(status_codes::RequestEntityTooLarge,
                  "request body is " + std::to_string(declared) + " bytes; the limit is " +
                      std::to_string(kMaxBodyBytes));
  }
  // The continuation keeps the request in flight: Stop waits for it.
  http::ReadBody(request, kMaxBodyBytes)
      .then([this, in_flight, request, worker,
             route = std::move(route).value()](pplx::task<http::Body> read) {
        try {
          Dispatch(request, route, worker, read.get());
        } catch (...) {
          SendError(request, status_codes::InternalError,
                    "coordinator failed: " + http::CurrentExceptionMessage());
        }
      });
}

void CoordinatorServer::Impl::Dispatch(const http_request& request, const Route& route,
                                       const std::string& caller, const http::Body& body) {
  if (!body.error.empty()) {
    return SendError(request, status_codes::BadRequest,
                     "could not read the request body: " + body.error);
  }
  if (body.too_large) {
    return SendError(
        request, status_codes::RequestEntityTooLarge,
        "request body is over the limit of " + std::to_string(kMaxBodyBytes) + " bytes");
  }
  const std::string& incarnation = coordinator_.incarnation();
  const auto is_get = request.method() == web::http::methods::GET;
  if (route.action == Action::kPlan || (route.action == Action::kStore && is_get)) {
    Result<std::map<std::string, std::string>> query =
        coordinator::ParseQuery(request.request_uri().query());
    if (!query.ok()) return SendStatus(request, query.status());
    const bool plan = route.action == Action::kPlan;
    Result<int64_t> after = coordinator::QueryInt(*query, "after", 0);
    if (!after.ok()) return SendStatus(request, after.status());
    Result<int64_t> timeout =
        coordinator::PollTimeout(*query, plan ? kMaxPlanPollMs : kMaxStorePollMs);
    if (!timeout.ok()) return SendStatus(request, timeout.status());
    return StartPoll(request, route, *after, *timeout);
  }
  if (route.action == Action::kStore) {
    return SendNoContentOr(request, coordinator_.SetKey(route.job, route.key, body.data, caller),
                           incarnation);
  }

  Result<coordinator::Body> parsed = coordinator::ParseBody(route.action, body.data, caller);
  if (!parsed.ok()) return SendStatus(request, parsed.status());
  const coordinator::Body& fields = *parsed;
  switch (route.action) {
    case Action::kRegister: {
      const Status registered =
          coordinator_.RegisterWorker(route.job, fields.worker, fields.fingerprint, fields.build,
                                      fields.ready, fields.protocol);
      if (!registered.ok()) return SendStatus(request, registered);
      return SendJson(request, status_codes::OK, json{{"ok", true}}, incarnation);
    }
    case Action::kReport:
      return SendNoContentOr(
          request, coordinator_.RecordReport(route.job, fields.worker, fields.report), incarnation);
    case Action::kLeave:
      return SendNoContentOr(request, coordinator_.RequestLeave(route.job, fields.worker),
                             incarnation);
    case Action::kAck:
      return SendNoContentOr(request, coordinator_.AckPlan(route.job, fields.worker, fields.epoch),
                             incarnation);
    case Action::kFailure:
      return SendNoContentOr(request,
                             coordinator_.RecordFailure(route.job, fields.worker, fields.epoch,
                                                        fields.step, fields.message),
                             incarnation);
    default:
      return SendError(request, status_codes::InternalError, "unrouted request");
  }
}

void CoordinatorServer::Impl::StartPoll(const http_request& request, const Route& route,
                                        int64_t after, int64_t timeout_ms) {
  auto poll = std::make_shared<Poll>();
  poll->request = request;
  poll->is_key = route.action == Action::kStore;
  poll->key = route.key;
  poll->timeout_ms = timeout_ms;
  poll->incarnation = coordinator_.incarnation();
  std::weak_ptr<Poll> weak = poll;

  Result<Coordinator::WatchId> id = Coordinator::kNoWatch;
  if (poll->is_key) {
    id = coordinator_.WatchKey(route.job, route.key, [poll](Result<std::string> value) {
      if (!value.ok()) return SendStatus(poll->request, value.status());
      http_response response(status_codes::OK);
      http::SetBody(response, *value, "application/octet-stream");
      SendOk(poll->request, std::move(response), poll->incarnation);
    });
  } else {
    id = coordinator_.WatchPlan(route.job, after, [poll](Result<Plan> plan) {
      if (!plan.ok()) return SendStatus(poll->request, plan.status());
      SendJson(poll->request, status_codes::OK, wire::PlanToJson(*plan), poll->incarnation);
    });
  }
  poll.reset();  // from here on the callback owns it
  if (!id.ok()) return SendStatus(request, id.status());
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
// first. The task completes when the answer is sent.
pplx::task<void> CoordinatorServer::Impl::Expire(const Timer& timer, bool shutting_down) {
  // Locked before cancelling: a successful cancel destroys the callback, the poll's other owner.
  std::shared_ptr<Poll> poll = timer.poll.lock();
  if (poll == nullptr || !coordinator_.CancelWatch(timer.id)) return pplx::task_from_result();
  if (shutting_down) {
    return SendErrorTask(poll->request, status_codes::ServiceUnavailable,
                         "coordinator is shutting down");
  }
  SendTimeout(*poll);
  return pplx::task_from_result();
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
    for (const Timer& timer : due) {
      try {
        Expire(timer, /*shutting_down=*/false);
      } catch (...) {
      }
    }
    lock.lock();
  }
}

void CoordinatorServer::Impl::Stop() {
  if (listener_ != nullptr) listener_->Stop([this] { AnswerPendingPolls(); });
}

// Runs once, while the listener refuses new requests but still holds its connections.
void CoordinatorServer::Impl::AnswerPendingPolls() {
  std::multimap<Clock::time_point, Timer> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    pending.swap(timers_);
    timer_cv_.notify_all();
  }
  if (timer_thread_.joinable()) timer_thread_.join();
  std::vector<pplx::task<void>> answers;
  for (const auto& entry : pending) {
    try {
      answers.push_back(Expire(entry.second, /*shutting_down=*/true));
    } catch (...) {
    }
  }
  // Closing the listener cuts every connection at once; give the 503s a moment to go out first,
  // so that pollers learn why.
  if (!answers.empty()) {
    auto flushed = std::make_shared<std::promise<void>>();
    std::future<void> done = flushed->get_future();
    pplx::when_all(answers.begin(), answers.end()).then([flushed](pplx::task<void> all) {
      try {
        all.get();
      } catch (...) {
      }
      flushed->set_value();
    });
    done.wait_for(kStopFlushTime);
  }
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
