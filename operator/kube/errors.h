// Failures of Kubernetes API calls as values: what the API server said (its Status object's
// reason, message and details, and the HTTP code), or why there was no answer at all.
//
// Calls return ApiResult<T> or ApiStatus. Both work with VF_ASSIGN_OR_RETURN / VF_RETURN_IF_ERROR
// and convert to vf::Result<T> / vf::Status, so code that only propagates errors needs nothing
// Kubernetes-specific, while code that branches on the outcome reads the exact reason:
//
//   ApiResult<json> lease = client.Get(kLeases, ns, name);
//   if (lease.reason() == Reason::kNotFound) return client.Create(kLeases, ns, fresh);
//   VF_ASSIGN_OR_RETURN(json current, std::move(lease));
//
// Converted to a vf::Status, the message reads "<verb> <resource> <namespace>/<name>: <Reason>:
// <message>" and the code follows the reason (see StatusCodeFor): only kNotFound maps to
// StatusCode::kNotFound, so "not found is success" still works on a plain vf::Status.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <nlohmann/json.hpp>

#include "runtime/status.h"

namespace vf::kube {

// Why a call failed: the API server's metav1.StatusReason, or a failure with no answer behind it.
enum class Reason {
  kOk = 0,
  kBadRequest,             // 400
  kUnauthorized,           // 401: missing, expired or unknown credentials
  kForbidden,              // 403: authorization (RBAC) refused the request
  kNotFound,               // 404
  kMethodNotAllowed,       // 405
  kNotAcceptable,          // 406
  kAlreadyExists,          // 409 on create: the name is taken
  kConflict,               // 409 otherwise: a resourceVersion or uid precondition failed
  kGone,                   // 410, "Gone" or "Expired": the resourceVersion is too old; re-list
  kRequestEntityTooLarge,  // 413
  kUnsupportedMediaType,   // 415
  kInvalid,                // 422: the object failed validation; details.causes names the fields
  kTooManyRequests,        // 429: throttled by the server (API priority and fairness)
  kInternalError,          // 500
  kServiceUnavailable,     // 503
  kTimeout,                // 504 or "Timeout": the server gave up waiting for something
  kServerTimeout,          // "ServerTimeout": the server could not finish in time; retry
  kUnknown,                // any other HTTP error
  kTransport,              // no HTTP answer: connection refused or reset, TLS handshake failed
  kDeadlineExceeded,       // the call's own timeout passed before the answer was complete
  kCancelled,              // the caller asked the call to stop
  kBadResponse,            // an answer that is not what the API promises (not a JSON object)
};

// "NotFound", "Conflict", ... as Kubernetes spells the reason ("Transport" etc. for our own).
std::string_view ReasonName(Reason reason);

// The vf::StatusCode a reason converts to: kNotFound -> kNotFound; kInvalid, kBadRequest and the
// other malformed-request reasons -> kInvalidArgument; kAlreadyExists, kConflict, kGone,
// kForbidden, kUnauthorized -> kFailedPrecondition; kDeadlineExceeded -> kDeadlineExceeded;
// throttling, unavailability, timeouts, transport failures and cancellation -> kUnavailable;
// everything else -> kInternal.
StatusCode StatusCodeFor(Reason reason);

// Everything known about one failed call. Value type; thread-compatible.
struct ApiError {
  Reason reason = Reason::kUnknown;
  // The HTTP status code, or 0 when there was no HTTP answer (kTransport, kDeadlineExceeded,
  // kCancelled) or the failure came as a watch ERROR event without a code.
  int http_code = 0;
  // Status.reason exactly as the server sent it ("Expired" for a kGone, say); may be empty.
  std::string server_reason;
  // Status.message, or the best description available.
  std::string message;
  // Status.details (name, kind, causes, retryAfterSeconds), or null.
  nlohmann::json details;
  // From the Retry-After header or details.retryAfterSeconds; zero when the server gave none.
  std::chrono::seconds retry_after{0};
  // What was being done: "get configmaps default/settings". Set by the client.
  std::string context;

  // "<context>: <Reason>: <message>"; the HTTP code is appended when there was one.
  std::string ToString() const;
  Status ToStatus() const { return Status(StatusCodeFor(reason), ToString()); }
};

// The error an HTTP answer with a non-2xx `http_code` stands for. A body holding a Kubernetes
// Status object gives the reason, message and details; any other body (a proxy's HTML page, a
// plain-text 403 from the authorizer) is summarised in the message and the reason follows the
// code, as client-go does for such answers.
ApiError ParseApiError(int http_code, std::string_view body);

// The error a Status object describes (a watch ERROR event's object). `fallback_code` is used
// when the object has no "code".
ApiError ApiErrorFromStatus(const nlohmann::json& status, int fallback_code = 0);

// The reason an HTTP status code stands for when the body does not name one.
Reason ReasonForHttpCode(int http_code);

// Maps a Status.reason string (and its code, to tell AlreadyExists-shaped 409s apart) to a
// Reason; unknown strings follow the code.
Reason ReasonFromServer(std::string_view server_reason, int http_code);

// The outcome of a call that returns a value: the value, or an ApiError. Value type;
// thread-compatible.
template <typename T>
class [[nodiscard]] ApiResult {
 public:
  ApiResult(T value) : v_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  ApiResult(ApiError error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  // Reason::kOk on success.
  Reason reason() const { return ok() ? Reason::kOk : std::get<ApiError>(v_).reason; }
  // Only when !ok().
  const ApiError& error() const { return std::get<ApiError>(v_); }
  Status status() const { return ok() ? Status::Ok() : error().ToStatus(); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  // For code that only propagates errors; the reason survives in the status code and message.
  operator Result<T>() const& {  // NOLINT(google-explicit-constructor)
    if (ok()) return value();
    return status();
  }
  operator Result<T>() && {  // NOLINT(google-explicit-constructor)
    if (ok()) return std::get<T>(std::move(v_));
    return status();
  }

 private:
  std::variant<T, ApiError> v_;
};

// The outcome of a call that returns no value: OK, or an ApiError. Value type; thread-compatible.
class [[nodiscard]] ApiStatus {
 public:
  ApiStatus() = default;
  ApiStatus(ApiError error) : error_(std::move(error)) {}  // NOLINT(google-explicit-constructor)
  static ApiStatus Ok() { return {}; }

  bool ok() const { return !error_.has_value(); }
  Reason reason() const { return ok() ? Reason::kOk : error_->reason; }
  // Only when !ok().
  const ApiError& error() const { return *error_; }
  Status status() const { return ok() ? Status::Ok() : error_->ToStatus(); }
  operator Status() const { return status(); }  // NOLINT(google-explicit-constructor)

 private:
  std::optional<ApiError> error_;
};

}  // namespace vf::kube
