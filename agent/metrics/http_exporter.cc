#include "agent/metrics/http_exporter.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <utility>

#include "agent/http/listener.h"

namespace vf {
namespace {

using web::http::http_request;
using web::http::http_response;
using web::http::status_codes;

// The Content-Type of the text exposition format that prometheus::TextSerializer writes.
constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

void Handle(const prometheus::Registry& registry, const MetricsServer::ReadinessCheck& readiness,
            const http_request& request) {
  const std::string path = request.request_uri().path();
  if (path != "/metrics" && path != "/healthz" && path != "/readyz") {
    http::Send(request, http::TextResponse(
                            status_codes::NotFound,
                            "no such path: " + path + " (try /metrics, /healthz or /readyz)"));
    return;
  }
  if (request.method() != web::http::methods::GET) {
    http_response response =
        http::TextResponse(status_codes::MethodNotAllowed,
                           "method " + request.method() + " is not allowed here; use GET");
    response.headers().add("Allow", "GET");
    http::Send(request, response);
    return;
  }
  if (path == "/metrics") {
    // Served here rather than by prometheus-cpp's pull Exposer: the Exposer answers /metrics
    // only, and the Helm chart's probes need /healthz and /readyz on the same port, which would
    // take a second HTTP server just for them.
    http_response response(status_codes::OK);
    http::SetBody(response, prometheus::TextSerializer().Serialize(registry.Collect()),
                  kExpositionContentType);
    http::Send(request, response);
    return;
  }
  const Status ready = path == "/readyz" && readiness ? readiness() : Status::Ok();
  if (ready.ok()) {
    http::Send(request, http::TextResponse(status_codes::OK, "ok"));
  } else {
    http::Send(request, http::TextResponse(status_codes::ServiceUnavailable,
                                           "not ready: " + ready.message()));
  }
}

}  // namespace

MetricsServer::MetricsServer(const prometheus::Registry& registry, ReadinessCheck readiness)
    : registry_(registry), readiness_(std::move(readiness)) {}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const prometheus::Registry& registry,
                                                            const std::string& host, int port,
                                                            ReadinessCheck readiness) {
  std::unique_ptr<MetricsServer> server(new MetricsServer(registry, std::move(readiness)));
  http::Listener::Options options;
  options.name = "metrics server";
  // It serves GET only: a body is never read, so none is let in.
  options.max_body_bytes = 0;
  const MetricsServer* self = server.get();
  VF_ASSIGN_OR_RETURN(
      server->listener_,
      http::Listener::Start(host, port, std::move(options),
                            [self](const http_request& request, const http::InFlight&) {
                              Handle(self->registry_, self->readiness_, request);
                            }));
  return server;
}

MetricsServer::~MetricsServer() { Stop(); }

int MetricsServer::port() const { return listener_->port(); }

std::string MetricsServer::url() const { return listener_->url(); }

void MetricsServer::Stop() {
  if (listener_ != nullptr) listener_->Stop();
}

}  // namespace vf
