// A small key-value store used for rendezvous between the ranks of one communicator (Gloo's
// layering: Store, PrefixStore, then the Communicator built on top).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/status.h"

namespace vf {

// Rendezvous key-value store: set once, read by peers that wait for the key to appear.
// Implementations are thread-safe.
class Store {
 public:
  virtual ~Store() = default;
  // Stores `value` under `key`, replacing any earlier value.
  virtual Status Set(const std::string& key, std::string_view value) = 0;
  // Returns the value of `key`, waiting up to `timeout` for it to be set. A timeout is a
  // kDeadlineExceeded error naming the key.
  virtual Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Waits until every key is set, or fails with kDeadlineExceeded naming the missing keys.
  virtual Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

// In-process store for ranks that are threads of one process (tests, the local backend).
// Thread-safe.
class MemoryStore : public Store {
 public:
  Status Set(const std::string& key, std::string_view value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
};

// Store backed by one file per key in a directory shared by processes on one machine. Writes are
// atomic (temporary file + rename), so a reader never sees a partial value. Thread-safe.
class FileStore : public Store {
 public:
  // `directory` must exist and be writable.
  explicit FileStore(std::string directory);
  Status Set(const std::string& key, std::string_view value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::string PathFor(const std::string& key) const;
  std::string directory_;
};

// Decorator that puts every key under "prefix/" so several communicators (one per membership
// epoch) can share one store without collisions. Thread-safe if the inner store is.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, Store& inner) : prefix_(std::move(prefix)), inner_(inner) {}
  Status Set(const std::string& key, std::string_view value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::string Key(const std::string& key) const { return prefix_ + "/" + key; }
  std::string prefix_;
  Store& inner_;
};

}  // namespace vf
