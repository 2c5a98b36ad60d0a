#include "runtime/comm/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "runtime/deadline.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;

std::string DescribeKeys(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& key : keys) {
    if (!out.empty()) out += ", ";
    out += "'" + key + "'";
  }
  return out;
}

Status TimedOut(std::chrono::milliseconds timeout, const std::vector<std::string>& missing) {
  return DeadlineExceeded("timed out after " + std::to_string(timeout.count()) +
                          "ms waiting for store key(s) " + DescribeKeys(missing));
}

Status ErrnoError(const std::string& what, const std::string& path, int err) {
  std::string message = what + " " + path + ": " + std::strerror(err);
  if (err == ENOENT) return NotFound(std::move(message));
  return Internal(std::move(message));
}

// Closes a file descriptor on every return path.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;

 private:
  int fd_;
};

// File names keep [A-Za-z0-9_.-] and percent-encode every other byte, so a key can hold '/'
// or anything else and still name exactly one file inside the directory. A leading '.' is
// encoded too: it keeps "." and ".." out and leaves dot-names free for temporary files. The
// empty key becomes "%", which no encoded key can equal.
std::string EncodeKey(const std::string& key) {
  if (key.empty()) return "%";
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(key.size());
  for (size_t i = 0; i < key.size(); ++i) {
    const auto c = static_cast<unsigned char>(key[i]);
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '_' || c == '-' || (c == '.' && i > 0);
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    }
  }
  return out;
}

// Reads the whole file at `path`. Returns kNotFound if it does not exist (yet).
Result<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open store file", path, errno);
  FdCloser closer(fd);
  std::string data;
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot read store file", path, errno);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  return data;
}

Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("cannot write store file", path, errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// MemoryStore

Status MemoryStore::Set(const std::string& key, std::string_view value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[key] = std::string(value);
  }
  cv_.notify_all();
  return Status::Ok();
}

Result<std::string> MemoryStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = data_.end();
  const bool found = cv_.wait_until(lock, DeadlineAfter(timeout), [&] {
    it = data_.find(key);
    return it != data_.end();
  });
  if (!found) return TimedOut(timeout, {key});
  return it->second;
}

Status MemoryStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all_set = [&] {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string& key) { return data_.count(key) > 0; });
  };
  if (cv_.wait_until(lock, DeadlineAfter(timeout), all_set)) return Status::Ok();
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (data_.count(key) == 0) missing.push_back(key);
  }
  return TimedOut(timeout, missing);
}

// ---------------------------------------------------------------------------------------------
// FileStore
//
// Readers poll. The alternatives that would wake them (inotify, a lock file with fcntl waits, a
// named pipe per key) are each more code and more failure modes than a short sleep loop, and
// rendezvous happens once per membership epoch, so the few milliseconds of latency are free.

namespace {

constexpr std::chrono::milliseconds kFirstPoll(1);
constexpr std::chrono::milliseconds kMaxPoll(20);

// Sleeps before the next poll without overshooting the deadline; the interval grows so a long
// wait does not spin.
void SleepBeforeNextPoll(std::chrono::milliseconds& interval, Clock::time_point deadline) {
  const auto remaining = deadline - Clock::now();
  std::this_thread::sleep_for(std::min<Clock::duration>(interval, remaining));
  interval = std::min(interval * 2, kMaxPoll);
}

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {}

std::string FileStore::PathFor(const std::string& key) const {
  return directory_ + "/" + EncodeKey(key);
}

Status FileStore::Set(const std::string& key, std::string_view value) {
  const std::string path = PathFor(key);
  // mkstemp gives a name no other thread or process (even one in another container sharing the
  // directory, with the same pid) can be using; the leading '.' keeps it apart from key files.
  std::string tmp = directory_ + "/.tmp-XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return ErrnoError("cannot create temporary store file in", directory_, errno);
  Status status;
  {
    FdCloser closer(fd);
    // mkstemp creates the file 0600; peers running as another user must still be able to read.
    if (::fchmod(fd, 0644) != 0) {
      status = ErrnoError("cannot chmod store file", tmp, errno);
    } else {
      status = WriteAll(fd, value, tmp);
    }
  }
  // No fsync: rendezvous data only has to outlive the job's processes, not a machine crash.
  if (status.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    status = ErrnoError("cannot rename store file to", path, errno);
  }
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

Result<std::string> FileStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string path = PathFor(key);
  const auto deadline = DeadlineAfter(timeout);
  auto interval = kFirstPoll;
  for (;;) {
    Result<std::string> data = ReadFile(path);
    if (data.ok() || data.status().code() != StatusCode::kNotFound) return data;
    if (Clock::now() >= deadline) return TimedOut(timeout, {key});
    SleepBeforeNextPoll(interval, deadline);
  }
}

Status FileStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = DeadlineAfter(timeout);
  auto interval = kFirstPoll;
  for (;;) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      const std::string path = PathFor(key);
      struct stat st {};
      if (::stat(path.c_str(), &st) == 0) continue;
      if (errno != ENOENT) return ErrnoError("cannot stat store file", path, errno);
      missing.push_back(key);
    }
    if (missing.empty()) return Status::Ok();
    if (Clock::now() >= deadline) return TimedOut(timeout, missing);
    SleepBeforeNextPoll(interval, deadline);
  }
}

// ---------------------------------------------------------------------------------------------
// PrefixStore

Status PrefixStore::Set(const std::string& key, std::string_view value) {
  return inner_.Set(Key(key), value);
}

Result<std::string> PrefixStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  return inner_.Get(Key(key), timeout);
}

Status PrefixStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(Key(key));
  return inner_.Wait(prefixed, timeout);
}

}  // namespace vf
