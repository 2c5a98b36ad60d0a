// Helpers for the project's HTTP listeners (the coordinator, the metrics exporter): choosing a
// port to bind, and writing a host into a URL.
#pragma once

#include <functional>
#include <string>

#include "runtime/status.h"

namespace vf::net {

// A port that was free on `host` a moment ago ("" means every address). cpprest's listener
// needs a concrete port to bind and says nothing of the one it got for port 0, so callers ask
// for port 0 by picking one here. kInvalidArgument when `host` does not resolve, kUnavailable
// when nothing could be bound.
Result<int> PickFreePort(const std::string& host);

// Opens a listener through `open(port)`: on `port` itself, or, for port 0, on ports picked with
// PickFreePort, trying a few in turn (a picked port can be taken by someone else before the
// listener binds it). Returns the last failure when none opened.
Status OpenOnPort(const std::string& host, int port, const std::function<Status(int)>& open);

// `host` as it goes into a URL: IPv6 addresses in brackets.
std::string HostForUri(const std::string& host);

}  // namespace vf::net
