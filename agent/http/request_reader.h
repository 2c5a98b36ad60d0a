// How the server reads one request from the bytes a client sends: a Beast parser set to the
// listener's limits, the checks made once the header fields are in, the answer each parse error
// gets, and the Request made of it all. Internal to agent/http: the listener reads through it,
// and so does its fuzzer (request_reader_fuzz.cc), so that both run the same code.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include "agent/http/listener.h"

namespace vf::http {

// The server's own answer to a request it does not hand on. Value type.
struct Refusal {
  int code = codes::kBadRequest;
  std::string message;  // without the server's name
};

// Reads one request. Not thread-safe: one per request being read.
class RequestReader {
 public:
  using Parser = boost::beast::http::request_parser<boost::beast::http::string_body>;

  explicit RequestReader(const Listener::Limits& limits);

  Parser& parser() { return parser_; }

  // Once the header fields are in: the request without its body.
  Request Head(const std::string& peer) const;
  // Once the header fields are in, `head_bytes` of them: a refusal when the head is over its
  // limit (Beast enforces it only on a head that arrives in pieces), or the declared body is one
  // the limits do not allow (any body where none is taken, a Content-Length over the limit).
  std::optional<Refusal> CheckHead(size_t head_bytes) const;
  // Once the head has passed CheckHead: the body is read under the limit from here on
  // (a chunked one as its chunks arrive).
  void LimitBody();
  // What a failed read of the head (`in_body` false) or the body is answered; nullopt when the
  // error only says the connection ended or timed out, which is answered with nothing.
  std::optional<Refusal> RefusalFor(const boost::beast::error_code& error, bool in_body) const;

 private:
  Refusal HeadTooLarge() const;

  const Listener::Limits limits_;
  Parser parser_;
};

// What reading `chunks` (the bytes in the pieces they arrived in) as one request gives, the way
// the listener reads it. Value type; for the fuzzer and the tests.
struct ParsedRequest {
  std::optional<Request> request;  // the whole request, body included
  std::optional<Refusal> refusal;  // or the server's answer
  // Neither: the bytes ended before the request did (the server waits for more, then its
  // deadline closes the connection).
};
ParsedRequest ParseRequest(const std::vector<std::string_view>& chunks,
                           const Listener::Limits& limits);

}  // namespace vf::http
