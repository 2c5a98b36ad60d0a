#include "agent/http/listener.h"

#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>

// Boost.Asio's scheduler, inlined at -O2, trips GCC's -Wnull-dereference on a pointer it has
// checked elsewhere (boost/asio/detail/impl/scheduler.ipp); the warning is Boost's, not ours.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#pragma GCC diagnostic pop

#include "agent/http/request_reader.h"

namespace vf::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

// ---- Names, codes and messages ----

std::string HostForUri(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

int HttpCode(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
      return codes::kBadRequest;
    case StatusCode::kNotFound:
      return codes::kNotFound;
    case StatusCode::kFailedPrecondition:
      return codes::kConflict;
    case StatusCode::kDeadlineExceeded:
      return codes::kRequestTimeout;
    case StatusCode::kUnavailable:
      return codes::kServiceUnavailable;
    case StatusCode::kUnauthenticated:
      return codes::kUnauthorized;
    case StatusCode::kPermissionDenied:
      return codes::kForbidden;
    default:
      return codes::kInternalError;
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

void Headers::Add(std::string name, std::string value) {
  fields_.emplace_back(std::move(name), std::move(value));
}

void Headers::Set(const std::string& name, std::string value) {
  std::erase_if(fields_, [&](const auto& field) { return beast::iequals(field.first, name); });
  Add(name, std::move(value));
}

std::optional<std::string> Headers::Get(std::string_view name) const {
  for (const auto& [field, value] : fields_) {
    if (beast::iequals(field, beast::string_view(name.data(), name.size()))) return value;
  }
  return std::nullopt;
}

Response Response::With(int status, std::string body, const std::string& content_type) {
  Response response;
  response.status = status;
  response.body = std::move(body);
  response.headers.Set("Content-Type", content_type);
  return response;
}

Response Response::Text(int status, const std::string& message) {
  return With(status, OneLine(message) + "\n", "text/plain; charset=utf-8");
}

// ---- Connections ----

namespace {

// How long the server still reads (and drops) what a client sends after the server's last
// answer on a connection, so that closing it does not reset the connection under that answer
// (a close with unread data sends RST, and the client may lose the answer).
constexpr std::chrono::seconds kLingerTime(1);
constexpr size_t kLingerBytes = 4 << 20;
// Requests being handled get this long to be answered once Stop has begun.
constexpr std::chrono::seconds kStopDrain(2);
// After a failed accept (out of file descriptors), the next accept waits this long.
constexpr std::chrono::milliseconds kAcceptBackoff(100);

// One accepted connection as the listener sees it: answers are handed to it from any thread,
// and it can be closed from any thread. Thread-safe (both post onto the connection's strand).
class Connection {
 public:
  virtual ~Connection() = default;
  // Writes `response` as the answer to the request being handled; `in_flight` is released once
  // the answer is written (or cannot be).
  virtual void Answer(Response response, std::shared_ptr<void> in_flight) = 0;
  // Closes the connection at once, whatever it is doing.
  virtual void Close() = 0;
  // The listener's own error answer, in the server's shape.
  virtual Response ServerError(int code, const std::string& message) const = 0;

  // Since when this connection waits for a request head; max() when it does not.
  std::atomic<int64_t> waiting_since{std::numeric_limits<int64_t>::max()};
};

}  // namespace

namespace detail {

// The state every copy of one Responder shares. Thread-safe.
class ResponderState {
 public:
  ResponderState(std::shared_ptr<Connection> connection, std::shared_ptr<void> in_flight)
      : in_flight_(std::move(in_flight)), connection_(std::move(connection)) {}
  ~ResponderState() {
    if (!answered_.exchange(true)) {
      Answer(connection_->ServerError(codes::kInternalError, "the request was not answered"));
    }
  }
  ResponderState(const ResponderState&) = delete;
  ResponderState& operator=(const ResponderState&) = delete;

  void Send(Response response) {
    if (answered_.exchange(true)) return;
    Answer(std::move(response));
  }

 private:
  // The write holds the request's token; this thread holds a copy until the post has returned,
  // so that Stop, which waits for the last token, cannot destroy the I/O context while this
  // thread is still inside the post (TSan saw it signal the context's condition variable as
  // Stop destroyed it). It lets go of the connection before that copy too: when the write has
  // already finished, this is the connection's last owner, and destroying it (its timers
  // belong to the context) after Stop destroyed the context was a use after free (ASan).
  void Answer(Response response) {
    std::shared_ptr<void> until_posted = in_flight_;
    connection_->Answer(std::move(response), std::move(in_flight_));
    connection_.reset();
  }

  std::atomic<bool> answered_{false};
  std::shared_ptr<void> in_flight_;  // moved into the answer's write
  std::shared_ptr<Connection> connection_;
};

}  // namespace detail

void Responder::Send(Response response) const { state_->Send(std::move(response)); }

// The listener's state: the acceptor, the I/O threads, the open connections and the count of
// requests being handled. Shared with every connection and Responder, so that it outlives them.
// Thread-safe.
namespace detail {
class ListenerCore : public std::enable_shared_from_this<ListenerCore> {
 public:
  using Options = Listener::Options;
  using Handler = Listener::Handler;

  ListenerCore(std::string host, Options options, Handler handler)
      : host_(std::move(host)), options_(std::move(options)), handler_(std::move(handler)) {}

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  const Options& options() const { return options_; }
  const Handler& handler() const { return handler_; }
  const char* scheme() const { return options_.tls != nullptr ? "https" : "http"; }
  bool stopping() const { return stopping_.load(); }

  Status Open(int port);
  void Stop(const std::function<void()>& before_close);

  // A token that counts one request as being handled until it is released; nullptr once the
  // listener is stopping.
  std::shared_ptr<void> Enter();
  // A token that holds `bytes` of the bodies' budget (Limits::max_buffered_body_bytes) until it
  // is released; nullptr when they do not fit now.
  std::shared_ptr<void> ReserveBody(size_t bytes);
  void Register(const std::shared_ptr<Connection>& connection);
  void Unregister(const Connection* connection);
  int open_connections() const;

 private:
  void Accept();
  void OnAccept(beast::error_code error, tcp::socket socket);
  // Makes room for one more connection: closes the one that has waited longest for a request
  // head or in its TLS handshake. False when every connection is busy with a request.
  bool MakeRoom();
  void Leave();
  void CloseEverything();

  const std::string host_;
  const Options options_;
  const Handler handler_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};

  // Set by Open, dropped by Stop once the threads are joined.
  std::unique_ptr<net::io_context> io_;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_;
  std::unique_ptr<tcp::acceptor> acceptor_;  // used on its strand only
  std::unique_ptr<net::steady_timer> accept_backoff_;
  std::unique_ptr<net::ssl::context> ssl_;
  std::vector<std::thread> threads_;

  std::mutex stop_mu_;     // serialises Stop calls
  bool stopped_ = false;   // guarded by stop_mu_
  mutable std::mutex mu_;  // guards everything below
  std::condition_variable idle_;
  int64_t in_flight_ = 0;
  size_t buffered_body_bytes_ = 0;
  std::unordered_map<const Connection*, std::weak_ptr<Connection>> connections_;
};
}  // namespace detail

namespace {

int64_t NowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string PeerOf(const tcp::socket& socket) {
  beast::error_code error;
  const tcp::endpoint peer = socket.remote_endpoint(error);
  if (error) return "unknown";
  return HostForUri(peer.address().to_string()) + ":" + std::to_string(peer.port());
}

// One connection's life: TLS handshake (for HTTPS), then requests one after another, each read
// under the listener's limits, handed to the handler and answered. Everything runs on the
// connection's strand. Not thread-safe beyond Connection's members.
template <class Stream>
class Session : public Connection, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Session(std::shared_ptr<detail::ListenerCore> listener, Stream stream, std::string peer)
      : listener_(std::move(listener)),
        limits_(listener_->options().limits),
        stream_(std::move(stream)),
        peer_(std::move(peer)),
        pace_(stream_.get_executor()) {}
  ~Session() override { listener_->Unregister(this); }

  void Run() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
      if constexpr (kTls) {
        self->Handshake();
      } else {
        self->ReadHead();
      }
    });
  }

  void Answer(Response response, std::shared_ptr<void> in_flight) override {
    net::post(stream_.get_executor(),
              [self = this->shared_from_this(), response = std::move(response),
               in_flight = std::move(in_flight)]() mutable {
                self->Write(std::move(response), std::move(in_flight), /*from_server=*/false);
              });
  }

  void Close() override {
    net::post(stream_.get_executor(), [self = this->shared_from_this()] { self->CloseNow(); });
  }

  Response ServerError(int code, const std::string& message) const override {
    const Listener::Options& options = listener_->options();
    return options.error_response(code, options.name + " failed: " + message);
  }

 private:
  beast::tcp_stream& Tcp() { return beast::get_lowest_layer(stream_); }

  void Handshake() {
    // A connection still in its handshake may be closed to make room, as one waiting for a head.
    waiting_since.store(NowNanos());
    Tcp().expires_after(limits_.handshake_timeout);
    if constexpr (kTls) {
      stream_.async_handshake(net::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code error) {
                                if (error) return self->CloseNow();
                                self->ReadHead();
                              });
    }
  }

  // ---- Reading a request ----

  void ReadHead() {
    if (closed_) return;
    reader_.emplace(limits_);
    waiting_since.store(NowNanos());
    Tcp().expires_after(limits_.head_timeout);
    bhttp::async_read_header(
        stream_, buffer_, reader_->parser(),
        [self = this->shared_from_this()](beast::error_code error, size_t head_bytes) {
          self->OnHead(error, head_bytes);
        });
  }

  void OnHead(beast::error_code error, size_t head_bytes) {
    waiting_since.store(std::numeric_limits<int64_t>::max());
    if (closed_) return;
    if (error) return RefuseOrClose(reader_->RefusalFor(error, /*in_body=*/false));
    request_ = reader_->Head(peer_);
    keep_alive_ = reader_->parser().get().keep_alive();
    if (listener_->stopping()) {
      return Refuse(codes::kServiceUnavailable, "is shutting down", /*prefix=*/false);
    }
    if (std::optional<Refusal> refusal = reader_->CheckHead(head_bytes)) {
      return RefuseOrClose(refusal);
    }
    reader_->LimitBody();
    const Listener::Admit& admit = listener_->options().admit;
    if (admit) {
      std::optional<Response> refused;
      try {
        refused = admit(request_);
      } catch (...) {
        return Refuse(codes::kInternalError, "failed: " + CurrentExceptionMessage(),
                      /*prefix=*/false);
      }
      if (refused.has_value()) return Write(std::move(*refused), nullptr, /*from_server=*/true);
    }
    if (reader_->parser().is_done()) return Dispatch();
    const size_t reserve = reader_->parser().chunked()
                               ? limits_.max_body_bytes
                               : static_cast<size_t>(*reader_->parser().content_length());
    body_reservation_ = listener_->ReserveBody(reserve);
    if (body_reservation_ == nullptr) {
      return Refuse(codes::kServiceUnavailable, "is busy reading other requests' bodies; try again",
                    /*prefix=*/false);
    }
    ContinueThenReadBody();
  }

  // A client that sent "Expect: 100-continue" waits for this before it sends the body.
  void ContinueThenReadBody() {
    const std::optional<std::string> expect = request_.headers.Get("Expect");
    if (!expect.has_value() || !beast::iequals(*expect, "100-continue")) return ReadBody();
    auto interim =
        std::make_shared<bhttp::response<bhttp::empty_body>>(bhttp::status::continue_, 11);
    Tcp().expires_after(limits_.write_timeout);
    bhttp::async_write(stream_, *interim,
                       [self = this->shared_from_this(), interim](beast::error_code error, size_t) {
                         if (error) return self->CloseNow();
                         self->ReadBody();
                       });
  }

  void ReadBody() {
    Tcp().expires_after(limits_.body_timeout);
    bhttp::async_read(stream_, buffer_, reader_->parser(),
                      [self = this->shared_from_this()](beast::error_code error, size_t) {
                        self->OnBody(error);
                      });
  }

  void OnBody(beast::error_code error) {
    if (closed_) return;
    if (error) return RefuseOrClose(reader_->RefusalFor(error, /*in_body=*/true));
    Dispatch();
  }

  // ---- Handling and answering ----

  void Dispatch() {
    request_.body = std::move(reader_->parser().get().body());
    std::shared_ptr<void> in_flight = listener_->Enter();
    if (in_flight == nullptr) {
      return Refuse(codes::kServiceUnavailable, "is shutting down", /*prefix=*/false);
    }
    // While the handler holds the request (a long poll), nothing is read and no deadline runs.
    Tcp().expires_never();
    Responder responder(
        std::make_shared<detail::ResponderState>(this->shared_from_this(), std::move(in_flight)));
    try {
      listener_->handler()(request_, responder);
    } catch (...) {
      // A bug in the handler: the client learns of it instead of waiting for its timeout.
      responder.Send(ServerError(codes::kInternalError, CurrentExceptionMessage()));
    }
    // The handler has taken what it keeps of the body.
    request_.body = std::string();
    body_reservation_.reset();
  }

  // The server's own answer, after which the connection closes: "<name>: <message>", or
  // "<name> <message>" without the prefix's colon.
  void Refuse(int code, const std::string& message, bool prefix = true) {
    const Listener::Options& options = listener_->options();
    Write(options.error_response(code, options.name + (prefix ? ": " : " ") + message), nullptr,
          /*from_server=*/true);
  }

  void RefuseOrClose(const std::optional<Refusal>& refusal) {
    if (!refusal.has_value()) return CloseNow();
    Refuse(refusal->code, refusal->message);
  }

  void Write(Response response, std::shared_ptr<void> in_flight, bool from_server) {
    if (closed_) return;
    auto out = std::make_shared<bhttp::response<bhttp::string_body>>(
        static_cast<bhttp::status>(response.status), 11);
    for (const auto& [name, value] : response.headers.fields()) out->insert(name, value);
    // These answers have no body (and Beast refuses to send one).
    if (out->result() != bhttp::status::no_content &&
        out->result() != bhttp::status::not_modified &&
        bhttp::to_status_class(out->result()) != bhttp::status_class::informational) {
      out->body() = std::move(response.body);
    }
    ++requests_;
    const bool keep = !from_server && keep_alive_ && !listener_->stopping() &&
                      requests_ < limits_.max_requests_per_connection;
    out->keep_alive(keep);
    out->prepare_payload();
    Tcp().expires_after(limits_.write_timeout);
    bhttp::async_write(stream_, *out,
                       [self = this->shared_from_this(), out, in_flight = std::move(in_flight),
                        keep](beast::error_code error, size_t) {
                         if (error) return self->CloseNow();
                         if (keep) return self->PaceThenReadHead();
                         self->CloseGracefully();
                       });
  }

  // Requests beyond the connection's rate wait before the next one is read (a generic cell
  // rate: a burst of one second's worth, then one per interval).
  void PaceThenReadHead() {
    const auto interval = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(1.0 / limits_.requests_per_second));
    const Clock::time_point now = Clock::now();
    next_allowed_ = std::max(next_allowed_, now) + interval;
    const auto burst = interval * static_cast<int64_t>(limits_.requests_per_second);
    const Clock::time_point read_at = next_allowed_ - burst;
    if (read_at <= now) return ReadHead();
    pace_.expires_at(read_at);
    pace_.async_wait([self = this->shared_from_this()](beast::error_code error) {
      if (error) return self->CloseNow();
      self->ReadHead();
    });
  }

  // ---- Closing ----

  // After the last answer: with TLS, this side's close_notify; then a half-close that still
  // reads (and drops) what the client sends for a moment (kLingerTime). With TLS the server does
  // not wait for the client's close_notify: a client still sending a body the server refused
  // makes OpenSSL fail that wait on the first record of it, and closing then, with that body
  // unread, resets the connection under the answer (the client may lose it: seen as a refused
  // 100 MB upload that got no answer at all). Marking the client's close_notify as received
  // makes the shutdown send ours and return, as a web server's lingering close does.
  void CloseGracefully() {
    if (closed_) return;
    closing_ = true;
    if constexpr (kTls) {
      SSL_set_shutdown(stream_.native_handle(), SSL_RECEIVED_SHUTDOWN);
      Tcp().expires_after(kLingerTime);
      stream_.async_shutdown(
          [self = this->shared_from_this()](beast::error_code) { self->HalfCloseAndLinger(); });
    } else {
      HalfCloseAndLinger();
    }
  }

  void HalfCloseAndLinger() {
    if (closed_) return;
    beast::error_code ignored;
    Tcp().socket().shutdown(tcp::socket::shutdown_send, ignored);
    Tcp().expires_after(kLingerTime);
    Linger();
  }

  void Linger() {
    if (closed_) return;
    scratch_.resize(16 << 10);
    Tcp().async_read_some(net::buffer(scratch_),
                          [self = this->shared_from_this()](beast::error_code error, size_t n) {
                            self->lingered_ += n;
                            if (error || self->lingered_ > kLingerBytes) return self->CloseNow();
                            self->Linger();
                          });
  }

  void CloseNow() {
    if (closed_) return;
    closed_ = true;
    waiting_since.store(std::numeric_limits<int64_t>::max());
    pace_.cancel();
    Tcp().close();
  }

  const std::shared_ptr<detail::ListenerCore> listener_;
  const Listener::Limits limits_;
  Stream stream_;
  const std::string peer_;
  net::steady_timer pace_;
  beast::flat_buffer buffer_;
  std::optional<RequestReader> reader_;
  Request request_;
  std::shared_ptr<void> body_reservation_;  // while this request's body is held
  bool keep_alive_ = false;
  int requests_ = 0;
  Clock::time_point next_allowed_;
  bool closing_ = false;
  bool closed_ = false;
  std::vector<char> scratch_;
  size_t lingered_ = 0;
};

}  // namespace

// ---- The listener ----

std::shared_ptr<void> detail::ListenerCore::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load()) return nullptr;
  ++in_flight_;
  // The deleter runs once, when the last holder lets go; it keeps this state alive until then.
  // The pointer is never used, only tested: a token made of nullptr would compare equal to it.
  return std::shared_ptr<void>(static_cast<void*>(this),
                               [self = shared_from_this()](void*) { self->Leave(); });
}

std::shared_ptr<void> detail::ListenerCore::ReserveBody(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > options_.limits.max_buffered_body_bytes - buffered_body_bytes_) return nullptr;
  buffered_body_bytes_ += bytes;
  return std::shared_ptr<void>(static_cast<void*>(this), [self = shared_from_this(), bytes](void*) {
    std::lock_guard<std::mutex> released(self->mu_);
    self->buffered_body_bytes_ -= bytes;
  });
}

void detail::ListenerCore::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--in_flight_ == 0) idle_.notify_all();
}

void detail::ListenerCore::Register(const std::shared_ptr<Connection>& connection) {
  std::lock_guard<std::mutex> lock(mu_);
  connections_.emplace(connection.get(), connection);
}

void detail::ListenerCore::Unregister(const Connection* connection) {
  std::lock_guard<std::mutex> lock(mu_);
  connections_.erase(connection);
}

int detail::ListenerCore::open_connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(connections_.size());
}

bool detail::ListenerCore::MakeRoom() {
  std::shared_ptr<Connection> oldest;
  int64_t since = std::numeric_limits<int64_t>::max();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, weak] : connections_) {
      if (key->waiting_since.load() < since) {
        if (std::shared_ptr<Connection> connection = weak.lock()) {
          since = key->waiting_since.load();
          oldest = std::move(connection);
        }
      }
    }
  }
  if (oldest == nullptr) return false;
  oldest->Close();
  return true;
}

Status detail::ListenerCore::Open(int port) {
  const std::string address =
      std::string(scheme()) + "://" + HostForUri(host_) + ":" + std::to_string(port) + "/";
  io_ = std::make_unique<net::io_context>(std::max(1, options_.threads));
  beast::error_code error;
  tcp::resolver resolver(*io_);
  const auto endpoints = resolver.resolve(
      host_, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, error);
  if (error) return InvalidArgument("cannot resolve host '" + host_ + "': " + error.message());
  acceptor_ = std::make_unique<tcp::acceptor>(net::make_strand(*io_));
  for (const auto& entry : endpoints) {
    const tcp::endpoint endpoint = entry.endpoint();
    acceptor_->close(error);
    acceptor_->open(endpoint.protocol(), error);
    if (!error) acceptor_->set_option(net::socket_base::reuse_address(true), error);
    if (!error) acceptor_->bind(endpoint, error);
    if (!error) acceptor_->listen(net::socket_base::max_listen_connections, error);
    if (!error) break;
  }
  if (error || endpoints.empty()) {
    return Unavailable("cannot listen on " + address + ": " +
                       (error ? error.message() : std::string("no address")));
  }
  port_ = acceptor_->local_endpoint().port();
  accept_backoff_ = std::make_unique<net::steady_timer>(acceptor_->get_executor());
  if (options_.tls != nullptr) {
    ssl_ = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
    // The credentials choose the certificate at each handshake, so a renewed one is served
    // without reopening the port.
    options_.tls->Configure(ssl_->native_handle());
  }
  work_.emplace(net::make_work_guard(*io_));
  Accept();
  for (int i = 0; i < std::max(1, options_.threads); ++i) {
    threads_.emplace_back([this] {
      for (;;) {
        try {
          io_->run();
          return;
        } catch (...) {
          std::fprintf(stderr, "%s: error on a connection: %s\n", options_.name.c_str(),
                       CurrentExceptionMessage().c_str());
        }
      }
    });
  }
  return Status::Ok();
}

void detail::ListenerCore::Accept() {
  acceptor_->async_accept(net::make_strand(*io_),
                          [self = shared_from_this()](beast::error_code error, tcp::socket socket) {
                            self->OnAccept(error, std::move(socket));
                          });
}

void detail::ListenerCore::OnAccept(beast::error_code error, tcp::socket socket) {
  if (!acceptor_->is_open()) return;
  if (error) {
    // Out of file descriptors, or a connection reset before it was accepted: try again soon.
    accept_backoff_->expires_after(kAcceptBackoff);
    accept_backoff_->async_wait([self = shared_from_this()](beast::error_code waited) {
      if (!waited) self->Accept();
    });
    return;
  }
  if (open_connections() >= options_.limits.max_connections && !MakeRoom()) {
    beast::error_code ignored;
    socket.close(ignored);
    return Accept();
  }
  std::string peer = PeerOf(socket);
  if (ssl_ != nullptr) {
    using TlsStream = beast::ssl_stream<beast::tcp_stream>;
    auto session = std::make_shared<Session<TlsStream>>(
        shared_from_this(), TlsStream(beast::tcp_stream(std::move(socket)), *ssl_),
        std::move(peer));
    Register(session);
    session->Run();
  } else {
    auto session = std::make_shared<Session<beast::tcp_stream>>(
        shared_from_this(), beast::tcp_stream(std::move(socket)), std::move(peer));
    Register(session);
    session->Run();
  }
  Accept();
}

void detail::ListenerCore::CloseEverything() {
  // On the acceptor's strand, so that a connection accepted a moment before is in the list.
  net::post(acceptor_->get_executor(), [self = shared_from_this()] {
    beast::error_code ignored;
    self->acceptor_->close(ignored);
    self->accept_backoff_->cancel();
    std::vector<std::shared_ptr<Connection>> open;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      for (const auto& [key, weak] : self->connections_) {
        if (std::shared_ptr<Connection> connection = weak.lock()) open.push_back(connection);
      }
    }
    for (const auto& connection : open) connection->Close();
  });
}

void detail::ListenerCore::Stop(const std::function<void()>& before_close) {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (stopped_ || io_ == nullptr) return;
  stopping_.store(true);
  if (before_close) before_close();
  // Requests being handled get a moment to be answered and their answers written; bounded,
  // because a handler may hold a Responder for a long time.
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait_for(lock, kStopDrain, [this] { return in_flight_ == 0; });
  }
  CloseEverything();
  {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return in_flight_ == 0; });
  }
  // With the acceptor and every connection closed, the threads run out of work and return.
  work_.reset();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
  // What is still queued holds connections, and they hold this object: dropping the context
  // ends that cycle.
  acceptor_.reset();
  accept_backoff_.reset();
  io_.reset();
  stopped_ = true;
}

Result<std::unique_ptr<Listener>> Listener::Start(const std::string& host, int port,
                                                  Options options, Handler handler) {
  if (!options.error_response) options.error_response = Response::Text;
  if (host.empty()) return InvalidArgument(options.name + ": host is empty");
  if (port < 0 || port > 65535) {
    return InvalidArgument(options.name + ": port " + std::to_string(port) + " is not in 0..65535");
  }
  if (options.limits.requests_per_second <= 0 || options.limits.max_connections <= 0 ||
      options.limits.max_requests_per_connection <= 0) {
    return InvalidArgument(options.name + ": limits must be positive");
  }
  const std::string name = options.name;
  auto impl = std::make_shared<detail::ListenerCore>(host, std::move(options), std::move(handler));
  VF_RETURN_IF_ERROR(impl->Open(port).WithContext(name));
  return std::unique_ptr<Listener>(new Listener(std::move(impl)));
}

Listener::Listener(std::shared_ptr<detail::ListenerCore> core) : impl_(std::move(core)) {}

Listener::~Listener() { Stop(); }

int Listener::port() const { return impl_->port(); }

const std::string& Listener::host() const { return impl_->host(); }

std::string Listener::url() const {
  return std::string(impl_->scheme()) + "://" + HostForUri(impl_->host()) + ":" +
         std::to_string(impl_->port());
}

int Listener::open_connections() const { return impl_->open_connections(); }

void Listener::Stop(const std::function<void()>& before_close) { impl_->Stop(before_close); }

}  // namespace vf::http
