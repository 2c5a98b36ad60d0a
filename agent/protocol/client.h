// The agent's side of the coordinator's HTTP API (operator/coordinator/server.h), and a rendezvous
// Store on top of it so that the ranks of an epoch can build their communicator through the
// coordinator:
//
//   CoordinatorStore store(client);
//   PrefixStore epoch_store(plan.store_prefix, store);
//   CreateGlooCommunicator(epoch_store, rank, size, options);
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "agent/protocol/messages.h"
#include "runtime/comm/store.h"
#include "runtime/status.h"

namespace vf {

// Talks to the coordinator on behalf of one worker of one job. Errors come back as Status, never
// as exceptions: 400/413 kInvalidArgument, 401 kUnauthenticated ("coordinator refused the
// credential (401)"), 403 kPermissionDenied, 404 kNotFound, 408 kDeadlineExceeded, 409
// kFailedPrecondition with the server's message, 503 and connection failures kUnavailable; the HTTP
// code is in the message. Connection failures and 503s are retried with exponential backoff until
// the call's deadline, but for a full coordinator's (IsCoordinatorFull). Thread-safe (immutable but
// for the incarnation last seen and the kept connections, each under a mutex). Calls block
// the calling thread, so they must not be made from cpprest's own thread pool (an http_listener
// handler or a task continuation): that pool also completes the calls.
class CoordinatorClient {
 public:
  // `base_url` is like "http://coordinator:8080", or "https://..." for a coordinator that serves
  // TLS; `job` is "namespace/name"; `token` is the worker's own credential (the file the
  // operator or `vf run` mounts for it). Each call that is not a long poll must finish within
  // `request_timeout`, retries included. `ca_file` (PEM) is the only CA an https coordinator's
  // certificate may chain to (the operator's, which it mounts into every worker); empty: the
  // system's CAs. The certificate must name the URL's host. A CA file that cannot be read
  // (kUnavailable: a replacement pod may find it), or holds no certificate, or a certificate
  // that does not verify, fails every call with a message that says so.
  CoordinatorClient(std::string base_url, std::string job, std::string token, std::string worker,
                    std::chrono::milliseconds request_timeout = std::chrono::seconds(10),
                    std::string ca_file = "");

  const std::string& job() const { return job_; }
  const std::string& worker() const { return worker_; }
  // The incarnation (kIncarnationHeader) of the coordinator that last answered a call with
  // success; empty until one did, or when the coordinator names none (an older one).
  std::string incarnation() const;

  // Registers the worker, or updates its readiness, as a worker of coordinator protocol
  // `protocol` (another than kProtocolVersion only in tests: kTestAgentProtocolEnv).
  Status Register(const std::string& fingerprint, const std::string& build, bool ready,
                  int64_t protocol = kProtocolVersion);
  // The first plan with an epoch greater than `after`, waiting up to `timeout` for it. Past the
  // timeout the result is an empty Plan (epoch 0), i.e. "no newer plan"; waits longer than the
  // server's cap are made of several polls.
  Result<Plan> WaitForPlan(int64_t after, std::chrono::milliseconds timeout);
  // Ends a WaitForPlan in progress on another thread at once (its connection closed), and makes
  // every later one fail at once, both kUnavailable saying so: for the owner of a plan watcher
  // that stops, which would otherwise wait out the poll (a leaving worker's exit took a second
  // longer). The client's other calls are not affected.
  void CancelWaits();
  // Non-finite numbers are sent as null and read back as NaN.
  Status Report(const vf::Report& report);
  Status Leave();
  Status Ack(int64_t epoch);
  Status ReportFailure(int64_t epoch, int64_t step, const std::string& message);

  // `incarnation`, when given, receives that of the coordinator that took the key.
  Status SetKey(const std::string& key, std::string_view value, std::string* incarnation = nullptr);
  // Waits up to `timeout` for `key` (kDeadlineExceeded naming it after that).
  Result<std::string> GetKey(const std::string& key, std::chrono::milliseconds timeout);

 private:
  struct Response {
    int status = 0;
    std::string body;
    std::string incarnation;  // kIncarnationHeader of a successful answer
  };
  // Sends one request, retrying connection failures until `deadline`; each attempt may take
  // the time left until `deadline` plus `slack` (what a long poll's answer needs on top).
  // A cancellable call (`cancellable`) ends when CancelWaits is called.
  Result<Response> Call(const std::string& method, const std::string& path, const std::string* body,
                        const std::string& content_type,
                        std::chrono::steady_clock::time_point deadline,
                        std::chrono::milliseconds slack, bool cancellable = false) const;
  // A plain request: one JSON body, 2xx or an error, within the request timeout.
  Status Post(const std::string& action, const std::string& json_body) const;
  std::string Path(const std::string& action) const;

  std::string base_url_;
  std::string job_;
  std::string token_;
  std::string worker_;
  std::chrono::milliseconds request_timeout_;
  std::string ca_file_;
  std::string ca_pem_;               // the CA file's contents, read once
  Status ca_status_;                 // why the CA file could not be read, if it could not
  mutable std::mutex mu_;            // guards incarnation_
  mutable std::string incarnation_;  // of the last successful answer that named one
  // cpprest's cancellation source for WaitForPlan, kept out of this header. Thread-safe.
  struct WaitCancellation;
  std::shared_ptr<WaitCancellation> wait_cancellation_;
  // cpprest clients kept from call to call, with their open connections (client.cc).
  struct Connections;
  std::shared_ptr<Connections> connections_;
};

// Whether `s` (from a CoordinatorClient call, or passed on from one) is the coordinator's refusal
// of this worker because it runs another build than the job's workers (kAnotherBuildRefusal):
// the worker exits kExitAnotherBuild, which fails neither the job nor the worker.
bool IsAnotherBuildRefusal(const Status& s);

// Whether `s` (from CoordinatorClient::Register, or passed on from one) is the coordinator's
// answer that it has no room for this worker yet (kCoordinatorFull, HTTP 503): the worker waits
// and registers again for as long as it lasts. The client answers it at once, not retrying it as
// it retries other 503s.
bool IsCoordinatorFull(const Status& s);

// A vf::Store kept by the coordinator: Set is a PUT, Get a long poll (re-issued while the
// timeout is longer than the server holds one), Wait a Get of each key.
//
// The coordinator keeps the store in memory, so an operator restarted while a plan's members
// rendezvous loses the keys they wrote, and the peers waiting for them would wait out their
// timeout. So this store keeps the keys it set and holds them true, level-triggered: a key is
// written again whenever the coordinator that answers now is another incarnation than the one
// that took it (CoordinatorClient::incarnation), or was never taken because the coordinator was
// away or did not know the job yet (a Set that meets that succeeds, and the key is written once
// the coordinator takes it). Reassert does it; Get calls it before every poll, and the agent's
// plan watcher after every plan poll, so that it also happens while this worker is busy
// connecting to a peer. A Get waits on through a coordinator that is away or does not know the
// job or the worker yet (401, 404), until its timeout. ForgetKeys ends a rendezvous. Thread-safe;
// the client must outlive it.
class CoordinatorStore : public Store {
 public:
  explicit CoordinatorStore(CoordinatorClient& client) : client_(client) {}
  Status Set(const std::string& key, std::string_view value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

  // Writes again each key set here that the coordinator answering now may not hold; a write
  // that fails is tried again at the next call.
  void Reassert();
  // Stops holding the keys set so far: the rendezvous they were for is over.
  void ForgetKeys();

 private:
  struct OwnKey {
    std::string value;
    std::string incarnation;  // of the coordinator that took it; empty: not taken yet
  };

  CoordinatorClient& client_;
  std::mutex reassert_mu_;  // one Reassert at a time
  std::mutex mu_;           // guards own_
  std::map<std::string, OwnKey> own_;
};

}  // namespace vf
