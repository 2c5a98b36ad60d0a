// The list-then-watch loop an informer cache is built on: list everything, then watch for
// changes from the list's resourceVersion; when the watch ends, resume it; when the version is
// too old (410) or the server reports an error, list again; back off exponentially while things
// fail.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <random>
#include <stop_token>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/kube/client.h"

namespace vf::kube {

// What a Reflector mirrors and how it paces itself; value type.
struct ReflectorOptions {
  std::string label_selector;
  std::string field_selector;
  int64_t page_size = 500;
  bool bookmarks = true;
  // Each watch asks the server to end it after a random time in [min, 2 * min), so that many
  // reflectors do not all reconnect at once and no connection lives forever.
  std::chrono::seconds min_watch_timeout{300};
  std::chrono::milliseconds initial_backoff{200};
  std::chrono::milliseconds max_backoff{30000};
  // Start by watching from this version instead of listing: the caller already holds the state
  // at that version (a restart that kept it). A 410 falls back to a list as usual.
  std::string resume_from;
};

// Where a Reflector delivers what it learns; called on the thread that runs it.
struct ReflectorHandlers {
  // After every list: every object there is, and the version they are at. Objects the caller
  // holds that are not in `items` are gone.
  std::function<void(std::vector<nlohmann::json> items, const std::string& resource_version)>
      on_sync;
  // Every ADDED, MODIFIED and DELETED after the last sync, in order. (Bookmarks and errors are
  // handled here.)
  std::function<void(WatchEvent event)> on_event;
  // Optional: every failed list or watch, before the reflector backs off and retries (for
  // logs and metrics).
  std::function<void(const ApiError& error)> on_error;
};

// Counters for tests and metrics; value type.
struct ReflectorStats {
  uint64_t lists = 0;      // successful lists (on_sync calls)
  uint64_t watches = 0;    // watch streams opened
  uint64_t gone = 0;       // 410s that forced a list
  uint64_t errors = 0;     // failures of any kind (on_error calls)
  uint64_t bookmarks = 0;  // bookmarks received
};

// Keeps one resource (in one namespace, or all) mirrored into the handlers. Handlers run on
// the thread that calls Run, one at a time, in order. Run may be called once; resource_version()
// and stats() are thread-safe.
class Reflector {
 public:
  // `client` must outlive the reflector.
  Reflector(Client& client, const Resource& resource, std::string ns, ReflectorOptions options,
            ReflectorHandlers handlers);

  // Lists and watches until `stop` is requested.
  void Run(std::stop_token stop);

  // The newest version seen: from a list, an event or a bookmark.
  std::string resource_version() const;
  ReflectorStats stats() const;

 private:
  void SetVersion(std::string version);
  void Count(uint64_t ReflectorStats::*counter);
  void Failed(const ApiError& error);
  std::chrono::seconds NextWatchTimeout();

  Client& client_;
  const Resource resource_;
  const std::string ns_;
  const ReflectorOptions options_;
  const ReflectorHandlers handlers_;
  std::mt19937_64 random_;

  mutable std::mutex mu_;
  std::string resource_version_;
  ReflectorStats stats_;
};

}  // namespace vf::kube
