// Errors as values at every boundary of the runtime.
//
// Hand-written rather than absl::Status or std::expected: the runtime must build on the GPU
// machines with only a compiler, CMake, CUDA and NCCL (no Abseil), and std::expected is C++23.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace vf {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad input from a user: job file, flags, request body
  kNotFound,            // a file or key that should exist does not
  kDataLoss,            // corrupt or truncated data: dataset files, checkpoints
  kDeadlineExceeded,    // a wait ran past its timeout
  kUnavailable,         // a peer or service went away (collective failed, connection lost)
  kFailedPrecondition,  // the operation does not fit the current state
  kNumerical,           // NaN/Inf or overflow in training math
  kInternal,            // a bug or an unexpected library failure
  kUnauthenticated,     // credentials missing or not accepted (HTTP 401)
  kPermissionDenied,    // authenticated, but not allowed to do this (HTTP 403)
};

std::string_view StatusCodeName(StatusCode code);

// The outcome of an operation: OK, or a code with a human-readable message. Value type;
// thread-compatible (no shared state).
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy whose message reads "context: original message".
  Status WithContext(std::string_view context) const;

  // "message" for errors, "OK" for success.
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Unauthenticated(std::string m) {
  return {StatusCode::kUnauthenticated, std::move(m)};
}
inline Status PermissionDenied(std::string m) {
  return {StatusCode::kPermissionDenied, std::move(m)};
}
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) {
  return {StatusCode::kDeadlineExceeded, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status NumericalError(std::string m) { return {StatusCode::kNumerical, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status explaining why there is none. Value type; thread-compatible.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace vf

#define VF_STATUS_CONCAT_INNER_(a, b) a##b
#define VF_STATUS_CONCAT_(a, b) VF_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define VF_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::vf::Status vf_status_ = (expr);        \
    if (!vf_status_.ok()) return vf_status_; \
  } while (0)

// `lhs = value of expr` (a Result<T>), or return its Status from the enclosing function.
#define VF_ASSIGN_OR_RETURN(lhs, expr) \
  VF_ASSIGN_OR_RETURN_IMPL_(VF_STATUS_CONCAT_(vf_result_, __LINE__), lhs, expr)
// NOLINTBEGIN(bugprone-macro-parentheses): `tmp` is a name and `lhs` may be a declaration
// (`auto x`), neither of which can be parenthesised.
#define VF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
