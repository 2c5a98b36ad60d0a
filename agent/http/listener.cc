#include "agent/http/listener.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/ssl.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <cpprest/http_listener.h>

namespace vf::http {

using web::http::http_request;
using web::http::http_response;
using web::http::status_code;
using web::http::status_codes;

// ---- Ports and addresses ----

Result<int> PickFreePort(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &found);
  if (rc != 0) return InvalidArgument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  std::string error = "no address";
  int port = -1;
  for (addrinfo* ai = found; ai != nullptr && port < 0; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof(bound);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      port = bound.ss_family == AF_INET6
                 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                 : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (port < 0) return Unavailable("cannot find a free port on '" + host + "': " + error);
  return port;
}

Status OpenOnPort(const std::string& host, int port, const std::function<Status(int)>& open) {
  constexpr int kAttempts = 5;
  Status last;
  for (int attempt = 0; attempt < (port == 0 ? kAttempts : 1); ++attempt) {
    int chosen = port;
    if (chosen == 0) {
      VF_ASSIGN_OR_RETURN(chosen, PickFreePort(host));
    }
    last = open(chosen);
    if (last.ok()) return last;
  }
  return last;
}

std::string HostForUri(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// ---- Answers ----

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
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
    case StatusCode::kUnauthenticated:
      return status_codes::Unauthorized;
    case StatusCode::kPermissionDenied:
      return status_codes::Forbidden;
    default:
      return status_codes::InternalError;
  }
}

std::string CurrentExceptionMessage() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

void SetBody(http_response& response, const std::string& bytes, const std::string& content_type) {
  response.headers().set_content_type(content_type);
  response.set_body(std::vector<unsigned char>(bytes.begin(), bytes.end()));
}

http_response TextResponse(status_code code, const std::string& message) {
  http_response response(code);
  SetBody(response, OneLine(message) + "\n", "text/plain; charset=utf-8");
  return response;
}

namespace {

// Counts the answers Send has started and cpprest has not finished writing, in the whole
// process: Listener::Stop waits for them before cpprest's close(), which would cut a
// connection under its answer (see kCloseDrain below). Process-wide rather than per listener
// because Send is given only the request; another listener's answers can only make a Stop wait
// the few milliseconds they take. Thread-safe.
class AnswersBeingWritten {
 public:
  static AnswersBeingWritten& Get() {
    static AnswersBeingWritten* answers = new AnswersBeingWritten();  // never destroyed
    return *answers;
  }
  void Begin() {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
  }
  void End() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--count_ == 0) none_.notify_all();
  }
  void WaitForNone(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    none_.wait_for(lock, timeout, [this] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable none_;
  int64_t count_ = 0;  // guarded by mu_
};

}  // namespace

pplx::task<void> Send(const http_request& request, const http_response& response) {
  AnswersBeingWritten::Get().Begin();
  try {
    // The server ends the connection once the answer is out (see kCloseDrain below for why).
    // No client of the project's servers reuses one: the coordinator's client opens a
    // connection per request, and a Prometheus scrape every few seconds hardly notices.
    http_response closing = response;
    closing.headers()[web::http::header_names::connection] = "close";
    return request.reply(closing).then([](pplx::task<void> sent) {
      try {
        sent.get();
      } catch (...) {
      }
      AnswersBeingWritten::Get().End();
    });
  } catch (...) {
    // Already answered, or the listener closed the connection: nothing left to do.
    AnswersBeingWritten::Get().End();
    return pplx::task_from_result();
  }
}

// ---- Request bodies ----

namespace {

constexpr size_t kReadChunkBytes = 64 << 10;

// Reads one request's body for ReadBody; keeps itself alive through its continuations.
// Not thread-safe, and need not be: each step runs after the previous one finished.
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
  // says which, and a truncated value must never reach the handler.
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

}  // namespace

pplx::task<Body> ReadBody(const http_request& request, size_t limit) {
  return std::make_shared<BodyReader>(request, limit)->Read();
}

void DrainBody(const http_request& request) {
  try {
    ReadBody(request, 0);
  } catch (...) {
  }
}

// ---- The listener ----

namespace {

// How long Stop waits for the TLS connections still open to end by themselves before it has
// cpprest close them. Why it waits at all: cpprest's close() cuts every connection from the
// calling thread while that connection's own handlers may be using its socket on cpprest's
// threads, and Boost.Asio sockets are not safe for that. The window it hit was a TLS client
// that had just left: its end of stream without TLS's close_notify (cpprest's client sends
// none) reads as a truncated stream, which cpprest answers 400 on the connection it is closing;
// the write started on a socket closed under it and the process died (SIGSEGV in
// epoll_reactor::start_op, about 1 in 200 runs of http_tls_test). With every answer closing its
// connection (Send), a connection ends right after its answer, so the wait is short; a client
// that connected and says nothing keeps its connection until the wait ends, and closing one
// that waits to read is safe.
constexpr std::chrono::seconds kCloseDrain(2);

// Counts the TLS connections of one listener that cpprest has open: one per ssl::context, which
// cpprest makes per connection and frees with it. Thread-safe.
class TlsConnections {
 public:
  // Counts the connection whose context `context` is, until that context is freed.
  static void Track(const std::shared_ptr<TlsConnections>& self, SSL_CTX* context) {
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      ++self->open_;
    }
    // Owned by the context from here; its ex_data free callback counts the connection out.
    auto* owner = new std::shared_ptr<TlsConnections>(self);
    if (SSL_CTX_set_ex_data(context, Index(), owner) != 1)
      Untrack(nullptr, owner, nullptr, 0, 0, nullptr);
  }

  // Waits until none is open or `timeout` has passed.
  void WaitForNone(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    closed_.wait_for(lock, timeout, [this] { return open_ == 0; });
  }

 private:
  static int Index() {
    static const int index =
        SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, &TlsConnections::Untrack);
    return index;
  }

  static void Untrack(void* /*parent*/, void* ptr, CRYPTO_EX_DATA* /*data*/, int /*index*/,
                      long /*argl*/, void* /*argp*/) {
    auto* self = static_cast<std::shared_ptr<TlsConnections>*>(ptr);
    if (self == nullptr) return;
    {
      std::lock_guard<std::mutex> lock((*self)->mu_);
      if (--(*self)->open_ == 0) (*self)->closed_.notify_all();
    }
    delete self;
  }

  std::mutex mu_;
  std::condition_variable closed_;
  int64_t open_ = 0;  // guarded by mu_
};

}  // namespace

// The listener's state, shared with the InFlight of every request being handled so that it
// outlives them. Thread-safe.
class Listener::Impl : public std::enable_shared_from_this<Listener::Impl> {
 public:
  Impl(std::string host, int port, Options options, Handler handler)
      : host_(std::move(host)),
        port_(port),
        options_(std::move(options)),
        handler_(std::move(handler)) {}

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  const char* scheme() const { return options_.tls != nullptr ? "https" : "http"; }

  Status Open();
  void Stop(const std::function<void()>& before_close);

 private:
  std::optional<InFlight> Enter();
  void Leave();
  void Dispatch(const http_request& request);
  // Answers 413 and drops the body when the request's declared body is over the limit.
  bool RefuseLargeBody(const http_request& request);

  const std::string host_;
  const int port_;
  const Options options_;
  const Handler handler_;
  const std::shared_ptr<TlsConnections> tls_connections_ = std::make_shared<TlsConnections>();
  // Set by Open; closed and dropped by Stop (under stop_mu_).
  std::unique_ptr<web::http::experimental::listener::http_listener> listener_;

  std::mutex stop_mu_;    // serialises Stop calls
  bool stopped_ = false;  // guarded by stop_mu_
  std::mutex mu_;         // guards everything below
  std::condition_variable idle_;
  bool stopping_ = false;
  int64_t in_flight_ = 0;
};

std::optional<InFlight> Listener::Impl::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return std::nullopt;
  ++in_flight_;
  // The deleter runs once, when the last copy goes; it holds the state alive until then.
  return InFlight(
      std::shared_ptr<void>(nullptr, [self = shared_from_this()](void*) { self->Leave(); }));
}

void Listener::Impl::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--in_flight_ == 0) idle_.notify_all();
}

Status Listener::Impl::Open() {
  const std::string address =
      std::string(scheme()) + "://" + HostForUri(host_) + ":" + std::to_string(port_) + "/";
  try {
    web::http::experimental::listener::http_listener_config config;
    if (options_.tls != nullptr) {
      // The context is made when the port opens; the credentials choose the certificate at each
      // handshake, so that a renewed one is served without reopening.
      config.set_ssl_context_callback(
          [tls = options_.tls, connections = tls_connections_](boost::asio::ssl::context& context) {
            tls->Configure(context.native_handle());
            TlsConnections::Track(connections, context.native_handle());
          });
    }
    listener_ = std::make_unique<web::http::experimental::listener::http_listener>(address, config);
    // Weak, not strong: the listener belongs to this object, and a strong reference from its
    // handler would keep both alive for good. Not a plain pointer either, so that the handler's
    // safety does not rest on cpprest's close() waiting for handler calls in progress (it does,
    // and Stop closes the listener before this object can go).
    std::weak_ptr<Impl> weak = weak_from_this();
    listener_->support([weak](const http_request& request) {
      if (std::shared_ptr<Impl> self = weak.lock()) {
        self->Dispatch(request);
      } else {
        Send(request, TextResponse(status_codes::ServiceUnavailable, "shutting down"));
      }
    });
    listener_->open().wait();
  } catch (...) {
    listener_.reset();
    return Unavailable("cannot listen on " + address + ": " + CurrentExceptionMessage());
  }
  return Status::Ok();
}

void Listener::Impl::Dispatch(const http_request& request) {
  std::optional<InFlight> in_flight = Enter();
  if (!in_flight.has_value()) {
    Send(request, options_.error_response(status_codes::ServiceUnavailable,
                                          options_.name + " is shutting down"));
    DrainBody(request);
    return;
  }
  if (RefuseLargeBody(request)) return;
  try {
    handler_(request, *in_flight);
  } catch (...) {
    // A bug in the handler: the client learns of it instead of waiting for its timeout.
    Send(request, options_.error_response(status_codes::InternalError,
                                          options_.name + " failed: " + CurrentExceptionMessage()));
  }
}

bool Listener::Impl::RefuseLargeBody(const http_request& request) {
  const size_t limit = options_.max_body_bytes;
  uint64_t declared = 0;
  std::string encoding;
  std::string problem;
  if (request.headers().match(web::http::header_names::content_length, declared) &&
      declared > limit) {
    problem = "request body is " + std::to_string(declared) + " bytes";
  } else if (limit == 0 &&
             request.headers().match(web::http::header_names::transfer_encoding, encoding) &&
             encoding.find("chunked") != std::string::npos) {
    problem = "request has a chunked body";
  }
  if (problem.empty()) return false;
  Send(request, options_.error_response(status_codes::RequestEntityTooLarge,
                                        options_.name + ": " + problem + "; the limit is " +
                                            std::to_string(limit) + " bytes"));
  DrainBody(request);
  return true;
}

void Listener::Impl::Stop(const std::function<void()>& before_close) {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (stopped_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  if (before_close) before_close();
  // Handlers answer on connections that are still open: cpprest's close() would cut a
  // connection under a handler's reply, the same crash as kCloseDrain's (seen with a handler
  // that answered while Stop ran, ListenerTest.StopWaitsForAHandlerThatIsRunning under TSan's
  // timing). Bounded, because a request whose body never comes holds its InFlight until close
  // cuts it.
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait_for(lock, kCloseDrain, [this] { return in_flight_ == 0; });
  }
  // A handler that returned may have left its answer to cpprest's threads to write.
  AnswersBeingWritten::Get().WaitForNone(kCloseDrain);
  // Answered, the TLS connections end by themselves; only then is cpprest's close safe (see
  // kCloseDrain).
  if (options_.tls != nullptr) tls_connections_->WaitForNone(kCloseDrain);
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

Result<std::unique_ptr<Listener>> Listener::Start(const std::string& host, int port,
                                                  Options options, Handler handler) {
  if (!options.error_response) options.error_response = TextResponse;
  if (host.empty()) return InvalidArgument(options.name + ": host is empty");
  if (port < 0 || port > 65535) {
    return InvalidArgument(options.name + ": port " + std::to_string(port) + " is not in 0..65535");
  }
  std::shared_ptr<Impl> impl;
  VF_RETURN_IF_ERROR(OpenOnPort(host, port, [&](int chosen) {
                       impl = std::make_shared<Impl>(host, chosen, options, handler);
                       return impl->Open();
                     }).WithContext(options.name));
  return std::unique_ptr<Listener>(new Listener(std::move(impl)));
}

Listener::Listener(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Listener::~Listener() { Stop(); }

int Listener::port() const { return impl_->port(); }

const std::string& Listener::host() const { return impl_->host(); }

std::string Listener::url() const {
  return std::string(impl_->scheme()) + "://" + HostForUri(impl_->host()) + ":" +
         std::to_string(impl_->port());
}

void Listener::Stop(const std::function<void()>& before_close) { impl_->Stop(before_close); }

}  // namespace vf::http
