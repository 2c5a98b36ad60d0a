#include "runtime/comm/gloo/communicator.h"

#include <netdb.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

namespace vf {
namespace {

// Carries a vf::Status through Gloo, which only understands exceptions, back to our boundary
// with its code intact. An IoException because that is what Gloo's own stores throw.
class StoreException : public gloo::IoException {
 public:
  explicit StoreException(Status status)
      : gloo::IoException(status.message()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

void ThrowIfError(Status status) {
  if (!status.ok()) throw StoreException(std::move(status));
}

// Presents a vf::Store as Gloo's rendezvous store. Gloo calls get() without a timeout and
// expects it to block until the key exists, so every call is bounded by the communicator's
// timeout instead. Thread-safe if the underlying store is.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(vf::Store& store, std::chrono::milliseconds timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    ThrowIfError(store_.Set(key, std::string_view(data.data(), data.size())));
  }

  std::vector<char> get(const std::string& key) override {
    Result<std::string> value = store_.Get(key, timeout_);
    if (!value.ok()) throw StoreException(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    ThrowIfError(store_.Wait(keys, timeout));
  }

 private:
  vf::Store& store_;
  const std::chrono::milliseconds timeout_;
};

// Gloo reports every timeout (its own and one that closed the pairs under another operation) as
// an IoException whose text says so; there is no separate exception type in this Gloo version.
bool MentionsTimeout(std::string_view what) {
  return what.find("Timed out") != std::string_view::npos ||
         what.find("timeout") != std::string_view::npos;
}

// Converts the exception being handled. Must be called from inside a catch block.
Status FromCurrentException() {
  try {
    throw;
  } catch (const StoreException& e) {
    return e.status();
  } catch (const gloo::IoException& e) {
    return MentionsTimeout(e.what()) ? DeadlineExceeded(e.what()) : Unavailable(e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return Internal(e.what());
  } catch (const std::exception& e) {
    return Internal(e.what());
  } catch (...) {
    return Internal("unknown exception from gloo");
  }
}

// Gloo writes to sockets with writev(2), which raises SIGPIPE when the peer has gone away; the
// default action would kill the whole process instead of letting the collective fail. A handler
// the application installed itself is left alone.
void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

// Gloo's device setup resolves and binds the hostname itself, but it checks getaddrinfo(3) only
// for -1 (an unresolvable name makes it read an uninitialized list) and leaks the list when no
// address can be bound. Doing the same lookup and bind here first turns both into an error.
Status CheckCanListenOn(const std::string& hostname) {
  struct addrinfo hints {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* result = nullptr;
  const int rv = getaddrinfo(hostname.c_str(), nullptr, &hints, &result);
  if (rv != 0) {
    return InvalidArgument("cannot resolve hostname '" + hostname + "': " + gai_strerror(rv));
  }
  int bind_errno = 0;
  bool bound = false;
  for (const struct addrinfo* ai = result; ai != nullptr && !bound; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      bind_errno = errno;
      continue;
    }
    bound = bind(fd, ai->ai_addr, ai->ai_addrlen) == 0;
    if (!bound) bind_errno = errno;
    close(fd);
  }
  freeaddrinfo(result);
  if (!bound) {
    return InvalidArgument("cannot listen on '" + hostname +
                           "' (is it an address of this machine?): " + std::strerror(bind_errno));
  }
  return Status::Ok();
}

// Gloo's TCP device, whose event thread (started inside CreateDevice) reads every socket.
Result<std::shared_ptr<gloo::transport::Device>> CreateTcpDevice(const std::string& hostname) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (...) {
    return FromCurrentException().WithContext("gloo device on '" + hostname + "'");
  }
}

// The device, its event thread at nice value `nice` (or the caller's, if that is higher). Gloo
// has no setting for that thread, but a thread inherits its creator's nice value: a short-lived
// thread lowers its own priority and creates the device. (The caller's thread is left alone:
// raising a priority back needs a privilege.)
Result<std::shared_ptr<gloo::transport::Device>> CreateTcpDevice(const std::string& hostname,
                                                                 int nice) {
  if (nice == 0) return CreateTcpDevice(hostname);
  Result<std::shared_ptr<gloo::transport::Device>> device =
      Internal("gloo device: its creating thread did not run");
  std::thread creator([&] {
    const auto self = static_cast<id_t>(gettid());
    errno = 0;
    const int current = getpriority(PRIO_PROCESS, self);
    if (errno == 0 && current < nice && setpriority(PRIO_PROCESS, self, nice) != 0) {
      device = Internal("gloo device: setting its event thread's nice value to " +
                        std::to_string(nice) + ": " + std::strerror(errno));
      return;
    }
    device = CreateTcpDevice(hostname);
  });
  creator.join();
  return device;
}

}  // namespace

Result<std::unique_ptr<Communicator>> GlooCommunicator::Create(Store& store, int rank, int size,
                                                               const CommOptions& options) {
  if (size < 1) {
    return InvalidArgument("gloo world size must be at least 1, got " + std::to_string(size));
  }
  if (rank < 0 || rank >= size) {
    return InvalidArgument("gloo rank " + std::to_string(rank) + " is outside a world of size " +
                           std::to_string(size));
  }
  // Zero means "no timeout" to Gloo, which would turn a dead peer into a hang.
  if (options.timeout <= std::chrono::milliseconds::zero()) {
    return InvalidArgument("gloo timeout must be positive, got " +
                           std::to_string(options.timeout.count()) + "ms");
  }
  if (options.hostname.empty()) return InvalidArgument("gloo hostname is empty");
  if (options.event_thread_nice < 0 || options.event_thread_nice > 19) {
    return InvalidArgument("gloo event thread's nice value must be 0..19, got " +
                           std::to_string(options.event_thread_nice));
  }

  const std::string where =
      "gloo rendezvous (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  VF_RETURN_IF_ERROR(CheckCanListenOn(options.hostname).WithContext(where));
  IgnoreSigpipe();

  Result<std::shared_ptr<gloo::transport::Device>> made =
      CreateTcpDevice(options.hostname, options.event_thread_nice);
  if (!made.ok()) return made.status().WithContext(where);
  std::shared_ptr<gloo::transport::Device> device = std::move(made).value();

  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    GlooStoreAdapter adapter(store, options.timeout);
    context->connectFullMesh(adapter, device);
    return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(context), rank, size));
  } catch (...) {
    return FromCurrentException().WithContext(where);
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank, int size)
    : context_(std::move(context)), rank_(rank), size_(size) {}

// Destroying the context closes the sockets, which is how peers learn that this rank left. It
// neither blocks on peers nor throws when they are already gone.
GlooCommunicator::~GlooCommunicator() = default;

std::string GlooCommunicator::Describe(std::string_view op) const {
  return "gloo " + std::string(op) + " (rank " + std::to_string(rank_) + " of " +
         std::to_string(size_) + ")";
}

Status GlooCommunicator::CheckUsable(std::string_view op) const {
  if (broken_.ok()) return Status::Ok();
  return FailedPrecondition(
             "communicator is broken after an earlier failure; rebuild it (first failure: " +
             broken_.message() + ")")
      .WithContext(Describe(op));
}

template <typename Fn>
Status GlooCommunicator::Run(std::string_view op, Fn&& run) {
  try {
    run(next_tag_++);
    return Status::Ok();
  } catch (...) {
    broken_ = FromCurrentException().WithContext(Describe(op));
  }
  // Peers still blocked in this collective would otherwise wait out their whole timeout; closed
  // connections make them fail now, and this communicator is unusable anyway. (All but a peer
  // part-way through reading a payload from this rank: Gloo 0.5 fails a broken pair's posted
  // receives, not the one it is reading into, which waits out its timeout.)
  try {
    context_->closeConnections();
  } catch (...) {
    // Already failing; the first error is the one worth reporting.
  }
  return broken_;
}

template <typename T>
Status GlooCommunicator::AllReduceImpl(T* data, size_t count, ReduceOp op) {
  VF_RETURN_IF_ERROR(CheckUsable("allreduce"));
  using ReduceFn = void (*)(void*, const void*, const void*, size_t);
  ReduceFn reduce = nullptr;
  switch (op) {
    case ReduceOp::kSum:
      reduce = static_cast<ReduceFn>(&gloo::sum<T>);
      break;
    case ReduceOp::kMax:
      reduce = static_cast<ReduceFn>(&gloo::max<T>);
      break;
  }
  if (reduce == nullptr) {
    return InvalidArgument("unknown reduce op " + std::to_string(static_cast<int>(op)))
        .WithContext(Describe("allreduce"));
  }
  // Every rank passes the same count, so all of them skip together.
  if (count == 0) return Status::Ok();
  return Run("allreduce", [&](uint32_t tag) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, count);
    opts.setReduceFunction(reduce);
    opts.setTag(tag);
    gloo::allreduce(opts);
  });
}

Status GlooCommunicator::AllReduce(int64_t* data, size_t count, ReduceOp op) {
  return AllReduceImpl(data, count, op);
}

Status GlooCommunicator::AllReduce(float* data, size_t count, ReduceOp op) {
  return AllReduceImpl(data, count, op);
}

// Gloo 0.5 has no reduce-scatter in its tag-based API (only the older algorithm classes, with
// their own buffer registration), so this is a plain ring over unbound buffers: n - 1 steps, in
// step s rank r sends shard r - s - 1 to its right-hand neighbour and adds shard r - s - 2 from
// its left-hand one into its own copy, so that after the last step shard r holds all n
// contributions. Each rank sends and receives (n - 1) / n of the buffer, like the first half of
// Gloo's ring all-reduce.
Status GlooCommunicator::ReduceScatter(int64_t* data, size_t shard, ReduceOp op) {
  VF_RETURN_IF_ERROR(CheckUsable("reduce-scatter"));
  if (op != ReduceOp::kSum && op != ReduceOp::kMax) {
    return InvalidArgument("unknown reduce op " + std::to_string(static_cast<int>(op)))
        .WithContext(Describe("reduce-scatter"));
  }
  if (size_ == 1 || shard == 0) return Status::Ok();
  if (scratch_.size() < shard) scratch_.resize(shard);
  return Run("reduce-scatter", [&](uint32_t tag) {
    // Slot prefix 0x7f: one Gloo's own collectives do not use, so no late message of theirs can
    // be matched here.
    const uint64_t slot = gloo::Slot::build(0x7f, tag);
    const size_t bytes = shard * sizeof(int64_t);
    auto out = context_->createUnboundBuffer(data, bytes * static_cast<size_t>(size_));
    auto in = context_->createUnboundBuffer(scratch_.data(), bytes);
    const int right = (rank_ + 1) % size_;
    const int left = (rank_ + size_ - 1) % size_;
    const auto timeout = context_->getTimeout();
    for (int s = 0; s + 1 < size_; ++s) {
      const size_t send_shard = static_cast<size_t>((rank_ - s - 1 + 2 * size_) % size_);
      const size_t recv_shard = static_cast<size_t>((rank_ - s - 2 + 2 * size_) % size_);
      out->send(right, slot, send_shard * bytes, bytes);
      in->recv(left, slot, 0, bytes);
      // False only after an abort, which nothing here requests; timeouts throw.
      if (!in->waitRecv(timeout)) throw gloo::IoException("reduce-scatter receive was aborted");
      int64_t* __restrict dst = data + recv_shard * shard;
      const int64_t* __restrict src = scratch_.data();
      if (op == ReduceOp::kSum) {
        // Unsigned addition: wraps like the two's-complement hardware would, without the
        // undefined behaviour of a signed overflow. Exact mode keeps sums below 2^62.
        for (size_t i = 0; i < shard; ++i) {
          dst[i] =
              static_cast<int64_t>(static_cast<uint64_t>(dst[i]) + static_cast<uint64_t>(src[i]));
        }
      } else {
        for (size_t i = 0; i < shard; ++i) dst[i] = std::max(dst[i], src[i]);
      }
      // The shard just sent is read again only as a later step's destination, after this wait.
      if (!out->waitSend(timeout)) throw gloo::IoException("reduce-scatter send was aborted");
    }
  });
}

Status GlooCommunicator::AllGather(void* data, size_t shard_bytes) {
  VF_RETURN_IF_ERROR(CheckUsable("all-gather"));
  if (size_ == 1 || shard_bytes == 0) return Status::Ok();
  return Run("all-gather", [&](uint32_t tag) {
    gloo::AllgatherOptions opts(context_);
    // No input buffer: each rank's part of the output is its input (in place).
    opts.setOutput(static_cast<uint8_t*>(data), shard_bytes * static_cast<size_t>(size_));
    opts.setTag(tag);
    gloo::allgather(opts);
  });
}

Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  VF_RETURN_IF_ERROR(CheckUsable("broadcast"));
  if (root < 0 || root >= size_) {
    return InvalidArgument("broadcast root " + std::to_string(root) +
                           " is outside a world of size " + std::to_string(size_))
        .WithContext(Describe("broadcast"));
  }
  if (bytes == 0) return Status::Ok();
  return Run("broadcast", [&](uint32_t tag) {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTag(tag);
    gloo::broadcast(opts);
  });
}

Status GlooCommunicator::Barrier() {
  VF_RETURN_IF_ERROR(CheckUsable("barrier"));
  return Run("barrier", [&](uint32_t tag) {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag);
    gloo::barrier(opts);
  });
}

Result<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store& store, int rank, int size,
                                                             const CommOptions& options) {
  return GlooCommunicator::Create(store, rank, size, options);
}

}  // namespace vf
