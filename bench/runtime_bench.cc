// vf-bench: the runtime's benchmarks. Each prints a ratio measured within one run against a
// baseline from the same run, so results compare across machines.
//
//   vf-bench vnode-overhead   one worker, same global batch, V=8 vs V=1: time per step
//   vf-bench reduction        4 Gloo workers: all-reduce time, exact vs fast, and MLP step time
//   vf-bench memory           peak RSS of one worker at two global batches, same micro-batch
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cli/flags.h"
#include "runtime/executor.h"

namespace vf {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

JobSpec MlpJob(int virtual_nodes, int64_t global_batch, Reduction mode) {
  JobSpec j;
  j.name = "bench";
  j.virtual_nodes = virtual_nodes;
  j.global_batch_size = global_batch;
  j.replicas_max = virtual_nodes;
  j.steps = 1000000;
  j.reduction = mode;
  j.seed = 1;
  return j;
}

void Check(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "vf-bench: error: %s\n", s.message().c_str());
    std::exit(1);
  }
}
template <typename T>
T Check(Result<T> r) {
  Check(r.status());
  return std::move(r).value();
}

// Median seconds per step of `job` on one worker (after warm-up steps that settle the scale).
double TimePerStep(const JobSpec& job, const Dataset& train, int steps, int repeats) {
  auto dev = CreateCpuDevice(1);
  auto comm = CreateLocalCommunicator();
  auto ex = Check(Executor::Create(job, *dev, train));
  Check(ex->InitializeFresh());
  std::vector<int> all(static_cast<size_t>(job.virtual_nodes));
  for (int v = 0; v < job.virtual_nodes; ++v) all[static_cast<size_t>(v)] = v;
  for (int i = 0; i < 3; ++i) Check(ex->Step(*comm, all).status());
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) Check(ex->Step(*comm, all).status());
    samples.push_back(Seconds(t0, Clock::now()) / steps);
  }
  return Median(samples);
}

int VnodeOverhead(const Dataset& train, int steps, int repeats) {
  std::printf(
      "virtual-node overhead: one worker, exact reduction, V=8 vs V=1 at equal global "
      "batch (median of %d x %d steps)\n",
      repeats, steps);
  std::printf("%12s %12s %14s %14s %8s\n", "global batch", "micro (V=8)", "V=1 ms/step",
              "V=8 ms/step", "ratio");
  for (int64_t b : {256, 512, 1024, 2048}) {
    const double t1 = TimePerStep(MlpJob(1, b, Reduction::kExact), train, steps, repeats);
    const double t8 = TimePerStep(MlpJob(8, b, Reduction::kExact), train, steps, repeats);
    std::printf("%12lld %12lld %14.2f %14.2f %8.3f\n", static_cast<long long>(b),
                static_cast<long long>(b / 8), 1e3 * t1, 1e3 * t8, t8 / t1);
  }
  return 0;
}

// Runs `body(rank, comm, device)` on `ranks` threads that share a Gloo world.
template <typename Body>
void OnRanks(int ranks, Body body) {
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto dev = CreateCpuDevice(1);
      auto comm = Check(CreateGlooCommunicator(store, r, ranks, CommOptions{}));
      body(r, *comm, *dev);
    });
  }
  for (auto& t : threads) t.join();
}

// Median seconds of one reducer Finish (all of its collectives and conversions) of `n` values.
double ReduceTime(Reduction mode, size_t n, int ranks, int repeats) {
  std::vector<double> times(static_cast<size_t>(ranks));
  OnRanks(ranks, [&](int r, Communicator& comm, Device& dev) {
    const size_t sizes[] = {n};
    auto red = Check(CreateReducer(mode, dev, MakeBuckets(sizes, size_t{1} << 20), 8));
    auto grad = Check(DeviceBuffer<float>::Create(dev, n));
    for (size_t i = 0; i < n; ++i) grad.data()[i] = 1e-3f * static_cast<float>(i % 97) - 0.05f;
    auto out = Check(DeviceBuffer<float>::Create(dev, n));
    std::vector<double> samples;
    for (int i = 0; i < repeats + 2; ++i) {
      red->Begin();
      Check(red->Add(grad.data(), LossStats{}));
      Check(comm.Barrier());
      const auto t0 = Clock::now();
      auto res = Check(red->Finish(comm, {}, out.data()));
      const double t = Seconds(t0, Clock::now());
      if (!res.redo && i >= 2) samples.push_back(t);
    }
    times[static_cast<size_t>(r)] = Median(samples);
  });
  return *std::max_element(times.begin(), times.end());
}

// Median seconds per MLP step on `ranks` Gloo workers.
double StepTime(Reduction mode, const Dataset& train, int ranks, int steps, int64_t batch) {
  const JobSpec job = MlpJob(8, batch, mode);
  const auto assignment = EvenAssignment(job.virtual_nodes, ranks);
  std::vector<double> times(static_cast<size_t>(ranks));
  OnRanks(ranks, [&](int r, Communicator& comm, Device& dev) {
    auto ex = Check(Executor::Create(job, dev, train));
    Check(ex->InitializeFresh());
    const auto& mine = assignment[static_cast<size_t>(r)];
    for (int i = 0; i < 3; ++i) Check(ex->Step(comm, mine).status());
    std::vector<double> samples;
    for (int i = 0; i < steps; ++i) {
      const auto t0 = Clock::now();
      Check(ex->Step(comm, mine).status());
      samples.push_back(Seconds(t0, Clock::now()));
    }
    times[static_cast<size_t>(r)] = Median(samples);
  });
  return *std::max_element(times.begin(), times.end());
}

int RunReductionBench(const Dataset& train, int ranks, int repeats, int steps) {
  std::printf("exact vs fast reduction: %d Gloo workers over loopback (threads of one process)\n",
              ranks);
  std::printf("%-34s %12s %12s %8s\n", "measure", "fast ms", "exact ms", "ratio");
  for (size_t n : {size_t{535818}, size_t{25000000}}) {
    const int reps = n > 1000000 ? std::max(3, repeats / 5) : repeats;
    const double fast = ReduceTime(Reduction::kFast, n, ranks, reps);
    const double exact = ReduceTime(Reduction::kExact, n, ranks, reps);
    std::printf("%-34s %12.2f %12.2f %8.3f\n",
                ("all-reduce of " + std::to_string(n) + " values").c_str(), 1e3 * fast, 1e3 * exact,
                exact / fast);
  }
  for (int64_t batch : {256, 1024}) {
    const double fast = StepTime(Reduction::kFast, train, ranks, steps, batch);
    const double exact = StepTime(Reduction::kExact, train, ranks, steps, batch);
    std::printf("%-34s %12.2f %12.2f %8.3f\n",
                ("MLP step (B=" + std::to_string(batch) + ", V=8)").c_str(), 1e3 * fast,
                1e3 * exact, exact / fast);
  }
  return 0;
}

// Child process: trains `steps` steps at the given batch and exits; the parent reads its
// peak resident set size.
int MemoryChild(const Dataset& train, int virtual_nodes, int64_t global_batch, int steps) {
  (void)TimePerStep(MlpJob(virtual_nodes, global_batch, Reduction::kExact), train, steps, 1);
  return 0;
}

long PeakRssKiB(const std::string& self, int virtual_nodes, int64_t global_batch) {
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string v = std::to_string(virtual_nodes);
    const std::string b = std::to_string(global_batch);
    execl(self.c_str(), self.c_str(), "memory-child", "--virtual-nodes", v.c_str(),
          "--global-batch", b.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "vf-bench: memory child failed\n");
    std::exit(1);
  }
  return usage.ru_maxrss;
}

int Memory(const std::string& self) {
  std::printf("peak memory of one worker (RSS, includes the resident dataset)\n");
  std::printf("%8s %14s %12s %14s\n", "V", "global batch", "micro-batch", "peak RSS MiB");
  struct Case {
    int v;
    int64_t b;
  };
  std::vector<long> rss;
  for (Case c : {Case{8, 256}, Case{128, 4096}, Case{8, 4096}}) {
    const long kib = PeakRssKiB(self, c.v, c.b);
    rss.push_back(kib);
    std::printf("%8d %14lld %12lld %14.1f\n", c.v, static_cast<long long>(c.b),
                static_cast<long long>(c.b / c.v), static_cast<double>(kib) / 1024.0);
  }
  std::printf("ratio, global batch 16x at equal micro-batch: %.3f\n",
              static_cast<double>(rss[1]) / static_cast<double>(rss[0]));
  std::printf("ratio, micro-batch 16x at equal global batch: %.3f\n",
              static_cast<double>(rss[2]) / static_cast<double>(rss[1]));
  return 0;
}

}  // namespace
}  // namespace vf

int main(int argc, char** argv) {
  using namespace vf;
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: vf-bench vnode-overhead|reduction|memory|checkpoint-write [--help]\n");
    return 2;
  }
  const std::string cmd = argv[1];
  int64_t steps = 20, repeats = 5, ranks = 4, virtual_nodes = 8, global_batch = 256;
  std::string dataset = "/usr/share/datasets/fashion-mnist";
  std::string checkpoint;
  FlagParser flags("usage: vf-bench vnode-overhead|reduction|memory [options]");
  flags.AddInt("steps", &steps, "steps per measurement (default 20)");
  flags.AddInt("repeats", &repeats, "measurements per point; the median is reported (default 5)");
  flags.AddInt("workers", &ranks, "Gloo workers for `reduction` (default 4)");
  flags.AddInt("virtual-nodes", &virtual_nodes, "memory-child only");
  flags.AddInt("global-batch", &global_batch, "memory-child only");
  flags.AddString("dataset", &dataset, "Fashion-MNIST directory");
  flags.AddString("checkpoint", &checkpoint, "checkpoint-write: the checkpoint to copy");
  auto pos = flags.Parse(argc, argv, 2);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (!pos.ok()) {
    std::fprintf(stderr, "vf-bench: error: %s\n", pos.status().message().c_str());
    return 2;
  }
  if (cmd == "checkpoint-write") dataset.clear();
  auto data = dataset.empty() ? Result<DatasetSplits>(DatasetSplits{}) : LoadFashionMnist(dataset);
  if (!data.ok()) {
    std::fprintf(stderr, "vf-bench: error: %s\n", data.status().message().c_str());
    return 1;
  }
  const Dataset& train = data->train;
  if (cmd == "vnode-overhead") {
    return VnodeOverhead(train, static_cast<int>(steps), static_cast<int>(repeats));
  }
  if (cmd == "reduction") {
    return RunReductionBench(train, static_cast<int>(ranks), static_cast<int>(repeats),
                             static_cast<int>(steps));
  }
  if (cmd == "memory") return Memory(argv[0]);
  if (cmd == "checkpoint-write") {
    // Seconds to write a checkpoint the size of `--checkpoint`'s state, as the agent does.
    auto state = ReadCheckpoint(checkpoint);
    if (!state.ok()) {
      std::fprintf(stderr, "vf-bench: error: %s\n", state.status().message().c_str());
      return 1;
    }
    const std::string out = checkpoint + ".bench";
    const auto t0 = Clock::now();
    const Status s = WriteCheckpoint(out, *state);
    const double seconds = Seconds(t0, Clock::now());
    std::remove(out.c_str());
    if (!s.ok()) {
      std::fprintf(stderr, "vf-bench: error: %s\n", s.message().c_str());
      return 1;
    }
    std::printf("checkpoint write seconds %.4f\n", seconds);
    return 0;
  }
  if (cmd == "memory-child") {
    return MemoryChild(train, static_cast<int>(virtual_nodes), global_batch, 5);
  }
  std::fprintf(stderr, "vf-bench: unknown benchmark '%s'\n", cmd.c_str());
  return 2;
}
