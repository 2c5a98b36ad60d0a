// virtualflow._core: the agent library and the runtime pieces a PyTorch worker needs (job spec,
// data order, exact and fast reduction, checkpoints), bound for Python with nanobind. The
// PyTorch-facing API is python/virtualflow/torch.py; this module only moves bytes, numbers and
// raw CPU pointers, so it has no build dependency on PyTorch.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "agent/agent.h"
#include "agent/protocol/messages.h"
#include "runtime/data/dataset.h"
#include "runtime/device.h"
#include "runtime/device/cuda/plugin.h"
#include "runtime/job/spec.h"
#include "runtime/job/worker_env.h"
#include "runtime/reduce/reducer.h"
#include "runtime/state/training_state.h"

namespace nb = nanobind;

namespace vf::python {
namespace {

// Python exception types by status code; created in the module init.
struct Exceptions {
  nb::object error;       // virtualflow.Error(RuntimeError): everything else
  nb::object numerical;   // NumericalError(Error): NaN/Inf, the job diverged
  nb::object collective;  // CollectiveError(Error): a member died or stalled mid-step
  nb::object mismatch;    // JobMismatchError(Error): foreign state or a different model
};
Exceptions* g_exceptions = nullptr;

[[noreturn]] void Raise(const Status& s) {
  nb::object type = g_exceptions->error;
  switch (s.code()) {
    case StatusCode::kNumerical:
      type = g_exceptions->numerical;
      break;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
      type = g_exceptions->collective;
      break;
    case StatusCode::kFailedPrecondition:
      type = g_exceptions->mismatch;
      break;
    case StatusCode::kInvalidArgument:
      type = nb::borrow(PyExc_ValueError);
      break;
    default:
      break;
  }
  PyErr_SetString(type.ptr(), s.message().c_str());
  throw nb::python_error();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

// Runs `f` without the GIL (it may wait on the network), so that other Python threads run;
// its Status is raised only after the GIL is back.
template <typename F>
auto Released(F f) {
  nb::gil_scoped_release release;
  return f();
}

// The bytes of a payload given as one bytes-like object or as a list of them (the pieces of a
// PyTorch worker's state: its header, then each tensor's memory where it lies), held so that
// they can be read without the GIL until this is destroyed, which needs the GIL. The buffer
// protocol is Python's own way to lend memory; there is no packaged wrapper for a list of them.
// Not thread-safe.
class BufferPieces {
 public:
  BufferPieces() = default;
  BufferPieces(const BufferPieces&) = delete;
  BufferPieces& operator=(const BufferPieces&) = delete;
  ~BufferPieces() {
    for (Py_buffer& b : buffers_) PyBuffer_Release(&b);
  }

  // Raises TypeError for an object that lends no contiguous bytes.
  void Add(nb::handle payload) {
    if (!PyList_Check(payload.ptr()) && !PyTuple_Check(payload.ptr())) {
      buffers_.reserve(1);
      AddOne(payload);
      return;
    }
    const nb::sequence items = nb::borrow<nb::sequence>(payload);
    buffers_.reserve(nb::len(items));  // AddOne keeps each Py_buffer where it is put
    for (nb::handle item : items) AddOne(item);
  }
  const std::vector<std::string_view>& views() const { return views_; }

 private:
  void AddOne(nb::handle item) {
    Py_buffer view;
    if (PyObject_GetBuffer(item.ptr(), &view, PyBUF_SIMPLE) != 0) throw nb::python_error();
    buffers_.push_back(view);
    views_.emplace_back(static_cast<const char*>(view.buf), static_cast<size_t>(view.len));
  }

  std::vector<Py_buffer> buffers_;
  std::vector<std::string_view> views_;
};

// "Type: message" of a Python exception, without the traceback nanobind's what() carries, so
// that it fits the one-line errors the agent and vf run pass on.
std::string Describe(const nb::python_error& e) {
  const std::string type = nb::cast<std::string>(e.type().attr("__name__"));
  const std::string message = nb::cast<std::string>(nb::str(e.value()));
  return message.empty() ? type : type + ": " + message;
}

// The training state of a PyTorch worker, kept by a Python object (virtualflow.torch's
// _Holder): the whole state travels as one serialized blob, so Buffers() is empty. Every call
// takes the GIL, since the agent calls it from a thread that released it. Thread-compatible.
class PyStateHolder : public agent::TrainingStateHolder {
 public:
  explicit PyStateHolder(nb::object py) : py_(std::move(py)) {}

  bool has_state() const override {
    nb::gil_scoped_acquire gil;
    return nb::cast<bool>(py_.attr("has_state")());
  }
  int64_t step() const override {
    nb::gil_scoped_acquire gil;
    return nb::cast<int64_t>(py_.attr("step")());
  }
  Status Initialize() override { return Call("initialize", {}); }
  std::string Metadata() const override {
    nb::gil_scoped_acquire gil;
    try {
      nb::bytes b = nb::cast<nb::bytes>(py_.attr("metadata")());
      return std::string(b.c_str(), b.size());
    } catch (const nb::python_error& e) {
      // The source cannot serialize: the receivers see a short, corrupt blob and refuse it.
      return "unserializable state: " + Describe(e);
    }
  }
  Status CheckMetadata(std::string_view metadata) const override {
    nb::gil_scoped_acquire gil;
    try {
      std::string problem = nb::cast<std::string>(
          py_.attr("check_metadata")(nb::bytes(metadata.data(), metadata.size())));
      if (problem.empty()) return Status::Ok();
      return FailedPrecondition(problem);
    } catch (const nb::python_error& e) {
      return DataLoss(Describe(e));
    }
  }
  std::vector<std::span<std::byte>> Buffers() override { return {}; }
  void Invalidate() override {
    nb::gil_scoped_acquire gil;
    py_.attr("invalidate")();
  }
  Status Adopt(std::string_view metadata) override { return Call("adopt", metadata); }

 private:
  // Runs a method that returns nothing; an exception is the job's end (kDataLoss), since the
  // state may be half-replaced.
  Status Call(const char* method, std::string_view arg) const {
    nb::gil_scoped_acquire gil;
    try {
      if (std::string_view(method) == "adopt") {
        py_.attr(method)(nb::bytes(arg.data(), arg.size()));
      } else {
        py_.attr(method)();
      }
      return Status::Ok();
    } catch (const nb::python_error& e) {
      // A checkpoint of another job or model is a mismatch; anything else leaves the state
      // half-replaced.
      if (e.matches(g_exceptions->mismatch)) return FailedPrecondition(Describe(e));
      return DataLoss(std::string(method) + ": " + Describe(e));
    }
  }

  nb::object py_;
};

// A flat float32 CPU tensor, contiguous: the gradient buffer the parameters' .grad views.
using FlatGradient = nb::ndarray<float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// A step's gradients folded by virtualflow.torch on their own device and copied to the host
// once: the int64 sums of every element, then each bucket's largest |gradient| bit pattern, then
// the overflow flag (Worker.add_folded).
using FoldedStep = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// Virtual nodes' gradients as the rows of one float32 CPU array (fold_reference).
using NodeGradients = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

// The largest |gradient| of a bucket as its float's bit pattern, from an int64 slot.
Result<std::vector<uint32_t>> MaxBits(const int64_t* slots, size_t n) {
  std::vector<uint32_t> bits(n);
  for (size_t i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] > 0x7fffffff) {
      return InvalidArgument("bucket " + std::to_string(i) + "'s maximum " +
                             std::to_string(slots[i]) + " is not the bit pattern of a |float|");
    }
    bits[i] = static_cast<uint32_t>(slots[i]);
  }
  return bits;
}

// This worker's part in the next step, as Python sees it. Value type.
struct MembershipView {
  std::vector<std::string> members;  // worker names by rank
  int64_t epoch = 0;
  int rank = 0;
  int world = 0;
  std::vector<int> virtual_nodes;
  bool switched = false;
};

// A PyTorch worker: the agent (membership, state transfer, reports) and the gradient reducer
// on the CPU, over tensors whose memory Python passes as addresses. Not thread-safe: one per
// process, used from the training thread.
class Worker {
 public:
  explicit Worker(const agent::AgentOptions& options) {
    agent_ = Take(Released([&] { return agent::Agent::Join(options); }));
    device_ = CreateCpuDevice(1);
  }

  void Ready() {
    Check(Released([&] { return Live().Ready(); }));
  }

  // Collectives through NCCL on CUDA device `cuda_device` from the first plan on (see
  // Agent::CollectivesOnNccl), or virtualflow.Error saying why this process cannot have them:
  // no driver, no libvirtualflow-cuda.so (a build or wheel without CUDA), no such device.
  // Before Ready.
  void CollectivesOnNccl(int cuda_device) {
    std::string why;
    const int count = CudaDeviceCount(&why);
    if (count == 0) Raise(Internal("NCCL collectives need the CUDA plugin and a GPU: " + why));
    if (cuda_device < 0 || cuda_device >= count) {
      Raise(Internal("NCCL collectives on CUDA device " + std::to_string(cuda_device) +
                     ": this process sees " + std::to_string(count) + " CUDA device(s)"));
    }
    Live().CollectivesOnNccl(cuda_device);
  }

  std::optional<MembershipView> Next(nb::object holder) {
    auto state = std::make_shared<PyStateHolder>(std::move(holder));
    std::optional<agent::Membership> m = Take(Released([&] { return Live().Next(*state); }));
    if (!m) {
      comm_ = nullptr;
      return std::nullopt;
    }
    comm_ = m->comm;
    return MembershipView{m->members, m->epoch, m->rank, m->world, m->virtual_nodes, m->switched};
  }

  // After Next returned None: whether this worker left on SIGTERM without the coordinator's
  // answer, because the coordinator no longer knows the job (suspended, deleted, drained by an
  // operator of another protocol), so that the job will resume from its checkpoint.
  bool LeftUntoldOnRequest() const { return agent::LeaveRequested() && Live().left_untold(); }

  // Gradient buckets: one per tensor size in `sizes` (large tensors are cut), `virtual_nodes`
  // the job's V.
  void ConfigureReducer(const std::string& mode, const std::vector<size_t>& sizes,
                        int virtual_nodes) {
    const Reduction r = mode == "fast" ? Reduction::kFast : Reduction::kExact;
    constexpr size_t kMaxBucket = size_t{1} << 20;
    buckets_ = MakeBuckets(sizes, kMaxBucket);
    reducer_ = Take(CreateReducer(r, *device_, buckets_, virtual_nodes));
    elements_ = 0;
    for (size_t n : sizes) elements_ += n;
  }

  void Begin() { RequireReducer()->Begin(); }

  // The tensors come in through DLPack (a torch tensor is accepted as it is): no copy, and
  // dtype, layout, device and size are checked here rather than trusted.
  void Add(const FlatGradient& grad) {
    Check(CheckSize(grad.shape(0)));
    Check(RequireReducer()->Add(grad.data()));
  }

  // The gradient buckets as (offset, size): each shares one exponent (exponents()).
  std::vector<std::tuple<size_t, size_t>> Buckets() const {
    std::vector<std::tuple<size_t, size_t>> out;
    out.reserve(buckets_.size());
    for (const GradientBucket& b : buckets_) out.emplace_back(b.offset, b.size);
    return out;
  }

  // A whole step's nodes folded elsewhere (see FoldedStep and Reducer::AddFolded).
  void AddFolded(const FoldedStep& folded) {
    const size_t expected = elements_ + buckets_.size() + 1;
    if (folded.shape(0) != expected) {
      Raise(InvalidArgument("the folded step has " + std::to_string(folded.shape(0)) +
                            " values, the reducer expects " + std::to_string(expected) +
                            " (sums, bucket maxima, overflow flag)"));
    }
    const int64_t* p = folded.data();
    const std::vector<uint32_t> bits = Take(MaxBits(p + elements_, buckets_.size()));
    Check(RequireReducer()->AddFolded(p, bits, p[elements_ + buckets_.size()] != 0));
  }

  // A step's per-bucket maxima and overflow flag, its sums kept on their device (a world of one:
  // see Reducer::AddFolded); FinishKept then decides the step without converting anything.
  void AddFoldedFlags(const FoldedStep& flags) {
    const size_t expected = buckets_.size() + 1;
    if (flags.shape(0) != expected) {
      Raise(InvalidArgument("the folded step's flags have " + std::to_string(flags.shape(0)) +
                            " values, the reducer expects " + std::to_string(expected) +
                            " (bucket maxima, overflow flag)"));
    }
    const int64_t* p = flags.data();
    const std::vector<uint32_t> bits = Take(MaxBits(p, buckets_.size()));
    Check(RequireReducer()->AddFolded(nullptr, bits, p[buckets_.size()] != 0));
  }

  void AddLoss(double loss_sum, int64_t samples) {
    LossStats s;
    s.loss_sum = loss_sum;
    s.samples = samples;
    RequireReducer()->AddLoss(s);
  }

  // Sums across the members; returns (redo, loss_sum, samples, agreed_epoch).
  std::tuple<bool, double, int64_t, int64_t> Finish(const FlatGradient& mean_grad) {
    Check(CheckSize(mean_grad.shape(0)));
    Reducer* reducer = RequireReducer();
    Communicator* comm = RequireComm();
    const int64_t header[1] = {Live().latest_epoch()};
    float* mean = mean_grad.data();
    ReduceResult r = Take(Released([&] { return reducer->Finish(*comm, header, mean); }));
    const int64_t agreed = r.header_extra.size() == 1 ? r.header_extra[0] : 0;
    return {r.redo, r.totals.loss_sum, r.totals.samples, agreed};
  }

  // Finish for a step handed over by AddFoldedFlags: (redo, loss_sum, samples, agreed_epoch).
  std::tuple<bool, double, int64_t, int64_t> FinishKept() {
    Reducer* reducer = RequireReducer();
    Communicator* comm = RequireComm();
    const int64_t header[1] = {Live().latest_epoch()};
    ReduceResult r = Take(Released([&] { return reducer->Finish(*comm, header, nullptr); }));
    const int64_t agreed = r.header_extra.size() == 1 ? r.header_extra[0] : 0;
    return {r.redo, r.totals.loss_sum, r.totals.samples, agreed};
  }

  std::vector<int32_t> Exponents() { return RequireReducer()->exponents(); }
  void SetExponents(const std::vector<int32_t>& e) { Check(RequireReducer()->set_exponents(e)); }

  void Completed(int64_t step, double loss, double seconds, double compute_seconds, int64_t samples,
                 int64_t agreed_epoch, bool last_step) {
    agent::StepOutcome o;
    o.loss = loss;
    o.seconds = seconds;
    o.compute_seconds = compute_seconds;
    o.samples = samples;
    o.agreed_epoch = agreed_epoch;
    o.last_step = last_step;
    Check(Released([&] { return Live().Completed(step, o); }));
  }

  void Failed(int64_t step, const std::string& message) {
    comm_ = nullptr;
    nb::gil_scoped_release release;
    Live().Failed(step, Unavailable(message));
  }

  // How a checkpoint write went ("" for success): the agent reports a failure until a later
  // write succeeds.
  void CheckpointWritten(int64_t step, const std::string& error) {
    nb::gil_scoped_release release;
    Live().CheckpointWritten(step, error.empty() ? Status::Ok() : Internal(error));
  }

  // Rank 0's final report; false if it could not be delivered.
  bool FinishJob(int64_t step, double loss, const std::string& weights_sha256,
                 double test_accuracy) {
    Report final;
    final.step = step;
    final.loss = loss;
    final.weights_sha256 = weights_sha256;
    final.test_accuracy = test_accuracy;
    nb::gil_scoped_release release;
    return Live().Finish(final).ok();
  }

  // Every member's `value`, in rank order (the check mode's parameter hashes).
  std::vector<int64_t> AllGather(int64_t value) {
    Communicator* comm = RequireComm();
    std::vector<int64_t> all(static_cast<size_t>(comm->size()), 0);
    all[static_cast<size_t>(comm->rank())] = value;
    Check(Released([&] { return comm->AllGather(all.data(), sizeof(int64_t)); }));
    return all;
  }

  int64_t latest_epoch() const { return Live().latest_epoch(); }

  // Ends the agent now: its plan watcher's thread, its metrics endpoint and its communicator
  // stop here rather than whenever Python frees this object, which at interpreter exit can be
  // after the libraries under them (cpprest's thread pool) are gone, and a thread still polling
  // a coordinator that went away then crashes the process. Idempotent.
  void Close() {
    comm_ = nullptr;  // the agent's
    Released([&] {
      agent_.reset();
      return 0;
    });
  }
  void set_total_steps(int64_t total) { Live().set_total_steps(total); }

 private:
  Status CheckSize(size_t n) const {
    if (n == elements_) return Status::Ok();
    return InvalidArgument("the flat gradient has " + std::to_string(n) +
                           " elements, the reducer " + std::to_string(elements_));
  }
  Reducer* RequireReducer() {
    if (reducer_ == nullptr) Raise(Internal("the reducer is not configured"));
    return reducer_.get();
  }
  Communicator* RequireComm() {
    if (comm_ == nullptr) Raise(FailedPrecondition("this worker is in no membership plan now"));
    return comm_;
  }

  // The agent, or an error once close() has run (a C++ exception: this may run without the GIL;
  // nanobind raises it as RuntimeError).
  agent::Agent& Live() const {
    if (!agent_)
      throw std::runtime_error("virtualflow: this worker is closed (job.finish() ended it)");
    return *agent_;
  }

  std::unique_ptr<agent::Agent> agent_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Reducer> reducer_;
  std::vector<GradientBucket> buckets_;  // the reducer's
  Communicator* comm_ = nullptr;         // owned by the agent; valid until the next Next or Failed
  size_t elements_ = 0;                  // of the flat gradient the reducer was configured for
};

// The job as a PyTorch worker needs it: the fields of the one parsed JobSpec. Value type.
nb::dict JobToDict(const JobSpec& job) {
  nb::dict d;
  d["name"] = job.name;
  d["namespace"] = job.namespace_name;
  d["virtual_nodes"] = job.virtual_nodes;
  d["global_batch_size"] = job.global_batch_size;
  d["micro_batch"] = job.micro_batch();
  d["steps"] = job.steps;
  d["epochs"] = job.epochs;
  d["seed"] = job.seed;
  d["reduction"] = std::string(ReductionName(job.reduction));
  d["fingerprint"] = job.Fingerprint();
  d["checkpoint_path"] = job.checkpoint.path;
  d["checkpoint_every_steps"] = job.checkpoint.every_steps;
  return d;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "VirtualFlow's agent library and runtime, bound for virtualflow.torch";
  // A worker's Job (and so its Worker) lives until the interpreter exits, by design: nanobind's
  // report of instances alive at that point would only be noise on every worker's stderr.
  nb::set_leak_warnings(false);
  static Exceptions exceptions;
  g_exceptions = &exceptions;
  exceptions.error =
      nb::borrow(PyErr_NewException("virtualflow._core.Error", PyExc_RuntimeError, nullptr));
  exceptions.numerical = nb::borrow(
      PyErr_NewException("virtualflow._core.NumericalError", exceptions.error.ptr(), nullptr));
  exceptions.collective = nb::borrow(
      PyErr_NewException("virtualflow._core.CollectiveError", exceptions.error.ptr(), nullptr));
  exceptions.mismatch = nb::borrow(
      PyErr_NewException("virtualflow._core.JobMismatchError", exceptions.error.ptr(), nullptr));
  m.attr("Error") = exceptions.error;
  m.attr("NumericalError") = exceptions.numerical;
  m.attr("CollectiveError") = exceptions.collective;
  m.attr("JobMismatchError") = exceptions.mismatch;

  // The build identity a job's workers must share (the agent binary's, too): one version of the
  // reduction arithmetic.
  m.attr("BUILD") = std::string("virtualflow ") + VF_VERSION;
  // A worker the coordinator refused for running another build says this, and exits with this
  // code (agent/protocol/messages.h): the operator replaces its pod with the job's image.
  m.attr("ANOTHER_BUILD_REFUSAL") = std::string(vf::kAnotherBuildRefusal);
  m.attr("EXIT_ANOTHER_BUILD") = vf::kExitAnotherBuild;
  // The worker's environment (runtime/job/worker_env.h): ENV_JOB_SPEC is "VF_JOB_SPEC", and so
  // on, so that virtualflow.torch reads the names the operator and `vf run` set.
  for (const vf::worker_env::Variable& v : vf::worker_env::kAll) {
    const std::string_view name = v.name;
    m.attr(("ENV_" + std::string(name.substr(3))).c_str()) = std::string(name);
  }
  m.def(
      "parse_job",
      [](const std::string& text, const std::string& source) {
        return JobToDict(Take(ParseJobYaml(text, source)));
      },
      "Parses and validates a VirtualFlowJob manifest (YAML or JSON).");
  m.def(
      "total_steps",
      [](const std::string& text, int64_t dataset_size) {
        JobSpec job = Take(ParseJobYaml(text, "job"));
        Check(Sharder::Check(dataset_size, job.global_batch_size, job.virtual_nodes));
        return TotalSteps(job, dataset_size);
      },
      "The job's length in steps on a training set of `dataset_size` samples.");
  m.def(
      "mix_key",
      [](uint64_t seed, uint64_t a, uint64_t b, uint64_t c) { return MixKey(seed, a, b, c); },
      nb::arg("seed"), nb::arg("a"), nb::arg("b") = 0, nb::arg("c") = 0,
      "A counter-based 64-bit key of (seed, a, b, c): the per-virtual-node RNG seed.");
  m.def(
      "seal",
      [](nb::handle payload) {
        BufferPieces pieces;
        pieces.Add(payload);
        std::string sealed = SealBlob(pieces.views());
        return nb::bytes(sealed.data(), sealed.size());
      },
      nb::arg("payload"),
      "Wraps bytes (one bytes-like object, or a list of them taken one after the other) with a "
      "magic and a SHA-256, so corruption is found on read.");
  m.def(
      "unseal",
      [](const nb::bytes& sealed, const std::string& source) {
        std::string payload =
            Take(UnsealBlob(std::string_view(sealed.c_str(), sealed.size()), source));
        return nb::bytes(payload.data(), payload.size());
      },
      "The payload of seal(); raises for truncated, tampered or foreign bytes.");
  m.def(
      "write_checkpoint",
      [](const std::string& path, nb::handle payload) {
        // Without the GIL: virtualflow.torch writes from a background thread while the training
        // thread goes on. `pieces` holds the buffers (tensors' memory among them) meanwhile.
        BufferPieces pieces;
        pieces.Add(payload);
        Check(Released([&] { return WriteSealedFile(path, pieces.views()); }));
      },
      nb::arg("path"), nb::arg("payload"),
      "Writes seal(payload) atomically (temporary file, fsync, rename, fsync of the directory), "
      "without holding the GIL and without joining the pieces of a list first.");
  m.def(
      "read_checkpoint",
      [](const std::string& path) {
        std::string payload = Take(ReadSealedFile(path));
        return nb::bytes(payload.data(), payload.size());
      },
      "Reads and verifies what write_checkpoint wrote.");
  m.def(
      "sha256_hex", [](const nb::bytes& data) { return Sha256Hex(data.c_str(), data.size()); },
      "Lower-case hex SHA-256.");

  m.def(
      "fold_reference",
      [](const NodeGradients& grads, const std::vector<size_t>& sizes,
         const std::vector<int32_t>& exponents) {
        if (sizes.size() != exponents.size()) {
          Raise(InvalidArgument(std::to_string(sizes.size()) + " bucket sizes, " +
                                std::to_string(exponents.size()) + " exponents"));
        }
        std::vector<FoldBucket> plan;
        uint64_t n = 0;
        for (size_t i = 0; i < sizes.size(); ++i) {
          plan.push_back({n, sizes[i], exponents[i], 0});
          n += sizes[i];
        }
        if (grads.shape(1) != n) Raise(InvalidArgument("the rows are not the buckets' length"));
        std::unique_ptr<Device> cpu = CreateCpuDevice(1);
        std::vector<int64_t> sums(n, 0);
        std::vector<uint32_t> max_bits(plan.size(), 0);
        uint32_t bad = 0;
        for (size_t row = 0; row < grads.shape(0); ++row) {
          cpu->FoldBuckets(grads.data() + row * n, FoldPlan{plan, plan.data()}, kFixedPointLimit,
                           sums.data(), max_bits.data(), &bad);
        }
        return std::make_tuple(sums, max_bits, bad != 0);
      },
      nb::arg("grads"), nb::arg("sizes"), nb::arg("exponents"),
      "The exact reducer's own fold (the CPU's) of the rows of `grads`, virtual nodes' "
      "gradients, over consecutive buckets of `sizes` with `exponents` (INT32_MIN: only "
      "measured): (sums, each bucket's largest |gradient| bit pattern, overflow flag).");

  nb::class_<Sharder>(m, "Sharder")
      .def(nb::init<uint64_t, int64_t, int64_t, int>(), nb::arg("seed"), nb::arg("dataset_size"),
           nb::arg("global_batch"), nb::arg("virtual_nodes"))
      .def_static("check", [](int64_t n, int64_t b, int v) { Check(Sharder::Check(n, b, v)); })
      .def_prop_ro("steps_per_epoch", &Sharder::steps_per_epoch)
      .def_prop_ro("micro_batch", &Sharder::micro_batch)
      .def("epoch_of", &Sharder::EpochOf)
      .def(
          "indices",
          [](Sharder& s, int64_t step, int vnode) {
            std::vector<int64_t> out;
            s.MicroBatch(step, vnode, &out);
            return out;
          },
          "Sample indices of virtual node `vnode` at global step `step` (invariant 2).");

  nb::class_<MembershipView>(m, "Membership")
      .def_ro("members", &MembershipView::members)
      .def_ro("epoch", &MembershipView::epoch)
      .def_ro("rank", &MembershipView::rank)
      .def_ro("world", &MembershipView::world)
      .def_ro("virtual_nodes", &MembershipView::virtual_nodes)
      .def_ro("switched", &MembershipView::switched);

  nb::class_<Worker>(m, "Worker")
      .def(
          "__init__",
          [](Worker* self, const std::string& coordinator, const std::string& job_id,
             const std::string& worker, const std::string& token, const std::string& fingerprint,
             const std::string& build, double timeout, double report_interval, int metrics_port,
             const std::string& host, const std::string& ca_file,
             const std::string& termination_message_path) {
            agent::AgentOptions o;
            o.coordinator_url = coordinator;
            o.job_id = job_id;
            o.worker = worker;
            o.token = token;
            o.fingerprint = fingerprint;
            o.build = build;
            o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
            o.report_interval = report_interval;
            o.metrics_port = metrics_port;
            o.host = host;
            o.ca_file = ca_file;
            o.termination_message_path = termination_message_path;
            new (self) Worker(o);
          },
          nb::arg("coordinator"), nb::arg("job_id"), nb::arg("worker"), nb::arg("token"),
          nb::arg("fingerprint"), nb::arg("build"), nb::arg("timeout") = 60.0,
          nb::arg("report_interval") = 1.0, nb::arg("metrics_port") = -1,
          nb::arg("host") = "127.0.0.1", nb::arg("ca_file") = "",
          nb::arg("termination_message_path") = "")
      .def("ready", &Worker::Ready)
      .def("collectives_on_nccl", &Worker::CollectivesOnNccl, nb::arg("cuda_device"))
      .def("next", &Worker::Next, nb::arg("holder"))
      .def("left_untold_on_request", &Worker::LeftUntoldOnRequest)
      .def("configure_reducer", &Worker::ConfigureReducer, nb::arg("mode"), nb::arg("sizes"),
           nb::arg("virtual_nodes"))
      .def("begin", &Worker::Begin)
      .def("add", &Worker::Add, nb::arg("grad"))
      .def("buckets", &Worker::Buckets)
      .def("add_folded", &Worker::AddFolded, nb::arg("folded"))
      .def("add_folded_flags", &Worker::AddFoldedFlags, nb::arg("flags"))
      .def("finish_kept", &Worker::FinishKept)
      .def("add_loss", &Worker::AddLoss, nb::arg("loss_sum"), nb::arg("samples"))
      .def("finish", &Worker::Finish, nb::arg("mean_grad"))
      .def("exponents", &Worker::Exponents)
      .def("set_exponents", &Worker::SetExponents)
      .def("completed", &Worker::Completed, nb::arg("step"), nb::arg("loss"), nb::arg("seconds"),
           nb::arg("compute_seconds"), nb::arg("samples"), nb::arg("agreed_epoch"),
           nb::arg("last_step"))
      .def("failed", &Worker::Failed, nb::arg("step"), nb::arg("message"))
      .def("checkpoint_written", &Worker::CheckpointWritten, nb::arg("step"), nb::arg("error"))
      .def("finish_job", &Worker::FinishJob, nb::arg("step"), nb::arg("loss"),
           nb::arg("weights_sha256"), nb::arg("test_accuracy"))
      .def("all_gather", &Worker::AllGather, nb::arg("value"))
      .def("set_total_steps", &Worker::set_total_steps, nb::arg("total_steps"))
      .def("close", &Worker::Close)
      .def_prop_ro("latest_epoch", &Worker::latest_epoch);

  m.def(
      "exit_with_parent",
      [](int64_t parent) {
        // A launcher that dies, even by SIGKILL, takes its workers with it.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) std::_Exit(1);  // the parent died before prctl
      },
      "Die with the process `parent` (vf run sets VF_EXIT_WITH_PARENT).");
  m.def(
      "leave_on_sigterm", [] { std::signal(SIGTERM, [](int) { agent::RequestLeave(); }); },
      "SIGTERM makes this worker leave gracefully at the next step boundary.");
  m.def(
      "read_credential_file",
      [](const std::string& path, const std::string& what, const std::string& worker,
         double timeout) {
        const auto patience = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
        return Take(
            Released([&] { return agent::ReadCredentialFile(path, what, worker, patience); }));
      },
      nb::arg("path"), nb::arg("what"), nb::arg("worker"), nb::arg("timeout"),
      "The contents of a file the pod is given for the coordinator (its token, the CA), read "
      "again every half second for up to `timeout` seconds while it cannot be read or is empty; "
      "then CollectiveError: the worker exits 1 and is replaced, the job goes on.");
  m.def(
      "cuda_plugin",
      [] {
        Result<std::string> path = LoadCudaPlugin();
        if (!path.ok()) Raise(Internal(path.status().message()));  // virtualflow.Error
        return std::move(path).value();
      },
      "Loads libvirtualflow-cuda.so, which NCCL collectives need ($VF_CUDA_PLUGIN, else beside "
      "the executable), and returns its path; virtualflow.Error says why it cannot be loaded. "
      "Needs no GPU. Import torch first: the library uses the CUDA and NCCL libraries that "
      "PyTorch's wheels bring.");
  m.def("request_leave", &agent::RequestLeave,
        "Leave the job gracefully at the next step boundary (what SIGTERM does).");
}

}  // namespace vf::python
