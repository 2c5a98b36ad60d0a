#include "operator/controller/event_recorder.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

namespace vf::controller {

using nlohmann::json;

namespace {

const json& Metadata(const json& object) {
  static const json kEmpty = json::object();
  auto it = object.find("metadata");
  return it != object.end() && it->is_object() ? *it : kEmpty;
}

}  // namespace

EventRecorder::EventRecorder(kube::Client& client, const kube::Resource& resource,
                             size_t max_series)
    : client_(client), resource_(resource), max_series_(max_series) {}

size_t EventRecorder::series_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return series_.size();
}

void EventRecorder::Record(const json& object, kube::EventType type, const std::string& reason,
                           const std::string& message) {
  const json& meta = Metadata(object);
  const std::string key = meta.value("uid", "") + '\n' +
                          (type == kube::EventType::kWarning ? "W" : "N") + '\n' + reason + '\n' +
                          message;
  auto log = [&](const kube::ApiError& e) {
    std::fprintf(stderr, "virtualflow-operator: event %s for %s/%s not recorded: %s\n",
                 reason.c_str(), meta.value("namespace", "").c_str(),
                 meta.value("name", "").c_str(), e.ToString().c_str());
  };
  std::optional<Series> series;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = series_.find(key);
    if (it != series_.end()) series = it->second;
  }
  if (series) {
    const json patch = {{"count", series->count + 1},
                        {"lastTimestamp", kube::FormatTime(std::chrono::system_clock::now())}};
    auto patched = client_.MergePatch(kube::kEvents, series->ns, series->name, patch);
    if (patched.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = series_.find(key);
      if (it != series_.end()) it->second.count = series->count + 1;
      return;
    }
    // Gone (the API server keeps Events for an hour by default): a new series begins.
    if (patched.reason() != kube::Reason::kNotFound) return log(patched.error());
  }
  auto created = client_.CreateEvent(resource_, object, type, reason, message);
  if (!created.ok()) return log(created.error());
  const json& event_meta = Metadata(*created);
  if (event_meta.value("name", "").empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (series_.count(key) == 0) {
    order_.push_back(key);
    if (order_.size() > max_series_) {
      series_.erase(order_.front());
      order_.pop_front();
    }
  }
  series_[key] = Series{event_meta.value("namespace", ""), event_meta.value("name", ""), 1};
}

}  // namespace vf::controller
