#include "agent/http/request_reader.h"

#include <cstring>
#include <limits>

#include <boost/asio/error.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>

namespace vf::http {

namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace net = boost::asio;

RequestReader::RequestReader(const Listener::Limits& limits) : limits_(limits) {
  parser_.header_limit(static_cast<uint32_t>(limits.max_header_bytes));
  // No limit until the head is checked: Beast would refuse a declared length over its limit as
  // it reads the head, before CheckHead could say what was declared.
  parser_.body_limit(std::numeric_limits<uint64_t>::max());
}

Refusal RequestReader::HeadTooLarge() const {
  return Refusal{
      codes::kHeaderFieldsTooLarge,
      "request header is over the limit of " + std::to_string(limits_.max_header_bytes) + " bytes"};
}

void RequestReader::LimitBody() { parser_.body_limit(limits_.max_body_bytes); }

Request RequestReader::Head(const std::string& peer) const {
  const auto& head = parser_.get();
  Request request;
  request.method = std::string(head.method_string());
  request.target = std::string(head.target());
  const size_t question = request.target.find('?');
  request.path = request.target.substr(0, question);
  if (question != std::string::npos) request.query = request.target.substr(question + 1);
  for (const auto& field : head) {
    request.headers.Add(std::string(field.name_string()), std::string(field.value()));
  }
  request.peer = peer;
  return request;
}

std::optional<Refusal> RequestReader::CheckHead(size_t head_bytes) const {
  if (head_bytes > limits_.max_header_bytes) return HeadTooLarge();
  const uint64_t declared = parser_.content_length().value_or(0);
  if ((parser_.chunked() || declared > 0) && limits_.max_body_bytes == 0) {
    return Refusal{codes::kPayloadTooLarge, "request has a body; this server takes none"};
  }
  if (declared > limits_.max_body_bytes) {
    return Refusal{codes::kPayloadTooLarge, "request body is " + std::to_string(declared) +
                                                " bytes; the limit is " +
                                                std::to_string(limits_.max_body_bytes)};
  }
  return std::nullopt;
}

std::optional<Refusal> RequestReader::RefusalFor(const beast::error_code& error,
                                                 bool in_body) const {
  if (error == bhttp::error::header_limit) return HeadTooLarge();
  if (error == bhttp::error::body_limit) {
    return Refusal{codes::kPayloadTooLarge, "request body is over the limit of " +
                                                std::to_string(limits_.max_body_bytes) + " bytes"};
  }
  const bool ended = error == bhttp::error::end_of_stream ||
                     error == bhttp::error::partial_message || error == beast::error::timeout ||
                     error == net::error::eof || error == net::error::operation_aborted ||
                     error == net::error::connection_reset || error == net::error::broken_pipe ||
                     error.category() == net::error::get_ssl_category() ||
                     error == net::ssl::error::stream_truncated;
  if (ended || !error) return std::nullopt;
  return Refusal{
      codes::kBadRequest,
      std::string(in_body ? "malformed request body: " : "malformed request: ") + error.message()};
}

ParsedRequest ParseRequest(const std::vector<std::string_view>& chunks,
                           const Listener::Limits& limits) {
  RequestReader reader(limits);
  RequestReader::Parser& parser = reader.parser();
  beast::flat_buffer buffer;
  bool head_done = false;
  size_t head_bytes = 0;
  ParsedRequest parsed;
  for (std::string_view chunk : chunks) {
    if (chunk.empty()) continue;
    const auto space = buffer.prepare(chunk.size());
    std::memcpy(space.data(), chunk.data(), chunk.size());
    buffer.commit(chunk.size());
    while (!parser.is_done() && buffer.size() > 0) {
      beast::error_code error;
      const size_t used = parser.put(buffer.data(), error);
      buffer.consume(used);
      if (!head_done) head_bytes += used;
      if (error == bhttp::error::need_more) break;
      if (error) {
        parsed.refusal = reader.RefusalFor(error, head_done);
        return parsed;
      }
      if (!head_done && parser.is_header_done()) {
        head_done = true;
        parsed.refusal = reader.CheckHead(head_bytes);
        if (parsed.refusal.has_value()) return parsed;
        reader.LimitBody();
      }
      if (used == 0) break;
    }
    if (parser.is_done()) {
      parsed.request = reader.Head("fuzz");
      parsed.request->body = parser.get().body();
      return parsed;
    }
  }
  return parsed;
}

}  // namespace vf::http
