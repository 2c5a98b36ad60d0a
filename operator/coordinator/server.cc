#include "operator/coordinator/server.h"

#include <algorithm>
#include <cctype>
#include <charconv>
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

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using web::http::http_request;
using web::http::http_response;
using web::http::status_code;
using web::http::status_codes;
namespace wire = protocol;

constexpr int64_t kDefaultPollMs = 30000;
constexpr int64_t kMaxPlanPollMs = 60000;
constexpr int64_t kMaxStorePollMs = 120000;
constexpr std::chrono::seconds kStopFlushTime(2);
constexpr char kWorkerHeader[] = "X-VirtualFlow-Worker";

// The error answer: {"error": "<one line>"}. Also the listener's own (503, 500).
http_response JsonError(status_code code, const std::string& message) {
  http_response response(code);
  http::SetBody(response, wire::Dump(json{{"error", http::OneLine(message)}}), "application/json");
  return response;
}

void SendEmpty(const http_request& request, status_code code) {
  http::Send(request, http_response(code));
}

void SendJson(const http_request& request, status_code code, const json& body) {
  http_response response(code);
  http::SetBody(response, wire::Dump(body), "application/json");
  http::Send(request, response);
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

void SendNoContentOr(const http_request& request, const Status& status) {
  if (status.ok()) {
    SendEmpty(request, status_codes::NoContent);
  } else {
    SendStatus(request, status);
  }
}

// ---- Paths and queries ----

enum class Action { kRegister, kPlan, kStore, kReport, kLeave, kAck, kFailure };

struct Route {
  std::string job;  // "namespace/name"
  Action action = Action::kRegister;
  std::string key;  // kStore only
};

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

Result<std::string> Decode(const std::string& encoded) {
  try {
    return web::uri::decode(encoded);
  } catch (...) {
    return InvalidArgument("malformed percent-encoding in '" + encoded + "'");
  }
}

// NotFound for a path the API does not have. `raw_path` is still percent-encoded, so that a
// key may hold '/' written either plainly or as %2F.
Result<Route> ParseRoute(const std::string& raw_path) {
  static const std::string kPrefix = "/v1/jobs/";
  const Status unknown = NotFound("no such path: " + raw_path);
  if (raw_path.compare(0, kPrefix.size(), kPrefix) != 0) return unknown;
  const std::string rest = raw_path.substr(kPrefix.size());
  // namespace / name / action [/ key...]
  const size_t a = rest.find('/');
  if (a == std::string::npos) return unknown;
  const size_t b = rest.find('/', a + 1);
  if (b == std::string::npos) return unknown;
  const size_t c = rest.find('/', b + 1);
  const std::string action = rest.substr(b + 1, c == std::string::npos ? c : c - b - 1);
  Route route;
  VF_ASSIGN_OR_RETURN(const std::string ns, Decode(rest.substr(0, a)));
  VF_ASSIGN_OR_RETURN(const std::string name, Decode(rest.substr(a + 1, b - a - 1)));
  if (ns.empty() || name.empty()) return unknown;
  route.job = ns + "/" + name;
  if (action == "store") {
    if (c == std::string::npos || c + 1 == rest.size()) return unknown;
    route.action = Action::kStore;
    VF_ASSIGN_OR_RETURN(route.key, Decode(rest.substr(c + 1)));
    return route;
  }
  if (c != std::string::npos) return unknown;
  static const std::map<std::string, Action> kActions = {
      {"register", Action::kRegister}, {"plan", Action::kPlan}, {"report", Action::kReport},
      {"leave", Action::kLeave},       {"ack", Action::kAck},   {"failure", Action::kFailure}};
  auto it = kActions.find(action);
  if (it == kActions.end()) return unknown;
  route.action = it->second;
  return route;
}

// The methods a path answers, as an Allow header lists them.
std::string AllowedMethods(Action action) {
  switch (action) {
    case Action::kPlan:
      return "GET";
    case Action::kStore:
      return "GET, PUT";
    default:
      return "POST";
  }
}

bool MethodAllowed(Action action, const web::http::method& method) {
  using web::http::methods;
  switch (action) {
    case Action::kPlan:
      return method == methods::GET;
    case Action::kStore:
      return method == methods::GET || method == methods::PUT;
    default:
      return method == methods::POST;
  }
}

Result<std::map<std::string, std::string>> ParseQuery(const std::string& raw) {
  std::map<std::string, std::string> query;
  if (raw.empty()) return query;
  for (const std::string& pair : Split(raw, '&')) {
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    VF_ASSIGN_OR_RETURN(std::string name, Decode(pair.substr(0, eq)));
    std::string value;
    if (eq != std::string::npos) {
      VF_ASSIGN_OR_RETURN(value, Decode(pair.substr(eq + 1)));
    }
    query[std::move(name)] = std::move(value);
  }
  return query;
}

Result<int64_t> QueryInt(const std::map<std::string, std::string>& query, const std::string& name,
                         int64_t fallback) {
  auto it = query.find(name);
  if (it == query.end()) return fallback;
  const std::string& text = it->second;
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    return InvalidArgument("query parameter '" + name + "' must be an integer, got '" + text + "'");
  }
  return value;
}

Result<int64_t> PollTimeout(const std::map<std::string, std::string>& query, int64_t cap) {
  VF_ASSIGN_OR_RETURN(const int64_t timeout, QueryInt(query, "timeout_ms", kDefaultPollMs));
  if (timeout < 0) return InvalidArgument("query parameter 'timeout_ms' must be non-negative");
  return std::min(timeout, cap);
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
  static constexpr std::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size()) return {};
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(value[i])) != kScheme[i]) return {};
  }
  const size_t start = value.find_first_not_of(' ', kScheme.size());
  if (start == std::string::npos) return {};
  return value.substr(start);
}

// A long poll waiting for a plan or a key. The coordinator's callback owns it; the timer holds
// it weakly, so a poll that was answered costs nothing more than its timer entry.
struct Poll {
  http_request request;
  bool is_key = false;
  std::string key;
  int64_t timeout_ms = 0;
};

void SendTimeout(const Poll& poll) {
  if (poll.is_key) {
    SendError(poll.request, status_codes::RequestTimeout,
              "timed out after " + std::to_string(poll.timeout_ms) + "ms waiting for store key '" +
                  poll.key + "'");
  } else {
    SendEmpty(poll.request, status_codes::NoContent);
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

  Status Start(const std::string& host, int port);
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
  void HandleReport(const http_request& request, const Route& route, const json& body);
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

Status CoordinatorServer::Impl::Start(const std::string& host, int port) {
  http::Listener::Options options;
  options.name = "coordinator";
  options.error_response = JsonError;
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
  Result<Route> route = ParseRoute(request.request_uri().path());
  if (!route.ok()) return reject(http::HttpCode(route.status()), route.status().message());
  if (!MethodAllowed(route->action, request.method())) {
    http_response response = JsonError(status_codes::MethodNotAllowed,
                                       "method " + request.method() + " is not allowed here; use " +
                                           AllowedMethods(route->action));
    response.headers().add(U("Allow"), AllowedMethods(route->action));
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
  const auto is_get = request.method() == web::http::methods::GET;
  if (route.action == Action::kPlan || (route.action == Action::kStore && is_get)) {
    Result<std::map<std::string, std::string>> query = ParseQuery(request.request_uri().query());
    if (!query.ok()) return SendStatus(request, query.status());
    const bool plan = route.action == Action::kPlan;
    Result<int64_t> after = QueryInt(*query, "after", 0);
    if (!after.ok()) return SendStatus(request, after.status());
    Result<int64_t> timeout = PollTimeout(*query, plan ? kMaxPlanPollMs : kMaxStorePollMs);
    if (!timeout.ok()) return SendStatus(request, timeout.status());
    return StartPoll(request, route, *after, *timeout);
  }
  if (route.action == Action::kStore) {
    return SendNoContentOr(request, coordinator_.SetKey(route.job, route.key, body.data, caller));
  }

  Result<json> parsed = wire::ParseObject(body.data);
  if (!parsed.ok()) return SendStatus(request, parsed.status());
  const json& object = *parsed;
  Result<std::string> worker = wire::StringField(object, "worker");
  if (!worker.ok()) return SendStatus(request, worker.status());
  if (*worker != caller) {
    return SendStatus(request, PermissionDenied("the credential is worker " + caller +
                                                "'s; it cannot act as worker " + *worker));
  }

  switch (route.action) {
    case Action::kRegister: {
      Result<std::string> fingerprint = wire::StringField(object, "fingerprint");
      if (!fingerprint.ok()) return SendStatus(request, fingerprint.status());
      Result<std::string> build = wire::StringField(object, "build");
      if (!build.ok()) return SendStatus(request, build.status());
      Result<bool> ready = wire::BoolField(object, "ready");
      if (!ready.ok()) return SendStatus(request, ready.status());
      const Status registered =
          coordinator_.RegisterWorker(route.job, *worker, *fingerprint, *build, *ready);
      if (!registered.ok()) return SendStatus(request, registered);
      return SendJson(request, status_codes::OK, json{{"ok", true}});
    }
    case Action::kReport:
      return HandleReport(request, route, object);
    case Action::kLeave:
      return SendNoContentOr(request, coordinator_.RequestLeave(route.job, *worker));
    case Action::kAck: {
      Result<int64_t> epoch = wire::IntField(object, "epoch");
      if (!epoch.ok()) return SendStatus(request, epoch.status());
      return SendNoContentOr(request, coordinator_.AckPlan(route.job, *worker, *epoch));
    }
    case Action::kFailure: {
      Result<int64_t> epoch = wire::IntField(object, "epoch");
      if (!epoch.ok()) return SendStatus(request, epoch.status());
      Result<int64_t> step = wire::IntField(object, "step");
      if (!step.ok()) return SendStatus(request, step.status());
      Result<std::string> message = wire::StringField(object, "message");
      if (!message.ok()) return SendStatus(request, message.status());
      return SendNoContentOr(
          request, coordinator_.RecordFailure(route.job, *worker, *epoch, *step, *message));
    }
    default:
      return SendError(request, status_codes::InternalError, "unrouted request");
  }
}

void CoordinatorServer::Impl::HandleReport(const http_request& request, const Route& route,
                                           const json& object) {
  Result<Report> report = wire::ReportFromJson(object);
  if (!report.ok()) return SendStatus(request, report.status());
  SendNoContentOr(request, coordinator_.RecordReport(
                               route.job, object.at("worker").get<std::string>(), *report));
}

void CoordinatorServer::Impl::StartPoll(const http_request& request, const Route& route,
                                        int64_t after, int64_t timeout_ms) {
  auto poll = std::make_shared<Poll>();
  poll->request = request;
  poll->is_key = route.action == Action::kStore;
  poll->key = route.key;
  poll->timeout_ms = timeout_ms;
  std::weak_ptr<Poll> weak = poll;

  Result<Coordinator::WatchId> id = Coordinator::kNoWatch;
  if (poll->is_key) {
    id = coordinator_.WatchKey(route.job, route.key, [poll](Result<std::string> value) {
      if (!value.ok()) return SendStatus(poll->request, value.status());
      http_response response(status_codes::OK);
      http::SetBody(response, *value, "application/octet-stream");
      http::Send(poll->request, response);
    });
  } else {
    id = coordinator_.WatchPlan(route.job, after, [poll](Result<Plan> plan) {
      if (!plan.ok()) return SendStatus(poll->request, plan.status());
      SendJson(poll->request, status_codes::OK, wire::PlanToJson(*plan));
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

Result<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(Coordinator& coordinator,
                                                                    const std::string& host,
                                                                    int port) {
  auto impl = std::make_shared<Impl>(coordinator);
  VF_RETURN_IF_ERROR(impl->Start(host, port));
  return std::unique_ptr<CoordinatorServer>(new CoordinatorServer(std::move(impl)));
}

CoordinatorServer::CoordinatorServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

int CoordinatorServer::port() const { return impl_->listener().port(); }

std::string CoordinatorServer::url() const { return impl_->listener().url(); }

void CoordinatorServer::Stop() { impl_->Stop(); }

}  // namespace vf
