// vf-bench: the runtime's benchmarks. Each prints a ratio measured within one run against a
// baseline from the same run, so results compare across machines.
//
//   vf-bench vnode-overhead   one worker, same global batch, V nodes vs 1: time per step
//   vf-bench reduction        4 Gloo workers: all-reduce time, exact vs fast, and MLP step time
//   vf-bench memory           peak memory of one worker at two global batches, same micro-batch
//   vf-bench throughput       samples per second of one worker at one configuration
//   vf-bench products         the MLP's matrix products alone, V micro-batches vs 1 batch
// --device cuda runs vnode-overhead, products, memory and throughput on the GPU.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/command_line.h"
#include "runtime/executor.h"
#include "runtime/split.h"

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

// What one single-worker measurement runs on.
struct Setup {
  std::string device = "cpu";  // cpu or cuda
  Reduction reduction = Reduction::kExact;
  int steps = 20;   // per measurement
  int repeats = 5;  // measurements; the median is reported
  DeviceTuning tuning;
};

// `kind` is cpu or cuda (main checks it).
std::unique_ptr<Device> MakeDevice(const std::string& kind, const DeviceTuning& tuning = {}) {
  auto device = kind == "cuda" ? Check(CreateCudaDevice(0)) : CreateCpuDevice(1);
  device->Tune(tuning);
  return device;
}

// One worker running all of a job's virtual nodes, ready to be timed.
class Worker {
 public:
  Worker(const JobSpec& job, const Dataset& train, const Setup& setup)
      : device_(MakeDevice(setup.device, setup.tuning)),
        comm_(CreateLocalCommunicator()),
        executor_(Check(Executor::Create(job, *device_, train))),
        all_(static_cast<size_t>(job.virtual_nodes)) {
    Check(executor_->InitializeFresh());
    for (int v = 0; v < job.virtual_nodes; ++v) all_[static_cast<size_t>(v)] = v;
    Run(3);  // warm-up: settles the exact reducer's scale and the caches
  }

  // Seconds per step over `steps` steps.
  double Run(int steps) {
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) Check(executor_->Step(*comm_, all_).status());
    device_->Synchronize();
    const double seconds = Seconds(t0, Clock::now()) / steps;
    peak_device_bytes_ = std::max(peak_device_bytes_, device_->MemoryInUse());
    return seconds;
  }

  // Largest Device::MemoryInUse() seen after a run.
  size_t peak_device_bytes() const { return peak_device_bytes_; }
  std::string weights_sha256() const { return executor_->WeightsSha256(); }

 private:
  std::unique_ptr<Device> device_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Executor> executor_;
  std::vector<int> all_;
  size_t peak_device_bytes_ = 0;
};

// Median seconds per step of `job` on one worker.
double TimePerStep(const JobSpec& job, const Dataset& train, const Setup& setup) {
  Worker w(job, train, setup);
  std::vector<double> samples;
  for (int r = 0; r < setup.repeats; ++r) samples.push_back(w.Run(setup.steps));
  return Median(samples);
}

int VnodeOverhead(const Dataset& train, const Setup& setup, int virtual_nodes,
                  const std::vector<int64_t>& micro_batches) {
  std::printf(
      "virtual-node overhead: one worker on %s, %s reduction, V=%d vs V=1 at equal global "
      "batch; the two alternate, %d rounds of %d steps each, medians\n",
      MakeDevice(setup.device)->Name().c_str(), ReductionName(setup.reduction), virtual_nodes,
      setup.repeats, setup.steps);
  std::printf("%12s %12s %14s %14s %8s\n", "global batch", "micro-batch", "V=1 ms/step",
              ("V=" + std::to_string(virtual_nodes) + " ms/step").c_str(), "ratio");
  for (int64_t micro : micro_batches) {
    const int64_t b = micro * virtual_nodes;
    // Alternating the two jobs round by round, and taking the median of the rounds' ratios,
    // keeps a slow spell of the machine from landing on one side only.
    Worker one(MlpJob(1, b, setup.reduction), train, setup);
    Worker many(MlpJob(virtual_nodes, b, setup.reduction), train, setup);
    std::vector<double> t1, tv, ratio;
    for (int r = 0; r < setup.repeats; ++r) {
      t1.push_back(one.Run(setup.steps));
      tv.push_back(many.Run(setup.steps));
      ratio.push_back(tv.back() / t1.back());
    }
    std::printf("%12lld %12lld %14.3f %14.3f %8.3f\n", static_cast<long long>(b),
                static_cast<long long>(micro), 1e3 * Median(t1), 1e3 * Median(tv), Median(ratio));
  }
  return 0;
}

// The device's optional speed-ups (DeviceTuning), each measured by turning it over: one worker
// runs the same job under every configuration, round by round, and the final weights of all of
// them must be the same bits (a speed-up may change how work is issued, never its results).
int Tuning(const Dataset& train, const Setup& setup, int virtual_nodes, int64_t global_batch) {
  struct Config {
    const char* name;
    DeviceTuning tuning;
  };
  const DeviceTuning defaults;
  DeviceTuning no_record = defaults, no_fused = defaults, pinned = defaults, one_lane = defaults,
               none;
  one_lane.lanes = 1;
  no_record.record_nodes = false;
  no_fused.fused_fold = false;
  no_fused.record_nodes = false;  // recording needs the fused fold
  pinned.pinned_staging = !defaults.pinned_staging;
  none.record_nodes = none.fused_fold = none.pinned_staging = false;
  none.lanes = 1;
  const std::vector<Config> configs = {
      {"defaults", defaults},
      {"one lane (nodes in turn)", one_lane},
      {"without record (CUDA graphs)", no_record},
      {"without fused-fold or record", no_fused},
      {defaults.pinned_staging ? "without pinned-staging" : "with pinned-staging", pinned},
      {"none of them", none},
  };
  std::printf(
      "device tuning: one worker on %s, %s reduction, V=%d, global batch %lld (micro-batch "
      "%lld); configurations alternate, %d rounds of %d steps each, medians\n",
      MakeDevice(setup.device)->Name().c_str(), ReductionName(setup.reduction), virtual_nodes,
      static_cast<long long>(global_batch), static_cast<long long>(global_batch / virtual_nodes),
      setup.repeats, setup.steps);
  const JobSpec job = MlpJob(virtual_nodes, global_batch, setup.reduction);
  std::vector<std::unique_ptr<Worker>> workers;
  for (const Config& c : configs) {
    Setup s = setup;
    s.tuning = c.tuning;
    workers.push_back(std::make_unique<Worker>(job, train, s));
  }
  std::vector<std::vector<double>> times(configs.size()), ratios(configs.size());
  for (int r = 0; r < setup.repeats; ++r) {
    for (size_t i = 0; i < configs.size(); ++i) times[i].push_back(workers[i]->Run(setup.steps));
    for (size_t i = 0; i < configs.size(); ++i)
      ratios[i].push_back(times[i].back() / times[0].back());
  }
  std::printf("%-30s %12s %16s\n", "configuration", "ms/step", "vs defaults");
  for (size_t i = 0; i < configs.size(); ++i) {
    std::printf("%-30s %12.3f %16.3f\n", configs[i].name, 1e3 * Median(times[i]),
                Median(ratios[i]));
  }
  const std::string sha = workers[0]->weights_sha256();
  bool same = true;
  for (const auto& w : workers) same = same && w->weights_sha256() == sha;
  std::printf("final weights: %s (%s)\n", same ? "the same bits in every configuration" : "DIFFER",
              sha.substr(0, 16).c_str());
  return same ? 0 : 1;
}

// The reference MLP's matrix products, as a step runs them, on one device: forward, then
// backward from the top layer down (the weight gradient, then the gradient of the layer's input
// except for the first layer). The layers are the benchmark job's model (the default MLP on
// 28x28 images, 10 classes). Random weights and activations: the values do not change the
// work. Not thread-safe.
class MlpProducts {
 public:
  MlpProducts(Device& device, int64_t rows) : device_(device) {
    sizes_.push_back(28 * 28);
    const ModelSpec model = MlpJob(1, 1, Reduction::kExact).model;
    sizes_.insert(sizes_.end(), model.hidden_sizes.begin(), model.hidden_sizes.end());
    sizes_.push_back(10);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    auto filled = [&](size_t n) {
      std::vector<float> host(n);
      for (float& x : host) x = u(rng);
      auto b = Check(DeviceBuffer<float>::Create(device_, n));
      device_.CopyFromHost(b.data(), host.data(), n * sizeof(float));
      return b;
    };
    const auto r = static_cast<size_t>(rows);
    for (size_t l = 0; l < layers(); ++l) {
      const auto in = static_cast<size_t>(sizes_[l]), out = static_cast<size_t>(sizes_[l + 1]);
      weights_.push_back(filled(in * out));
      grads_.push_back(Check(DeviceBuffer<float>::Create(device_, in * out)));
    }
    for (int width : sizes_) {
      act_.push_back(filled(r * static_cast<size_t>(width)));
      delta_.push_back(filled(r * static_cast<size_t>(width)));
    }
  }

  size_t layers() const { return sizes_.size() - 1; }
  // Products per node and step: forward and weight gradient per layer, input gradient for all
  // but the first.
  size_t products() const { return 3 * layers() - 1; }
  // Outputs of layer l's forward product over `rows` rows.
  size_t outputs(size_t l, int64_t rows) const {
    return static_cast<size_t>(rows) * static_cast<size_t>(sizes_[l + 1]);
  }

  // All products of the rows [first, first + rows) of the batch.
  void Run(int64_t first, int rows) {
    for (size_t l = 0; l < layers(); ++l) Forward(l, first, rows, At(act_, l + 1, first));
    for (size_t l = layers(); l-- > 0;) {
      const int in = sizes_[l], out = sizes_[l + 1];
      device_.Gemm(true, false, in, out, rows, 1.f, At(act_, l, first), At(delta_, l + 1, first),
                   0.f, grads_[l].data());
      if (l > 0) {
        device_.Gemm(false, true, rows, in, out, 1.f, At(delta_, l + 1, first), weights_[l].data(),
                     0.f, At(delta_, l, first));
      }
    }
  }

  // The forward product of layer l for rows [first, first + rows), written to `out`.
  void Forward(size_t l, int64_t first, int rows, float* out) {
    device_.Gemm(false, false, rows, sizes_[l + 1], sizes_[l], 1.f, At(act_, l, first),
                 weights_[l].data(), 0.f, out);
  }

 private:
  // Row `row` of the layer-l buffer of `v` (activations or their gradients).
  float* At(std::vector<DeviceBuffer<float>>& v, size_t l, int64_t row) {
    return v[l].data() + static_cast<size_t>(row) * static_cast<size_t>(sizes_[l]);
  }

  Device& device_;
  std::vector<int> sizes_;  // layer widths, input first
  std::vector<DeviceBuffer<float>> weights_, grads_, act_, delta_;
};

// The part of vnode-overhead that lies in the products themselves: V products of m rows cost
// more than one of V*m rows (each packs the whole weight matrix, and a small product uses the
// BLAS's kernels less well). No change to the reducer can take that away. The nodes could share
// one product only if each output row came out with the same bits whatever rows were stacked
// around it; the last column counts the outputs of layer 0's forward product that differ.
int Products(const Setup& setup, int virtual_nodes, const std::vector<int64_t>& micro_batches) {
  auto device = MakeDevice(setup.device);
  std::printf(
      "matrix products alone (the MLP's %zu per node and step) on %s: V=%d products of the "
      "micro-batch vs 1 of the global batch; the two alternate, %d rounds of %d steps, medians\n",
      MlpProducts(*device, 1).products(), device->Name().c_str(), virtual_nodes, setup.repeats,
      setup.steps);
  std::printf("%12s %12s %14s %14s %8s %18s\n", "global batch", "micro-batch", "V=1 ms/step",
              ("V=" + std::to_string(virtual_nodes) + " ms/step").c_str(), "ratio",
              "stacked rows differ");
  for (int64_t micro : micro_batches) {
    const int64_t b = micro * virtual_nodes;
    const int m = static_cast<int>(micro);
    MlpProducts p(*device, b);
    auto time = [&](int nodes) {
      const auto t0 = Clock::now();
      for (int s = 0; s < setup.steps; ++s) {
        for (int v = 0; v < nodes; ++v) p.Run(v * b / nodes, static_cast<int>(b / nodes));
      }
      device->Synchronize();
      return Seconds(t0, Clock::now()) / setup.steps;
    };
    time(1);
    time(virtual_nodes);  // warm-up
    std::vector<double> t1, tv, ratio;
    for (int r = 0; r < setup.repeats; ++r) {
      t1.push_back(time(1));
      tv.push_back(time(virtual_nodes));
      ratio.push_back(tv.back() / t1.back());
    }
    // Layer 0's forward product: one over the whole batch vs one per micro-batch.
    const size_t outputs = p.outputs(0, b);
    auto stacked = Check(DeviceBuffer<float>::Create(*device, outputs));
    auto apart = Check(DeviceBuffer<float>::Create(*device, outputs));
    p.Forward(0, 0, static_cast<int>(b), stacked.data());
    for (int v = 0; v < virtual_nodes; ++v) {
      p.Forward(0, int64_t{v} * m, m, apart.data() + p.outputs(0, int64_t{v} * m));
    }
    std::vector<float> hs(outputs), ha(outputs);
    device->CopyToHost(hs.data(), stacked.data(), outputs * sizeof(float));
    device->CopyToHost(ha.data(), apart.data(), outputs * sizeof(float));
    size_t differ = 0;
    for (size_t i = 0; i < outputs; ++i) {
      differ += std::bit_cast<uint32_t>(hs[i]) != std::bit_cast<uint32_t>(ha[i]) ? 1 : 0;
    }
    std::printf("%12lld %12lld %14.3f %14.3f %8.3f %9zu of %6zu\n", static_cast<long long>(b),
                static_cast<long long>(micro), 1e3 * Median(t1), 1e3 * Median(tv), Median(ratio),
                differ, outputs);
  }
  return 0;
}

int Throughput(const Dataset& train, const Setup& setup, int virtual_nodes, int64_t global_batch) {
  const double seconds =
      TimePerStep(MlpJob(virtual_nodes, global_batch, setup.reduction), train, setup);
  std::printf(
      "throughput device=%s reduction=%s global_batch=%lld virtual_nodes=%d micro_batch=%lld "
      "ms_per_step=%.4f samples_per_second=%.1f\n",
      setup.device.c_str(), ReductionName(setup.reduction), static_cast<long long>(global_batch),
      virtual_nodes, static_cast<long long>(global_batch / virtual_nodes), 1e3 * seconds,
      static_cast<double>(global_batch) / seconds);
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
      Check(red->Add(grad.data()));
      red->AddLoss(LossStats{});
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
  const auto assignment =
      ContiguousVirtualNodes(SplitVirtualNodes(job.virtual_nodes, EqualTimes(ranks)));
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

// Child process: trains a few steps at the given batch, prints the device's peak memory in
// use and exits; the parent also reads the child's peak resident set size.
int MemoryChild(const Dataset& train, const Setup& setup, int virtual_nodes, int64_t global_batch) {
  Worker w(MlpJob(virtual_nodes, global_batch, setup.reduction), train, setup);
  for (int i = 0; i < 5; ++i) w.Run(1);
  std::printf("peak_device_bytes %zu\n", w.peak_device_bytes());
  return 0;
}

struct PeakMemory {
  long rss_kib = 0;
  size_t device_bytes = 0;
};

PeakMemory MeasureInChild(const std::string& self, const std::vector<std::string>& common,
                          int virtual_nodes, int64_t global_batch) {
  std::vector<std::string> args = {self,
                                   "memory-child",
                                   "--virtual-nodes",
                                   std::to_string(virtual_nodes),
                                   "--global-batch",
                                   std::to_string(global_batch)};
  args.insert(args.end(), common.begin(), common.end());
  int fds[2];
  if (pipe(fds) != 0) Check(Internal("vf-bench: pipe failed"));
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(self.c_str(), argv.data());
    std::_Exit(127);
  }
  close(fds[1]);
  std::string output;
  char buf[256];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) output.append(buf, buf + n);
  close(fds[0]);
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  PeakMemory out;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      std::sscanf(output.c_str(), "peak_device_bytes %zu", &out.device_bytes) != 1) {
    Check(Internal("vf-bench: memory child (V=" + std::to_string(virtual_nodes) +
                   ", B=" + std::to_string(global_batch) + ") failed"));
  }
  out.rss_kib = usage.ru_maxrss;
  return out;
}

// Peak memory at micro-batch m: V nodes at B = V*m, 16V nodes at B = 16V*m (same micro-batch,
// 16x the global batch), and V nodes at 16V*m (16x the micro-batch).
int Memory(const std::string& self, const std::vector<std::string>& common, const Setup& setup,
           int virtual_nodes, int64_t micro_batch) {
  const bool gpu = setup.device == "cuda";
  std::printf("peak memory of one worker on %s (%s)\n", setup.device.c_str(),
              gpu ? "device memory in use, the whole GPU, sampled after every step"
                  : "RSS, includes the resident dataset");
  std::printf("%8s %14s %12s %14s\n", "V", "global batch", "micro-batch", "peak MiB");
  struct Case {
    int v;
    int64_t b;
  };
  const int v = virtual_nodes;
  const int64_t m = micro_batch;
  std::vector<double> peak;
  for (Case c : {Case{v, v * m}, Case{16 * v, 16 * (v * m)}, Case{v, 16 * (v * m)}}) {
    const PeakMemory p = MeasureInChild(self, common, c.v, c.b);
    const double mib = gpu ? static_cast<double>(p.device_bytes) / (1 << 20)
                           : static_cast<double>(p.rss_kib) / 1024.0;
    peak.push_back(mib);
    std::printf("%8d %14lld %12lld %14.1f\n", c.v, static_cast<long long>(c.b),
                static_cast<long long>(c.b / c.v), mib);
  }
  std::printf("ratio, global batch 16x at equal micro-batch: %.3f\n", peak[1] / peak[0]);
  std::printf("ratio, micro-batch 16x at equal global batch: %.3f\n", peak[2] / peak[1]);
  return 0;
}

}  // namespace
}  // namespace vf

constexpr char kBenchmarks[] =
    "Benchmarks (each prints a ratio against a baseline measured in the same run):\n"
    "  vnode-overhead    one worker, V virtual nodes vs 1 at the same global batch\n"
    "  reduction         Gloo workers: exact vs fast reduction, alone and in a whole step\n"
    "  memory            peak memory at the same micro-batch as the global batch grows 16x\n"
    "  throughput        samples per second of one worker at --global-batch and --virtual-nodes\n"
    "  tuning            the device's optional speed-ups, each turned over, against the defaults,\n"
    "                    at --global-batch and --virtual-nodes; checks the weights stay the same\n"
    "  products          the MLP's matrix products alone: V micro-batches vs 1 batch, and\n"
    "                    whether one product over stacked micro-batches keeps each row's bits\n"
    "  checkpoint-write  seconds to write a checkpoint like --checkpoint\n";

int main(int argc, char** argv) {
  using namespace vf;
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: vf-bench BENCHMARK [options]\n\n%s(vf-bench --help lists the options)\n",
                 kBenchmarks);
    return 2;
  }
  std::string cmd;
  int64_t steps = 20, repeats = 5, ranks = 4, virtual_nodes = 8, global_batch = 256;
  int64_t micro_batch = 0;
  std::string dataset = "/usr/share/datasets/fashion-mnist";
  std::string checkpoint, device = "cpu", reduction = "exact", micro_batches;
  CLI::App app(kBenchmarks, "vf-bench");
  app.add_option("BENCHMARK", cmd, "the benchmark to run (above)");
  app.add_option("--steps", steps, "steps per measurement")
      ->transform(Base10Integer())
      ->capture_default_str();
  app.add_option("--repeats", repeats, "measurements per point; the median is reported")
      ->transform(Base10Integer())
      ->capture_default_str();
  app.add_option("--workers", ranks, "Gloo workers for `reduction`")
      ->transform(Base10Integer())
      ->capture_default_str();
  app.add_option("--device", device,
                 "cpu or cuda, for vnode-overhead, products, memory, throughput and tuning")
      ->capture_default_str();
  app.add_option("--reduction", reduction, "exact or fast, for vnode-overhead and throughput")
      ->capture_default_str();
  app.add_option("--virtual-nodes", virtual_nodes,
                 "virtual nodes: vnode-overhead's and products' many-node side,\n"
                 "memory's smallest case, throughput's job")
      ->transform(Base10Integer())
      ->capture_default_str();
  app.add_option("--micro-batches", micro_batches,
                 "vnode-overhead, products: micro-batches at V nodes,\n"
                 "comma-separated (default 32,64,128,256 on cpu, 64,256,1024 on cuda)")
      ->type_name("M1,M2,...");
  app.add_option("--micro-batch", micro_batch,
                 "memory: the micro-batch held fixed (default 32 on cpu, 256 on cuda)")
      ->transform(Base10Integer());
  app.add_option("--global-batch", global_batch, "throughput, tuning: the global batch")
      ->transform(Base10Integer())
      ->capture_default_str();
  app.add_option("--dataset", dataset,
                 "Fashion-MNIST directory, or `synthetic` (60,000 generated images)")
      ->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "checkpoint-write: the checkpoint to copy")
      ->type_name("PATH");
  if (auto exit_code = ParseCommandLine(app, "vf-bench", argc, argv)) return *exit_code;
  const std::vector<std::string> known = {"vnode-overhead", "reduction", "memory",
                                          "throughput",     "products",  "checkpoint-write",
                                          "memory-child",   "tuning"};
  if (std::find(known.begin(), known.end(), cmd) == known.end()) {
    std::fprintf(stderr, "vf-bench: error: unknown benchmark '%s' (see --help)\n", cmd.c_str());
    return 2;
  }
  if (reduction != "exact" && reduction != "fast") {
    std::fprintf(stderr, "vf-bench: error: --reduction must be exact or fast, not '%s'\n",
                 reduction.c_str());
    return 2;
  }
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "vf-bench: error: --device must be cpu or cuda, not '%s'\n",
                 device.c_str());
    return 2;
  }
  if (steps <= 0 || repeats <= 0 || virtual_nodes <= 0 || global_batch <= 0 || micro_batch < 0) {
    std::fprintf(stderr, "vf-bench: error: counts and batches must be positive\n");
    return 2;
  }
  const bool gpu = device == "cuda";
  auto parsed = ParseNumberList(
      "--micro-batches",
      !micro_batches.empty() ? micro_batches : (gpu ? "64,256,1024" : "32,64,128,256"), 1, 1e9,
      /*whole=*/true);
  if (!parsed.ok()) {
    std::fprintf(stderr, "vf-bench: error: %s\n", parsed.status().message().c_str());
    return 2;
  }
  const std::vector<int64_t> micro_batch_list(parsed->begin(), parsed->end());
  Setup setup;
  setup.device = device;
  setup.reduction = reduction == "exact" ? Reduction::kExact : Reduction::kFast;
  setup.steps = static_cast<int>(steps);
  setup.repeats = static_cast<int>(repeats);
  if (gpu) {
    std::string why;
    if (CudaDeviceCount(&why) == 0) {
      std::fprintf(stderr, "vf-bench: error: --device cuda: no CUDA device: %s\n", why.c_str());
      return 1;
    }
  }
  if (cmd == "checkpoint-write" || cmd == "products") dataset.clear();
  Result<DatasetSplits> data = DatasetSplits{};
  if (dataset == "synthetic") {
    data = MakeSyntheticDataset(60000, 1000, 28, 28, 10, 1);
  } else if (!dataset.empty()) {
    data = LoadFashionMnist(dataset);
  }
  if (!data.ok()) {
    std::fprintf(stderr, "vf-bench: error: %s\n", data.status().message().c_str());
    return 1;
  }
  const Dataset& train = data->train;
  if (cmd == "vnode-overhead") {
    return VnodeOverhead(train, setup, static_cast<int>(virtual_nodes), micro_batch_list);
  }
  if (cmd == "products") {
    return Products(setup, static_cast<int>(virtual_nodes), micro_batch_list);
  }
  if (cmd == "throughput" || cmd == "tuning") {
    if (global_batch % virtual_nodes != 0) {
      std::fprintf(stderr,
                   "vf-bench: error: --global-batch must be a multiple of --virtual-nodes\n");
      return 2;
    }
    if (cmd == "tuning") return Tuning(train, setup, static_cast<int>(virtual_nodes), global_batch);
    return Throughput(train, setup, static_cast<int>(virtual_nodes), global_batch);
  }
  if (cmd == "reduction") {
    if (gpu) {
      std::fprintf(stderr, "vf-bench: error: reduction runs Gloo workers on the cpu only\n");
      return 2;
    }
    return RunReductionBench(train, static_cast<int>(ranks), static_cast<int>(repeats),
                             static_cast<int>(steps));
  }
  // What a memory child needs to run as its parent does.
  const std::vector<std::string> common = {"--device", device,      "--reduction",
                                           reduction,  "--dataset", dataset};
  if (cmd == "memory") {
    return Memory(argv[0], common, setup, static_cast<int>(virtual_nodes),
                  micro_batch > 0 ? micro_batch : (gpu ? 256 : 32));
  }
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
    return MemoryChild(train, setup, static_cast<int>(virtual_nodes), global_batch);
  }
  return 2;  // not reached: every known benchmark returns above
}
