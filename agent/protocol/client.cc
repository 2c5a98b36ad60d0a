#include "agent/protocol/client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/socket.h>

#include <algorithm>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <cpprest/http_client.h>
#include <cpprest/uri.h>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <nlohmann/json.hpp>

#include "agent/http/tls.h"
#include "agent/protocol/json.h"
#include "runtime/deadline.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;
namespace wire = protocol;

constexpr milliseconds kMaxPlanPoll(kMaxPlanPollMs);
constexpr milliseconds kMaxStorePoll(kMaxStorePollMs);
constexpr milliseconds kFirstBackoff(50);
constexpr milliseconds kMaxBackoff(2000);
// How long a store Get waits before it asks a coordinator that is away or has forgotten the job
// again.
constexpr milliseconds kAwayPause(250);
// The incarnation of a key taken by a coordinator that names none (an older build).
constexpr char kUnnamedIncarnation[] = "-";

// The coordinator is away (an operator restarting), or does not know the job or this worker
// yet (a restarted one, until the operator restores the job and the worker registers again).
bool Away(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kUnauthenticated ||
         s.code() == StatusCode::kNotFound;
}

milliseconds Until(Clock::time_point deadline) {
  const auto now = Clock::now();
  if (deadline <= now) return milliseconds::zero();
  if (deadline == Clock::time_point::max()) return milliseconds::max();
  return std::chrono::ceil<milliseconds>(deadline - now);
}

std::string Encode(const std::string& text) { return web::uri::encode_data_string(text); }

// The server's {"error": ...}, or what the body says otherwise.
std::string ErrorMessage(const std::string& body) {
  Result<json> parsed = wire::ParseObject(body);
  if (parsed.ok()) {
    auto it = parsed->find("error");
    if (it != parsed->end() && it->is_string()) return it->get<std::string>();
  }
  if (body.empty()) return "no error message";
  return body.substr(0, 200);
}

Status HttpError(int code, const std::string& body) {
  const std::string message = ErrorMessage(body) + " (HTTP " + std::to_string(code) + ")";
  switch (code) {
    case 400:
    case 413:
      return InvalidArgument(message);
    case 401:
      return Unauthenticated("coordinator refused the credential (401)");
    case 403:
      return PermissionDenied(message);
    case 404:
      return NotFound(message);
    case 408:
      return DeadlineExceeded(message);
    case 409:
      return FailedPrecondition(message);
    case 503:
      return Unavailable(message);
    default:
      return Internal(message);
  }
}

}  // namespace

struct CoordinatorClient::WaitCancellation {
  pplx::cancellation_token_source source;
};

// A cpprest client keeps its connections open for the next request, but its timeout is fixed
// when it is made, and each call here has a timeout of its own. So the clients are kept by
// timeout, rounded up to kGrain (which only lengthens an attempt by less than that: attempts
// are bounds, not appointments). Without them every request paid a TCP connection, a TLS
// handshake and cpprest's load of the system's CA store (it loads it for each new connection,
// before the context callback narrows the trust): four requests of a leaving worker took most
// of the time from its SIGTERM to its exit. Thread-safe (a cpprest client is; the map is
// under the mutex).
struct CoordinatorClient::Connections {
  using Client = web::http::client::http_client;
  static constexpr milliseconds kGrain{250};
  // A kept connection whose peer vanished without a reset (an operator's pod replaced, its
  // address gone with it) would hold the next request until the attempt's timeout. With
  // TCP_USER_TIMEOUT the kernel gives up on it once a request has gone unacknowledged this long
  // (acknowledgements are the peer's kernel's, so a busy coordinator still sends them), and the
  // call is retried on a new connection at once. A long poll's wait is not cut short: its
  // request was acknowledged.
  static constexpr unsigned kUnacknowledgedMs = 5000;
  // Past this many timeouts the clients start over; in-flight calls keep their own.
  static constexpr size_t kMaxClients = 8;

  std::mutex mu;
  std::map<int64_t, std::shared_ptr<Client>> clients;  // by timeout in kGrain units

  std::shared_ptr<Client> For(const std::string& base_url, const std::string& ca_pem,
                              milliseconds attempt) {
    // Bounded so that a "wait forever" deadline does not overflow cpprest's microseconds.
    const milliseconds bounded = std::min(attempt, milliseconds(std::chrono::hours(24 * 365)));
    const int64_t grains = (bounded.count() + kGrain.count() - 1) / kGrain.count();
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = clients.find(grains); it != clients.end()) return it->second;
    if (clients.size() >= kMaxClients) clients.clear();
    web::http::client::http_client_config config;
    config.set_timeout(grains * kGrain);
    // Certificates are verified, the host name included (cpprest's default); the trust is the
    // operator's CA alone when there is one.
    config.set_validate_certificates(true);
    // cpprest calls this before every request with the connection's socket, which a new
    // connection opens only afterwards: from its second request on, a kept connection has it.
    const bool tls = base_url.size() > 5 && strncasecmp(base_url.c_str(), "https", 5) == 0;
    config.set_nativehandle_options([tls](web::http::client::native_handle handle) {
      const int fd =
          tls ? static_cast<boost::asio::ssl::stream<boost::asio::ip::tcp::socket&>*>(handle)
                    ->next_layer()
                    .native_handle()
              : static_cast<boost::asio::ip::tcp::socket*>(handle)->native_handle();
      if (fd < 0) return;
      const unsigned ms = kUnacknowledgedMs;
      // Best effort: without it a vanished peer costs the attempt's timeout, as before.
      (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
    });
    if (!ca_pem.empty()) {
      config.set_ssl_context_callback([ca_pem](boost::asio::ssl::context& context) {
        // The constructor checked that the file holds a certificate; were it to fail here,
        // nothing would be trusted and the handshake would fail.
        (void)http::TrustOnly(context.native_handle(), ca_pem);
      });
    }
    auto client = std::make_shared<Client>(base_url, config);
    clients.emplace(grains, client);
    return client;
  }
};

CoordinatorClient::CoordinatorClient(std::string base_url, std::string job, std::string token,
                                     std::string worker, milliseconds request_timeout,
                                     std::string ca_file)
    : base_url_(std::move(base_url)),
      job_(std::move(job)),
      token_(std::move(token)),
      worker_(std::move(worker)),
      request_timeout_(request_timeout),
      ca_file_(std::move(ca_file)),
      wait_cancellation_(std::make_shared<WaitCancellation>()),
      connections_(std::make_shared<Connections>()) {
  if (ca_file_.empty()) return;
  std::ifstream in(ca_file_);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    // The operator mounts it for the pod's life: missing here, it may be there for a new pod.
    ca_status_ = Unavailable("cannot read the coordinator's CA file " + ca_file_);
  } else if (!http::CertificateNotAfter(text.str()).ok()) {
    ca_status_ =
        InvalidArgument("the coordinator's CA file " + ca_file_ + " holds no PEM certificate");
  } else {
    ca_pem_ = text.str();
  }
}

std::string CoordinatorClient::Path(const std::string& action) const {
  const size_t slash = job_.find('/');
  const std::string ns = job_.substr(0, slash);
  const std::string name = slash == std::string::npos ? "" : job_.substr(slash + 1);
  return "/v1/jobs/" + Encode(ns) + "/" + Encode(name) + "/" + action;
}

Result<CoordinatorClient::Response> CoordinatorClient::Call(
    const std::string& method, const std::string& path, const std::string* body,
    const std::string& content_type, Clock::time_point deadline, milliseconds slack,
    bool cancellable) const {
  const std::string what = "coordinator " + method + " " + base_url_ + path;
  if (!ca_status_.ok()) return ca_status_.WithContext(what);
  const pplx::cancellation_token cancel =
      cancellable ? wait_cancellation_->source.get_token() : pplx::cancellation_token::none();
  const auto cancelled = [&] {
    return Unavailable(what + ": cancelled: the client stops waiting");
  };
  // The first failure is retried at once: it is most often a kept connection that the server
  // closed while it was idle (cpprest does not retry that itself), and the retry makes a new one.
  milliseconds backoff = milliseconds::zero();
  // A refused certificate says more than the timeout of a later attempt: it is what is
  // reported, whatever came after it.
  std::string tls_failure;
  while (true) {
    if (cancel.is_canceled()) return cancelled();
    std::string failure;
    try {
      const milliseconds left = Until(deadline);
      const milliseconds attempt = std::max(
          left > milliseconds::max() - slack ? milliseconds::max() : left + slack, milliseconds(1));
      const std::shared_ptr<Connections::Client> client =
          connections_->For(base_url_, ca_pem_, attempt);
      web::http::http_request request(method);
      request.set_request_uri(web::uri(path));
      // The worker's own credential, and the worker it is for (server.h).
      request.headers().add(web::http::header_names::authorization, "Bearer " + token_);
      request.headers().add(kWorkerHeader, worker_);
      if (body != nullptr) {
        // Bytes, not cpprest's std::string overload, which reads a char stream as unsigned char.
        request.headers().set_content_type(content_type);
        request.set_body(std::vector<unsigned char>(body->begin(), body->end()));
      }
      web::http::http_response response = client->request(request, cancel).get();
      const std::vector<unsigned char> bytes = response.extract_vector().get();
      Response result{response.status_code(), std::string(bytes.begin(), bytes.end()), {}};
      if (result.status / 100 == 2 &&
          response.headers().match(kIncarnationHeader, result.incarnation) &&
          !result.incarnation.empty()) {
        std::lock_guard<std::mutex> lock(mu_);
        incarnation_ = result.incarnation;
      }
      // A server that is shutting down (an operator restart) is as good as unreachable. A full
      // one answers at once, for the caller to wait for room at its own pace.
      if (result.status != 503 ||
          ErrorMessage(result.body).find(kCoordinatorFull) != std::string::npos) {
        return result;
      }
      failure = ErrorMessage(result.body) + " (HTTP 503)";
    } catch (const pplx::task_canceled&) {
      return cancelled();
    } catch (const web::http::http_exception& e) {
      if (cancel.is_canceled()) return cancelled();
      failure = e.error_code() == std::errc::timed_out ? "no answer within the request timeout"
                                                       : std::string(e.what());
      if (failure.find("SSL") != std::string::npos ||
          failure.find("handshake") != std::string::npos) {
        failure =
            "TLS handshake failed (is the coordinator's certificate signed by the CA in " +
            (ca_file_.empty() ? std::string("the system's store") : ca_file_) +
            ", and does it name the URL's host? does the coordinator serve https?): " + failure;
        tls_failure = failure;
      }
    } catch (const web::uri_exception& e) {
      return InvalidArgument(what + ": bad coordinator url: " + e.what());
    } catch (const std::invalid_argument& e) {
      return InvalidArgument(what + ": bad coordinator url: " + e.what());
    } catch (const std::exception& e) {
      return Internal(what + ": " + e.what());
    } catch (...) {
      return Internal(what + ": unknown exception");
    }
    const milliseconds left = Until(deadline);
    if (left <= milliseconds::zero()) {
      return Unavailable(what + ": " + (tls_failure.empty() ? failure : tls_failure));
    }
    std::this_thread::sleep_for(std::min(backoff, left));
    backoff = backoff == milliseconds::zero() ? kFirstBackoff : std::min(backoff * 2, kMaxBackoff);
  }
}

void CoordinatorClient::CancelWaits() { wait_cancellation_->source.cancel(); }

Status CoordinatorClient::Post(const std::string& action, const std::string& json_body) const {
  const std::string path = Path(action);
  VF_ASSIGN_OR_RETURN(const Response response,
                      Call("POST", path, &json_body, "application/json",
                           DeadlineAfter(request_timeout_), milliseconds::zero()));
  if (response.status / 100 == 2) return Status::Ok();
  return HttpError(response.status, response.body)
      .WithContext("coordinator POST " + base_url_ + path);
}

Status CoordinatorClient::Register(const std::string& fingerprint, const std::string& build,
                                   bool ready, int64_t protocol) {
  return Post("register", wire::Dump(json{{"worker", worker_},
                                          {"fingerprint", fingerprint},
                                          {"build", build},
                                          {"ready", ready},
                                          {"protocol", protocol}}));
}

Result<Plan> CoordinatorClient::WaitForPlan(int64_t after, milliseconds timeout) {
  const Clock::time_point deadline = DeadlineAfter(timeout);
  while (true) {
    const milliseconds poll = std::min(Until(deadline), kMaxPlanPoll);
    const std::string path = Path("plan") + "?after=" + std::to_string(after) +
                             "&timeout_ms=" + std::to_string(poll.count());
    const std::string context = "coordinator GET " + base_url_ + path;
    VF_ASSIGN_OR_RETURN(const Response response,
                        Call("GET", path, nullptr, "", deadline, request_timeout_, true));
    if (response.status == 200) {
      Result<json> parsed = wire::ParseObject(response.body);
      if (!parsed.ok()) return Internal(parsed.status().message()).WithContext(context);
      Result<Plan> plan = wire::PlanFromJson(*parsed);
      if (!plan.ok()) {
        return Internal("malformed plan: " + plan.status().message()).WithContext(context);
      }
      if (plan->epoch > after) return plan;
    } else if (response.status != 204) {
      return HttpError(response.status, response.body).WithContext(context);
    }
    if (Until(deadline) <= milliseconds::zero()) return Plan{};
  }
}

Status CoordinatorClient::Report(const vf::Report& report) {
  json body = wire::ReportToJson(report);
  body["worker"] = worker_;
  return Post("report", wire::Dump(body));
}

Status CoordinatorClient::Leave() { return Post("leave", wire::Dump(json{{"worker", worker_}})); }

Status CoordinatorClient::Ack(int64_t epoch) {
  return Post("ack", wire::Dump(json{{"worker", worker_}, {"epoch", epoch}}));
}

Status CoordinatorClient::ReportFailure(int64_t epoch, int64_t step, const std::string& message) {
  return Post("failure",
              wire::Dump(json{
                  {"worker", worker_}, {"epoch", epoch}, {"step", step}, {"message", message}}));
}

std::string CoordinatorClient::incarnation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return incarnation_;
}

Status CoordinatorClient::SetKey(const std::string& key, std::string_view value,
                                 std::string* incarnation) {
  // An empty key would address the store itself, a path the server does not have.
  if (key.empty()) return InvalidArgument("store key is empty");
  const std::string path = Path("store/" + Encode(key));
  const std::string body(value);
  VF_ASSIGN_OR_RETURN(const Response response,
                      Call("PUT", path, &body, "application/octet-stream",
                           DeadlineAfter(request_timeout_), milliseconds::zero()));
  if (response.status / 100 == 2) {
    if (incarnation != nullptr) *incarnation = response.incarnation;
    return Status::Ok();
  }
  return HttpError(response.status, response.body)
      .WithContext("coordinator PUT " + base_url_ + path);
}

Result<std::string> CoordinatorClient::GetKey(const std::string& key, milliseconds timeout) {
  if (key.empty()) return InvalidArgument("store key is empty");
  const Clock::time_point deadline = DeadlineAfter(timeout);
  while (true) {
    const milliseconds poll = std::min(Until(deadline), kMaxStorePoll);
    const std::string path =
        Path("store/" + Encode(key)) + "?timeout_ms=" + std::to_string(poll.count());
    VF_ASSIGN_OR_RETURN(const Response response,
                        Call("GET", path, nullptr, "", deadline, request_timeout_, true));
    if (response.status == 200) return response.body;
    if (response.status != 408 || Until(deadline) <= milliseconds::zero()) {
      if (response.status == 408) {
        return DeadlineExceeded("timed out after " + std::to_string(timeout.count()) +
                                "ms waiting for store key '" + key + "' of job " + job_);
      }
      return HttpError(response.status, response.body)
          .WithContext("coordinator GET " + base_url_ + path);
    }
  }
}

Status CoordinatorStore::Set(const std::string& key, std::string_view value) {
  std::string incarnation;
  Status s = client_.SetKey(key, value, &incarnation);
  if (!s.ok() && !Away(s)) return s;
  // Taken by a coordinator that names no incarnation (an older one): never written again.
  if (s.ok() && incarnation.empty()) incarnation = kUnnamedIncarnation;
  std::lock_guard<std::mutex> lock(mu_);
  own_[key] = OwnKey{std::string(value), s.ok() ? incarnation : std::string()};
  return Status::Ok();
}

void CoordinatorStore::Reassert() {
  std::lock_guard<std::mutex> one(reassert_mu_);
  const std::string now = client_.incarnation();
  std::vector<std::pair<std::string, std::string>> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, own] : own_) {
      if (own.incarnation.empty() ||
          (!now.empty() && own.incarnation != now && own.incarnation != kUnnamedIncarnation)) {
        stale.emplace_back(key, own.value);
      }
    }
  }
  for (const auto& [key, value] : stale) {
    std::string incarnation;
    // Refused (the coordinator away, or not holding the plan yet, or the epoch passed): the next
    // call tries again, until the rendezvous ends either way and ForgetKeys is called.
    if (!client_.SetKey(key, value, &incarnation).ok()) continue;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = own_.find(key);
    if (it == own_.end() || it->second.value != value) continue;  // forgotten meanwhile
    it->second.incarnation = incarnation.empty() ? kUnnamedIncarnation : incarnation;
  }
}

void CoordinatorStore::ForgetKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  own_.clear();
}

Result<std::string> CoordinatorStore::Get(const std::string& key, milliseconds timeout) {
  const Clock::time_point deadline = DeadlineAfter(timeout);
  while (true) {
    Reassert();
    Result<std::string> value = client_.GetKey(key, Until(deadline));
    if (value.ok() || !Away(value.status()) || Until(deadline) <= milliseconds::zero()) {
      return value;
    }
    std::this_thread::sleep_for(std::min(kAwayPause, Until(deadline)));
  }
}

Status CoordinatorStore::Wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const Clock::time_point deadline = DeadlineAfter(timeout);
  for (size_t i = 0; i < keys.size(); ++i) {
    Result<std::string> value = Get(keys[i], Until(deadline));
    if (value.ok()) continue;
    if (value.status().code() != StatusCode::kDeadlineExceeded) return value.status();
    // Name every key still missing, not just the first, as the other stores do.
    std::string missing = "'" + keys[i] + "'";
    for (size_t j = i + 1; j < keys.size(); ++j) {
      Result<std::string> later = client_.GetKey(keys[j], milliseconds::zero());
      if (!later.ok() && later.status().code() == StatusCode::kDeadlineExceeded) {
        missing += ", '" + keys[j] + "'";
      }
    }
    return DeadlineExceeded("timed out after " + std::to_string(timeout.count()) +
                            "ms waiting for store key(s) " + missing);
  }
  return Status::Ok();
}

bool IsAnotherBuildRefusal(const Status& s) {
  return s.code() == StatusCode::kFailedPrecondition &&
         s.message().find(kAnotherBuildRefusal) != std::string::npos;
}

bool IsCoordinatorFull(const Status& s) {
  return s.code() == StatusCode::kUnavailable &&
         s.message().find(kCoordinatorFull) != std::string::npos;
}

}  // namespace vf
