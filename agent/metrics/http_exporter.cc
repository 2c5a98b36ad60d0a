#include "agent/metrics/http_exporter.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <utility>

#include "agent/http/listener.h"

namespace vf {
namespace {

using http::Request;
using http::Responder;
using http::Response;
namespace codes = http::codes;

// The Content-Type of the text exposition format that prometheus::TextSerializer writes.
constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

void Handle(const prometheus::Registry& registry, const MetricsServer::ReadinessCheck& readiness,
            const Request& request, const Responder& responder) {
  const std::string& path = request.path;
  if (path != "/metrics" && path != "/healthz" && path != "/readyz") {
    return responder.Send(Response::Text(
        codes::kNotFound, "no such path: " + path + " (try /metrics, /healthz or /readyz)"));
  }
  if (request.method != "GET") {
    Response response = Response::Text(
        codes::kMethodNotAllowed, "method " + request.method + " is not allowed here; use GET");
    response.headers.Set("Allow", "GET");
    return responder.Send(std::move(response));
  }
  if (path == "/metrics") {
    // Served here rather than by prometheus-cpp's pull Exposer: the Exposer answers /metrics
    // only, and the Helm chart's probes need /healthz and /readyz on the same port, which would
    // take a second HTTP server just for them.
    return responder.Send(Response::With(codes::kOk,
                                         prometheus::TextSerializer().Serialize(registry.Collect()),
                                         kExpositionContentType));
  }
  const Status ready = path == "/readyz" && readiness ? readiness() : Status::Ok();
  if (ready.ok()) return responder.Send(Response::Text(codes::kOk, "ok"));
  responder.Send(Response::Text(codes::kServiceUnavailable, "not ready: " + ready.message()));
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
  options.limits.max_body_bytes = 0;
  const MetricsServer* self = server.get();
  VF_ASSIGN_OR_RETURN(
      server->listener_,
      http::Listener::Start(host, port, std::move(options),
                            [self](const Request& request, const Responder& responder) {
                              Handle(self->registry_, self->readiness_, request, responder);
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
