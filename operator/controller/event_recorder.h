// Events about the objects a controller manages, recorded as client-go's event recorder
// records them: a repeat of an Event already recorded (same object, type, reason and message)
// increments that Event's count and moves its lastTimestamp instead of creating another, so
// that a condition that persists across retries is one Event with a count, not thousands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "operator/kube/client.h"
#include "operator/kube/resource.h"

namespace vf::controller {

// Records core/v1 Events about objects of one resource, aggregating repeats into series. It
// remembers at most `max_series` series (the oldest is forgotten first, as client-go's cache of
// 4096), so a controller that runs for months holds a bounded amount. An Event that the API
// server no longer has (it keeps Events for an hour by default) starts a new series. A failed
// write is said on stderr and otherwise ignored: Events are for people, not for the controller's
// own decisions. Thread-safe: the series are behind a mutex; the client is thread-safe.
class EventRecorder {
 public:
  static constexpr size_t kMaxSeries = 4096;

  // `client` must outlive the recorder; `resource` is the kind of every object recorded about.
  EventRecorder(kube::Client& client, const kube::Resource& resource,
                size_t max_series = kMaxSeries);

  // Records an Event about `object` (as read from the API: its metadata names it).
  void Record(const nlohmann::json& object, kube::EventType type, const std::string& reason,
              const std::string& message);

  // How many series it remembers now.
  size_t series_count() const;

 private:
  struct Series {
    std::string ns;
    std::string name;
    int64_t count = 0;
  };

  kube::Client& client_;
  const kube::Resource resource_;
  const size_t max_series_;
  mutable std::mutex mu_;
  // Object UID, type, reason and message -> the Event's namespace, name and count.
  std::map<std::string, Series> series_;
  std::deque<std::string> order_;  // keys of series_, oldest first
};

}  // namespace vf::controller
