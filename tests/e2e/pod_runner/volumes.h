// A pod's volumes as the kubelet would mount them, for a runner that does not chroot: each
// volume the container mounts gets a directory on the host (emptyDir, Secret, ConfigMap and
// downwardAPI ones under the pod's state directory; hostPath and PersistentVolumeClaim ones
// where they are), and each volumeMount becomes a bind mount of that directory (or its subPath)
// at the mountPath in the process's own mount namespace.
//
// PlanVolumes is pure (objects come through lookups), so every rule is unit-tested; Prepare and
// Cleanup do what a plan says on the host file system.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/status.h"
#include "tests/e2e/pod_runner/env.h"
#include "tests/e2e/pod_runner/process.h"

namespace vf::podrunner {

// The API reads a plan needs. Each must return kNotFound when the object does not exist.
// Value type; thread-compatible.
struct VolumeLookups {
  ObjectLookup objects;  // Secrets and ConfigMaps
  std::function<Result<nlohmann::json>(const std::string& ns, const std::string& name)> claim;
  std::function<Result<nlohmann::json>(const std::string& name)> volume;  // PersistentVolumes
};

// One file of a Secret, ConfigMap or downwardAPI volume. Value type; thread-compatible.
struct VolumeFile {
  std::string path;  // relative to the volume's directory
  std::string content;
  int mode = 0644;
  friend bool operator==(const VolumeFile&, const VolumeFile&) = default;
};

// Where one volume lives on the host and what must be made for it. Value type;
// thread-compatible.
struct VolumeSource {
  enum class Kind {
    kDirectory,  // emptyDir on disk: an empty directory the runner makes and removes
    kMemory,     // emptyDir with medium Memory: a tmpfs the runner mounts and removes
    kHost,       // hostPath or a PersistentVolume's path: used as it is
    kFiles,      // Secret, ConfigMap, downwardAPI: a directory the runner fills and removes
  };
  std::string name;
  Kind kind = Kind::kDirectory;
  std::string path;                   // on the host
  std::string host_path_type;         // kHost from hostPath: its `type` ("" = no check)
  std::optional<int64_t> size_limit;  // kMemory: bytes (sizeLimit)
  std::vector<VolumeFile> files;      // kFiles
};

// What the runner does for a pod's volumes. Value type; thread-compatible.
struct VolumePlan {
  std::vector<VolumeSource> volumes;  // only the ones the container mounts
  std::vector<BindMount> mounts;      // parents before children
  // Directories inside volumes that subPath mounts need (made when missing, as the kubelet
  // does).
  std::vector<std::string> sub_path_dirs;
  // The file on the host that holds the container's termination message (AddTerminationMessage);
  // "" when none is mounted.
  std::string termination_message;
};

// The plan for `container` of `pod`, with the pod's own volumes under `pod_dir` (the pod's
// state directory, which need not exist yet).
//
// Errors: kInvalidArgument for what can never work (a volume kind the runner does not support,
// a mount of a volume the pod lacks, a relative mountPath, a subPath that leaves its volume):
// the pod fails. Anything else (a PersistentVolumeClaim or Secret that does not exist yet, a
// claim not Bound, a lookup that failed) is worth waiting for: the pod stays Pending and the
// plan is tried again.
Result<VolumePlan> PlanVolumes(const nlohmann::json& pod, const nlohmann::json& container,
                               const VolumeLookups& lookups, const std::string& pod_dir,
                               const EnvContext& context);

// Adds the container's termination message to `plan` as the kubelet does: an empty file of the
// pod's (<pod_dir>/termination-log) bind-mounted at the container's terminationMessagePath
// (default /dev/termination-log), which the runner reads when the process ends
// (ReadTerminationMessage). A path that is empty or not absolute adds nothing.
void AddTerminationMessage(VolumePlan& plan, const nlohmann::json& container,
                           const std::string& pod_dir);

// What the kubelet reports of a termination message file: its first 4096 bytes ("" when it is
// missing or empty).
std::string ReadTerminationMessage(const std::string& path);

// Whether `name` is the service account token volume the API server adds to every pod
// (kube-api-access-*, a projected volume). PlanVolumes leaves it and its mount out: the
// processes are not in the cluster (they reach the API server through the kubeconfig they are
// given, if at all), so a kubelet's token and CA files would serve nothing.
bool IsServiceAccountVolume(std::string_view name);

// A Kubernetes quantity ("64Mi", "1G", "1500") in bytes.
Result<int64_t> ParseQuantity(const std::string& text);

// The directories, outermost first, that must be made for `path` to exist: its ancestors (and
// itself) for which `exists` is false.
std::vector<std::string> MissingDirs(const std::string& path,
                                     const std::function<bool(const std::string&)>& exists);

// What Prepare made on the host, so that Cleanup removes exactly that. Value type;
// thread-compatible.
struct VolumeState {
  std::vector<std::string> created;  // mount targets made on the host (dirs and empty files)
  std::vector<std::string> tmpfs;    // tmpfs mounts in the runner's namespace
  std::string pod_dir;               // removed as a whole
};

// Makes what `plan` needs: the pod's volume directories, tmpfs mounts and files, the subPath
// directories, hostPath directories of type DirectoryOrCreate, and every mount target that is
// missing on the host (recorded in `state` as it goes, so a failure half way is cleaned up too).
// Errors are worth retrying (a hostPath of type Directory that is not there yet).
Status Prepare(const VolumePlan& plan, VolumeState& state);

// Removes what Prepare made. Mount targets that are in `keep` or an ancestor of one (other pods
// still mount there: removing a directory that is a mount point in another mount namespace
// would unmount it there), or that some mount namespace on the host has a mount on or below
// (a pod of another runner), are left and returned, for a later RemoveCreated. Directories are
// removed only when empty; errors are logged.
std::vector<std::string> Cleanup(VolumeState& state, const std::vector<std::string>& keep);

// Writes `state` to <pod_dir>/state, so that a runner started after this one was killed can
// undo it (RemoveStaleStates).
void SaveState(const VolumeState& state);

// Undoes every pod state found under `pods_dir` (one directory per pod, as a killed runner left
// them): unmounts their tmpfs, removes the mount points they made (when empty) and the
// directories themselves.
void RemoveStaleStates(const std::string& pods_dir);

// Removes the paths (mount targets made for pods) that are not in `keep` nor an ancestor of one,
// and that no mount namespace on the host has a mount on or below (read from /proc/*/mountinfo,
// symbolic links in the paths resolved), deepest first, directories only when empty; returns
// the ones left.
std::vector<std::string> RemoveCreated(std::vector<std::string> paths,
                                       const std::vector<std::string>& keep);

}  // namespace vf::podrunner
