// A Kubernetes API client for the operator: JSON objects in and out (nlohmann::json), errors as
// values with the API server's reason and message (errors.h), one rate limiter for all calls.
//
//   VF_ASSIGN_OR_RETURN(Config config, LoadKubeconfig(path));
//   VF_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Create(config));
//   ApiResult<json> pod = client->Get(kPods, "team", "worker-0");
//   if (pod.reason() == Reason::kNotFound) ...
//
// Informers are built on List + Watch (see reflector.h for the list-then-watch loop).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/kube/config.h"
#include "operator/kube/errors.h"
#include "operator/kube/rate_limiter.h"
#include "operator/kube/resource.h"
#include "operator/kube/watch.h"
#include "runtime/status.h"

namespace vf::kube {

// How a Client behaves; value type.
struct ClientOptions {
  // The token bucket every call passes through (watches too, when they connect).
  double qps = 20;
  int burst = 30;
  // When set, used instead of qps/burst, so that several clients share one budget.
  std::shared_ptr<RateLimiter> rate_limiter;
  // How long a call may take, waiting for the rate limiter and retries included, unless the
  // call's own options say otherwise. For a watch, how long connecting may take.
  std::chrono::milliseconds timeout{30000};
  // Answers of 429 Too Many Requests are retried after the server's Retry-After (1 s if it gives
  // none) this many times, within the call's timeout.
  int max_throttle_retries = 5;
  std::string user_agent = "virtualflow-operator";
};

// Options every single-request call takes; value type.
struct CallOptions {
  // 0: the client's timeout.
  std::chrono::milliseconds timeout{0};
};

// What to list and how; value type.
struct ListOptions {
  std::string label_selector;  // "app=worker,tier!=cache"
  std::string field_selector;  // "spec.nodeName=gpu-1"
  // Items per request; the list is fetched in pages of this size and returned whole. 0: one
  // request.
  int64_t page_size = 500;
  // "" reads the latest state (a quorum read); "0" accepts the API server's cache, which may be
  // a little stale.
  std::string resource_version;
  std::chrono::milliseconds timeout{0};  // for the whole list, all pages; 0: the client's
};

// A full list: the items and the resourceVersion to start a watch from. Value type.
struct ObjectList {
  std::vector<nlohmann::json> items;
  std::string resource_version;
};

// What to watch, from where, and for how long; value type.
struct WatchOptions {
  // Events after this version. "" starts with synthetic ADDED events for every existing
  // object; a version from a list or an earlier event resumes without them.
  std::string resource_version;
  bool allow_bookmarks = true;
  std::string label_selector;
  std::string field_selector;
  // The server ends the stream after this long (Watch then returns OK); 0 leaves it to the
  // server (between 30 and 60 minutes).
  int64_t timeout_seconds = 300;
  // The stream is deemed dead after this long without a byte; 0: timeout_seconds plus a minute
  // (or an hour and a minute without a timeout_seconds). Keep it above the bookmark interval.
  std::chrono::milliseconds idle_timeout{0};
  // How long establishing the stream may take; 0: the client's timeout.
  std::chrono::milliseconds connect_timeout{0};
};

// Called for each event of a watch, on the thread that called Watch.
using WatchHandler = std::function<void(WatchEvent event)>;

// How to delete; value type.
struct DeleteOptions {
  // "Background", "Foreground" or "Orphan"; "" leaves the server's default for the resource.
  std::string propagation_policy;
  // Delete only that incarnation of the object / only that version of it (Conflict otherwise).
  std::string precondition_uid;
  std::string precondition_resource_version;
  std::optional<int64_t> grace_period_seconds;
  std::chrono::milliseconds timeout{0};
};

// The type of a core/v1 Event: routine, or something a person should look at.
enum class EventType { kNormal, kWarning };

// Told about every HTTP request a Client sends, retries and watch connections included, so that
// the operator can export request latency and errors without the client knowing about metrics.
// `verb` is the Kubernetes verb: "get", "list" (once per page), "watch", "create", "update"
// (Replace, ReplaceStatus), "patch" (MergePatch, PatchStatus) or "delete". `http_status` is the
// answer's code, or 0 when none came (connection failed, timed out, cancelled). `seconds` runs
// from sending to the complete answer; for a watch, to the answer's headers. Called on the
// thread that made the call, once the request is over; it must be quick, must not throw and
// must not call the client.
using RequestObserver = std::function<void(std::string_view verb, int http_status, double seconds)>;

// Talks to one API server as one identity. Calls block the calling thread until the answer is
// complete, the call's timeout passes or (for Watch) the caller stops it; they never throw. The
// calling thread must not be one of cpprest's own (an http_listener handler or a task
// continuation): that thread pool also completes the calls. Thread-safe: any number of threads
// may call at once; connections are pooled and reused.
class Client {
 public:
  // Fails when the configuration cannot work: no server, PEM material that does not parse, a
  // client key that does not match its certificate, an unreadable token file.
  static Result<std::unique_ptr<Client>> Create(const Config& config, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Config& config() const;
  const std::shared_ptr<RateLimiter>& rate_limiter() const;
  // Requests sent so far, retries and watch connections included.
  uint64_t requests_sent() const;

  // Replaces the observer (null: none). Thread-safe, and may be called at any time; requests
  // already under way may still report to the one before.
  void set_request_observer(RequestObserver observer);

  // GET one object.
  ApiResult<nlohmann::json> Get(const Resource& resource, std::string_view ns,
                                std::string_view name, const CallOptions& options = {});

  // Every object in `ns` ("" = all namespaces; ignored for cluster-scoped resources) that
  // matches the selectors, with the collection's resourceVersion. Paged; if the server forgets
  // the paging token mid-list (410), the list starts over unpaged.
  ApiResult<ObjectList> List(const Resource& resource, std::string_view ns,
                             const ListOptions& options = {});

  // Streams the changes to the matching objects, calling `handler` for each event in order,
  // until the server ends the stream (OK), `stop` is requested (OK), the stream breaks
  // (kTransport, or kDeadlineExceeded after idle_timeout) or the server sends an ERROR event.
  // An ERROR event is passed to `handler` and then returned as the error: kGone for a
  // resource_version that is too old (list again), for instance.
  ApiStatus Watch(const Resource& resource, std::string_view ns, const WatchOptions& options,
                  const WatchHandler& handler, std::stop_token stop = {});

  // POST. apiVersion and kind are filled in from `resource` when missing; metadata.namespace
  // from `ns`.
  ApiResult<nlohmann::json> Create(const Resource& resource, std::string_view ns,
                                   nlohmann::json object, const CallOptions& options = {});

  // PUT of the whole object, named by its metadata.name. With metadata.resourceVersion set, the
  // write happens only if the object is still at that version (kConflict otherwise): the
  // optimistic concurrency Leases need.
  ApiResult<nlohmann::json> Replace(const Resource& resource, std::string_view ns,
                                    nlohmann::json object, const CallOptions& options = {});

  // PATCH with a JSON merge patch (RFC 7386): maps merge, lists and scalars are replaced, null
  // deletes. Put metadata.resourceVersion in the patch to make it conditional.
  ApiResult<nlohmann::json> MergePatch(const Resource& resource, std::string_view ns,
                                       std::string_view name, const nlohmann::json& patch,
                                       const CallOptions& options = {});

  // DELETE. The answer is the object (still there while finalizers or a grace period run) or a
  // Status of success.
  ApiResult<nlohmann::json> Delete(const Resource& resource, std::string_view ns,
                                   std::string_view name, const DeleteOptions& options = {});

  // The status subresource: writes to .status that the main resource ignores (and vice versa).
  // ReplaceStatus PUTs the whole object (conditional on metadata.resourceVersion when set);
  // PatchStatus merge-patches, e.g. {"status": {"conditions": [...]}}.
  ApiResult<nlohmann::json> ReplaceStatus(const Resource& resource, std::string_view ns,
                                          nlohmann::json object, const CallOptions& options = {});
  ApiResult<nlohmann::json> PatchStatus(const Resource& resource, std::string_view ns,
                                        std::string_view name, const nlohmann::json& patch,
                                        const CallOptions& options = {});

  // Records a core/v1 Event about `object` (of kind `resource`, as read from the API: its
  // metadata gives the name, namespace, uid and resourceVersion), from `component`.
  // `reason` is a short UpperCamelCase word ("Resized"), `message` a sentence for people.
  ApiResult<nlohmann::json> CreateEvent(const Resource& resource, const nlohmann::json& object,
                                        EventType type, std::string_view reason,
                                        std::string_view message,
                                        std::string_view component = "virtualflow-operator",
                                        const CallOptions& options = {});

 private:
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Builds the Event CreateEvent sends, with `now` as its timestamps; exposed for tests.
nlohmann::json MakeEvent(const Resource& resource, const nlohmann::json& object, EventType type,
                         std::string_view reason, std::string_view message,
                         std::string_view component, std::chrono::system_clock::time_point now);

// RFC 3339 with seconds in UTC ("2024-05-01T12:00:00Z"), as metav1.Time is written.
std::string FormatTime(std::chrono::system_clock::time_point time);

}  // namespace vf::kube
