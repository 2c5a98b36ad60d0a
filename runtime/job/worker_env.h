// The environment of a worker process: every VF_* variable the operator or `vf run` gives a
// worker and the worker (virtualflow-agent, or a user's program through virtualflow.torch) reads,
// with its meaning, in one table. The operator builds pods from it, `vf run` starts local
// workers from it, the agent reads these names, and the Python library reads them through
// virtualflow._core (ENV_JOB_SPEC == "VF_JOB_SPEC", ...); worker_env_test checks the user
// guide's list against it. Here, on the lowest floor, because every floor above uses it.
#pragma once

#include <array>
#include <string_view>

namespace vf::worker_env {

// Who gives a variable its value.
enum class Kind {
  // A fact of the job or of this worker, set by whoever starts the worker (the operator, `vf
  // run`): a pod template's value of the same name is dropped.
  kFact,
  // A setting `vf run` gives from its flags; a template's env may give it too.
  kRunFlag,
  // A setting of the worker: the template's env (or the environment `vf run` runs in) gives it.
  kSetting,
};

// One variable of a worker's environment. Constant plain data; thread-safe.
struct Variable {
  const char* name;     // VF_...
  Kind kind;            //
  const char* meaning;  // one line for people
};

// The job's facts.
inline constexpr Variable kJobSpec{"VF_JOB_SPEC", Kind::kFact,
                                   "the job's manifest itself (JSON or YAML)"};
inline constexpr Variable kJob{"VF_JOB", Kind::kFact, "the job file's path (vf run)"};
inline constexpr Variable kCoordinator{"VF_COORDINATOR", Kind::kFact, "the coordinator's URL"};
inline constexpr Variable kJobId{"VF_JOB_ID", Kind::kFact, "the job's namespace/name"};
inline constexpr Variable kWorker{"VF_WORKER", Kind::kFact, "this worker's name"};
inline constexpr Variable kJobTokenFile{"VF_JOB_TOKEN_FILE", Kind::kFact,
                                        "the file holding this worker's coordinator credential"};
inline constexpr Variable kJobToken{"VF_JOB_TOKEN", Kind::kFact,
                                    "this worker's coordinator credential itself"};
inline constexpr Variable kCoordinatorCaFile{
    "VF_COORDINATOR_CA_FILE", Kind::kFact,
    "the CA an https:// coordinator's certificate must chain to"};
inline constexpr Variable kMetricsPort{"VF_METRICS_PORT", Kind::kFact,
                                       "the port of the worker's /metrics (0: any free one)"};
inline constexpr Variable kResult{"VF_RESULT", Kind::kFact,
                                  "where the worker writes its result (JSON)"};
inline constexpr Variable kPodIp{"VF_POD_IP", Kind::kFact,
                                 "the pod's address, where the communicator listens"};
inline constexpr Variable kTerminationMessagePath{
    "VF_TERMINATION_MESSAGE_PATH", Kind::kFact,
    "the file the worker's last report goes to (the container's termination message)"};
inline constexpr Variable kTestAgentProtocol{
    "VF_TEST_AGENT_PROTOCOL", Kind::kFact,
    "tests only: the coordinator protocol the worker speaks, as its operator's"};

// Set by `vf run` from its flags; a template may set them too.
inline constexpr Variable kTimeout{"VF_TIMEOUT", Kind::kRunFlag,
                                   "seconds the worker waits for the coordinator (--timeout)"};
inline constexpr Variable kReportInterval{"VF_REPORT_INTERVAL", Kind::kRunFlag,
                                          "seconds between progress reports"};
inline constexpr Variable kSteps{"VF_STEPS", Kind::kRunFlag,
                                 "the job's length in steps, replacing the manifest's (--steps)"};
inline constexpr Variable kSlowdown{"VF_SLOWDOWN", Kind::kRunFlag,
                                    "experiments: this worker's step time multiplied by it"};
inline constexpr Variable kVnodeDelayMs{
    "VF_VNODE_DELAY_MS", Kind::kRunFlag,
    "experiments: milliseconds added to each virtual node's step (--vnode-delay-ms)"};
inline constexpr Variable kExitWithParent{"VF_EXIT_WITH_PARENT", Kind::kRunFlag,
                                          "a process id: the worker exits when it does"};

// The worker's own settings.
inline constexpr Variable kThreads{"VF_THREADS", Kind::kSetting,
                                   "PyTorch's threads per worker (default 1)"};
inline constexpr Variable kCheckEvery{"VF_CHECK_EVERY", Kind::kSetting,
                                      "check mode: compare the workers' state every N steps"};
inline constexpr Variable kDevice{"VF_DEVICE", Kind::kSetting,
                                  "the built-in model's device: cpu, or cuda-shared"};
inline constexpr Variable kCudaPlugin{"VF_CUDA_PLUGIN", Kind::kSetting,
                                      "the path of the CUDA plugin library"};
inline constexpr Variable kTorchFold{
    "VF_TORCH_FOLD", Kind::kSetting,
    "where exact reduction folds a node's gradients: device or host"};
inline constexpr Variable kTorchFoldKernel{
    "VF_TORCH_FOLD_KERNEL", Kind::kSetting,
    "how a GPU folds a node's gradients: triton (one kernel, the default) or torch"};
inline constexpr Variable kTorchCollectives{"VF_TORCH_COLLECTIVES", Kind::kSetting,
                                            "gloo (the default) or nccl"};
inline constexpr Variable kTorchStaging{
    "VF_TORCH_STAGING", Kind::kSetting,
    "slots of pinned host memory a GPU's gradients are staged through (1 or 2)"};
inline constexpr Variable kCommThreadNice{
    "VF_COMM_THREAD_NICE", Kind::kSetting,
    "the nice value (0..19) of the Gloo thread that reads the sockets (default 0)"};
inline constexpr Variable kFaultInject{"VF_FAULT_INJECT", Kind::kSetting,
                                       "tests only: faults to inject, worker-N:point[@step],..."};

// Every variable, facts first.
inline constexpr std::array kAll{kJobSpec,
                                 kJob,
                                 kCoordinator,
                                 kJobId,
                                 kWorker,
                                 kJobTokenFile,
                                 kJobToken,
                                 kCoordinatorCaFile,
                                 kMetricsPort,
                                 kResult,
                                 kPodIp,
                                 kTerminationMessagePath,
                                 kTestAgentProtocol,
                                 kTimeout,
                                 kReportInterval,
                                 kSteps,
                                 kSlowdown,
                                 kVnodeDelayMs,
                                 kExitWithParent,
                                 kThreads,
                                 kCheckEvery,
                                 kDevice,
                                 kCudaPlugin,
                                 kTorchFold,
                                 kTorchFoldKernel,
                                 kTorchCollectives,
                                 kTorchStaging,
                                 kCommThreadNice,
                                 kFaultInject};

// The variable called `name`, or nullptr.
constexpr const Variable* Find(std::string_view name) {
  for (const Variable& v : kAll) {
    if (name == v.name) return &v;
  }
  return nullptr;
}

// Whether a worker's starter sets `name` itself (a template's value of it is dropped).
constexpr bool IsFact(std::string_view name) {
  const Variable* v = Find(name);
  return v != nullptr && v->kind == Kind::kFact;
}

}  // namespace vf::worker_env
