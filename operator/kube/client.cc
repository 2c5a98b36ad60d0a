#include "operator/kube/client.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <exception>
#include <fstream>
#include <future>
#include <mutex>
#include <sstream>
#include <system_error>
#include <thread>
#include <utility>
#include <variant>

#include <cpprest/http_client.h>
#include <cpprest/uri.h>
#include <openssl/ssl.h>

#include "runtime/deadline.h"

namespace vf::kube {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using std::chrono::milliseconds;

// Bound projected service-account tokens are rotated by the kubelet well before they expire;
// re-reading the file this often picks up the new one in time (client-go does the same).
constexpr auto kTokenRefresh = std::chrono::minutes(1);
// cpprest's own timeout is an inactivity timer per connection; the calls enforce their deadlines
// themselves, so this only has to be longer than any of them.
constexpr auto kTransportTimeout = std::chrono::hours(1);
constexpr auto kDefaultThrottleWait = std::chrono::seconds(1);
// Event messages are cut to the length events.k8s.io allows, so they read the same everywhere.
constexpr size_t kMaxEventMessage = 1024;

ApiError MakeError(Reason reason, std::string message, std::string context = "") {
  ApiError error;
  error.reason = reason;
  error.message = std::move(message);
  error.context = std::move(context);
  return error;
}

// Loads `config`'s trust anchors and client certificate into a TLS context. Used both to check a
// configuration when the client is created and, for every new connection, from cpprest's
// context callback.
Status ConfigureTls(boost::asio::ssl::context& context, const Config& config) {
  SSL_CTX* ctx = context.native_handle();
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  boost::system::error_code ec;
  if (!config.ca_pem.empty()) {
    // Only the cluster's CA: cpprest has loaded the system's roots, which must not vouch for an
    // API server (kubectl trusts the configured CA alone, too).
    SSL_CTX_set_cert_store(ctx, X509_STORE_new());
    context.add_certificate_authority(boost::asio::buffer(config.ca_pem), ec);
    if (ec) return InvalidArgument("certificate authority: " + ec.message());
  }
  if (!config.client_cert_pem.empty()) {
    context.use_certificate_chain(boost::asio::buffer(config.client_cert_pem), ec);
    if (ec) return InvalidArgument("client certificate: " + ec.message());
    context.use_private_key(boost::asio::buffer(config.client_key_pem),
                            boost::asio::ssl::context::pem, ec);
    if (ec) return InvalidArgument("client key: " + ec.message());
    if (SSL_CTX_check_private_key(ctx) != 1) {
      return InvalidArgument("client key does not match the client certificate");
    }
  }
  return Status::Ok();
}

std::string Trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

Result<std::string> ReadToken(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("token file " + path + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  std::string token = Trim(text.str());
  if (token.empty()) return FailedPrecondition("token file " + path + " is empty");
  return token;
}

// The bearer token to send: fixed, or read from a file and re-read as it is rotated. A failed
// re-read keeps the last good token (the file is replaced atomically, but by a rename the
// reader may catch in between). Thread-safe.
class TokenSource {
 public:
  TokenSource(std::string token, std::string file)
      : token_(std::move(token)), file_(std::move(file)) {}

  std::string Get() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!file_.empty() && (!read_at_.has_value() || Clock::now() - *read_at_ >= kTokenRefresh)) {
      Result<std::string> token = ReadToken(file_);
      if (token.ok()) token_ = std::move(token).value();
      read_at_ = Clock::now();
    }
    return token_;
  }

 private:
  std::mutex mu_;
  std::string token_;
  const std::string file_;
  std::optional<Clock::time_point> read_at_;
};

std::string Query(std::initializer_list<std::pair<const char*, std::string>> params) {
  std::string query;
  for (const auto& [key, value] : params) {
    if (value.empty()) continue;
    query += query.empty() ? "?" : "&";
    query += key;
    query += "=";
    query += UrlEncode(value);
  }
  return query;
}

// apiVersion and kind of `resource` on an object that lacks them (list items come without).
void FillTypeMeta(const Resource& resource, json& object) {
  if (!object.is_object()) return;
  if (!object.contains("apiVersion")) object["apiVersion"] = resource.ApiVersion();
  if (!object.contains("kind")) object["kind"] = std::string(resource.kind);
}

std::string MetadataString(const json& object, const char* key) {
  if (!object.is_object()) return "";
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return "";
  auto value = metadata->find(key);
  if (value == metadata->end() || !value->is_string()) return "";
  return value->get<std::string>();
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// An http_exception from cpprest as an ApiError: its timer firing is an idle stream or a silent
// server, anything else a failed connection.
ApiError TransportError(const web::http::http_exception& e) {
  if (e.error_code() == std::errc::timed_out) {
    return MakeError(Reason::kDeadlineExceeded, "no data from the server within the timeout");
  }
  if (e.error_code() == std::errc::operation_canceled) {
    return MakeError(Reason::kCancelled, "the request was cancelled");
  }
  return MakeError(Reason::kTransport, e.what());
}

// Byte vectors, not cpprest's std::string overload of set_body, which reads the string through
// a stream of unsigned char and trips UBSan.
void SetJsonBody(web::http::http_request& request, const json& body,
                 const std::string& content_type) {
  const std::string text = body.dump();
  request.headers().set_content_type(content_type);
  request.set_body(std::vector<unsigned char>(text.begin(), text.end()));
}

}  // namespace

std::string FormatTime(std::chrono::system_clock::time_point time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

json MakeEvent(const Resource& resource, const json& object, EventType type,
               std::string_view reason, std::string_view message, std::string_view component,
               std::chrono::system_clock::time_point now) {
  const std::string name = MetadataString(object, "name");
  std::string ns = MetadataString(object, "namespace");
  json involved = {
      {"apiVersion", resource.ApiVersion()}, {"kind", std::string(resource.kind)}, {"name", name}};
  if (!ns.empty()) involved["namespace"] = ns;
  if (std::string uid = MetadataString(object, "uid"); !uid.empty()) involved["uid"] = uid;
  if (std::string rv = MetadataString(object, "resourceVersion"); !rv.empty()) {
    involved["resourceVersion"] = rv;
  }
  // Events about cluster-scoped objects (nodes) go to "default", as kubelet and client-go do.
  if (ns.empty()) ns = "default";
  const auto nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  char suffix[32];
  std::snprintf(suffix, sizeof(suffix), ".%llx", static_cast<unsigned long long>(nanos));
  std::string text(message.substr(0, kMaxEventMessage));
  const std::string time = FormatTime(now);
  json event = {
      {"apiVersion", "v1"},
      {"kind", "Event"},
      {"metadata", {{"name", name + suffix}, {"namespace", ns}}},
      {"involvedObject", involved},
      {"reason", std::string(reason)},
      {"message", text},
      {"type", type == EventType::kWarning ? "Warning" : "Normal"},
      {"count", 1},
      {"firstTimestamp", time},
      {"lastTimestamp", time},
      {"source", {{"component", std::string(component)}}},
      {"reportingComponent", std::string(component)},
  };
  if (std::string host = HostName(); !host.empty()) event["reportingInstance"] = host;
  return event;
}

// What a Client shares between its calls: configuration, rate limiter, credentials and the pooled
// HTTP client for short calls. Thread-safe.
class Client::Impl {
 public:
  Impl(Config config, ClientOptions options)
      : config_(std::move(config)),
        options_(std::move(options)),
        limiter_(options_.rate_limiter != nullptr
                     ? options_.rate_limiter
                     : std::make_shared<RateLimiter>(options_.qps, options_.burst)),
        tokens_(config_.token, config_.token_file),
        http_(web::uri(config_.server), HttpConfig(kTransportTimeout)) {}

  const Config& config() const { return config_; }
  const std::shared_ptr<RateLimiter>& limiter() const { return limiter_; }
  uint64_t requests_sent() const { return requests_.load(); }

  void set_observer(RequestObserver observer) {
    std::shared_ptr<const RequestObserver> next;
    if (observer) next = std::make_shared<const RequestObserver>(std::move(observer));
    std::lock_guard<std::mutex> lock(observer_mu_);
    observer_ = std::move(next);
  }

  // Reports one request, sent at `sent`, to the observer if there is one.
  void Observe(std::string_view verb, int http_status, Clock::time_point sent) {
    std::shared_ptr<const RequestObserver> observer;
    {
      std::lock_guard<std::mutex> lock(observer_mu_);
      observer = observer_;
    }
    if (observer == nullptr) return;
    (*observer)(verb, http_status, std::chrono::duration<double>(Clock::now() - sent).count());
  }

  web::http::client::http_client_config HttpConfig(Clock::duration timeout) const {
    web::http::client::http_client_config http;
    http.set_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
    if (config_.insecure_skip_tls_verify) http.set_validate_certificates(false);
    auto config = std::make_shared<const Config>(config_);
    http.set_ssl_context_callback([config](boost::asio::ssl::context& context) {
      // Checked when the client was created, so this cannot fail; if it did, the handshake
      // fails and the call reports it.
      static_cast<void>(ConfigureTls(context, *config));
    });
    return http;
  }

  web::http::http_request NewRequest(const web::http::method& method,
                                     const std::string& path_and_query) {
    web::http::http_request request(method);
    request.set_request_uri(web::uri(path_and_query));
    auto& headers = request.headers();
    headers.add(web::http::header_names::accept, "application/json");
    headers.add(web::http::header_names::user_agent, options_.user_agent);
    if (const std::string token = tokens_.Get(); !token.empty()) {
      headers.add(web::http::header_names::authorization, "Bearer " + token);
    }
    // cpprest checks the certificate against (and sends as SNI) the Host header when there is
    // one, which is how tls-server-name is honoured.
    if (!config_.tls_server_name.empty()) {
      headers.add(web::http::header_names::host, config_.tls_server_name);
    }
    return request;
  }

  struct RawResponse {
    int code = 0;
    std::string body;
    std::string retry_after;
  };

  // Sends `request` and reads the whole answer by `deadline`. Blocks the calling thread on a
  // future, never inside cpprest's pool.
  std::variant<RawResponse, ApiError> Exchange(web::http::http_request request,
                                               Clock::time_point deadline) {
    pplx::cancellation_token_source cancel;
    auto promise = std::make_shared<std::promise<RawResponse>>();
    std::future<RawResponse> future = promise->get_future();
    ++requests_;
    try {
      http_.request(request, cancel.get_token())
          .then([](web::http::http_response response) {
            return response.extract_vector().then([response](std::vector<unsigned char> bytes) {
              RawResponse raw;
              raw.code = response.status_code();
              raw.body.assign(bytes.begin(), bytes.end());
              auto it = response.headers().find(U("Retry-After"));
              if (it != response.headers().end()) raw.retry_after = it->second;
              return raw;
            });
          })
          .then([promise](pplx::task<RawResponse> done) {
            try {
              promise->set_value(done.get());
            } catch (...) {
              promise->set_exception(std::current_exception());
            }
          });
    } catch (const std::exception& e) {
      return MakeError(Reason::kTransport, e.what());
    }
    if (future.wait_until(deadline) != std::future_status::ready) {
      cancel.cancel();  // closes the connection; the continuation still completes the promise
      return MakeError(Reason::kDeadlineExceeded, "no complete answer within the call's timeout");
    }
    try {
      return future.get();
    } catch (const web::http::http_exception& e) {
      return TransportError(e);
    } catch (const std::exception& e) {
      return MakeError(Reason::kTransport, e.what());
    }
  }

  // One API call: rate limit, send, decode; 429s retried as the server asks. The answer must be
  // a JSON object.
  ApiResult<json> Call(std::string_view verb, const std::string& context,
                       const web::http::method& method, const std::string& path_and_query,
                       const json* body, const std::string& content_type,
                       Clock::time_point deadline) {
    for (int attempt = 0;; ++attempt) {
      if (!limiter_->Wait(deadline)) {
        return MakeError(Reason::kDeadlineExceeded,
                         "the client's rate limit would delay the call past its timeout", context);
      }
      web::http::http_request request = NewRequest(method, path_and_query);
      if (body != nullptr) SetJsonBody(request, *body, content_type);
      const Clock::time_point sent = Clock::now();
      std::variant<RawResponse, ApiError> exchanged = Exchange(request, deadline);
      const auto* answered = std::get_if<RawResponse>(&exchanged);
      Observe(verb, answered != nullptr ? answered->code : 0, sent);
      if (auto* error = std::get_if<ApiError>(&exchanged)) {
        error->context = context;
        return std::move(*error);
      }
      RawResponse& raw = std::get<RawResponse>(exchanged);
      if (raw.code / 100 == 2) {
        json parsed = json::parse(raw.body, nullptr, /*allow_exceptions=*/false);
        if (!parsed.is_object()) {
          ApiError error =
              MakeError(Reason::kBadResponse,
                        "the answer is not a JSON object: " + raw.body.substr(0, 200), context);
          error.http_code = raw.code;
          return error;
        }
        return parsed;
      }
      ApiError error = ParseApiError(raw.code, raw.body);
      error.context = context;
      if (!raw.retry_after.empty()) {
        int seconds = 0;
        if (std::sscanf(raw.retry_after.c_str(), "%d", &seconds) == 1 && seconds > 0) {
          error.retry_after = std::chrono::seconds(seconds);
        }
      }
      if (error.reason != Reason::kTooManyRequests || attempt >= options_.max_throttle_retries) {
        return error;
      }
      const auto wait =
          error.retry_after > std::chrono::seconds(0) ? error.retry_after : kDefaultThrottleWait;
      if (Clock::now() + wait >= deadline) return error;
      std::this_thread::sleep_for(wait);
    }
  }

  Clock::time_point Deadline(milliseconds call_timeout) const {
    return DeadlineAfter(call_timeout > milliseconds::zero() ? call_timeout : options_.timeout);
  }

  ApiStatus Watch(const Resource& resource, std::string_view ns, const WatchOptions& options,
                  const WatchHandler& handler, std::stop_token stop);

 private:
  const Config config_;
  const ClientOptions options_;
  const std::shared_ptr<RateLimiter> limiter_;
  TokenSource tokens_;
  web::http::client::http_client http_;
  std::atomic<uint64_t> requests_{0};
  std::mutex observer_mu_;
  std::shared_ptr<const RequestObserver> observer_;  // guarded by observer_mu_
};

ApiStatus Client::Impl::Watch(const Resource& resource, std::string_view ns,
                              const WatchOptions& options, const WatchHandler& handler,
                              std::stop_token stop) {
  const std::string context = "watch " + Describe(resource, ns);
  const Clock::time_point connect_deadline = Deadline(options.connect_timeout);
  if (!limiter_->Wait(connect_deadline, stop)) {
    if (stop.stop_requested()) return ApiStatus::Ok();
    return MakeError(Reason::kDeadlineExceeded,
                     "the client's rate limit would delay the watch past its connect timeout",
                     context);
  }
  milliseconds idle = std::min(options.idle_timeout, kLongestWait);
  if (idle <= milliseconds::zero()) {
    const std::chrono::seconds server_timeout(
        options.timeout_seconds > 0
            ? std::min<int64_t>(options.timeout_seconds, int64_t{24} * 365 * 3600)
            : 3600);
    idle = server_timeout + std::chrono::minutes(1);
  }
  const std::string path =
      ResourcePath(resource, ns) +
      Query({{"watch", "true"},
             {"resourceVersion", options.resource_version},
             {"allowWatchBookmarks", options.allow_bookmarks ? "true" : ""},
             {"labelSelector", options.label_selector},
             {"fieldSelector", options.field_selector},
             {"timeoutSeconds",
              options.timeout_seconds > 0 ? std::to_string(options.timeout_seconds) : ""}});

  // A client of its own: its inactivity timer is the stream's idle timeout, and its connection
  // is never shared with short calls.
  web::http::client::http_client http(web::uri(config_.server), HttpConfig(idle));
  pplx::cancellation_token_source cancel;
  // Whatever way this function is left, the stream is closed, so an unread stream cannot keep
  // filling memory.
  struct CancelOnExit {
    pplx::cancellation_token_source& source;
    ~CancelOnExit() { source.cancel(); }
  } cancel_on_exit{cancel};
  std::stop_callback on_stop(stop, [&cancel] { cancel.cancel(); });

  auto failed = [&](ApiError error) -> ApiStatus {
    if (stop.stop_requested()) return ApiStatus::Ok();
    error.context = context;
    return error;
  };

  // Headers first, within the connect deadline.
  web::http::http_response response;
  {
    auto promise = std::make_shared<std::promise<web::http::http_response>>();
    std::future<web::http::http_response> future = promise->get_future();
    ++requests_;
    const Clock::time_point sent = Clock::now();
    // Reported however the wait for the headers ends.
    int answered = 0;
    struct ObserveOnExit {
      Impl& impl;
      const Clock::time_point& sent;
      const int& code;
      ~ObserveOnExit() { impl.Observe("watch", code, sent); }
    } observe_on_exit{*this, sent, answered};
    try {
      http.request(NewRequest(web::http::methods::GET, path), cancel.get_token())
          .then([promise](pplx::task<web::http::http_response> done) {
            try {
              promise->set_value(done.get());
            } catch (...) {
              promise->set_exception(std::current_exception());
            }
          });
    } catch (const std::exception& e) {
      return failed(MakeError(Reason::kTransport, e.what()));
    }
    if (future.wait_until(connect_deadline) != std::future_status::ready) {
      cancel.cancel();
      return failed(MakeError(Reason::kDeadlineExceeded,
                              "the server did not answer within the connect timeout"));
    }
    try {
      response = future.get();
      answered = response.status_code();  // NOLINT(clang-analyzer-deadcode.DeadStores): read by
                                          // observe_on_exit
    } catch (const web::http::http_exception& e) {
      return failed(TransportError(e));
    } catch (const std::exception& e) {
      return failed(MakeError(Reason::kTransport, e.what()));
    }
  }

  auto body = response.body().streambuf();
  if (response.status_code() != web::http::status_codes::OK) {
    // An error answer is short; read it within what is left of the connect deadline.
    std::string text;
    auto promise = std::make_shared<std::promise<std::vector<unsigned char>>>();
    std::future<std::vector<unsigned char>> future = promise->get_future();
    response.extract_vector().then([promise](pplx::task<std::vector<unsigned char>> done) {
      try {
        promise->set_value(done.get());
      } catch (...) {
        promise->set_exception(std::current_exception());
      }
    });
    if (future.wait_until(std::max(connect_deadline, Clock::now() + std::chrono::seconds(5))) ==
        std::future_status::ready) {
      try {
        const std::vector<unsigned char> bytes = future.get();
        text.assign(bytes.begin(), bytes.end());
      } catch (const std::exception&) {
        // The code alone still says what went wrong.
      }
    }
    return failed(ParseApiError(response.status_code(), text));
  }

  using Traits = concurrency::streams::streambuf<uint8_t>::traits;
  LineSplitter lines;
  std::optional<ApiError> error;
  std::string bytes;
  auto on_line = [&](std::string_view line) {
    ApiResult<WatchEvent> event = ParseWatchEvent(line);
    if (!event.ok()) {
      error = event.error();
      return false;
    }
    if (event->type == WatchEventType::kError) {
      error = ApiErrorFromStatus(event->object);
      handler(std::move(event).value());
      return false;
    }
    handler(std::move(event).value());
    return !stop.stop_requested();
  };
  try {
    while (!stop.stop_requested()) {
      // One byte, waiting for it; then whatever else has arrived, without waiting. (Asking for
      // more would wait until that much arrived, holding back the events already here.)
      const Traits::int_type first = body.bumpc().get();
      if (first == Traits::eof()) {
        if (lines.pending() > 0) {
          error =
              MakeError(Reason::kBadResponse, "the watch stream ended in the middle of an event");
        }
        break;
      }
      bytes.assign(1, static_cast<char>(first));
      if (const size_t available = body.in_avail(); available > 0) {
        bytes.resize(1 + available);
        const size_t read =
            body.getn(reinterpret_cast<uint8_t*>(bytes.data() + 1), available).get();
        bytes.resize(1 + read);
      }
      if (!lines.Feed(bytes, on_line)) {
        if (!error.has_value() && !stop.stop_requested()) {
          error = MakeError(Reason::kBadResponse, "a watch event longer than the limit");
        }
        break;
      }
    }
  } catch (const web::http::http_exception& e) {
    return failed(TransportError(e));
  } catch (const std::exception& e) {
    return failed(MakeError(Reason::kTransport, e.what()));
  }
  if (error.has_value()) return failed(std::move(*error));
  return ApiStatus::Ok();
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Create(const Config& config, ClientOptions options) {
  if (config.server.empty()) return InvalidArgument("kube client: no server given");
  try {
    const web::uri uri(config.server);
    if (uri.scheme() != "https" && uri.scheme() != "http") {
      return InvalidArgument("kube client: server " + config.server + " is not an http(s) URL");
    }
    if (uri.host().empty()) {
      return InvalidArgument("kube client: server " + config.server + " names no host");
    }
  } catch (const std::exception& e) {
    return InvalidArgument("kube client: bad server URL " + config.server + ": " + e.what());
  }
  try {
    boost::asio::ssl::context tls(boost::asio::ssl::context::sslv23);
    VF_RETURN_IF_ERROR(ConfigureTls(tls, config).WithContext("kube client"));
  } catch (const std::exception& e) {
    return Internal(std::string("kube client: cannot set up TLS: ") + e.what());
  }
  if (!config.token_file.empty()) {
    Result<std::string> token = ReadToken(config.token_file);
    if (!token.ok()) return token.status().WithContext("kube client");
  }
  try {
    return std::unique_ptr<Client>(new Client(std::make_unique<Impl>(config, std::move(options))));
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("kube client: ") + e.what());
  }
}

const Config& Client::config() const { return impl_->config(); }
const std::shared_ptr<RateLimiter>& Client::rate_limiter() const { return impl_->limiter(); }
uint64_t Client::requests_sent() const { return impl_->requests_sent(); }
void Client::set_request_observer(RequestObserver observer) {
  impl_->set_observer(std::move(observer));
}

ApiResult<json> Client::Get(const Resource& resource, std::string_view ns, std::string_view name,
                            const CallOptions& options) {
  return impl_->Call("get", "get " + Describe(resource, ns, name), web::http::methods::GET,
                     ResourcePath(resource, ns, name), nullptr, "",
                     impl_->Deadline(options.timeout));
}

ApiResult<ObjectList> Client::List(const Resource& resource, std::string_view ns,
                                   const ListOptions& options) {
  const std::string context = "list " + Describe(resource, ns);
  const Clock::time_point deadline = impl_->Deadline(options.timeout);
  ObjectList list;
  std::string next;
  bool paged = options.page_size > 0;
  while (true) {
    const std::string query =
        Query({{"labelSelector", options.label_selector},
               {"fieldSelector", options.field_selector},
               {"limit", paged ? std::to_string(options.page_size) : ""},
               {"continue", next},
               // A continuation is pinned to the first page's version already; the server
               // refuses both at once.
               {"resourceVersion", next.empty() ? options.resource_version : ""}});
    ApiResult<json> page = impl_->Call("list", context, web::http::methods::GET,
                                       ResourcePath(resource, ns) + query, nullptr, "", deadline);
    if (!page.ok()) {
      if (page.reason() == Reason::kGone && !next.empty()) {
        // The continue token expired between pages: take the whole list in one go instead.
        paged = false;
        next.clear();
        list.items.clear();
        continue;
      }
      return page.error();
    }
    json& object = page.value();
    if (auto items = object.find("items"); items != object.end() && items->is_array()) {
      for (json& item : *items) {
        FillTypeMeta(resource, item);
        list.items.push_back(std::move(item));
      }
    }
    list.resource_version = ResourceVersionOf(object);
    next = MetadataString(object, "continue");
    if (next.empty()) return list;
  }
}

ApiStatus Client::Watch(const Resource& resource, std::string_view ns, const WatchOptions& options,
                        const WatchHandler& handler, std::stop_token stop) {
  return impl_->Watch(resource, ns, options, handler, std::move(stop));
}

ApiResult<json> Client::Create(const Resource& resource, std::string_view ns, json object,
                               const CallOptions& options) {
  FillTypeMeta(resource, object);
  if (resource.namespaced && !ns.empty() && object.is_object()) {
    json& metadata = object["metadata"];
    if (!metadata.contains("namespace")) metadata["namespace"] = std::string(ns);
  }
  std::string name = MetadataString(object, "name");
  if (name.empty()) name = MetadataString(object, "generateName") + "*";
  return impl_->Call("create", "create " + Describe(resource, ns, name), web::http::methods::POST,
                     ResourcePath(resource, ns), &object, "application/json",
                     impl_->Deadline(options.timeout));
}

namespace {

ApiResult<json> NamedObjectError(const std::string& verb, const Resource& resource,
                                 std::string_view ns) {
  return MakeError(Reason::kInvalid, "the object has no metadata.name",
                   verb + " " + Describe(resource, ns, "?"));
}

}  // namespace

ApiResult<json> Client::Replace(const Resource& resource, std::string_view ns, json object,
                                const CallOptions& options) {
  FillTypeMeta(resource, object);
  const std::string name = MetadataString(object, "name");
  if (name.empty()) return NamedObjectError("replace", resource, ns);
  return impl_->Call("update", "replace " + Describe(resource, ns, name), web::http::methods::PUT,
                     ResourcePath(resource, ns, name), &object, "application/json",
                     impl_->Deadline(options.timeout));
}

ApiResult<json> Client::MergePatch(const Resource& resource, std::string_view ns,
                                   std::string_view name, const json& patch,
                                   const CallOptions& options) {
  return impl_->Call("patch", "patch " + Describe(resource, ns, name), web::http::methods::PATCH,
                     ResourcePath(resource, ns, name), &patch, "application/merge-patch+json",
                     impl_->Deadline(options.timeout));
}

ApiResult<json> Client::Delete(const Resource& resource, std::string_view ns, std::string_view name,
                               const DeleteOptions& options) {
  json body = {{"apiVersion", "v1"}, {"kind", "DeleteOptions"}};
  if (!options.propagation_policy.empty()) {
    body["propagationPolicy"] = options.propagation_policy;
  }
  if (!options.precondition_uid.empty()) {
    body["preconditions"]["uid"] = options.precondition_uid;
  }
  if (!options.precondition_resource_version.empty()) {
    body["preconditions"]["resourceVersion"] = options.precondition_resource_version;
  }
  if (options.grace_period_seconds.has_value()) {
    body["gracePeriodSeconds"] = *options.grace_period_seconds;
  }
  return impl_->Call("delete", "delete " + Describe(resource, ns, name), web::http::methods::DEL,
                     ResourcePath(resource, ns, name), &body, "application/json",
                     impl_->Deadline(options.timeout));
}

ApiResult<json> Client::ReplaceStatus(const Resource& resource, std::string_view ns, json object,
                                      const CallOptions& options) {
  FillTypeMeta(resource, object);
  const std::string name = MetadataString(object, "name");
  if (name.empty()) return NamedObjectError("replace status of", resource, ns);
  return impl_->Call("update", "replace status of " + Describe(resource, ns, name),
                     web::http::methods::PUT, ResourcePath(resource, ns, name, "status"), &object,
                     "application/json", impl_->Deadline(options.timeout));
}

ApiResult<json> Client::PatchStatus(const Resource& resource, std::string_view ns,
                                    std::string_view name, const json& patch,
                                    const CallOptions& options) {
  return impl_->Call("patch", "patch status of " + Describe(resource, ns, name),
                     web::http::methods::PATCH, ResourcePath(resource, ns, name, "status"), &patch,
                     "application/merge-patch+json", impl_->Deadline(options.timeout));
}

ApiResult<json> Client::CreateEvent(const Resource& resource, const json& object, EventType type,
                                    std::string_view reason, std::string_view message,
                                    std::string_view component, const CallOptions& options) {
  json event = MakeEvent(resource, object, type, reason, message, component,
                         std::chrono::system_clock::now());
  const std::string ns = event["metadata"]["namespace"].get<std::string>();
  const std::string context =
      "create event for " +
      Describe(resource, MetadataString(object, "namespace"), MetadataString(object, "name"));
  return impl_->Call("create", context, web::http::methods::POST, ResourcePath(kEvents, ns), &event,
                     "application/json", impl_->Deadline(options.timeout));
}

}  // namespace vf::kube
