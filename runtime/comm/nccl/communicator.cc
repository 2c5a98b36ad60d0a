#include "runtime/comm/nccl/communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;

// Where rank 0 publishes the NCCL unique id (the address of its bootstrap root) for the others.
constexpr char kUniqueIdKey[] = "nccl-unique-id";

// How often initialisation and finalisation, which take milliseconds at least, are polled.
constexpr std::chrono::milliseconds kSlowPoll(1);

// Paces the polls of a collective: yields for the first 100 µs, in which a small collective on
// one node usually completes, then sleeps 50 µs between polls so that a long wait leaves the
// core to others.
class Backoff {
 public:
  void Pause() {
    if (Clock::now() - start_ < std::chrono::microseconds(100)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  const Clock::time_point start_ = Clock::now();
};

std::string CudaError(std::string_view call, cudaError_t error) {
  return std::string(call) + ": " + cudaGetErrorString(error);
}

// "<call>: <NCCL's text for result> (last NCCL error: ...)". NCCL keeps a single process-wide
// last-error string (the comm argument is unused in 2.28), so it may describe another
// communicator; it is added as a hint only.
std::string NcclError(std::string_view call, ncclResult_t result, ncclComm_t comm) {
  std::string message = std::string(call) + ": " + ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') {
    message += " (last NCCL error: ";
    message += last;
    message += ")";
  }
  return message;
}

// What a failed initialisation returns. NCCL's refusals of the communicator itself (invalid
// usage or argument: two ranks on one GPU, say) come back the same on every try, so they are
// kInvalidArgument, which ends the job with NCCL's reason rather than have the worker report it
// and be planned into the same refusal again; anything else (a peer that died, a network error)
// is kUnavailable, and a new plan may well succeed.
Status InitFailed(std::string_view call, ncclResult_t result, ncclComm_t comm) {
  std::string message = NcclError(call, result, comm);
  if (result != ncclInvalidUsage && result != ncclInvalidArgument) return Unavailable(message);
  return InvalidArgument("NCCL refused the communicator: " + message);
}

// Where each rank whose initialisation NCCL refused publishes its GpuIdentity.
std::string GpuKey(int rank) { return "nccl-refused-gpu/" + std::to_string(rank); }

// How long a refused rank waits for the others' GpuIdentity: they publish it as soon as NCCL
// refuses them too, which it does at the same point of the bootstrap for every rank.
constexpr std::chrono::milliseconds kGpuIdentityWait(5000);

// "<host>|<PCI bus id>": two ranks with the same identity are one GPU to NCCL, which then
// refuses them both. The host is told apart as NCCL does: by NCCL_HOSTID where it is set, else
// by the host name and the kernel's boot id. Empty where CUDA cannot name the device.
std::string GpuIdentity(int device) {
  char bus_id[64] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  std::string host;
  if (const char* id = std::getenv("NCCL_HOSTID"); id != nullptr && id[0] != '\0') {
    host = id;
  } else {
    char name[256] = {};
    (void)gethostname(name, sizeof(name) - 1);
    host = name;
    std::ifstream boot("/proc/sys/kernel/random/boot_id");
    std::string boot_id;
    if (boot >> boot_id) host += "/" + boot_id;
  }
  return host + "|" + bus_id;
}

// `refused` (NCCL's kInvalidArgument from Init) with the advice to give each worker a GPU where
// some ranks of the world share this rank's GPU. NCCL says so in its last-error text only
// sometimes (with several ranks in a process, another rank's later warning replaces it), so the
// ranks compare their GPUs themselves, through `store`: each refused rank publishes its
// GpuIdentity and reads the others'.
Status WithSharedGpuAdvice(Status refused, Store& store, int rank, int size, int device,
                           std::chrono::milliseconds timeout) {
  const std::string mine = GpuIdentity(device);
  std::vector<int> sharing;
  if (!mine.empty() && store.Set(GpuKey(rank), mine).ok()) {
    const Clock::time_point deadline = Clock::now() + std::min(timeout, kGpuIdentityWait);
    for (int other = 0; other < size; ++other) {
      if (other == rank) continue;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          std::max(deadline - Clock::now(), Clock::duration(std::chrono::milliseconds(1))));
      Result<std::string> theirs = store.Get(GpuKey(other), left);
      if (theirs.ok() && *theirs == mine) sharing.push_back(other);
    }
  }
  const bool nccl_says_so = refused.message().find("Duplicate GPU") != std::string::npos;
  if (sharing.empty() && !nccl_says_so) return refused;
  std::string advice = "; NCCL takes one rank per GPU, and ";
  if (sharing.empty()) {
    advice += "these workers share one";
  } else {
    advice += "this rank shares GPU " + mine.substr(mine.rfind('|') + 1) + " with rank";
    if (sharing.size() > 1) advice += "s";
    for (size_t i = 0; i < sharing.size(); ++i) {
      advice += (i == 0 ? " " : ", ") + std::to_string(sharing[i]);
    }
  }
  advice += ": give each worker a GPU of its own, or reduce through Gloo";
  return InvalidArgument(std::string(refused.message()) + advice);
}

std::string Millis(std::chrono::milliseconds timeout) {
  return std::to_string(timeout.count()) + " ms";
}

// Makes `device` current on this thread, or says why there is no such GPU.
Status UseDevice(int device) {
  int count = 0;
  cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // Not sticky; keep it from surfacing in an unrelated later call.
    return FailedPrecondition("no CUDA device: " + CudaError("cudaGetDeviceCount", error));
  }
  if (count <= 0) return FailedPrecondition("no CUDA device: cudaGetDeviceCount found none");
  if (device >= count) {
    return FailedPrecondition("no CUDA device " + std::to_string(device) + ": this machine has " +
                              std::to_string(count));
  }
  error = cudaSetDevice(device);
  if (error != cudaSuccess) {
    return Unavailable(CudaError("cudaSetDevice(" + std::to_string(device) + ")", error));
  }
  return Status::Ok();
}

template <typename T>
constexpr ncclDataType_t kNcclType = ncclNumTypes;  // Only the specializations below are used.
template <>
constexpr ncclDataType_t kNcclType<int64_t> = ncclInt64;
template <>
constexpr ncclDataType_t kNcclType<float> = ncclFloat32;

// NCCL's operation for `op`, or ncclNumOps for a value outside the enum.
ncclRedOp_t ToNcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclNumOps;
}

}  // namespace

Result<std::unique_ptr<Communicator>> NcclCommunicator::Create(Store& store, int rank, int size,
                                                               const CommOptions& options,
                                                               int cuda_device) {
  if (size < 1) {
    return InvalidArgument("nccl world size must be at least 1, got " + std::to_string(size));
  }
  if (rank < 0 || rank >= size) {
    return InvalidArgument("nccl rank " + std::to_string(rank) + " is outside a world of size " +
                           std::to_string(size));
  }
  // Nothing would bound the waits otherwise.
  if (options.timeout <= std::chrono::milliseconds::zero()) {
    return InvalidArgument("nccl timeout must be positive, got " +
                           std::to_string(options.timeout.count()) + "ms");
  }
  if (cuda_device < 0) {
    return InvalidArgument("nccl CUDA device must not be negative, got " +
                           std::to_string(cuda_device));
  }

  const std::string where =
      "nccl init (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  std::string unique_id;
  if (rank == 0) {
    // Without a GPU there is nothing to publish: the other ranks then time out on the store
    // instead of joining a bootstrap root that nobody will use.
    VF_RETURN_IF_ERROR(UseDevice(cuda_device).WithContext(where));
    ncclUniqueId id;
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result != ncclSuccess) {
      return Unavailable(NcclError("ncclGetUniqueId", result, nullptr)).WithContext(where);
    }
    unique_id.assign(id.internal, sizeof(id.internal));
    VF_RETURN_IF_ERROR(store.Set(kUniqueIdKey, unique_id).WithContext(where));
  } else {
    // The store comes before any CUDA call, so a rank whose peers never arrive reports that (as
    // kDeadlineExceeded) whether or not this machine has a GPU.
    Result<std::string> value = store.Get(kUniqueIdKey, options.timeout);
    if (!value.ok()) return value.status().WithContext(where);
    if (value->size() != sizeof(ncclUniqueId)) {
      return DataLoss("store key '" + std::string(kUniqueIdKey) + "' holds " +
                      std::to_string(value->size()) + " bytes, not the " +
                      std::to_string(sizeof(ncclUniqueId)) + " of an ncclUniqueId")
          .WithContext(where);
    }
    unique_id = std::move(value).value();
    VF_RETURN_IF_ERROR(UseDevice(cuda_device).WithContext(where));
  }

  // The destructor releases whatever Init got before it failed.
  std::unique_ptr<NcclCommunicator> comm(
      new NcclCommunicator(rank, size, cuda_device, options.timeout));
  Status init = comm->Init(unique_id);
  if (init.code() == StatusCode::kInvalidArgument) {
    init = WithSharedGpuAdvice(std::move(init), store, rank, size, cuda_device, options.timeout);
  }
  VF_RETURN_IF_ERROR(init.WithContext(where));
  return std::unique_ptr<Communicator>(std::move(comm));
}

NcclCommunicator::NcclCommunicator(int rank, int size, int device,
                                   std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), device_(device), timeout_(timeout) {}

Status NcclCommunicator::Init(const std::string& unique_id) {
  cudaStream_t stream = nullptr;
  cudaError_t error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (error != cudaSuccess) return Unavailable(CudaError("cudaStreamCreateWithFlags", error));
  stream_ = stream;
  void* scratch = nullptr;
  error = cudaMalloc(&scratch, sizeof(int64_t));
  if (error != cudaSuccess) return Unavailable(CudaError("cudaMalloc", error));
  scratch_ = static_cast<int64_t*>(scratch);
  // Zero on every rank, so the sums of Barrier stay zero. Queued on stream_, ahead of them.
  error = cudaMemsetAsync(scratch_, 0, sizeof(int64_t), stream_);
  if (error != cudaSuccess) return Unavailable(CudaError("cudaMemsetAsync", error));

  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking: the call returns at once (normally ncclInProgress) and NCCL connects to the
  // other ranks on a thread of its own, which is what lets a missing peer become a timeout.
  config.blocking = 0;

  const Clock::time_point deadline = Clock::now() + timeout_;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    Status status = InitFailed("ncclCommInitRankConfig", result, comm);
    // NCCL 2.28 frees the communicator itself and returns null when the call fails outright;
    // anything it did hand back is aborted so that its threads stop.
    if (comm != nullptr) (void)ncclCommAbort(comm);
    return status;
  }
  comm_ = comm;

  // Until the state leaves ncclInProgress, no other call may be made on the communicator.
  while (true) {
    ncclResult_t state = ncclInProgress;
    result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) {
      return Break(Unavailable(NcclError("ncclCommGetAsyncError", result, comm_)));
    }
    if (state == ncclSuccess) return Status::Ok();
    if (state != ncclInProgress) {
      return Break(InitFailed("ncclCommInitRankConfig", state, comm_));
    }
    if (Clock::now() >= deadline) {
      return Break(DeadlineExceeded("timed out after " + Millis(timeout_) +
                                    " waiting for the other " + std::to_string(size_ - 1) +
                                    " rank(s) to join the NCCL communicator"));
    }
    std::this_thread::sleep_for(kSlowPoll);
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr && stream_ == nullptr && scratch_ == nullptr) return;
  (void)cudaSetDevice(device_);
  if (comm_ != nullptr) {
    // Finalize flushes this rank's outstanding work and stops its proxy; in non-blocking mode
    // it returns ncclInProgress and completes on a thread of NCCL's. It needs no peer, but it is
    // bounded anyway: a communicator that does not quiesce in time is aborted instead.
    bool finalized = false;
    ncclResult_t result = ncclCommFinalize(comm_);
    if (result == ncclSuccess || result == ncclInProgress) {
      const Clock::time_point deadline = Clock::now() + timeout_;
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < deadline) {
        std::this_thread::sleep_for(kSlowPoll);
      }
      finalized = state == ncclSuccess;
    }
    // Destroy and abort are blocking even on a non-blocking communicator. Destroy refuses a
    // communicator in an error state (without freeing it); abort frees one in any state.
    if (finalized) {
      (void)ncclCommDestroy(comm_);
    } else {
      (void)ncclCommAbort(comm_);
    }
    comm_ = nullptr;
  }
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  if (scratch_ != nullptr) (void)cudaFree(scratch_);
  if (staging_ != nullptr) (void)cudaFree(staging_);
}

std::string NcclCommunicator::Describe(std::string_view op) const {
  return "nccl " + std::string(op) + " (rank " + std::to_string(rank_) + " of " +
         std::to_string(size_) + ")";
}

Status NcclCommunicator::CheckUsable(std::string_view op) const {
  if (broken_.ok()) return Status::Ok();
  return FailedPrecondition(
             "communicator is broken after an earlier failure; rebuild it (first failure: " +
             broken_.message() + ")")
      .WithContext(Describe(op));
}

Result<bool> NcclCommunicator::IsHostBuffer(std::string_view op, const void* data) const {
  if (data == nullptr) return InvalidArgument("buffer is null").WithContext(Describe(op));
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, data);
  if (error != cudaSuccess) {
    (void)cudaGetLastError();  // Not sticky; keep it from surfacing in an unrelated later call.
    return InvalidArgument("cannot tell where the buffer lives: " +
                           CudaError("cudaPointerGetAttributes", error))
        .WithContext(Describe(op));
  }
  if (attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost) {
    return true;
  }
  if (attributes.type == cudaMemoryTypeManaged) return false;
  if (attributes.device != device_) {
    return InvalidArgument("buffer is memory of CUDA device " + std::to_string(attributes.device) +
                           ", not of this communicator's device " + std::to_string(device_))
        .WithContext(Describe(op));
  }
  return false;
}

Result<void*> NcclCommunicator::Staging(std::string_view op, size_t bytes) {
  if (bytes <= staging_bytes_) return staging_;
  if (staging_ != nullptr) (void)cudaFree(staging_);
  staging_ = nullptr;
  staging_bytes_ = 0;
  const cudaError_t error = cudaMalloc(&staging_, bytes);
  if (error != cudaSuccess) {
    staging_ = nullptr;
    (void)cudaGetLastError();
    return Unavailable(CudaError("cudaMalloc of the staging buffer", error))
        .WithContext(Describe(op));
  }
  staging_bytes_ = bytes;
  return staging_;
}

template <typename Fn>
Status NcclCommunicator::RunOn(std::string_view op, void* data, size_t bytes, Fn&& enqueue) {
  VF_ASSIGN_OR_RETURN(const bool host, IsHostBuffer(op, data));
  if (!host) return Run(op, [&] { return enqueue(data); });
  // Small host buffers (the step header, state metadata) travel through device memory of the
  // communicator's own: copied in, reduced or broadcast there, copied back.
  VF_ASSIGN_OR_RETURN(void* device, Staging(op, bytes));
  cudaError_t error = cudaMemcpy(device, data, bytes, cudaMemcpyHostToDevice);
  if (error != cudaSuccess) {
    return Break(Unavailable(CudaError("cudaMemcpy to the staging buffer", error))
                     .WithContext(Describe(op)));
  }
  VF_RETURN_IF_ERROR(Run(op, [&] { return enqueue(device); }));
  error = cudaMemcpy(data, device, bytes, cudaMemcpyDeviceToHost);
  if (error != cudaSuccess) {
    return Break(Unavailable(CudaError("cudaMemcpy from the staging buffer", error))
                     .WithContext(Describe(op)));
  }
  return Status::Ok();
}

Status NcclCommunicator::Break(Status status) {
  broken_ = status;
  if (comm_ != nullptr) {
    // Sets NCCL's abort flags, which the GPU kernels and NCCL's threads poll, so nothing of this
    // communicator stays stuck waiting for a dead peer; then frees it. Blocking.
    (void)cudaSetDevice(device_);
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }
  return status;
}

template <typename Fn>
Status NcclCommunicator::Run(std::string_view op, Fn&& enqueue) {
  const Clock::time_point deadline = Clock::now() + timeout_;
  const auto timed_out = [&](std::string_view waiting_for) {
    return Break(DeadlineExceeded("timed out after " + Millis(timeout_) + " waiting for " +
                                  std::string(waiting_for) + " (did a peer die or fall behind?)")
                     .WithContext(Describe(op)));
  };

  const cudaError_t set_error = cudaSetDevice(device_);
  if (set_error != cudaSuccess) {
    return Break(Unavailable(CudaError("cudaSetDevice", set_error)).WithContext(Describe(op)));
  }
  // The buffer was written by kernels on other streams (the device's own); the communicator's
  // stream is not ordered after them, so wait for all of this GPU's work first.
  const cudaError_t sync_error = cudaDeviceSynchronize();
  if (sync_error != cudaSuccess) {
    return Break(
        Unavailable(CudaError("cudaDeviceSynchronize", sync_error)).WithContext(Describe(op)));
  }

  // A non-blocking communicator may finish queuing the operation (connection setup, the launch)
  // on a thread of NCCL's and return ncclInProgress; no other call may be made on it until its
  // state leaves ncclInProgress.
  ncclResult_t result = enqueue();
  Backoff enqueue_backoff;
  while (result == ncclInProgress) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    result = query != ncclSuccess ? query : state;
    if (result == ncclInProgress) {
      if (Clock::now() >= deadline) return timed_out("NCCL to queue the operation");
      enqueue_backoff.Pause();
    }
  }
  if (result != ncclSuccess) {
    return Break(
        Unavailable(NcclError("queuing the operation", result, comm_)).WithContext(Describe(op)));
  }

  // Then the GPU. NCCL notices some failures itself (a network peer that went away, reported
  // through the async error); a peer that simply stops shows only as a collective that never
  // completes, hence the deadline.
  Backoff backoff;
  while (true) {
    const cudaError_t error = cudaStreamQuery(stream_);
    if (error == cudaSuccess) return Status::Ok();
    if (error != cudaErrorNotReady) {
      return Break(Unavailable(CudaError("cudaStreamQuery", error)).WithContext(Describe(op)));
    }
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) state = query;
    if (state != ncclSuccess && state != ncclInProgress) {
      return Break(Unavailable(NcclError("NCCL reported an asynchronous error", state, comm_))
                       .WithContext(Describe(op)));
    }
    if (Clock::now() >= deadline) return timed_out("the collective to complete");
    backoff.Pause();
  }
}

template <typename T>
Status NcclCommunicator::AllReduceImpl(T* data, size_t count, ReduceOp op) {
  VF_RETURN_IF_ERROR(CheckUsable("allreduce"));
  const ncclRedOp_t nccl_op = ToNcclOp(op);
  if (nccl_op == ncclNumOps) {
    return InvalidArgument("unknown reduce op " + std::to_string(static_cast<int>(op)))
        .WithContext(Describe("allreduce"));
  }
  // Every rank passes the same count, so all of them skip together.
  if (count == 0) return Status::Ok();
  return RunOn("allreduce", data, count * sizeof(T), [&](void* buffer) {
    return ncclAllReduce(buffer, buffer, count, kNcclType<T>, nccl_op, comm_, stream_);
  });
}

Status NcclCommunicator::AllReduce(int64_t* data, size_t count, ReduceOp op) {
  return AllReduceImpl(data, count, op);
}

Status NcclCommunicator::AllReduce(float* data, size_t count, ReduceOp op) {
  return AllReduceImpl(data, count, op);
}

Status NcclCommunicator::ReduceScatter(int64_t* data, size_t shard, ReduceOp op) {
  VF_RETURN_IF_ERROR(CheckUsable("reduce-scatter"));
  const ncclRedOp_t nccl_op = ToNcclOp(op);
  if (nccl_op == ncclNumOps) {
    return InvalidArgument("unknown reduce op " + std::to_string(static_cast<int>(op)))
        .WithContext(Describe("reduce-scatter"));
  }
  if (shard == 0) return Status::Ok();
  const size_t bytes = shard * sizeof(int64_t) * static_cast<size_t>(size_);
  // In place: NCCL's in-place form receives into the rank's own shard of the send buffer.
  return RunOn("reduce-scatter", data, bytes, [&](void* buffer) {
    int64_t* all = static_cast<int64_t*>(buffer);
    return ncclReduceScatter(all, all + static_cast<size_t>(rank_) * shard, shard, ncclInt64,
                             nccl_op, comm_, stream_);
  });
}

Status NcclCommunicator::AllGather(void* data, size_t shard_bytes) {
  VF_RETURN_IF_ERROR(CheckUsable("all-gather"));
  if (shard_bytes == 0) return Status::Ok();
  const size_t bytes = shard_bytes * static_cast<size_t>(size_);
  // In place: the rank's own shard of the output is the input.
  return RunOn("all-gather", data, bytes, [&](void* buffer) {
    uint8_t* all = static_cast<uint8_t*>(buffer);
    return ncclAllGather(all + static_cast<size_t>(rank_) * shard_bytes, all, shard_bytes,
                         ncclUint8, comm_, stream_);
  });
}

Status NcclCommunicator::Broadcast(void* data, size_t bytes, int root) {
  VF_RETURN_IF_ERROR(CheckUsable("broadcast"));
  if (root < 0 || root >= size_) {
    return InvalidArgument("broadcast root " + std::to_string(root) +
                           " is outside a world of size " + std::to_string(size_))
        .WithContext(Describe("broadcast"));
  }
  if (bytes == 0) return Status::Ok();
  // In place: NCCL reads the root's buffer and writes everyone else's.
  return RunOn("broadcast", data, bytes, [&](void* buffer) {
    return ncclBroadcast(buffer, buffer, bytes, ncclUint8, root, comm_, stream_);
  });
}

Status NcclCommunicator::Barrier() {
  VF_RETURN_IF_ERROR(CheckUsable("barrier"));
  // No rank's all-reduce completes before every rank has contributed to it.
  return Run("barrier", [&] {
    return ncclAllReduce(scratch_, scratch_, 1, ncclInt64, ncclSum, comm_, stream_);
  });
}

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Store& store, int rank, int size,
                                                             const CommOptions& options,
                                                             int cuda_device) {
  return NcclCommunicator::Create(store, rank, size, options, cuda_device);
}

}  // namespace vf
