"""Real nodes for the end-to-end tests: kubelets on containerd, on this machine.

RealNodes(cp).start(images) readies the host for a control plane started with
ControlPlane(nodes="kubelet"): it records the host's state (HostState), imports the images into
a containerd root kept in the cache (only what changed) and starts CoreDNS, the cluster's DNS;
kube-proxy starts with the first node. add_node()
then starts one node: containerd and a kubelet, and the suite's device plugin when the node has
GPUs, all in a mount namespace of the node's own, so that the paths a kubelet and containerd
keep fixed (/var/lib/kubelet with the device-plugin socket, /var/log/pods, /run/containerd,
/run/netns, /var/lib/cni) are the node's and every mount they make goes when the node stops.
The network, the cgroups and the sysctls are the host's: each node's pods are on a bridge of
its own (vfnode<i>, 10.240.<i>.0/24) and reach the other nodes' pods, the host and, through
kube-proxy, the Services' ClusterIPs.

stop() stops the nodes, kube-proxy and CoreDNS and puts the host back as HostState recorded it:
sysctls, iptables rules, and of mounts, cgroups and network links those on the nodes' paths and
names (a test beside this one may make others), and the directories made for the mounts. A
run killed before it could do so leaves the record in STATE_DIR, and the next start() puts the
host back from it first.

Needs root, containerd, runc, the CNI plugins in /usr/lib/cni, umoci, iptables and gcc (for the
pause image: there is no registry to pull one from). See README.md beside this file.
"""

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.request

from controlplane import Component, _wait, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.environ.get("VF_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "virtualflow"
)
# Where the record of the host's state before the nodes started is kept while they run.
STATE_DIR = "/var/lib/vf-e2e-nodes"
PAUSE_SOURCE = os.path.join(HERE, "node", "pause.c")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
CNI_BIN_DIR = "/usr/lib/cni"
# The nodes' pods: node i's bridge vfnode<i> holds 10.240.i.1 of 10.240.i.0/24.
POD_CIDR = "10.240.0.0/16"
BRIDGE_PREFIX = "vfnode"
CGROUP_ROOT = "/sys/fs/cgroup"
# Node NAME's cgroup tree is /vf-node-NAME in each hierarchy (the kubelet's cgroupRoot).
CGROUP_PREFIX = "vf-node-"
# Paths a kubelet or containerd keeps fixed, made the node's own inside its mount namespace.
PRIVATE_PATHS = (
    "/var/lib/kubelet",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/netns",
    "/var/lib/cni",
)
# What the kubelet (protectKernelDefaults: false), kube-proxy and the bridge plugin may set.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.ipv4.conf.all.forwarding",
    "net.ipv4.conf.default.forwarding",
    "net.ipv6.conf.all.forwarding",
    "net.netfilter.nf_conntrack_max",
)
# The cluster DNS Service's ClusterIP (the kubelets' clusterDNS), as kubeadm picks it.
DNS_SERVICE_IP = "10.96.0.10"
# Bumped when the way images are imported changes, so cached containerd roots are remade.
IMAGES_FORMAT = 1


def host_ip():
    """The host's address on its default route: what the nodes advertise and where the API
    server is reached from pods (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # TEST-NET-3: a route, never a host
            return s.getsockname()[0]
        except OSError as e:
            raise RuntimeError("real nodes need an IPv4 default route: %s" % e) from e


def _run(argv, **kwargs):
    kwargs.setdefault("check", True)
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    try:
        return subprocess.run(argv, **kwargs)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(
            "%s failed (exit %d): %s" % (" ".join(argv), e.returncode, (e.stderr or "").strip())
        ) from e


def _sysctl_path(name):
    return "/proc/sys/" + name.replace(".", "/")


# ---------------------------------------------------------------- the host's state


BUILTIN_CHAINS = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}


def _iptables_rules(tool):
    """The rules of every table, without counters and comments: what must come back. A table
    with nothing but its built-in chains, accepting, is left out: once a program has used it
    the kernel lists it, and it cannot be unloaded (nor does it change anything)."""
    proc = subprocess.run([tool + "-save"], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    tables, lines = [], []
    for line in proc.stdout.splitlines():
        if line.startswith("#"):
            continue
        if line.startswith(":"):
            line = line.split(" [")[0]
        lines.append(line)
        if line == "COMMIT":
            empty = all(
                kept.startswith("*")
                or kept == "COMMIT"
                or (kept[1:].split()[0] in BUILTIN_CHAINS and kept.endswith(" ACCEPT"))
                for kept in lines
            )
            if not empty:
                tables.append("\n".join(lines))
            lines = []
    return "\n".join(tables)


def _iptables_tables(tool):
    """The names of the tables TOOL-save lists now."""
    proc = subprocess.run([tool + "-save"], capture_output=True, text=True)
    return [line[1:] for line in proc.stdout.splitlines() if line.startswith("*")]


def _restore_iptables(tool, rules):
    """Makes TOOL's tables hold RULES (as _iptables_rules gives them) again: a table RULES
    has not is emptied, its own chains deleted."""
    text = rules.strip()
    present = {line[1:] for line in text.splitlines() if line.startswith("*")}
    for table in _iptables_tables(tool):
        if table not in present:
            text += "\n*%s\nCOMMIT" % table
    proc = subprocess.run([tool + "-restore"], input=text + "\n", text=True, capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError("%s-restore failed: %s" % (tool, proc.stderr.strip()))


def _cgroups():
    """The cgroup directories of the nodes' trees (CGROUP_PREFIX*) in every mounted hierarchy,
    as paths under CGROUP_ROOT. Others are not the nodes' business: a test beside this one may
    run a container (runc makes its cgroups at the top)."""
    found = []
    for hierarchy in sorted(os.listdir(CGROUP_ROOT)):
        top = os.path.join(CGROUP_ROOT, hierarchy)
        if os.path.islink(top) or not os.path.isdir(top):
            continue
        for name in os.listdir(top):
            if name.startswith(CGROUP_PREFIX):
                for path, _dirs, _files in os.walk(os.path.join(top, name)):
                    found.append(os.path.relpath(path, CGROUP_ROOT))
    return sorted(found)


def _mounts():
    """The host's mount points on the paths the nodes use (the paths they keep as their own,
    /run/netns and the control planes' directories), in its mount namespace: none of the nodes'
    mounts should be there, they are in the nodes' own namespaces."""
    ours = (*PRIVATE_PATHS, "/var/run/netns", os.path.join(tempfile.gettempdir(), "vf-e2e-"))
    with open("/proc/self/mountinfo") as f:
        return sorted(p for p in (line.split()[4] for line in f) if p.startswith(ours))


def _links():
    """The network links the nodes make: their bridges and their pods' veth ends."""
    return sorted(n for n in os.listdir("/sys/class/net") if n.startswith((BRIDGE_PREFIX, "veth")))


class HostState:
    """What the real nodes change on the host and must put back: a plain snapshot, taken by
    capture() and compared with diff(). Not thread-safe (a value)."""

    def __init__(self, values):
        self.values = values

    @classmethod
    def capture(cls):
        sysctls = {}
        for name in SYSCTLS:
            try:
                with open(_sysctl_path(name)) as f:
                    sysctls[name] = f.read().strip()
            except OSError:
                pass  # not on this kernel (nf_conntrack not loaded)
        return cls(
            {
                "sysctls": sysctls,
                "iptables": _iptables_rules("iptables"),
                "ip6tables": _iptables_rules("ip6tables"),
                "mounts": _mounts(),
                "cgroups": _cgroups(),
                "links": _links(),
            }
        )

    def diff(self, other):
        """What differs from OTHER (the state before), one line each; empty when nothing."""
        lines = []
        for name, before in other.values["sysctls"].items():
            now = self.values["sysctls"].get(name)
            if now != before:
                lines.append("sysctl %s is %s, was %s" % (name, now, before))
        for tool in ("iptables", "ip6tables"):
            if self.values[tool] != other.values[tool]:
                old = set((other.values[tool] or "").splitlines())
                new = set((self.values[tool] or "").splitlines())
                lines.append(
                    "%s rules differ: added %s, removed %s"
                    % (tool, sorted(new - old)[:10], sorted(old - new)[:10])
                )
        for key in ("mounts", "cgroups", "links"):
            old, new = set(other.values[key]), set(self.values[key])
            if old != new:
                lines.append(
                    "%s differ: added %s, removed %s"
                    % (key, sorted(new - old)[:10], sorted(old - new)[:10])
                )
        return lines


class HostGuard:
    """Records the host's state in STATE_DIR before the nodes change it, and puts it back.
    One per process; not thread-safe."""

    def __init__(self):
        self.record = os.path.join(STATE_DIR, "host-before.json")
        self.before = None

    def take(self):
        """Puts back what a killed run left (its record), then records the host as it is."""
        os.makedirs(STATE_DIR, exist_ok=True)
        if os.path.exists(self.record):
            with open(self.record) as f:
                left = json.load(f)
            self.before = HostState(left["state"])
            self.made_dirs = left.get("made_dirs", [])
            self.restore()
        self.before = HostState.capture()
        self.made_dirs = []
        self._save()

    def made_dir(self, path):
        """Remembers a directory made on the host for a mount, to remove it when restoring."""
        self.made_dirs.append(path)
        self._save()

    def _save(self):
        tmp = self.record + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"state": self.before.values, "made_dirs": self.made_dirs}, f)
        os.replace(tmp, self.record)

    def restore(self):
        """Puts the host back as recorded and returns what still differs (empty when all is
        back); the record is removed when nothing does."""
        before = self.before.values
        _kill_cgroups(set(before["cgroups"]))
        # containerd's shims are not in the nodes' cgroups and outlive containerd: those of any
        # node (of this run or of one killed before it could stop its nodes).
        for pid in _pids_with_argument(os.path.join(tempfile.gettempdir(), "vf-e2e-"), prefix=True):
            with contextlib.suppress(OSError), open("/proc/%d/comm" % pid) as f:
                if f.read().startswith("containerd-shim"):
                    os.kill(pid, signal.SIGKILL)
        for path in sorted(set(_mounts()) - set(before["mounts"]), key=len, reverse=True):
            subprocess.run(["umount", "-l", path], capture_output=True)
        for name in sorted(set(_links()) - set(before["links"])):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
        for tool in ("iptables", "ip6tables"):
            if before[tool] is not None and _iptables_rules(tool) != before[tool]:
                _restore_iptables(tool, before[tool])
        for name, value in before["sysctls"].items():
            try:
                with open(_sysctl_path(name), "w") as f:
                    f.write(value)
            except OSError:
                pass
        for path in reversed(self.made_dirs):
            with contextlib.suppress(OSError):
                os.rmdir(path)
        left = HostState.capture().diff(self.before)
        if not left:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.record)
        return left


def _kill_cgroups(keep):
    """Kills every process in a cgroup not in KEEP (the cgroups from before) and removes those
    cgroups, deepest first."""
    extra = [c for c in _cgroups() if c not in keep]
    for _ in range(50):
        pids = set()
        for cgroup in extra:
            with (
                contextlib.suppress(OSError),
                open(os.path.join(CGROUP_ROOT, cgroup, "cgroup.procs")) as f,
            ):
                pids.update(int(p) for p in f.read().split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for cgroup in sorted(extra, key=lambda c: c.count("/"), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(CGROUP_ROOT, cgroup))
        extra = [c for c in _cgroups() if c not in keep]
        if not extra:
            return
        time.sleep(0.1)


# ---------------------------------------------------------------- images


def _oci_archive(layout, tag, name, out, skip=None):
    """Writes to OUT an OCI archive of image TAG of the OCI layout LAYOUT, named NAME (what
    `ctr images import` reads): the layout's other tags and their blobs are left out, and so
    are the layers containerd's blob directory SKIP already holds."""
    with open(os.path.join(layout, "index.json")) as f:
        index = json.load(f)
    refs = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag
    ]
    if not refs:
        raise RuntimeError(
            "%s has no image tagged %s (scripts/images.sh builds it)" % (layout, tag)
        )

    def blob(descriptor):
        return os.path.join(layout, "blobs", *descriptor["digest"].split(":"))

    with open(blob(refs[0])) as f:
        manifest = json.load(f)
    top = dict(refs[0], annotations={"org.opencontainers.image.ref.name": name})
    with tarfile.open(fileobj=out, mode="w|") as tar:

        def add(path, data):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps({"schemaVersion": 2, "manifests": [top]}).encode())
        for descriptor in [refs[0], manifest["config"], *manifest["layers"]]:
            held = skip and os.path.exists(os.path.join(skip, *descriptor["digest"].split(":")))
            if held and descriptor in manifest["layers"]:
                continue
            tar.add(blob(descriptor), arcname="blobs/" + descriptor["digest"].replace(":", "/"))


def _manifest_digest(layout, tag):
    with open(os.path.join(layout, "index.json")) as f:
        for m in json.load(f)["manifests"]:
            if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
                return m["digest"]
    raise RuntimeError("%s has no image tagged %s (scripts/images.sh builds it)" % (layout, tag))


def pause_layout():
    """An OCI layout with the pause image (tag 3.10): node/pause.c built static, packed with
    umoci; cached by the source's hash."""
    with open(PAUSE_SOURCE, "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:16]
    layout = os.path.join(CACHE, "node-images", "pause-" + key)
    if os.path.exists(os.path.join(layout, "index.json")):
        return layout
    tmp = layout + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "root"))
    _run(["gcc", "-static", "-Os", "-s", "-o", os.path.join(tmp, "root", "pause"), PAUSE_SOURCE])
    image = os.path.join(tmp, "layout") + ":3.10"
    _run(["umoci", "init", "--layout", os.path.join(tmp, "layout")])
    _run(["umoci", "new", "--image", image])
    _run(
        [
            "umoci",
            "insert",
            "--rootless",
            "--image",
            image,
            os.path.join(tmp, "root", "pause"),
            "/pause",
        ]
    )
    _run(
        ["umoci", "config", "--image", image, "--config.entrypoint", "/pause",
         "--config.user", "65535:65535", "--architecture", "amd64", "--os", "linux"]
    )  # fmt: skip
    os.replace(os.path.join(tmp, "layout"), layout)
    shutil.rmtree(tmp, ignore_errors=True)
    return layout


CONTAINERD_CONFIG = """version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # Root here lacks CAP_SYS_RESOURCE: without this every container fails to start.
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{cni_conf}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"""


def _write_containerd_config(node_dir, root):
    paths = {
        "root": root,
        "state": os.path.join(node_dir, "containerd-state"),
        "socket": os.path.join(node_dir, "containerd.sock"),
        "pause": PAUSE_IMAGE,
        "runc": shutil.which("runc") or "/usr/sbin/runc",
        "cni_bin": CNI_BIN_DIR,
        "cni_conf": os.path.join(node_dir, "cni"),
        "opt": os.path.join(node_dir, "containerd-opt"),
    }
    os.makedirs(paths["cni_conf"], exist_ok=True)
    path = os.path.join(node_dir, "containerd.toml")
    with open(path, "w") as f:
        f.write(CONTAINERD_CONFIG.format(**paths))
    return path, paths["socket"]


def images_root(images, log_dir):
    """The containerd root kept in the cache that holds IMAGES ((OCI layout, tag, name)
    triples) and the pause image, and nothing else; each node's root is a hard-linked copy of
    it. An image whose manifest changed is imported again: only its new blobs (a changed
    binary's last layer) are written and unpacked, the rest is there. Returns its path; hold
    images_lock() shared while copying it."""
    images = [(pause_layout(), "3.10", PAUSE_IMAGE), *images]
    want = {name: _manifest_digest(layout, tag) for layout, tag, name in images}
    top = os.path.join(CACHE, "node-images")
    root = os.path.join(top, "root")
    marker = os.path.join(top, "root.json")
    with images_lock(exclusive=True):
        try:
            with open(marker) as f:
                have = json.load(f)
        except (OSError, ValueError):
            have = {}
        if have.get("format") != IMAGES_FORMAT:
            shutil.rmtree(root, ignore_errors=True)
            have = {"format": IMAGES_FORMAT, "images": {}}
        if have["images"] == want and os.path.isdir(root):
            return root
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)  # until the import is complete
        _import_images(root, images, have["images"], want, log_dir)
        with open(marker, "w") as f:
            json.dump({"format": IMAGES_FORMAT, "images": want}, f, indent=1)
    return root


@contextlib.contextmanager
def images_lock(exclusive):
    """The cached root's lock: exclusive to change it, shared to copy it."""
    import fcntl

    top = os.path.join(CACHE, "node-images")
    os.makedirs(top, exist_ok=True)
    with open(os.path.join(top, ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


def _import_images(root, images, have, want, log_dir):
    """Imports into ROOT each of IMAGES whose digest HAVE does not already show, and removes the
    images WANT no longer names, with a containerd of its own."""
    work = root + ".import"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    config, sock = _write_containerd_config(work, root)
    # Its own mount namespace: unpacking mounts snapshots for a moment.
    containerd = Component(
        "containerd-import",
        ["unshare", "--mount", "--propagation", "slave", "containerd", "--config", config],
        os.path.join(log_dir, "containerd-import.log"),
    )
    ctr = ["ctr", "-a", sock, "-n", "k8s.io"]
    blobs = os.path.join(root, "io.containerd.content.v1.content", "blobs")
    try:
        _wait(
            "containerd (importing images)",
            lambda: containerd.check_alive() or os.path.exists(sock),
            60,
        )
        for layout, tag, name in images:
            if have.get(name) == want[name]:
                continue
            started = time.monotonic()
            proc = subprocess.Popen(
                [*ctr, "images", "import", "--base-name", name.rsplit(":", 1)[0], "-"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                _oci_archive(layout, tag, name, proc.stdin, skip=blobs)
            finally:
                proc.stdin.close()
            with proc.stdout:
                out = proc.stdout.read().decode(errors="replace")
            if proc.wait() != 0:
                raise RuntimeError("importing %s failed: %s" % (name, out))
            print("nodes: imported %s in %.1f s" % (name, time.monotonic() - started), flush=True)
        for name in sorted(set(have) - set(want)):
            subprocess.run([*ctr, "images", "rm", name], capture_output=True)
    finally:
        containerd.stop()
        shutil.rmtree(work, ignore_errors=True)


def _copy_root(template, dest):
    """A copy of the containerd root TEMPLATE at DEST: blobs and unpacked layers hard-linked
    (containerd never writes to them), its databases copied (it writes those in place)."""
    proc = subprocess.run(["cp", "-al", template, dest], capture_output=True, text=True)
    if proc.returncode != 0:  # another file system: copy it all
        shutil.rmtree(dest, ignore_errors=True)
        _run(["cp", "-a", template, dest])
        return
    for path, _dirs, files in os.walk(dest):
        for name in files:
            if name.endswith(".db"):
                full = os.path.join(path, name)
                shutil.copy2(full, full + ".copy")
                os.replace(full + ".copy", full)


# ---------------------------------------------------------------- nodes


def _cni_config(index):
    subnet = "10.240.%d.0/24" % index
    return {
        "cniVersion": "1.0.0",
        "name": "%s%d" % (BRIDGE_PREFIX, index),
        "plugins": [
            {
                "type": "bridge",
                "bridge": "%s%d" % (BRIDGE_PREFIX, index),
                "isGateway": True,
                # A pod reaching a Service that leads back to itself (kube-proxy masquerades).
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet, "gateway": "10.240.%d.1" % index}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def _kubelet_config(node, ca_file, cert, key, socket_path, resolv_conf):
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "port": node.ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.ports["kubelet-healthz"],
        "tlsCertFile": cert,
        "tlsPrivateKeyFile": key,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": ca_file},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": "unix://" + socket_path,
        # These machines mount cgroup v1, which the kubelet refuses by default since 1.35.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # Each node's pods in a cgroup tree of its own: several kubelets share the host's.
        "cgroupRoot": node.cgroup,
        "failSwapOn": False,
        "makeIPTablesUtilChains": False,
        "clusterDomain": "cluster.local",
        "clusterDNS": node.cluster_dns,
        "resolvConf": resolv_conf,
        # The images cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "volumePluginDir": "/var/lib/kubelet/volume-plugins",
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "shutdownGracePeriod": "0s",
    }


class KubeletNode:
    """One real node: containerd, a kubelet and, with GPUs, the suite's device plugin, in a
    mount namespace of its own (see the module's docstring). Made by RealNodes.add_node();
    not thread-safe."""

    def __init__(self, nodes, name, index, gpus, labels):
        self.nodes = nodes
        self.cp = nodes.cp
        self.name = name
        self.index = index
        self.gpus = gpus
        self.labels = labels
        self.ip = nodes.ip
        self.dir = os.path.join(nodes.dir, name)
        self.bridge = "%s%d" % (BRIDGE_PREFIX, index)
        self.cgroup = "/" + CGROUP_PREFIX + name
        self.cluster_dns = nodes.cluster_dns
        self.ports = {"kubelet": free_port(), "kubelet-healthz": free_port()}
        self.components = []
        self.namespace = None
        self.containerd = None
        self.kubelet = None
        self.device_plugin = None
        self.socket = None

    def _spawn(self, what, argv):
        component = Component(
            "%s-%s" % (self.name, what),
            argv,
            os.path.join(self.cp.logs, "%s-%s.log" % (self.name, what)),
        )
        self.components.append(component)
        return component

    def _in_namespace(self, what, argv):
        return self._spawn(what, ["nsenter", "-t", str(self.namespace.proc.pid), "-m", "--", *argv])

    def start(self, timeout=120):
        deadline = time.monotonic() + timeout
        left = lambda: max(5, deadline - time.monotonic())  # noqa: E731
        os.makedirs(self.dir)
        self._make_cgroup()
        self._start_namespace(left())
        with images_lock(exclusive=False):
            _copy_root(self.nodes.template, os.path.join(self.dir, "containerd-root"))
        config, self.socket = _write_containerd_config(
            self.dir, os.path.join(self.dir, "containerd-root")
        )
        with open(os.path.join(self.dir, "cni", "10-%s.conflist" % self.bridge), "w") as f:
            json.dump(_cni_config(self.index), f, indent=2)
        self.containerd = self._in_namespace("containerd", ["containerd", "--config", config])
        _wait(
            "%s: containerd" % self.name,
            lambda: self.containerd.check_alive() or os.path.exists(self.socket),
            left(),
        )
        self.kubelet = self._in_namespace("kubelet", self._kubelet_argv())
        self.cp.wait_for(
            "node %s Ready" % self.name,
            lambda: self.kubelet.check_alive() or self.ready(),
            timeout=left(),
        )
        if self.gpus:
            self.device_plugin = self._in_namespace(
                "device-plugin",
                [os.path.join(self.cp.bin, "vf-device-plugin"), "--count", str(self.gpus)],
            )
            self.cp.wait_for(
                "node %s advertising %d GPUs" % (self.name, self.gpus),
                lambda: self.device_plugin.check_alive() or self.allocatable_gpus() == self.gpus,
                timeout=left(),
            )
        return self

    def _make_cgroup(self):
        for hierarchy in os.listdir(CGROUP_ROOT):
            top = os.path.join(CGROUP_ROOT, hierarchy)
            if hierarchy == "unified" or os.path.islink(top) or not os.path.isdir(top):
                continue
            path = top + self.cgroup
            os.makedirs(path, exist_ok=True)
            if hierarchy == "cpuset":  # a v1 cpuset starts empty: no process could join it
                for key in ("cpuset.cpus", "cpuset.mems"):
                    with (
                        open(os.path.join(top, key)) as src,
                        open(os.path.join(path, key), "w") as dst,
                    ):
                        dst.write(src.read())

    def _start_namespace(self, timeout):
        binds = []
        for target in PRIVATE_PATHS:
            if not os.path.isdir(target):
                os.makedirs(target)
                self.nodes.guard.made_dir(target)
            source = os.path.join(self.dir, "private" + target)
            os.makedirs(source)
            binds.append("mount --bind %s %s" % (source, target))
        ready = os.path.join(self.dir, "namespace-ready")
        script = "set -e; %s; touch %s; exec sleep infinity" % ("; ".join(binds), ready)
        self.namespace = self._spawn(
            "namespace", ["unshare", "--mount", "--propagation", "slave", "sh", "-c", script]
        )
        _wait(
            "%s: its mount namespace" % self.name,
            lambda: self.namespace.check_alive() or os.path.exists(ready),
            timeout,
        )

    def _kubelet_argv(self):
        kubeconfig, cert, key = self.cp.node_credentials(self.name, self.ip)
        resolv = os.path.join(self.dir, "resolv.conf")
        with open(resolv, "w") as f:
            f.write(self.nodes.resolv_conf)
        config = os.path.join(self.dir, "kubelet.json")
        with open(config, "w") as f:
            json.dump(
                _kubelet_config(self, self.cp.ca_file, cert, key, self.socket, resolv), f, indent=2
            )
        labels = dict(self.labels)
        return [
            os.path.join(self.cp.bin, "kubelet"),
            "--config=" + config,
            "--kubeconfig=" + kubeconfig,
            "--hostname-override=" + self.name,
            "--node-ip=" + self.ip,
            "--node-labels=" + ",".join("%s=%s" % kv for kv in sorted(labels.items())),
            "--v=2",
        ]

    def node(self):
        return self.cp.get("/api/v1/nodes/" + self.name)

    def ready(self):
        try:
            conditions = self.node()["status"].get("conditions", [])
        except Exception:  # noqa: BLE001 - not registered yet
            return False
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def allocatable_gpus(self):
        try:
            value = self.node()["status"].get("allocatable", {}).get("nvidia.com/gpu")
        except Exception:  # noqa: BLE001
            return None
        return int(value) if value is not None else None

    def stop(self):
        """Stops the kubelet and everything the node runs; its pods' processes are killed (as
        when a machine goes down) and what the node made on the host is removed. The Node
        object stays (delete it with the API). Safe to call twice."""
        for component in (self.device_plugin, self.kubelet):
            if component:
                component.stop()
        own = self.cgroup.lstrip("/")
        _kill_cgroups({c for c in _cgroups() if c.split("/")[1] != own})
        if self.socket:  # the shims outlive containerd; their containers are gone already
            for pid in _pids_with_argument(self.socket):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for component in (self.containerd, self.namespace):
            if component:
                component.stop()
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def _pids_with_argument(argument, prefix=False):
    """The processes with ARGUMENT among their arguments (with PREFIX, one starting with it)."""
    want = argument.encode()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.startswith(want) if prefix else a == want for a in args):
            pids.append(int(pid))
    return pids


class RealNodes:
    """The real nodes of a control plane started with nodes="kubelet": kube-proxy for the host
    and a KubeletNode per add_node(). Not thread-safe."""

    def __init__(self, cp):
        self.cp = cp
        self.nodes = {}
        self.guard = HostGuard()
        self.dir = os.path.join(cp.dir, "nodes")
        self.ip = cp.host_ip
        self.template = None
        self.kube_proxy = None
        self.cluster_dns = [DNS_SERVICE_IP]
        # The host's own resolvers are not the pods' business here: nothing outside is reached.
        self.resolv_conf = "options ndots:1\n"
        self.coredns = None
        self._next_index = 0

    def start(self, images=(), timeout=600):
        """Records the host, imports IMAGES ((OCI layout, tag, image name) triples) and the pause
        image (once: cached) and starts the cluster's DNS; kube-proxy starts with the first
        node."""
        taken = [n for n in _links() if n.startswith(BRIDGE_PREFIX)]
        if taken:
            raise RuntimeError("bridges %s exist: another run's real nodes are up" % taken)
        self.guard.take()
        os.makedirs(self.dir)
        started = time.monotonic()
        self.template = images_root(images, self.cp.logs)
        print("nodes: images ready in %.1f s" % (time.monotonic() - started), flush=True)
        self._start_dns()
        return self

    def _start_kube_proxy(self, node):
        """kube-proxy for the host (every node shares its network stack: one is enough, and
        more would fight over the same chains), as node NODE's, which must exist."""
        kubeconfig = self.cp.user_kubeconfig("kube-proxy", "/CN=system:kube-proxy")
        ports = {"healthz": free_port(), "metrics": free_port()}
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": kubeconfig},
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "hostnameOverride": node,
            "bindAddress": self.ip,
            "healthzBindAddress": "127.0.0.1:%d" % ports["healthz"],
            "metricsBindAddress": "127.0.0.1:%d" % ports["metrics"],
            # Every node's pods and the host share one network stack, and the bridges do not
            # pass through iptables (no br_netfilter): a Service's reply must come back through
            # the host, so every connection to a ClusterIP is masqueraded.
            "iptables": {"masqueradeAll": True, "localhostNodePorts": False, "minSyncPeriod": "0s"},
            "nodePortAddresses": [self.ip + "/32"],
            # Leave the host's conntrack settings alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
                "udpTimeout": "0s",
                "udpStreamTimeout": "0s",
            },
            "oomScoreAdj": 0,
        }
        path = os.path.join(self.dir, "kube-proxy.json")
        with open(path, "w") as f:
            json.dump(config, f, indent=2)
        self.kube_proxy = Component(
            "kube-proxy",
            [os.path.join(self.cp.bin, "kube-proxy"), "--config=" + path, "--v=2"],
            os.path.join(self.cp.logs, "kube-proxy.log"),
        )

        def healthy():
            self.kube_proxy.check_alive()
            try:
                with socket.create_connection(("127.0.0.1", ports["healthz"]), timeout=1):
                    return True
            except OSError:
                return False

        _wait("kube-proxy", healthy, 60)

    def _start_dns(self):
        """CoreDNS on the host, serving cluster.local from the API server, behind the Service
        kube-system/kube-dns at DNS_SERVICE_IP (an EndpointSlice of the host's address: it runs
        as a process, not a pod), which every node's pods get as their nameserver."""
        port, ready_port = free_port(), free_port()
        corefile = os.path.join(self.dir, "Corefile")
        with open(corefile, "w") as f:
            f.write(
                ".:%d {\n  bind %s\n  errors\n  ready 127.0.0.1:%d\n  cache 5\n"
                "  kubernetes cluster.local in-addr.arpa ip6.arpa {\n"
                "    kubeconfig %s\n    fallthrough in-addr.arpa ip6.arpa\n  }\n}\n"
                % (port, self.ip, ready_port, self.cp.kubeconfig)
            )
        self.coredns = Component(
            "coredns",
            [os.path.join(self.cp.bin, "coredns"), "-conf", corefile],
            os.path.join(self.cp.logs, "coredns.log"),
        )

        def ready():
            self.coredns.check_alive()
            try:
                with urllib.request.urlopen(
                    "http://127.0.0.1:%d/ready" % ready_port, timeout=2
                ) as r:
                    return r.status == 200
            except OSError:
                return False

        _wait("coredns /ready", ready, 60)
        ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
        self.cp.apply(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "kube-dns", "namespace": "kube-system"},
                "spec": {
                    "clusterIP": DNS_SERVICE_IP,
                    "ports": [
                        {"name": n, "protocol": p, "port": 53, "targetPort": port} for n, p in ports
                    ],
                },
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": "kube-dns-host",
                    "namespace": "kube-system",
                    "labels": {"kubernetes.io/service-name": "kube-dns"},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [self.ip], "conditions": {"ready": True}}],
                "ports": [{"name": n, "protocol": p, "port": port} for n, p in ports],
            },
        )

    def add_node(self, name, gpus=0, gpu_product=None, labels=None, timeout=180):
        """Starts node NAME with GPUS devices of the device plugin (gpu_product: the value of
        nvidia.com/gpu.product) and LABELS; returns it once Ready (and advertising its GPUs)."""
        all_labels = dict(labels or {})
        if gpu_product:
            all_labels["nvidia.com/gpu.product"] = gpu_product
        node = KubeletNode(self, name, self._next_index, gpus, all_labels)
        self._next_index += 1
        self.nodes[name] = node
        started = time.monotonic()
        node.start(timeout)
        if not self.kube_proxy:
            self._start_kube_proxy(name)
        print("nodes: %s Ready in %.1f s" % (name, time.monotonic() - started), flush=True)
        return node

    def stop(self):
        """Stops every node and kube-proxy and puts the host back; returns what still differs
        from before (empty when all is back)."""
        for node in self.nodes.values():
            node.stop()
        if self.coredns:
            self.coredns.stop()
        if self.kube_proxy:
            self.kube_proxy.stop()
            subprocess.run(
                [os.path.join(self.cp.bin, "kube-proxy"), "--cleanup"], capture_output=True
            )
        if self.guard.before is None:
            return []
        return self.guard.restore()

    def logs(self):
        """Every node component's log file, with kube-proxy's."""
        files = [c.log_path for n in self.nodes.values() for c in n.components]
        files += [c.log_path for c in (self.kube_proxy, self.coredns) if c]
        return files
