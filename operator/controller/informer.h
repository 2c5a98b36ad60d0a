// An informer: a thread-safe, read-only mirror of one kind of object, kept current by a
// Reflector (list, then watch) on a thread of its own, with a callback for every change so a
// controller can queue the keys that need another look.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "operator/kube/client.h"
#include "operator/kube/reflector.h"

namespace vf::controller {

// "namespace/name" for namespaced objects, "name" for cluster-scoped ones.
std::string ObjectKey(const nlohmann::json& object);

// Mirrors the objects of one resource. Get/List/synced are thread-safe and may be called while
// the reflector runs; the change callback runs on the informer's own thread, one at a time,
// with no lock held.
class Informer {
 public:
  // Called with the object's old and new state (null when absent) after every change.
  using OnChange = std::function<void(const nlohmann::json& before, const nlohmann::json& after)>;

  // Trims an object before the cache keeps it (client-go's transform): what the cache holds and
  // what on_change sees is what it leaves. Called on the informer's thread.
  using Transform = std::function<void(nlohmann::json& object)>;

  // `client` must outlive the informer. `ns` "" watches all namespaces. `transform`, when set,
  // is applied to every object listed or watched before it is kept.
  Informer(kube::Client& client, const kube::Resource& resource, std::string ns,
           kube::ReflectorOptions options, OnChange on_change, Transform transform = nullptr);
  ~Informer();
  Informer(const Informer&) = delete;
  Informer& operator=(const Informer&) = delete;

  // Starts the reflector thread. Call once.
  void Start();
  // Stops it and waits for it.
  void Stop();

  // True once the first full list has been applied.
  bool synced() const;
  // Blocks until synced() or `stop`; false if stopped first.
  bool WaitForSync(std::stop_token stop) const;

  std::optional<nlohmann::json> Get(const std::string& key) const;
  bool Has(const std::string& key) const;
  // The last failed list or watch, until a list succeeds again (then nullopt).
  std::optional<std::string> last_error() const;

  // Every object for which `keep` is true (all when it is null), in key order.
  std::vector<nlohmann::json> List(
      const std::function<bool(const nlohmann::json&)>& keep = nullptr) const;
  // The same without copying the objects: each is shared with the cache, which replaces (never
  // modifies) an object that changes. What a controller that reads every object on every
  // reconcile uses: a copy of a thousand pods costs more than the reconcile itself.
  std::vector<std::shared_ptr<const nlohmann::json>> Snapshot(
      const std::function<bool(const nlohmann::json&)>& keep = nullptr) const;
  // The keys of every object, in order.
  std::vector<std::string> Keys() const;
  // Counts the changes applied so far: equal versions, the same objects. Read it before a
  // Snapshot to label what the snapshot holds (a change in between only makes the label older).
  uint64_t version() const { return version_.load(); }

 private:
  void Sync(std::vector<nlohmann::json> items);
  void Apply(const kube::WatchEvent& event);

  kube::Client& client_;
  const kube::Resource resource_;
  const std::string ns_;
  OnChange on_change_;
  const Transform transform_;
  std::unique_ptr<kube::Reflector> reflector_;
  std::jthread thread_;

  mutable std::mutex mu_;
  mutable std::condition_variable_any synced_cv_;
  std::map<std::string, std::shared_ptr<const nlohmann::json>> objects_;
  bool synced_ = false;
  std::optional<std::string> last_error_;
  std::atomic<uint64_t> version_{0};
};

}  // namespace vf::controller
