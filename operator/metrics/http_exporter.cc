#include "operator/metrics/http_exporter.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include <cpprest/http_listener.h>

#include "operator/net/listen.h"

#include "runtime/metrics/text_format.h"

namespace vf {
namespace {

using web::http::http_request;
using web::http::http_response;
using web::http::status_code;
using web::http::status_codes;

constexpr char kPlainText[] = "text/plain; charset=utf-8";

std::string CurrentExceptionMessage() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

std::string OneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

// Never through cpprest's std::string body overload: it hands cpprest a stream of char that it
// then reads as unsigned char, which UBSan reports (see operator/coordinator/server.cc).
void Send(const http_request& request, status_code code, const std::string& body,
          std::string_view content_type) {
  http_response response(code);
  response.headers().set_content_type(std::string(content_type));
  response.set_body(std::vector<unsigned char>(body.begin(), body.end()));
  if (code == status_codes::MethodNotAllowed) response.headers().add(U("Allow"), U("GET"));
  try {
    // A scraper that went away makes the send fail; the failure is observed here, because an
    // unobserved failed task terminates the process.
    request.reply(response).then([](pplx::task<void> sent) {
      try {
        sent.get();
      } catch (...) {
      }
    });
  } catch (...) {
    // The listener closed the connection already: nothing left to do.
  }
}

}  // namespace

// The server's state, shared with the listener's handler so that a request arriving while the
// server goes away finds out safely. Thread-safe.
class MetricsServer::Impl : public std::enable_shared_from_this<MetricsServer::Impl> {
 public:
  Impl(const metrics::Registry& registry, std::string host, int port, ReadinessCheck readiness)
      : registry_(registry),
        host_(std::move(host)),
        port_(port),
        readiness_(std::move(readiness)) {}

  int port() const { return port_; }
  const std::string& host() const { return host_; }

  Status Open();
  void Stop();

 private:
  // Counts a running handler, so that Stop can wait until none touches the registry.
  class InFlight {
   public:
    explicit InFlight(Impl& impl) : impl_(impl) {}
    ~InFlight() {
      std::lock_guard<std::mutex> lock(impl_.mu_);
      if (--impl_.in_flight_ == 0) impl_.idle_.notify_all();
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    Impl& impl_;
  };

  bool Enter();
  void Handle(const http_request& request);

  const metrics::Registry& registry_;
  const std::string host_;
  const int port_;
  const ReadinessCheck readiness_;
  // Set by Open; closed and dropped by Stop (under stop_mu_).
  std::unique_ptr<web::http::experimental::listener::http_listener> listener_;

  std::mutex stop_mu_;    // serialises Stop calls
  bool stopped_ = false;  // guarded by stop_mu_
  std::mutex mu_;         // guards everything below
  std::condition_variable idle_;
  bool stopping_ = false;
  int64_t in_flight_ = 0;
};

bool MetricsServer::Impl::Enter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  ++in_flight_;
  return true;
}

Status MetricsServer::Impl::Open() {
  const std::string address =
      "http://" + net::HostForUri(host_) + ":" + std::to_string(port_) + "/";
  try {
    listener_ = std::make_unique<web::http::experimental::listener::http_listener>(address);
    // Weak: the listener belongs to this object, and a strong reference from its handler would
    // keep both alive for good.
    std::weak_ptr<Impl> weak = shared_from_this();
    listener_->support([weak](http_request request) {
      if (std::shared_ptr<Impl> self = weak.lock()) {
        self->Handle(request);
      } else {
        Send(request, status_codes::ServiceUnavailable, "shutting down\n", kPlainText);
      }
    });
    listener_->open().wait();
  } catch (...) {
    listener_.reset();
    return Unavailable("cannot listen on " + address + ": " + CurrentExceptionMessage());
  }
  return Status::Ok();
}

void MetricsServer::Impl::Handle(const http_request& request) {
  if (!Enter()) {
    Send(request, status_codes::ServiceUnavailable, "shutting down\n", kPlainText);
    return;
  }
  InFlight guard(*this);
  try {
    const std::string path = request.request_uri().path();
    if (path != "/metrics" && path != "/healthz" && path != "/readyz") {
      return Send(request, status_codes::NotFound,
                  "no such path: " + OneLine(path) + " (try /metrics, /healthz or /readyz)\n",
                  kPlainText);
    }
    if (request.method() != web::http::methods::GET) {
      return Send(request, status_codes::MethodNotAllowed,
                  "method " + OneLine(request.method()) + " is not allowed here; use GET\n",
                  kPlainText);
    }
    if (path == "/metrics") {
      return Send(request, status_codes::OK, registry_.Serialize(), metrics::kTextContentType);
    }
    if (path == "/healthz") return Send(request, status_codes::OK, "ok\n", kPlainText);
    const Status ready = readiness_ ? readiness_() : Status::Ok();
    if (ready.ok()) return Send(request, status_codes::OK, "ok\n", kPlainText);
    Send(request, status_codes::ServiceUnavailable, "not ready: " + OneLine(ready.message()) + "\n",
         kPlainText);
  } catch (...) {
    Send(request, status_codes::InternalError,
         "metrics server failed: " + OneLine(CurrentExceptionMessage()) + "\n", kPlainText);
  }
}

void MetricsServer::Impl::Stop() {
  std::lock_guard<std::mutex> stop_lock(stop_mu_);
  if (stopped_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
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

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const metrics::Registry& registry,
                                                            const std::string& host, int port,
                                                            ReadinessCheck readiness) {
  if (host.empty()) return InvalidArgument("metrics host is empty");
  if (port < 0 || port > 65535) {
    return InvalidArgument("metrics port " + std::to_string(port) + " is not in 0..65535");
  }
  std::shared_ptr<Impl> impl;
  VF_RETURN_IF_ERROR(net::OpenOnPort(host, port, [&](int chosen) {
                       impl = std::make_shared<Impl>(registry, host, chosen, readiness);
                       return impl->Open();
                     }).WithContext("metrics server"));
  return std::unique_ptr<MetricsServer>(new MetricsServer(impl));
}

MetricsServer::MetricsServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() { Stop(); }

int MetricsServer::port() const { return impl_->port(); }

std::string MetricsServer::url() const {
  return "http://" + net::HostForUri(impl_->host()) + ":" + std::to_string(impl_->port());
}

void MetricsServer::Stop() { impl_->Stop(); }

}  // namespace vf
