// Serves a prometheus-cpp Registry over HTTP for Prometheus, with the liveness and readiness
// probes Kubernetes asks for:
//
//   GET /metrics  -> 200, the registry in the text exposition format 0.0.4
//                    (Content-Type: text/plain; version=0.0.4; charset=utf-8)
//   GET /healthz  -> 200 "ok" while the process is alive (and its HTTP threads answer)
//   GET /readyz   -> 200 "ok", or 503 with the one-line reason the readiness check gives
//   another path  -> 404; another method on these paths -> 405 with "Allow: GET"
//
// Query strings are ignored.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "runtime/status.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace vf {
namespace http {
class Listener;
}  // namespace http

// Serves one Registry and the probes on host:port, on the project's listener shell
// (agent/http/listener.h). Thread-safe.
class MetricsServer {
 public:
  // OK when the process should receive work; otherwise the reason, sent with the 503. Called on
  // cpprest's threads, for each GET /readyz: it must be quick and thread-safe.
  using ReadinessCheck = std::function<Status()>;

  // Listens on host:port; port 0 picks a free port (see port()). `registry` must outlive the
  // server. Without `readiness`, /readyz always answers 200.
  static Result<std::unique_ptr<MetricsServer>> Start(const prometheus::Registry& registry,
                                                      const std::string& host, int port,
                                                      ReadinessCheck readiness = nullptr);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port it listens on: the one given to Start, or the one picked for port 0.
  int port() const;
  // "http://host:port", with the host as given to Start.
  std::string url() const;

  // Closes the listener and returns once no request handler runs any more, so the registry and
  // whatever the readiness check uses may be destroyed afterwards. Idempotent.
  void Stop();

 private:
  MetricsServer(const prometheus::Registry& registry, ReadinessCheck readiness);

  const prometheus::Registry& registry_;
  const ReadinessCheck readiness_;
  // Set by Start; its handler holds a plain pointer to this server, which the listener's Stop
  // (called by ours, and by the destructor) makes safe.
  std::unique_ptr<http::Listener> listener_;
};

}  // namespace vf
