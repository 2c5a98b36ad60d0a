#include "operator/kube/errors.h"

#include <algorithm>

namespace vf::kube {
namespace {

using nlohmann::json;

// Long non-Status bodies (an HTML error page from a proxy) are cut to this many bytes.
constexpr size_t kMaxBodyInMessage = 300;

std::string Summarize(std::string_view body) {
  std::string text(body.substr(0, kMaxBodyInMessage));
  // One line: error messages end up in logs and in Events.
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\n' || c == '\r' || c == '\t'; }, ' ');
  while (!text.empty() && text.back() == ' ') text.pop_back();
  if (body.size() > kMaxBodyInMessage) text += "...";
  return text;
}

std::string StringField(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

}  // namespace

std::string_view ReasonName(Reason reason) {
  switch (reason) {
    case Reason::kOk:
      return "OK";
    case Reason::kBadRequest:
      return "BadRequest";
    case Reason::kUnauthorized:
      return "Unauthorized";
    case Reason::kForbidden:
      return "Forbidden";
    case Reason::kNotFound:
      return "NotFound";
    case Reason::kMethodNotAllowed:
      return "MethodNotAllowed";
    case Reason::kNotAcceptable:
      return "NotAcceptable";
    case Reason::kAlreadyExists:
      return "AlreadyExists";
    case Reason::kConflict:
      return "Conflict";
    case Reason::kGone:
      return "Gone";
    case Reason::kRequestEntityTooLarge:
      return "RequestEntityTooLarge";
    case Reason::kUnsupportedMediaType:
      return "UnsupportedMediaType";
    case Reason::kInvalid:
      return "Invalid";
    case Reason::kTooManyRequests:
      return "TooManyRequests";
    case Reason::kInternalError:
      return "InternalError";
    case Reason::kServiceUnavailable:
      return "ServiceUnavailable";
    case Reason::kTimeout:
      return "Timeout";
    case Reason::kServerTimeout:
      return "ServerTimeout";
    case Reason::kUnknown:
      return "Unknown";
    case Reason::kTransport:
      return "Transport";
    case Reason::kDeadlineExceeded:
      return "DeadlineExceeded";
    case Reason::kCancelled:
      return "Cancelled";
    case Reason::kBadResponse:
      return "BadResponse";
  }
  return "Unknown";
}

StatusCode StatusCodeFor(Reason reason) {
  switch (reason) {
    case Reason::kOk:
      return StatusCode::kOk;
    case Reason::kNotFound:
      return StatusCode::kNotFound;
    case Reason::kBadRequest:
    case Reason::kInvalid:
    case Reason::kMethodNotAllowed:
    case Reason::kNotAcceptable:
    case Reason::kRequestEntityTooLarge:
    case Reason::kUnsupportedMediaType:
      return StatusCode::kInvalidArgument;
    case Reason::kAlreadyExists:
    case Reason::kConflict:
    case Reason::kGone:
    case Reason::kForbidden:
    case Reason::kUnauthorized:
      return StatusCode::kFailedPrecondition;
    case Reason::kDeadlineExceeded:
      return StatusCode::kDeadlineExceeded;
    case Reason::kTooManyRequests:
    case Reason::kServiceUnavailable:
    case Reason::kTimeout:
    case Reason::kServerTimeout:
    case Reason::kTransport:
    case Reason::kCancelled:
      return StatusCode::kUnavailable;
    case Reason::kInternalError:
    case Reason::kUnknown:
    case Reason::kBadResponse:
      return StatusCode::kInternal;
  }
  return StatusCode::kInternal;
}

std::string ApiError::ToString() const {
  std::string text = context;
  if (!text.empty()) text += ": ";
  text += server_reason.empty() ? std::string(ReasonName(reason)) : server_reason;
  text += ": ";
  text += message.empty() ? "no message" : message;
  if (http_code != 0) text += " (HTTP " + std::to_string(http_code) + ")";
  return text;
}

Reason ReasonForHttpCode(int http_code) {
  switch (http_code) {
    case 400:
      return Reason::kBadRequest;
    case 401:
      return Reason::kUnauthorized;
    case 403:
      return Reason::kForbidden;
    case 404:
      return Reason::kNotFound;
    case 405:
      return Reason::kMethodNotAllowed;
    case 406:
      return Reason::kNotAcceptable;
    case 409:
      return Reason::kConflict;
    case 410:
      return Reason::kGone;
    case 413:
      return Reason::kRequestEntityTooLarge;
    case 415:
      return Reason::kUnsupportedMediaType;
    case 422:
      return Reason::kInvalid;
    case 429:
      return Reason::kTooManyRequests;
    case 500:
      return Reason::kInternalError;
    case 503:
      return Reason::kServiceUnavailable;
    case 504:
      return Reason::kTimeout;
    default:
      return Reason::kUnknown;
  }
}

Reason ReasonFromServer(std::string_view server_reason, int http_code) {
  struct Name {
    std::string_view text;
    Reason reason;
  };
  // metav1.StatusReason values; "Expired" is what a watch or list from a compacted
  // resourceVersion answers, and is handled exactly like "Gone".
  static constexpr Name kNames[] = {
      {"BadRequest", Reason::kBadRequest},
      {"Unauthorized", Reason::kUnauthorized},
      {"Forbidden", Reason::kForbidden},
      {"NotFound", Reason::kNotFound},
      {"MethodNotAllowed", Reason::kMethodNotAllowed},
      {"NotAcceptable", Reason::kNotAcceptable},
      {"AlreadyExists", Reason::kAlreadyExists},
      {"Conflict", Reason::kConflict},
      {"Gone", Reason::kGone},
      {"Expired", Reason::kGone},
      {"RequestEntityTooLarge", Reason::kRequestEntityTooLarge},
      {"UnsupportedMediaType", Reason::kUnsupportedMediaType},
      {"Invalid", Reason::kInvalid},
      {"TooManyRequests", Reason::kTooManyRequests},
      {"InternalError", Reason::kInternalError},
      {"ServiceUnavailable", Reason::kServiceUnavailable},
      {"Timeout", Reason::kTimeout},
      {"ServerTimeout", Reason::kServerTimeout},
  };
  for (const Name& name : kNames) {
    if (name.text == server_reason) return name.reason;
  }
  return ReasonForHttpCode(http_code);
}

ApiError ApiErrorFromStatus(const json& status, int fallback_code) {
  ApiError error;
  int code = fallback_code;
  if (auto it = status.find("code"); it != status.end() && it->is_number_integer()) {
    code = it->get<int>();
  }
  error.http_code = code;
  error.server_reason = StringField(status, "reason");
  error.message = StringField(status, "message");
  error.reason = ReasonFromServer(error.server_reason, code);
  if (auto it = status.find("details"); it != status.end() && it->is_object()) {
    error.details = *it;
    if (auto r = it->find("retryAfterSeconds"); r != it->end() && r->is_number_integer()) {
      error.retry_after = std::chrono::seconds(r->get<int64_t>());
    }
  }
  if (error.message.empty()) {
    error.message = code != 0
                        ? "the server answered HTTP " + std::to_string(code) + " without a message"
                        : "the server reported an error without a message";
  }
  return error;
}

ApiError ParseApiError(int http_code, std::string_view body) {
  const json parsed = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object() && StringField(parsed, "kind") == "Status") {
    ApiError error = ApiErrorFromStatus(parsed, http_code);
    // The HTTP code is the truth for this answer; a Status may carry a different one.
    error.http_code = http_code;
    return error;
  }
  ApiError error;
  error.http_code = http_code;
  error.reason = ReasonForHttpCode(http_code);
  std::string text = Summarize(body);
  error.message =
      text.empty() ? "the server answered HTTP " + std::to_string(http_code) + " with an empty body"
                   : std::move(text);
  return error;
}

}  // namespace vf::kube
