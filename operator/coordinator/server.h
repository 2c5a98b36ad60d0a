// The coordinator's HTTP API, which the agent in every pod talks to. All paths are under
// /v1/jobs/{namespace}/{name}/ and every request names its worker and carries that worker's
// credential (Coordinator::CheckCredential): "X-VirtualFlow-Worker: <worker>" and
// "Authorization: Bearer <credential>". A body's "worker" must be that worker.
//
//   POST register        {"worker", "fingerprint", "build", "ready"}          -> 200 {"ok": true}
//   GET  plan?after=N&timeout_ms=T   -> 200 plan once its epoch > N, or 204 after T ms
//                                       (default 30000, at most 60000; N defaults to 0)
//   PUT  store/{key}     raw bytes                                            -> 204
//   GET  store/{key}?timeout_ms=T    -> 200 raw bytes, or 408 after T ms (default 30000, at
//                                       most 120000)
//   POST report          {"worker", "epoch", "step", "loss", "samplesPerSecond",
//                         "secondsPerVirtualNode", "pauseSeconds" (optional), "hasState"} -> 204
//   POST leave           {"worker"}                                           -> 204
//   POST ack             {"worker", "epoch"}                                  -> 204
//   POST failure         {"worker", "epoch", "step", "message"}               -> 204
//
//   GET  /healthz (no credential)     -> 200 "ok": the server reads and answers requests
//
// Requests are read by the project's HTTP server (agent/http/listener.h), under its limits:
// a request whose head has no valid credential is answered from the head alone, before any of
// its body is read.
//
// Every 2xx answer carries "X-VirtualFlow-Coordinator: <incarnation>" (Coordinator::incarnation),
// so that a worker can tell a restarted coordinator, whose store is empty, from the one it wrote
// its rendezvous keys to.
//
// A plan is {"epoch", "storePrefix", "members": [{"worker", "rank", "virtualNodes"}]}. Errors
// are {"error": "<one line>"}: 400 malformed body or query, 401 missing or wrong credential or
// worker header (and an unknown job, with the same words), 403 a body naming another worker, a
// job-level report (finished, final weights) from anyone but rank 0, or a rendezvous key of the
// current epoch from a worker outside its plan, 404 unknown worker or path,
// 405 wrong method, 408 store wait timed out, 409 the request does not fit the job's state (spec
// or build mismatch, an epoch in the past or the future, a limit on workers, keys or bytes
// reached), 413 body over 1 MiB, 431 header fields over 16 KiB, 503 shutting down (or, for a
// registration, the coordinator full for now: the agent retries), 500 a bug.
#pragma once

#include <memory>
#include <string>

#include "agent/http/tls.h"
#include "operator/coordinator/coordinator.h"
#include "runtime/status.h"

namespace vf {

// Serves one Coordinator over HTTP. Long polls hold no thread while they wait: the reply is
// sent from the coordinator's callback or from a timer. Thread-safe.
class CoordinatorServer {
 public:
  static constexpr size_t kMaxBodyBytes = 1u << 20;

  // Listens on host:port; port 0 picks a free port. `coordinator` must outlive the server.
  // With `tls`, serves HTTPS only (a plain HTTP request fails the handshake and reaches no
  // handler); the credentials may be replaced while it serves (a renewed certificate).
  static Result<std::unique_ptr<CoordinatorServer>> Start(
      Coordinator& coordinator, const std::string& host, int port,
      std::shared_ptr<http::ServerCredentials> tls = nullptr);
  ~CoordinatorServer();
  CoordinatorServer(const CoordinatorServer&) = delete;
  CoordinatorServer& operator=(const CoordinatorServer&) = delete;

  int port() const;
  // "http://host:port" ("https://" with TLS), with the host as given to Start.
  std::string url() const;

  // Answers pending long polls with 503, closes every connection and returns once no request
  // handler is running any more, so the coordinator may be destroyed afterwards. Idempotent.
  void Stop();

 private:
  class Impl;
  explicit CoordinatorServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace vf
