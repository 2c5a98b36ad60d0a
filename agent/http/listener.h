// The one HTTP server every server of the project stands on: the agent's and the operator's
// /metrics and probe endpoints (agent/metrics/http_exporter.h) and the coordinator's API
// (operator/coordinator/server.h). It faces the network: Boost.Beast parses each request with
// limits enforced while it reads (header size, body size, chunk sizes), every phase of a
// connection has a deadline (TLS handshake, request head, body, answer), connections are
// capped, and each connection's request rate is paced. Nothing a client sends ends the process
// or holds a thread: a malformed request is answered 400 and its connection closed.
//
// Hand-written over Beast because Beast is a toolkit, not a server: the accept loop, the
// per-connection state machine, the deadlines and the stop sequence are left to its user.
// It lives on the agent floor, the lowest that serves HTTP.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/http/tls.h"
#include "runtime/status.h"

namespace vf::http {

// The HTTP status codes the project's servers answer with.
namespace codes {
inline constexpr int kOk = 200;
inline constexpr int kNoContent = 204;
inline constexpr int kBadRequest = 400;
inline constexpr int kUnauthorized = 401;
inline constexpr int kForbidden = 403;
inline constexpr int kNotFound = 404;
inline constexpr int kMethodNotAllowed = 405;
inline constexpr int kRequestTimeout = 408;
inline constexpr int kConflict = 409;
inline constexpr int kPayloadTooLarge = 413;
inline constexpr int kHeaderFieldsTooLarge = 431;
inline constexpr int kInternalError = 500;
inline constexpr int kServiceUnavailable = 503;
}  // namespace codes

// `host` as it goes into a URL: IPv6 addresses in brackets.
std::string HostForUri(const std::string& host);

// `text` with its line breaks turned into spaces: error bodies are one line, so that a client's
// log shows them as they are.
std::string OneLine(std::string text);

// The HTTP status that answers a failed Status: 400 InvalidArgument, 401 Unauthenticated,
// 403 PermissionDenied, 404 NotFound, 409 FailedPrecondition, 408 DeadlineExceeded,
// 503 Unavailable, 500 anything else.
int HttpCode(const Status& status);

// The message of the exception being handled; call inside a catch block only.
std::string CurrentExceptionMessage();

// A message's header fields in the order they came; names compare without case. Value type.
class Headers {
 public:
  void Add(std::string name, std::string value);
  // Replaces every field named `name` by one.
  void Set(const std::string& name, std::string value);
  // The first field named `name`.
  std::optional<std::string> Get(std::string_view name) const;
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// A request as the server read it. Value type.
struct Request {
  std::string method;  // "GET"
  std::string target;  // as sent: "/v1/jobs/a/b/plan?after=3"
  std::string path;    // the target up to '?', as sent (not decoded)
  std::string query;   // after '?', without it; empty when there is none
  Headers headers;
  std::string body;  // empty until the body was read (see Listener::Options::admit)
  std::string peer;  // the client's address, "127.0.0.1:51234"
};

// An answer. Value type.
struct Response {
  int status = codes::kOk;
  Headers headers;
  std::string body;

  // `body` with its Content-Type.
  static Response With(int status, std::string body, const std::string& content_type);
  // A text/plain answer: `message` on one line, then a newline.
  static Response Text(int status, const std::string& message);
};

class Listener;
namespace detail {
class ListenerCore;
class ResponderState;
}  // namespace detail

// Answers one request, once: the first Send wins and later ones do nothing. While any copy
// lives, the request counts as being handled, so Listener::Stop waits for it; a handler that
// answers later (a long poll) keeps a copy. When the last copy goes unanswered, the request is
// answered 500. Send may be called from any thread. Copyable; thread-safe.
class Responder {
 public:
  explicit Responder(std::shared_ptr<detail::ResponderState> state) : state_(std::move(state)) {}
  void Send(Response response) const;

 private:
  std::shared_ptr<detail::ResponderState> state_;
};

// An HTTP(S) server on host:port that hands every request to one handler. Thread-safe.
//
// The handler and `admit` run on the server's threads, only between Start and the return of
// Stop: an object that owns a Listener and stops it in its destructor may give it a handler that
// holds a plain pointer to itself. They must not block: the server's few threads serve every
// connection.
class Listener {
 public:
  using Handler = std::function<void(const Request& request, const Responder& responder)>;
  // Decides from the request line and headers alone, before the body is read: an answer ends the
  // request there, its body is never read, and the connection closes after the answer. The
  // coordinator refuses requests without a valid credential here, so that nobody without one
  // makes it buffer a body.
  using Admit = std::function<std::optional<Response>(const Request& head)>;
  // The answer for an error the server itself gives (400 malformed, 413, 431, 503 while
  // stopping, 500 for a handler that threw). Servers whose errors have a shape of their own
  // (JSON) supply it.
  using ErrorResponse = std::function<Response(int code, const std::string& message)>;

  // What one client may make the server hold, enforced while a request is read. Value type.
  struct Limits {
    // The request line and header fields together; more is answered 431.
    size_t max_header_bytes = 16 << 10;
    // More is answered 413, for a declared length at once and for a chunked body as its chunks
    // arrive. 0: no body at all.
    size_t max_body_bytes = 1 << 20;
    // From the accepted connection to the end of the TLS handshake.
    std::chrono::milliseconds handshake_timeout{10'000};
    // From the moment the server waits for a request (a new connection, or a kept one after an
    // answer) to the end of that request's header fields: a client sending a byte a second is
    // cut off here.
    std::chrono::milliseconds head_timeout{10'000};
    // From the end of the header fields to the end of the body.
    std::chrono::milliseconds body_timeout{30'000};
    // For writing one answer.
    std::chrono::milliseconds write_timeout{30'000};
    // Connections open at once. At the cap a new connection closes the one that has waited
    // longest for a request head (or in its TLS handshake); if every connection is busy with a
    // request, the new one is closed.
    int max_connections = 1024;
    // Requests on one kept-alive connection, then the server closes it.
    int max_requests_per_connection = 1000;
    // Requests per second on one connection; faster ones wait before the next is read.
    double requests_per_second = 200;
    // Request bodies held at once, over all connections: a body reserves its declared length
    // (a chunked one the body limit) when its head is read, until its handler returns. A
    // request that would pass this is answered 503, and a client retries it later: memory stays
    // bounded however many clients send bodies at once.
    size_t max_buffered_body_bytes = 64 << 20;
  };

  // How a server speaks and what it allows. Value type.
  struct Options {
    // Said in errors and answers: "metrics server: cannot listen on ...", "metrics server is
    // shutting down".
    std::string name = "server";
    ErrorResponse error_response;  // default: Response::Text
    Admit admit;                   // default: admit every request
    Limits limits;
    // Set: HTTPS with these credentials, and nothing else on the port (a plain HTTP request
    // fails the TLS handshake and never reaches the handler). Unset: plain HTTP.
    std::shared_ptr<ServerCredentials> tls;
    int threads = 2;  // the server's I/O threads
  };

  // Listens on host:port; port 0 picks a free port (see port()). InvalidArgument for an empty
  // host, a host that does not resolve or a port outside 0..65535, Unavailable when the port
  // cannot be bound.
  static Result<std::unique_ptr<Listener>> Start(const std::string& host, int port, Options options,
                                                 Handler handler);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // The port it listens on: the one given to Start, or the one picked for port 0.
  int port() const;
  // The host as given to Start.
  const std::string& host() const;
  // "http://host:port" ("https://" with TLS), with the host as given to Start.
  std::string url() const;
  // Connections open now.
  int open_connections() const;

  // Stops in this order: new requests are answered 503 without reaching the handler; then
  // `before_close` runs (a server answers what it still holds, such as pending long polls);
  // requests being handled get up to 2 s to be answered and their answers written; then every
  // connection is closed, and Stop returns once no handler call runs and no Responder is left,
  // so whatever the handler uses may be destroyed afterwards. Idempotent: later calls, and their
  // `before_close`, do nothing. Must not be called from a handler (it would wait for itself).
  void Stop(const std::function<void()>& before_close = nullptr);

 private:
  explicit Listener(std::shared_ptr<detail::ListenerCore> core);
  std::shared_ptr<detail::ListenerCore> impl_;
};

}  // namespace vf::http
