#include "tests/e2e/pod_runner/volumes.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "operator/kube/config.h"
#include "tests/e2e/pod_runner/log.h"
#include "tests/e2e/pod_runner/pod_json.h"

namespace vf::podrunner {
namespace {

using nlohmann::json;

constexpr int kDefaultMode = 0644;  // the API's defaultMode default, 420
// The projected volume the ServiceAccount admission plugin adds to every pod, and where.
constexpr std::string_view kServiceAccountVolume = "kube-api-access-";
constexpr char kDefaultTerminationMessagePath[] = "/dev/termination-log";
constexpr size_t kMaxTerminationMessageBytes = 4096;  // what the kubelet keeps of the file

std::string Errno() { return std::strerror(errno); }

// A path inside a volume: relative, without "..", as the API server also demands.
bool SafeRelative(const std::string& path) {
  if (path.empty() || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const std::string part = path.substr(start, slash - start);
    if (part == "..") return false;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

int Depth(const std::string& path) {
  return static_cast<int>(std::count(path.begin(), path.end(), '/'));
}

int ModeAt(const json& object, const char* key, int fallback) {
  const std::optional<int64_t> mode = IntAt(object, {key});
  return mode.has_value() && *mode >= 0 && *mode <= 0777 ? static_cast<int>(*mode) : fallback;
}

// The key -> bytes of a Secret (data, base64) or ConfigMap (data as is, binaryData base64).
Result<std::map<std::string, std::string>> KeysOf(SourceKind kind, const json& object,
                                                  const std::string& where) {
  std::map<std::string, std::string> out;
  auto add = [&](const char* field, bool base64) -> Status {
    const json* data = Field(object, field);
    if (data == nullptr || !data->is_object()) return Status::Ok();
    for (const auto& [key, value] : data->items()) {
      if (!value.is_string()) continue;
      if (!base64) {
        out[key] = value.get<std::string>();
        continue;
      }
      Result<std::string> decoded = kube::DecodeBase64(value.get<std::string>());
      if (!decoded.ok()) return InvalidArgument("key " + key + " of " + where + " is not base64");
      out[key] = std::move(decoded).value();
    }
    return Status::Ok();
  };
  const bool secret = kind == SourceKind::kSecret;
  VF_RETURN_IF_ERROR(add("data", secret));
  if (!secret) VF_RETURN_IF_ERROR(add("binaryData", true));
  return out;
}

// The files of a Secret or ConfigMap volume: every key, or `items` with their paths and modes.
Result<std::vector<VolumeFile>> KeyFiles(SourceKind kind, const json& source, const std::string& ns,
                                         const std::string& name, const ObjectLookup& lookup) {
  const bool secret = kind == SourceKind::kSecret;
  const std::string where = std::string(secret ? "Secret " : "ConfigMap ") + ns + "/" + name;
  const bool optional = BoolAt(source, {"optional"});
  const int default_mode = ModeAt(source, "defaultMode", kDefaultMode);
  Result<json> object = lookup ? lookup(kind, ns, name) : Internal("no lookup function");
  if (!object.ok()) {
    if (object.status().code() != StatusCode::kNotFound) {
      return object.status().WithContext("reading " + where);
    }
    if (optional) return std::vector<VolumeFile>();
    return NotFound(std::string(secret ? "secret" : "configmap") + " \"" + name + "\" not found");
  }
  VF_ASSIGN_OR_RETURN(auto keys, KeysOf(kind, *object, where));
  std::vector<VolumeFile> files;
  const json* items = Field(source, "items");
  if (items == nullptr || !items->is_array() || items->empty()) {
    for (auto& [key, value] : keys) files.push_back({key, std::move(value), default_mode});
    return files;
  }
  for (const json& item : *items) {
    const std::string key = StringAt(item, {"key"});
    const std::string path = StringAt(item, {"path"});
    if (!SafeRelative(path)) {
      return InvalidArgument("item path '" + path + "' of " + where + " must be relative");
    }
    auto it = keys.find(key);
    if (it == keys.end()) {
      if (optional) continue;
      return NotFound("couldn't find key " + key + " in " + where);
    }
    files.push_back({path, it->second, ModeAt(item, "mode", default_mode)});
  }
  return files;
}

Result<std::vector<VolumeFile>> DownwardFiles(const json& source, const json& pod,
                                              const EnvContext& context) {
  const int default_mode = ModeAt(source, "defaultMode", kDefaultMode);
  std::vector<VolumeFile> files;
  const json* items = Field(source, "items");
  if (items == nullptr || !items->is_array()) return files;
  for (const json& item : *items) {
    const std::string path = StringAt(item, {"path"});
    if (!SafeRelative(path)) return InvalidArgument("downwardAPI path '" + path + "' is invalid");
    const std::string field = StringAt(item, {"fieldRef", "fieldPath"});
    if (field.empty()) {
      return InvalidArgument("downwardAPI item " + path +
                             ": only fieldRef is supported by vf-pod-runner");
    }
    VF_ASSIGN_OR_RETURN(std::string value, FieldRefValue(pod, field, context));
    files.push_back({path, std::move(value), ModeAt(item, "mode", default_mode)});
  }
  return files;
}

// The PersistentVolume path behind a claim, and whether the claim is read-only.
Result<std::string> ClaimPath(const json& source, const std::string& ns,
                              const VolumeLookups& lookups) {
  const std::string claim = StringAt(source, {"claimName"});
  if (claim.empty()) return InvalidArgument("persistentVolumeClaim has no claimName");
  Result<json> pvc = lookups.claim ? lookups.claim(ns, claim) : Internal("no lookup function");
  if (!pvc.ok()) {
    if (pvc.status().code() == StatusCode::kNotFound) {
      return NotFound("persistentvolumeclaim \"" + claim + "\" not found");
    }
    return pvc.status().WithContext("reading persistentvolumeclaim " + ns + "/" + claim);
  }
  const std::string phase = StringAt(*pvc, {"status", "phase"});
  const std::string pv = StringAt(*pvc, {"spec", "volumeName"});
  if (phase != "Bound" || pv.empty()) {
    return FailedPrecondition("persistentvolumeclaim \"" + claim + "\" is not bound (phase " +
                              (phase.empty() ? "unknown" : phase) + ")");
  }
  Result<json> volume = lookups.volume ? lookups.volume(pv) : Internal("no lookup function");
  if (!volume.ok()) {
    if (volume.status().code() == StatusCode::kNotFound) {
      return NotFound("persistentvolume \"" + pv + "\" of claim " + claim + " not found");
    }
    return volume.status().WithContext("reading persistentvolume " + pv);
  }
  std::string path = StringAt(*volume, {"spec", "hostPath", "path"});
  if (path.empty()) path = StringAt(*volume, {"spec", "local", "path"});
  if (path.empty() || path.front() != '/') {
    return InvalidArgument("persistentvolume " + pv + " (claim " + claim +
                           ") has no hostPath or local path: vf-pod-runner cannot mount it");
  }
  return path;
}

struct Resolved {
  VolumeSource source;
  bool read_only = false;  // every mount of it is read-only
};

Result<Resolved> ResolveVolume(const json& volume, const json& pod, const VolumeLookups& lookups,
                               const std::string& pod_dir, const EnvContext& context) {
  Resolved out;
  VolumeSource& v = out.source;
  v.name = StringAt(volume, {"name"});
  const std::string ns = StringAt(pod, {"metadata", "namespace"});
  const std::string own_dir = pod_dir + "/volumes/" + v.name;
  const auto where = [&](const Status& s) { return s.WithContext("volume " + v.name); };
  if (const json* s = Field(volume, "emptyDir")) {
    v.path = own_dir;
    if (StringAt(*s, {"medium"}) == "Memory") {
      v.kind = VolumeSource::Kind::kMemory;
      const std::string limit = StringAt(*s, {"sizeLimit"});
      if (!limit.empty()) {
        Result<int64_t> bytes = ParseQuantity(limit);
        if (!bytes.ok()) return where(bytes.status());
        v.size_limit = *bytes;
      }
    }
  } else if (const json* h = Field(volume, "hostPath")) {
    v.kind = VolumeSource::Kind::kHost;
    v.path = StringAt(*h, {"path"});
    v.host_path_type = StringAt(*h, {"type"});
    if (v.path.empty() || v.path.front() != '/') {
      return where(InvalidArgument("hostPath path '" + v.path + "' must be absolute"));
    }
  } else if (const json* c = Field(volume, "persistentVolumeClaim")) {
    v.kind = VolumeSource::Kind::kHost;
    Result<std::string> path = ClaimPath(*c, ns, lookups);
    if (!path.ok()) return where(path.status());
    v.path = *path;
    out.read_only = BoolAt(*c, {"readOnly"});
  } else if (const json* sec = Field(volume, "secret")) {
    v.kind = VolumeSource::Kind::kFiles;
    v.path = own_dir;
    auto files =
        KeyFiles(SourceKind::kSecret, *sec, ns, StringAt(*sec, {"secretName"}), lookups.objects);
    if (!files.ok()) return where(files.status());
    v.files = std::move(files).value();
    out.read_only = true;
  } else if (const json* cm = Field(volume, "configMap")) {
    v.kind = VolumeSource::Kind::kFiles;
    v.path = own_dir;
    auto files =
        KeyFiles(SourceKind::kConfigMap, *cm, ns, StringAt(*cm, {"name"}), lookups.objects);
    if (!files.ok()) return where(files.status());
    v.files = std::move(files).value();
    out.read_only = true;
  } else if (const json* d = Field(volume, "downwardAPI")) {
    v.kind = VolumeSource::Kind::kFiles;
    v.path = own_dir;
    auto files = DownwardFiles(*d, pod, context);
    if (!files.ok()) return where(files.status());
    v.files = std::move(files).value();
    out.read_only = true;
  } else {
    std::string kind = "this kind of";
    for (const auto& [key, value] : volume.items()) {
      if (key != "name") kind = key;
    }
    return where(InvalidArgument(
        "vf-pod-runner does not support " + kind +
        " volumes (only emptyDir, hostPath, persistentVolumeClaim, secret, configMap and "
        "downwardAPI)"));
  }
  return out;
}

}  // namespace

Result<int64_t> ParseQuantity(const std::string& text) {
  static const std::pair<const char*, long double> kSuffixes[] = {
      {"Ki", 1024.0L},
      {"Mi", 1024.0L * 1024},
      {"Gi", 1024.0L * 1024 * 1024},
      {"Ti", 1024.0L * 1024 * 1024 * 1024},
      {"k", 1e3L},
      {"M", 1e6L},
      {"G", 1e9L},
      {"T", 1e12L},
  };
  size_t digits = 0;
  while (digits < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) {
    ++digits;
  }
  const std::string number = text.substr(0, digits);
  const std::string suffix = text.substr(digits);
  long double scale = 0;
  if (suffix.empty()) scale = 1;
  for (const auto& [s, v] : kSuffixes) {
    if (suffix == s) scale = v;
  }
  if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1 ||
      scale == 0) {
    return InvalidArgument("'" + text + "' is not a quantity (like 64Mi or 1G)");
  }
  return static_cast<int64_t>(std::ceil(std::stold(number) * scale));
}

bool IsServiceAccountVolume(std::string_view name) {
  return name.starts_with(kServiceAccountVolume);
}

Result<VolumePlan> PlanVolumes(const json& pod, const json& container, const VolumeLookups& lookups,
                               const std::string& pod_dir, const EnvContext& context) {
  VolumePlan plan;
  const json* mounts = Field(container, "volumeMounts");
  if (mounts == nullptr || !mounts->is_array() || mounts->empty()) return plan;
  std::map<std::string, const json*> declared;
  if (const json* volumes = FieldPath(pod, {"spec", "volumes"});
      volumes != nullptr && volumes->is_array()) {
    for (const json& v : *volumes) declared[StringAt(v, {"name"})] = &v;
  }
  std::map<std::string, Resolved> resolved;  // by volume name, in plan.volumes order
  for (const json& m : *mounts) {
    const std::string name = StringAt(m, {"name"});
    if (IsServiceAccountVolume(name)) continue;
    const std::string target = StringAt(m, {"mountPath"});
    const std::string sub_path = StringAt(m, {"subPath"});
    const std::string what = "volumeMount " + name + " at " + target;
    if (target.empty() || target.front() != '/') {
      return InvalidArgument(what + ": the mountPath must be absolute");
    }
    if (!StringAt(m, {"subPathExpr"}).empty()) {
      return InvalidArgument(what + ": subPathExpr is not supported by vf-pod-runner");
    }
    if (!sub_path.empty() && !SafeRelative(sub_path)) {
      return InvalidArgument(what + ": subPath '" + sub_path + "' must stay inside the volume");
    }
    auto d = declared.find(name);
    if (d == declared.end()) return InvalidArgument(what + ": the pod has no volume " + name);
    auto it = resolved.find(name);
    if (it == resolved.end()) {
      VF_ASSIGN_OR_RETURN(Resolved r, ResolveVolume(*d->second, pod, lookups, pod_dir, context));
      plan.volumes.push_back(r.source);
      it = resolved.emplace(name, std::move(r)).first;
    }
    const VolumeSource& v = it->second.source;
    BindMount mount;
    mount.source = sub_path.empty() ? v.path : v.path + "/" + sub_path;
    mount.target = target;
    mount.read_only = BoolAt(m, {"readOnly"}) || it->second.read_only;
    for (const BindMount& other : plan.mounts) {
      if (other.target == target) return InvalidArgument(what + ": the mountPath is used twice");
    }
    if (!sub_path.empty() && v.kind != VolumeSource::Kind::kFiles) {
      plan.sub_path_dirs.push_back(mount.source);
    }
    plan.mounts.push_back(std::move(mount));
  }
  std::stable_sort(
      plan.mounts.begin(), plan.mounts.end(),
      [](const BindMount& a, const BindMount& b) { return Depth(a.target) < Depth(b.target); });
  return plan;
}

void AddTerminationMessage(VolumePlan& plan, const json& container, const std::string& pod_dir) {
  std::string target = StringAt(container, {"terminationMessagePath"});
  if (target.empty() && Field(container, "terminationMessagePath") == nullptr) {
    target = kDefaultTerminationMessagePath;  // the API server's default
  }
  if (target.empty() || target.front() != '/') return;
  for (const BindMount& m : plan.mounts) {
    if (m.target == target) return;  // a volume mounted there wins
  }
  plan.termination_message = pod_dir + "/termination-log";
  plan.mounts.push_back({plan.termination_message, target, false});
}

std::string ReadTerminationMessage(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string out(kMaxTerminationMessageBytes, '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  out.resize(static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  return out;
}

std::vector<std::string> MissingDirs(const std::string& path,
                                     const std::function<bool(const std::string&)>& exists) {
  std::vector<std::string> out;
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i != path.size() && path[i] != '/') continue;
    const std::string prefix = path.substr(0, i);
    if (prefix.back() == '/') continue;
    if (out.empty() && exists(prefix)) continue;
    out.push_back(prefix);  // everything under a missing directory is missing too
  }
  return out;
}

namespace {

bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

bool IsDir(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// mkdir -p, recording the directories made in `created` when it is given.
Status MakeDirs(const std::string& path, std::vector<std::string>* created) {
  for (const std::string& dir : MissingDirs(path, Exists)) {
    if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      return Internal("cannot create " + dir + ": " + Errno());
    }
    if (created != nullptr) created->push_back(dir);
  }
  if (!IsDir(path)) return FailedPrecondition(path + " exists and is not a directory");
  return Status::Ok();
}

Status WriteFile(const std::string& path, const std::string& content, int mode) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Internal("cannot write " + path + ": " + Errno());
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      return Internal("cannot write " + path + ": " + Errno());
    }
    done += static_cast<size_t>(n);
  }
  fchmod(fd, static_cast<mode_t>(mode));
  close(fd);
  return Status::Ok();
}

Status PrepareHostPath(const VolumeSource& v) {
  const std::string& type = v.host_path_type;
  if (type.empty() || type == "DirectoryOrCreate") return MakeDirs(v.path, nullptr);
  if (type == "Directory") {
    if (!IsDir(v.path)) return FailedPrecondition("hostPath " + v.path + " is not a directory");
    return Status::Ok();
  }
  if (type == "FileOrCreate" && !Exists(v.path)) {
    const size_t slash = v.path.rfind('/');
    if (slash > 0) VF_RETURN_IF_ERROR(MakeDirs(v.path.substr(0, slash), nullptr));
    return WriteFile(v.path, "", 0644);
  }
  if (!Exists(v.path)) return FailedPrecondition("hostPath " + v.path + " does not exist");
  return Status::Ok();
}

Status PrepareVolume(const VolumeSource& v, VolumeState& state) {
  switch (v.kind) {
    case VolumeSource::Kind::kHost:
      return PrepareHostPath(v);
    case VolumeSource::Kind::kDirectory:
      return MakeDirs(v.path, nullptr);
    case VolumeSource::Kind::kMemory: {
      VF_RETURN_IF_ERROR(MakeDirs(v.path, nullptr));
      std::string options = "mode=0777";
      if (v.size_limit.has_value()) options += ",size=" + std::to_string(*v.size_limit);
      if (mount("tmpfs", v.path.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
        return Internal("mounting a tmpfs at " + v.path + ": " + Errno());
      }
      state.tmpfs.push_back(v.path);
      return Status::Ok();
    }
    case VolumeSource::Kind::kFiles:
      VF_RETURN_IF_ERROR(MakeDirs(v.path, nullptr));
      for (const VolumeFile& f : v.files) {
        const std::string path = v.path + "/" + f.path;
        VF_RETURN_IF_ERROR(MakeDirs(path.substr(0, path.rfind('/')), nullptr));
        VF_RETURN_IF_ERROR(WriteFile(path, f.content, f.mode));
      }
      return Status::Ok();
  }
  return Status::Ok();
}

// A mount target that is missing on the host: directories for a directory, and an empty file
// (in made directories) for a file.
Status MakeTarget(const BindMount& m, VolumeState& state) {
  if (Exists(m.target)) return Status::Ok();
  if (IsDir(m.source)) return MakeDirs(m.target, &state.created);
  const size_t slash = m.target.rfind('/');
  if (slash > 0) VF_RETURN_IF_ERROR(MakeDirs(m.target.substr(0, slash), &state.created));
  VF_RETURN_IF_ERROR(WriteFile(m.target, "", 0644));
  state.created.push_back(m.target);
  return Status::Ok();
}

// The termination message file, empty and writable by the container, and its mount point. A
// missing mount point is made and left on the host, not recorded for removal: the same path
// (/dev/termination-log) is every pod's, including those of other runners on the machine, and
// removing a file that is a mount point in another mount namespace would unmount it there.
Status PrepareTerminationMessage(const BindMount& m) {
  VF_RETURN_IF_ERROR(MakeDirs(m.source.substr(0, m.source.rfind('/')), nullptr));
  VF_RETURN_IF_ERROR(WriteFile(m.source, "", 0666));
  if (Exists(m.target)) return Status::Ok();
  const size_t slash = m.target.rfind('/');
  if (slash > 0) VF_RETURN_IF_ERROR(MakeDirs(m.target.substr(0, slash), nullptr));
  const int fd = open(m.target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Internal("cannot create " + m.target + ": " + Errno());
  close(fd);
  return Status::Ok();
}

bool Kept(const std::string& path, const std::vector<std::string>& keep) {
  for (const auto& k : keep) {
    if (k == path || (k.size() > path.size() && k.starts_with(path) && k[path.size()] == '/')) {
      return true;
    }
  }
  return false;
}

// A mount point as /proc/PID/mountinfo writes it: space, tab, newline and backslash as octal
// escapes (\040, \011, \012, \134).
std::string UnescapeMountField(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string digits = field.substr(i + 1, 3);
      if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out += static_cast<char>(std::stoi(digits, nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

// The mount points of every mount namespace on this host, each namespace read once (from the
// first of its processes whose mountinfo can be read). Every pod of every runner on the host
// has a namespace of its own; this is how one runner sees another's pods' mounts, which share
// the host's directories as mount points.
std::vector<std::string> MountPointsOfEveryNamespace() {
  std::set<std::string> namespaces;
  std::set<std::string> points;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string pid = entry.path().filename().string();
    if (pid.empty() ||
        !std::all_of(pid.begin(), pid.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    std::error_code link_error;
    const std::string ns =
        std::filesystem::read_symlink(entry.path() / "ns" / "mnt", link_error).string();
    if (link_error || namespaces.count(ns) != 0) continue;
    std::ifstream in(entry.path() / "mountinfo");
    std::string line;
    bool read = false;
    while (std::getline(in, line)) {
      read = true;
      // "ID PARENT MAJOR:MINOR ROOT MOUNT-POINT OPTIONS ...", see proc(5).
      std::istringstream fields(line);
      std::string id, parent, device, root, point;
      if (fields >> id >> parent >> device >> root >> point) {
        points.insert(UnescapeMountField(point));
      }
    }
    if (read) namespaces.insert(ns);
  }
  return {points.begin(), points.end()};
}

// Whether something is mounted at `path` or below it in some mount namespace on the host. The
// kernel names mount points with symbolic links resolved (/var/run/x is /run/x), so the path is
// resolved first.
bool MountedAnywhere(const std::string& path, const std::vector<std::string>& mount_points) {
  std::error_code error;
  const std::filesystem::path resolved = std::filesystem::canonical(path, error);
  return Kept(error ? path : resolved.string(), mount_points);
}

}  // namespace

Status Prepare(const VolumePlan& plan, VolumeState& state) {
  for (const VolumeSource& v : plan.volumes) {
    if (Status s = PrepareVolume(v, state); !s.ok()) return s.WithContext("volume " + v.name);
  }
  for (const std::string& dir : plan.sub_path_dirs) VF_RETURN_IF_ERROR(MakeDirs(dir, nullptr));
  for (const BindMount& m : plan.mounts) {
    Status made = Status::Ok();
    if (m.source == plan.termination_message) {
      made = PrepareTerminationMessage(m);
    } else {
      made = MakeTarget(m, state);
    }
    if (!made.ok()) return made.WithContext("mount point " + m.target);
  }
  return Status::Ok();
}

std::vector<std::string> RemoveCreated(std::vector<std::string> paths,
                                       const std::vector<std::string>& keep) {
  std::sort(paths.begin(), paths.end(), [](const std::string& a, const std::string& b) {
    return a.size() > b.size();  // a child is longer than its parent
  });
  std::vector<std::string> left;
  // This runner knows which of its own pods use a path (`keep`); other runners' pods on this
  // host may have it mounted too, and removing a directory unmounts it in every namespace that
  // has a mount on it: their secrets and volumes would vanish under running processes.
  const std::vector<std::string> mounted =
      paths.empty() ? std::vector<std::string>() : MountPointsOfEveryNamespace();
  for (const std::string& path : paths) {
    if (Kept(path, keep) || MountedAnywhere(path, mounted)) {
      left.push_back(path);
      continue;
    }
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) continue;
    const bool empty_file = S_ISREG(st.st_mode) && st.st_size == 0;
    const int rc = empty_file ? unlink(path.c_str()) : rmdir(path.c_str());
    if (rc != 0) LogLine("not removing " + path + ", made as a mount point: " + Errno());
  }
  return left;
}

std::vector<std::string> Cleanup(VolumeState& state, const std::vector<std::string>& keep) {
  for (const std::string& path : state.tmpfs) {
    if (umount2(path.c_str(), MNT_DETACH) != 0) {
      LogLine("unmounting the tmpfs at " + path + ": " + Errno());
    }
  }
  if (!state.pod_dir.empty()) {
    std::error_code error;
    std::filesystem::remove_all(state.pod_dir, error);
    if (error) LogLine("removing " + state.pod_dir + ": " + error.message());
  }
  std::vector<std::string> left = RemoveCreated(std::move(state.created), keep);
  state = VolumeState();
  return left;
}

void SaveState(const VolumeState& state) {
  if (state.pod_dir.empty()) return;
  std::ofstream out(state.pod_dir + "/state", std::ios::trunc);
  for (const auto& path : state.tmpfs) out << "tmpfs " << path << "\n";
  for (const auto& path : state.created) out << "created " << path << "\n";
  if (!out) LogLine("cannot write " + state.pod_dir + "/state");
}

void RemoveStaleStates(const std::string& pods_dir) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(pods_dir, error)) {
    VolumeState state;
    state.pod_dir = entry.path().string();
    std::ifstream in(state.pod_dir + "/state");
    std::string line;
    while (std::getline(in, line)) {
      const size_t space = line.find(' ');
      if (space == std::string::npos) continue;
      const std::string kind = line.substr(0, space);
      std::string path = line.substr(space + 1);
      if (kind == "tmpfs") {
        state.tmpfs.push_back(std::move(path));
      } else if (kind == "created") {
        state.created.push_back(std::move(path));
      }
    }
    LogLine("removing the volumes of a pod of an earlier runner: " + state.pod_dir);
    Cleanup(state, {});
  }
}

}  // namespace vf::podrunner
