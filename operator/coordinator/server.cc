#include "operator/coordinator/server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <cpprest/http_listener.h>

#include <cpprest/uri.h>
#include <nlohmann/json.hpp>
#include "operator/net/listen.h"

#include "operator/coordinator/wire.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using web::http::http_request;
using web::http::http_response;
using web::http::status_code;
using web::http::status_codes;
namespace wire = coordinator_wire;

constexpr int64_t kDefaultPollMs = 30000;
constexpr int64_t kMaxPlanPollMs = 60000;
constexpr int64_t kMaxStorePollMs = 120000;
constexpr size_t kReadChunkBytes = 64 << 10;
constexpr std::chrono::seconds kStopFlushTime(2);

std::string CurrentExceptionMessage() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Error bodies are one line: a client's log shows them as they are.
std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

// Sets a body of bytes. Never through cpprest's std::string overload: that one hands cpprest a
// stream of char that it then reads as a stream of unsigned char (undefined behaviour that
// UBSan reports).
void SetBody(http_response& response, const std::string& bytes, const std::string& content_type) {
  response.headers().set_content_type(content_type);
  response.set_body(std::vector<unsigned char>(bytes.begin(), bytes.end()));
}

// Starts sending `response`; the task completes once it is sent or has failed. A client that
// went away makes the send fail; that is observed here, because an unobserved failed task
// terminates the process.
pplx::task<void> Send(http_request request, const http_response& response) {
  try {
    return request.reply(response).then([](pplx::task<void> sent) {
      try {
        sent.get();
      } catch (...) {
      }
    });
  } catch (...) {
    // Already answered (the listener closed the connection): nothing left to do.
    return pplx::task_from_result();
  }
}

void SendEmpty(const http_request& request, status_code code) {
  Send(request, http_response(code));
}

pplx::task<void> SendJsonTask(const http_request& request, status_code code, const json& body) {
  http_response response(code);
  SetBody(response, wire::Dump(body), "application/json");
  return Send(request, response);
}

void SendJson(const http_request& request, status_code code, const json& body) {
  SendJsonTask(request, code, body);
}

pplx::task<void> SendErrorTask(const http_request& request, status_code code, std::string message) {
  return SendJsonTask(request, code, json{{"error", OneLine(std::move(message))}});
}

void SendError(const http_request& request, status_code code, std::string message) {
  SendErrorTask(request, code, std::move(message));
}

status_code HttpCode(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return status_codes::BadRequest;
    case StatusCode::kNotFound:
      return status_codes::NotFound;
    case StatusCode::kFailedPrecondition:
      return status_codes::Conflict;
    case StatusCode::kDeadlineExceeded:
      return status_codes::RequestTimeout;
    case StatusCode::kUnavailable:
      return status_codes::ServiceUnavailable;
    default:
      return status_codes::InternalError;
  }
}

void SendStatus(const http_request& request, const Status& status) {
  SendError(request, HttpCode(status), status.message());
}

void SendNoContentOr(const http_request& request, const Status& status) {
  if (status.ok()) {
    SendEmpty(request, status_codes::NoContent);
  } else {
    SendStatus(request, status);
  }
}

// ---- Request bodies ----

struct Body {
  std::string data;
  bool too_large = false;
  std::string error;  // the body could not be read (the client went away mid-body)
};

// Reads a request body chunk by chunk. The listener buffers whatever a client sends until it is
// read, so even a body that is refused is read to its end (and dropped): memory stays bounded
// by one chunk, not by what the client chose to send.
class BodyReader : public std::enable_shared_from_this<BodyReader> {
 public:
  BodyReader(http_request request, size_t limit)
      : request_(request), limit_(limit), chunk_(kReadChunkBytes) {}

  pplx::task<Body> Read() {
    try {
      const concurrency::streams::istream& stream = request_.body();
      if (!stream.is_valid()) {
        Finish();
      } else {
        buffer_ = stream.streambuf();
        Next();
      }
    } catch (...) {
      body_.error = CurrentExceptionMessage();
      Finish();
    }
    return pplx::create_task(done_);
  }

 private:
  void Next() {
    auto self = shared_from_this();
    buffer_.getn(chunk_.data(), chunk_.size()).then([self](pplx::task<size_t> read) {
      self->OnChunk(std::move(read));
    });
  }

  void OnChunk(pplx::task<size_t> read) {
    try {
      const size_t n = read.get();
      if (n == 0) {
        CheckComplete();
        return;
      }
      if (!body_.too_large) {
        if (body_.data.size() + n > limit_) {
          body_.too_large = true;
          std::string().swap(body_.data);
        } else {
          body_.data.append(reinterpret_cast<const char*>(chunk_.data()), n);
        }
      }
      Next();
    } catch (...) {
      body_.error = CurrentExceptionMessage();
      Finish();
    }
  }

  // End of stream also comes when the connection broke mid-body; only the request's completion
  // says which, and a truncated value must never reach the store.
  void CheckComplete() {
    auto self = shared_from_this();
    request_.content_ready().then([self](pplx::task<http_request> ready) {
      try {
        ready.get();
        uint64_t declared = 0;
        if (!self->body_.too_large &&
            self->request_.headers().match(web::http::header_names::content_length, declared) &&
            declared != self->body_.data.size()) {
          self->body_.error = "body has " + std::to_string(self->body_.data.size()) +
                              " bytes, Content-Length says " + std::to_string(declared);
        }
      } catch (...) {
        self->body_.error = CurrentExceptionMessage();
      }
      self->Finish();
    });
  }

  void Finish() { done_.set(std::move(body_)); }

  http_request request_;
  size_t limit_;
  std::vector<uint8_t> chunk_;
  concurrency::streams::streambuf<uint8_t> buffer_;
  Body body_;
  pplx::task_completion_event<Body> done_;
};

pplx::task<Body> ReadBody(const http_request& request, size_t limit) {
  return std::make_shared<BodyReader>(request, limit)->Read();
}

// Reads and drops the body of a request that has already been answered.
void DrainBody(const http_request& request) {
  try {
    ReadBody(request, 0);
  } catch (...) {
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

// The server's state, shared with the request handlers' continuations so that it outlives them.
// Thread-safe.
class CoordinatorServer::Impl : public std::enable_shared_from_this<CoordinatorServer::Impl> {
 public:
  Impl(Coordinator& coordinator, std::string host, int port)
      : coordinator_(coordinator), host_(std::move(host)), port_(port) {}
  ~Impl() {
    if (timer_thread_.joinable()) timer_thread_.join();
  }

  int port() const { return port_; }
  const std::string& host() const { return host_; }

  Status Open();
  void Stop();

 private:
  // Counts a running handler, so that Stop can wait until none touches the coordinator.
  struct InFlight {
    explicit InFlight(std::shared_ptr<Impl> i) : impl(std::move(i)) {}
    ~InFlight() {
      std::lock_guard<std::mutex> lock(impl->mu_);
      if (--impl->in_flight_ == 0) impl->idle_.notify_all();
    }
    std::shared_ptr<Impl> impl;
  };
  using Guard = std::shared_ptr<InFlight>;

  struct Timer {
    Coordinator::WatchId id;
    std::weak_ptr<Poll> poll;
  };

  Guard Enter();
  void Handle(http_request request);
  void Dispatch(const http_request& request, const Route& route, const Body& body);
  void HandleReport(const http_request& request, const Route& route, const json& body);
  void StartPoll(const http_request& request, const Route& route, int64_t after,
                 int64_t timeout_ms);
  void TimerLoop();
  pplx::task<void> Expire(const Timer& timer, bool shutting_down);

  Coordinator& coordinator_;
  const std::string host_;
  const int port_;
  // Set by Open; closed and dropped by Stop (under stop_mu_).
  std::unique_ptr<web::http::experimental::listener::http_listener> listener_;
  std::thread timer_thread_;

  std::mutex stop_mu_;    // serialises Stop calls
  bool stopped_ = false;  // guarded by stop_mu_
  std::mutex mu_;         // guards everything below
  std::condition_variable timer_cv_;
  std::condition_variable idle_;
  bool stopping_ = false;
  int64_t in_flight_ = 0;
  std::multimap<Clock::time_point, Timer> timers_;
};

CoordinatorServer::Impl::Guard CoordinatorServer::Impl::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return nullptr;
  ++in_flight_;
  return std::make_shared<InFlight>(shared_from_this());
}

Status CoordinatorServer::Impl::Open() {
  const std::string address =
      "http://" + net::HostForUri(host_) + ":" + std::to_string(port_) + "/";
  try {
    listener_ = std::make_unique<web::http::experimental::listener::http_listener>(address);
    // A raw pointer: the listener belongs to this object, and Stop closes it before the object
    // can go away, so the handler never outlives it.
    Impl* self = this;
    listener_->support([self](http_request request) { self->Handle(request); });
    listener_->open().wait();
  } catch (...) {
    listener_.reset();
    return Unavailable("cannot listen on " + address + ": " + CurrentExceptionMessage());
  }
  timer_thread_ = std::thread([this] { TimerLoop(); });
  return Status::Ok();
}

void CoordinatorServer::Impl::Handle(http_request request) {
  Guard guard = Enter();
  if (guard == nullptr) {
    SendError(request, status_codes::ServiceUnavailable, "coordinator is shutting down");
    DrainBody(request);
    return;
  }
  try {
    // Everything decided from the request line and headers comes first; the body is read
    // (and dropped) after an early answer too.
    auto reject = [&](status_code code, const std::string& message) {
      SendError(request, code, message);
      DrainBody(request);
    };
    Result<Route> route = ParseRoute(request.request_uri().path());
    if (!route.ok()) return reject(HttpCode(route.status()), route.status().message());
    if (!MethodAllowed(route->action, request.method())) {
      http_response response(status_codes::MethodNotAllowed);
      response.headers().add(U("Allow"), AllowedMethods(route->action));
      SetBody(
          response,
          wire::Dump(json{{"error", "method " + request.method() + " is not allowed here; use " +
                                        AllowedMethods(route->action)}}),
          "application/json");
      Send(request, response);
      DrainBody(request);
      return;
    }
    const std::string token = BearerToken(request);
    const Status auth = coordinator_.CheckToken(route->job, token);
    if (auth.code() == StatusCode::kNotFound) {
      return reject(status_codes::NotFound, auth.message());
    }
    if (!auth.ok()) {
      return reject(status_codes::Unauthorized, token.empty()
                                                    ? "request has no bearer token"
                                                    : "the bearer token is not this job's token");
    }
    uint64_t declared = 0;
    if (request.headers().match(web::http::header_names::content_length, declared) &&
        declared > kMaxBodyBytes) {
      return reject(status_codes::RequestEntityTooLarge,
                    "request body is " + std::to_string(declared) + " bytes; the limit is " +
                        std::to_string(kMaxBodyBytes));
    }
    ReadBody(request, kMaxBodyBytes)
        .then([self = shared_from_this(), guard, request,
               route = std::move(route).value()](pplx::task<Body> read) {
          try {
            self->Dispatch(request, route, read.get());
          } catch (...) {
            SendError(request, status_codes::InternalError,
                      "coordinator failed: " + CurrentExceptionMessage());
          }
        });
  } catch (...) {
    SendError(request, status_codes::InternalError,
              "coordinator failed: " + CurrentExceptionMessage());
  }
}

void CoordinatorServer::Impl::Dispatch(const http_request& request, const Route& route,
                                       const Body& body) {
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
    return SendNoContentOr(request, coordinator_.SetKey(route.job, route.key, body.data));
  }

  Result<json> parsed = wire::ParseObject(body.data);
  if (!parsed.ok()) return SendStatus(request, parsed.status());
  const json& object = *parsed;
  Result<std::string> worker = wire::StringField(object, "worker");
  if (!worker.ok()) return SendStatus(request, worker.status());

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
  Report report;
  const auto read_int = [&](const char* name, int64_t& out) {
    Result<int64_t> value = wire::IntField(object, name);
    if (value.ok()) out = *value;
    return value.status();
  };
  const auto read_number = [&](const char* name, double& out) {
    Result<double> value = wire::NumberField(object, name);
    if (value.ok()) out = *value;
    return value.status();
  };
  Status status = read_int("epoch", report.epoch);
  if (status.ok()) status = read_int("step", report.step);
  if (status.ok()) status = read_number("loss", report.loss);
  if (status.ok()) status = read_number("samplesPerSecond", report.samples_per_second);
  if (status.ok()) status = read_number("secondsPerVirtualNode", report.seconds_per_virtual_node);
  if (status.ok() && object.contains("pauseSeconds")) {
    status = read_number("pauseSeconds", report.pause_seconds);
  }
  if (status.ok()) {
    Result<bool> has_state = wire::BoolField(object, "hasState");
    if (has_state.ok()) report.has_state = *has_state;
    status = has_state.status();
  }
  // The final report's fields are optional, so older agents keep working.
  if (status.ok() && object.contains("finished")) {
    Result<bool> finished = wire::BoolField(object, "finished");
    if (finished.ok()) report.finished = *finished;
    status = finished.status();
  }
  if (status.ok() && object.contains("weightsSha256")) {
    Result<std::string> sha = wire::StringField(object, "weightsSha256");
    if (sha.ok()) report.weights_sha256 = *sha;
    status = sha.status();
  }
  if (status.ok() && object.contains("testAccuracy")) {
    status = read_number("testAccuracy", report.test_accuracy);
  }
  if (status.ok()) status = wire::ReadReportTotalSteps(object, report);
  if (!status.ok()) return SendStatus(request, status);
  SendNoContentOr(request, coordinator_.RecordReport(
                               route.job, object.at("worker").get<std::string>(), report));
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
      SetBody(response, *value, "application/octet-stream");
      Send(poll->request, response);
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
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (stopped_) return;
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
  if (listener_ != nullptr) {
    try {
      listener_->close().wait();
    } catch (...) {
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return in_flight_ == 0; });
  }
  listener_.reset();
  stopped_ = true;
}

Result<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(Coordinator& coordinator,
                                                                    const std::string& host,
                                                                    int port) {
  if (host.empty()) return InvalidArgument("coordinator host is empty");
  if (port < 0 || port > 65535) {
    return InvalidArgument("coordinator port " + std::to_string(port) + " is not in 0..65535");
  }
  std::shared_ptr<Impl> impl;
  VF_RETURN_IF_ERROR(net::OpenOnPort(host, port, [&](int chosen) {
                       impl = std::make_shared<Impl>(coordinator, host, chosen);
                       return impl->Open();
                     }).WithContext("coordinator server"));
  return std::unique_ptr<CoordinatorServer>(new CoordinatorServer(impl));
}

CoordinatorServer::CoordinatorServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

CoordinatorServer::~CoordinatorServer() { Stop(); }

int CoordinatorServer::port() const { return impl_->port(); }

std::string CoordinatorServer::url() const {
  return "http://" + net::HostForUri(impl_->host()) + ":" + std::to_string(impl_->port());
}

void CoordinatorServer::Stop() { impl_->Stop(); }

}  // namespace vf
