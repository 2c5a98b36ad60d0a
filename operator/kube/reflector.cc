#include "operator/kube/reflector.h"

#include <algorithm>
#include <utility>

#include "operator/kube/rate_limiter.h"

namespace vf::kube {
namespace {

using Clock = std::chrono::steady_clock;

// A watch that lasted this long was healthy, whatever ended it: the next failure starts the
// backoff afresh.
constexpr auto kHealthyWatch = std::chrono::seconds(10);

// Failures where the stream broke but the version is still good: resume the watch from it.
bool ResumableWatchFailure(Reason reason) {
  return reason == Reason::kTransport || reason == Reason::kDeadlineExceeded ||
         reason == Reason::kTooManyRequests || reason == Reason::kServiceUnavailable ||
         reason == Reason::kTimeout || reason == Reason::kServerTimeout;
}

}  // namespace

Reflector::Reflector(Client& client, const Resource& resource, std::string ns,
                     ReflectorOptions options, ReflectorHandlers handlers)
    : client_(client),
      resource_(resource),
      ns_(std::move(ns)),
      options_(std::move(options)),
      handlers_(std::move(handlers)),
      random_(std::random_device{}()) {}

std::string Reflector::resource_version() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resource_version_;
}

ReflectorStats Reflector::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Reflector::SetVersion(std::string version) {
  std::lock_guard<std::mutex> lock(mu_);
  resource_version_ = std::move(version);
}

void Reflector::Count(uint64_t ReflectorStats::*counter) {
  std::lock_guard<std::mutex> lock(mu_);
  ++(stats_.*counter);
}

void Reflector::Failed(const ApiError& error) {
  Count(&ReflectorStats::errors);
  if (handlers_.on_error) handlers_.on_error(error);
}

std::chrono::seconds Reflector::NextWatchTimeout() {
  const int64_t min = std::max<int64_t>(1, options_.min_watch_timeout.count());
  std::uniform_int_distribution<int64_t> pick(min, 2 * min - 1 > min ? 2 * min - 1 : min);
  return std::chrono::seconds(pick(random_));
}

void Reflector::Run(std::stop_token stop) {
  std::string version = options_.resume_from;
  bool need_list = version.empty();
  SetVersion(version);
  std::chrono::milliseconds backoff = options_.initial_backoff;
  bool last_gone = false;
  // Sleeps before the next attempt after a failure, doubling up to the maximum with jitter, so
  // that a fleet of reflectors does not retry in lockstep.
  auto back_off = [&]() {
    std::uniform_real_distribution<double> jitter(1.0, 1.5);
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(backoff * jitter(random_));
    backoff = std::min(backoff * 2, options_.max_backoff);
    return SleepUntil(Clock::now() + wait, stop);
  };

  while (!stop.stop_requested()) {
    if (need_list) {
      ListOptions list_options;
      list_options.label_selector = options_.label_selector;
      list_options.field_selector = options_.field_selector;
      list_options.page_size = options_.page_size;
      ApiResult<ObjectList> list = client_.List(resource_, ns_, list_options);
      if (stop.stop_requested()) return;
      if (!list.ok()) {
        Failed(list.error());
        if (!back_off()) return;
        continue;
      }
      version = list->resource_version;
      SetVersion(version);
      Count(&ReflectorStats::lists);
      if (handlers_.on_sync) handlers_.on_sync(std::move(list->items), version);
      need_list = false;
    }

    WatchOptions watch;
    watch.resource_version = version;
    watch.allow_bookmarks = options_.bookmarks;
    watch.label_selector = options_.label_selector;
    watch.field_selector = options_.field_selector;
    watch.timeout_seconds = NextWatchTimeout().count();
    bool progressed = false;
    const Clock::time_point started = Clock::now();
    Count(&ReflectorStats::watches);
    ApiStatus result = client_.Watch(
        resource_, ns_, watch,
        [&](WatchEvent event) {
          if (event.type == WatchEventType::kError) return;  // returned by Watch; handled below
          std::string event_version = ResourceVersionOf(event.object);
          if (!event_version.empty()) {
            version = std::move(event_version);
            SetVersion(version);
          }
          progressed = true;
          if (event.type == WatchEventType::kBookmark) {
            Count(&ReflectorStats::bookmarks);
            return;
          }
          if (handlers_.on_event) handlers_.on_event(std::move(event));
        },
        stop);
    if (stop.stop_requested()) return;
    if (progressed || Clock::now() - started >= kHealthyWatch) {
      backoff = options_.initial_backoff;
    }
    if (result.ok()) {
      last_gone = false;
      continue;  // the server ended the stream: resume from `version`
    }

    Failed(result.error());
    const bool gone_again = last_gone && !progressed;
    last_gone = result.reason() == Reason::kGone;
    if (last_gone) {
      Count(&ReflectorStats::gone);
      need_list = true;
      // Listing at once is what a 410 calls for; only a fresh list's version being refused
      // again at once (a server in trouble) backs off.
      if (gone_again && !back_off()) return;
      continue;
    }
    // A broken connection leaves the version valid; anything the server reported (an ERROR
    // event, a 403, a 500) may mean the state moved on without us, so it is listed afresh.
    if (!ResumableWatchFailure(result.reason())) need_list = true;
    if (!back_off()) return;
  }
}

}  // namespace vf::kube
