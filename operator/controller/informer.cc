#include "operator/controller/informer.h"

#include <cstdio>
#include <utility>

namespace vf::controller {

using nlohmann::json;

std::string ObjectKey(const json& object) {
  // By reference: json::value("metadata", json::object()) would copy the whole metadata.
  if (!object.is_object()) return "";
  auto meta = object.find("metadata");
  if (meta == object.end() || !meta->is_object()) return "";
  const std::string name = meta->value("name", "");
  const std::string ns = meta->value("namespace", "");
  return ns.empty() ? name : ns + "/" + name;
}

Informer::Informer(kube::Client& client, const kube::Resource& resource, std::string ns,
                   kube::ReflectorOptions options, OnChange on_change, Transform transform)
    : client_(client),
      resource_(resource),
      ns_(std::move(ns)),
      on_change_(std::move(on_change)),
      transform_(std::move(transform)) {
  kube::ReflectorHandlers handlers;
  handlers.on_sync = [this](std::vector<json> items, const std::string&) {
    Sync(std::move(items));
  };
  handlers.on_event = [this](const kube::WatchEvent& event) { Apply(event); };
  handlers.on_error = [this](const kube::ApiError& error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      last_error_ = error.ToString();
    }
    std::fprintf(stderr, "virtualflow-operator: informer %s: %s (retrying)\n",
                 std::string(resource_.resource).c_str(), error.ToString().c_str());
  };
  reflector_ = std::make_unique<kube::Reflector>(client_, resource_, ns_, std::move(options),
                                                 std::move(handlers));
}

Informer::~Informer() { Stop(); }

void Informer::Start() {
  thread_ = std::jthread([this](std::stop_token stop) { reflector_->Run(stop); });
}

void Informer::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    thread_.join();
  }
}

bool Informer::synced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return synced_;
}

bool Informer::WaitForSync(std::stop_token stop) const {
  std::unique_lock<std::mutex> lock(mu_);
  return synced_cv_.wait(lock, stop, [this] { return synced_; });
}

std::optional<json> Informer::Get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(key);
  if (it == objects_.end()) return std::nullopt;
  return *it->second;
}

bool Informer::Has(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return objects_.count(key) != 0;
}

std::optional<std::string> Informer::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

std::vector<json> Informer::List(const std::function<bool(const json&)>& keep) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<json> out;
  for (const auto& [key, object] : objects_) {
    if (!keep || keep(*object)) out.push_back(*object);
  }
  return out;
}

std::vector<std::shared_ptr<const json>> Informer::Snapshot(
    const std::function<bool(const json&)>& keep) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<const json>> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) {
    if (!keep || keep(*object)) out.push_back(object);
  }
  return out;
}

std::vector<std::string> Informer::Keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  out.reserve(objects_.size());
  for (const auto& [key, object] : objects_) out.push_back(key);
  return out;
}

void Informer::Sync(std::vector<json> items) {
  std::map<std::string, std::shared_ptr<const json>> fresh;
  for (auto& item : items) {
    if (transform_) transform_(item);
    std::string key = ObjectKey(item);
    fresh.emplace(std::move(key), std::make_shared<const json>(std::move(item)));
  }
  std::vector<std::pair<json, json>> changes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, object] : objects_) {
      auto it = fresh.find(key);
      if (it == fresh.end()) {
        changes.emplace_back(*object, json());
      } else if (*it->second != *object) {
        changes.emplace_back(*object, *it->second);
      }
    }
    for (const auto& [key, object] : fresh) {
      if (objects_.count(key) == 0) changes.emplace_back(json(), *object);
    }
    objects_ = std::move(fresh);
    if (!changes.empty()) ++version_;
    synced_ = true;
    last_error_.reset();
  }
  synced_cv_.notify_all();
  if (on_change_) {
    for (const auto& [before, after] : changes) on_change_(before, after);
  }
}

void Informer::Apply(const kube::WatchEvent& event) {
  const std::string key = ObjectKey(event.object);
  json object;
  if (event.type != kube::WatchEventType::kDeleted) {
    object = event.object;
    if (transform_) transform_(object);
  }
  std::shared_ptr<const json> before;
  std::shared_ptr<const json> after;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it != objects_.end()) before = it->second;
    if (event.type == kube::WatchEventType::kDeleted) {
      objects_.erase(key);
    } else {
      // A change only to fields the transform drops changes nothing the cache holds.
      if (before && *before == object) return;
      after = std::make_shared<const json>(std::move(object));
      objects_[key] = after;
    }
    ++version_;
  }
  static const json kNone;
  if (on_change_) on_change_(before ? *before : kNone, after ? *after : kNone);
}

}  // namespace vf::controller
