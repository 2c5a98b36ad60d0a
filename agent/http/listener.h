// The one HTTP listener shell the project's servers stand on: the agent's and the operator's
// /metrics endpoint (agent/metrics/http_exporter.h) and the coordinator's API
// (operator/coordinator/server.h). It opens cpprest's listener on a port (port 0 picks a free
// one), counts the requests being handled, answers 503 once it is stopping and 500 for a handler
// that throws, and stops only when no handler runs any more. What a request is answered is the
// handler's business.
//
// Hand-written over cpprest (the project's HTTP library, client and server) because cpprest's
// http_listener leaves exactly these parts to its user: it cannot report the port it got for
// port 0, and its close() waits for handler calls but not for the continuations they started.
// It lives on the agent floor, the lowest that serves HTTP.
#pragma once

// cpprest defines a macro U; a header that uses U as a template parameter (GoogleTest) must come
// before this one.
#include <cpprest/http_msg.h>

#include <cstddef>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "agent/http/tls.h"
#include "runtime/status.h"

namespace vf::http {

// ---- Ports and addresses ----

// A port that was free on `host` a moment ago ("" means every address). cpprest's listener
// needs a concrete port to bind and says nothing of the one it got for port 0, so port 0 is
// served by picking one here. InvalidArgument when `host` does not resolve, Unavailable when
// nothing could be bound.
Result<int> PickFreePort(const std::string& host);

// Opens a listener through `open(port)`: on `port` itself, or, for port 0, on ports picked with
// PickFreePort, trying a few in turn (a picked port can be taken by someone else before the
// listener binds it). Returns the last failure when none opened.
Status OpenOnPort(const std::string& host, int port, const std::function<Status(int)>& open);

// `host` as it goes into a URL: IPv6 addresses in brackets.
std::string HostForUri(const std::string& host);

// ---- Answers ----

// `text` with its line breaks turned into spaces: error bodies are one line, so that a client's
// log shows them as they are.
std::string OneLine(std::string text);

// The HTTP status that answers a failed Status: 400 InvalidArgument, 401 Unauthenticated,
// 403 PermissionDenied, 404 NotFound, 409 FailedPrecondition, 408 DeadlineExceeded,
// 503 Unavailable, 500 anything else.
web::http::status_code HttpCode(const Status& status);

// The message of the exception being handled; call inside a catch block only.
std::string CurrentExceptionMessage();

// Sets `bytes` as the body. Never through cpprest's std::string overload: that one hands cpprest
// a stream of char that it then reads as a stream of unsigned char (undefined behaviour that
// UBSan reports).
void SetBody(web::http::http_response& response, const std::string& bytes,
             const std::string& content_type);

// A text/plain answer: `message` on one line, then a newline.
web::http::http_response TextResponse(web::http::status_code code, const std::string& message);

// Starts sending `response`; the task completes once it is sent or has failed. A client that
// went away makes the send fail; that is observed here, because an unobserved failed task
// terminates the process. Answering a request twice is a no-op. The answer says
// "Connection: close", and the server ends the connection after it: cpprest cannot close a
// connection safely while it reads or writes on it, and a kept one is read again right after
// each answer (listener.cc says more).
pplx::task<void> Send(const web::http::http_request& request,
                      const web::http::http_response& response);

// ---- Request bodies ----

// A request body as read by ReadBody. Value type.
struct Body {
  std::string data;
  bool too_large = false;  // over the limit: `data` is empty, the rest was read and dropped
  std::string error;       // the body could not be read (the client went away mid-body)
};

// Reads a request body chunk by chunk. The listener buffers whatever a client sends until it is
// read, so even a body over `limit` is read to its end (and dropped): memory stays bounded by
// one chunk, not by what the client chose to send. A body shorter than its Content-Length (the
// connection broke) is an error, never a truncated value.
pplx::task<Body> ReadBody(const web::http::http_request& request, size_t limit);

// Reads and drops the body of a request that has been answered without it.
void DrainBody(const web::http::http_request& request);

// ---- The listener ----

// Counts one request as being handled while any copy of it lives. A handler that answers later
// (from a continuation, once the body is read) keeps a copy there, so that Listener::Stop waits
// for that continuation too. Copyable; thread-safe.
class InFlight {
 private:
  friend class Listener;
  explicit InFlight(std::shared_ptr<void> done) : done_(std::move(done)) {}
  std::shared_ptr<void> done_;  // its deleter marks the request done
};

// An HTTP listener on host:port that hands every request to one handler. Thread-safe.
//
// The handler is called on cpprest's threads, only between Start and the return of Stop: an
// object that owns a Listener and stops it in its destructor may give it a handler that holds
// a plain pointer to itself.
class Listener {
 public:
  using Handler =
      std::function<void(const web::http::http_request& request, const InFlight& in_flight)>;
  // The answer for an error the listener itself gives: 503 while stopping, 500 for a handler
  // that threw. Servers whose errors have a shape of their own (JSON) supply it.
  using ErrorResponse =
      std::function<web::http::http_response(web::http::status_code code, const std::string&)>;

  // How a listener speaks of itself. Value type.
  struct Options {
    // Said in errors and answers: "metrics server: cannot listen on ...", "metrics server is
    // shutting down".
    std::string name = "server";
    ErrorResponse error_response;  // default: TextResponse
    // A request whose Content-Length is larger is answered 413 without reaching the handler,
    // and its body is read and dropped. 0: no body at all, so a chunked body (whose size only
    // its end tells) is refused too; a server that takes bodies bounds chunked ones as it reads
    // them (ReadBody).
    size_t max_body_bytes = std::numeric_limits<size_t>::max();
    // Set: HTTPS with these credentials, and nothing else on the port (a plain HTTP request
    // fails the TLS handshake and never reaches the handler). Unset: plain HTTP.
    std::shared_ptr<ServerCredentials> tls;
  };

  // Listens on host:port; port 0 picks a free port (see port()). InvalidArgument for an empty
  // host or a port outside 0..65535, Unavailable when the port cannot be bound.
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

  // Stops in this order: new requests are answered 503 without reaching the handler; then
  // `before_close` runs (a server answers what it still holds, such as pending long polls);
  // with TLS, the connections still open are given up to 2 s to end by themselves (each ends
  // after its answer); then the listener closes every connection, and Stop returns once no
  // handler call runs and no InFlight is left, so whatever the handler uses may be destroyed
  // afterwards. Idempotent: later calls, and their `before_close`, do nothing. Must not be
  // called from a handler (it would wait for itself).
  void Stop(const std::function<void()>& before_close = nullptr);

 private:
  class Impl;
  explicit Listener(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace vf::http
