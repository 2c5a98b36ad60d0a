// The Gloo backend: CPU collectives over TCP between the ranks of one membership epoch.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/comm/communicator.h"
#include "runtime/status.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace vf {

// Communicator over a connected Gloo context; converts every Gloo exception into a Status and,
// after the first failed collective, refuses further work. Not thread-safe (like Communicator).
class GlooCommunicator final : public Communicator {
 public:
  // Rendezvous through `store` and a full mesh of TCP connections; see CreateGlooCommunicator.
  static Result<std::unique_ptr<Communicator>> Create(Store& store, int rank, int size,
                                                      const CommOptions& options);
  ~GlooCommunicator() override;

  GlooCommunicator(const GlooCommunicator&) = delete;
  GlooCommunicator& operator=(const GlooCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }

  Status AllReduce(int64_t* data, size_t count, ReduceOp op) override;
  Status AllReduce(float* data, size_t count, ReduceOp op) override;
  Status ReduceScatter(int64_t* data, size_t shard, ReduceOp op) override;
  Status AllGather(void* data, size_t shard_bytes) override;
  Status Broadcast(void* data, size_t bytes, int root) override;
  Status Barrier() override;

 private:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, int rank, int size);

  template <typename T>
  Status AllReduceImpl(T* data, size_t count, ReduceOp op);

  // Runs one collective; `run` receives the collective's tag. Exceptions become a Status with
  // context "gloo <op> (rank r of n)", and any failure breaks the communicator.
  template <typename Fn>
  Status Run(std::string_view op, Fn&& run);

  // "gloo <op> (rank r of n)", the context added to every error.
  std::string Describe(std::string_view op) const;
  // OK, or the kFailedPrecondition that a broken communicator answers with.
  Status CheckUsable(std::string_view op) const;

  std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int size_;
  // Every rank issues the same collectives in the same order, so equal counters give matching
  // tags without any exchange; distinct tags keep a late message from one collective from being
  // taken for the next.
  uint32_t next_tag_ = 0;
  // The first failure; OK while the communicator is usable.
  Status broken_;
  // Receive buffer of ReduceScatter, kept between calls (one shard).
  std::vector<int64_t> scratch_;
};

}  // namespace vf
