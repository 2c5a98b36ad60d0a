"""A real Kubernetes control plane on loopback for the end-to-end tests.

ControlPlane.start() generates a CA and certificates with the openssl CLI, then starts etcd,
kube-apiserver, kube-controller-manager and kube-scheduler (built from the upstream sources by
build-k8s-tools.sh) on free 127.0.0.1 ports, each in its own process group with its log in the
temporary directory. stop() tears everything down; it also runs at interpreter exit and on
SIGTERM/SIGINT, and every child gets SIGKILL if this process dies first.

Nodes are fake: Node objects that advertise nvidia.com/gpu and are marked Ready through the status
subresource. No kubelet runs; start_pod_runner() starts vf-pod-runner, which plays the kubelet for
the nodes labelled virtualflow.io/pod-runner=true (add_gpu_node's default): it runs each pod bound
to them as a local process and keeps the pod's status true. The scheduler, the garbage collector
and every other controller are the real ones. See README.md beside this file.
"""

import atexit
import base64
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_SCRIPT = os.path.join(HERE, "build-k8s-tools.sh")

# The fake nodes' default GPU model, as NVIDIA's GPU feature discovery labels it.
DEFAULT_GPU_PRODUCT = "NVIDIA-A100-SXM4-40GB"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# The label of the nodes vf-pod-runner plays the kubelet for.
POD_RUNNER_LABEL = "virtualflow.io/pod-runner"

# The in-cluster names of the API server; its serving certificate covers them all, plus the
# first address of SERVICE_CIDR (the `kubernetes` Service's ClusterIP).
SERVICE_CIDR = "10.96.0.0/12"
SERVICE_IP = "10.96.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
API_DNS_NAMES = [
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]

# kube-controller-manager runs every default controller but the node lifecycle controller: with
# no kubelet posting heartbeats it would mark the fake nodes NotReady and evict their pods.
CONTROLLERS = "*,-node-lifecycle-controller"

START_TIMEOUT = 180
# Starts tried when a component loses its port to another process (see ControlPlane.start).
START_ATTEMPTS = 3


def bin_dir():
    """The directory with the built tools: $VF_K8S_BIN_DIR, or what build-k8s-tools.sh builds
    (a no-op that prints the cache directory when the tools are cached)."""
    env = os.environ.get("VF_K8S_BIN_DIR")
    if env:
        return env
    proc = subprocess.run([BUILD_SCRIPT], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError("build-k8s-tools.sh failed (exit %d)" % proc.returncode)
    return proc.stdout.strip().splitlines()[-1]


_ports_given: set[int] = set()
_port_choice = random.SystemRandom()  # apart from `random`'s state, which a test may seed


def _ephemeral_low() -> int:
    """The lowest port of the kernel's range for outgoing connections' local ports."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now, for a server about to start, and
    none this process gave before. Not port 0's pick: that comes from the range the kernel gives
    outgoing connections their local ports from, so between this check and the server's bind
    any connection (the server's own client to the API server, say) could take it, and Kueue
    once failed to start so ("bind: address already in use"). Below that range no connection
    takes a port by itself; nor from 30000 on, Kubernetes' NodePorts."""
    high = min(_ephemeral_low(), 30000)
    for _ in range(1000):
        port = _port_choice.randrange(max(1024, high - 10000), high)
        if port in _ports_given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port
    raise RuntimeError("no free TCP port on 127.0.0.1 below %d" % high)


def _die_with_parent():
    """preexec_fn: the child gets SIGKILL when the thread that started it exits, so a killed
    test leaves no control plane behind."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _b64(path):
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def _wait(what, predicate, timeout, interval=0.25):
    """Calls predicate() until it returns something truthy, which is returned; raises
    TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - kept for the timeout message
            last_error = e
        if time.monotonic() > deadline:
            raise TimeoutError(
                "timed out after %ss waiting for %s%s"
                % (timeout, what, " (last error: %s)" % last_error if last_error else "")
            )
        time.sleep(interval)


class ApiError(Exception):
    def __init__(self, status, body):
        super().__init__("HTTP %d: %s" % (status, body[:500]))
        self.status = status
        self.body = body


class Component:
    """One control-plane process: its own process group, its output in a log file."""

    def __init__(self, name, argv, log_path, env=None):
        self.name = name
        self.argv = argv
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def alive(self):
        return self.proc.poll() is None

    def check_alive(self):
        if not self.alive():
            raise RuntimeError(
                "%s exited with status %s; the end of its log:\n%s"
                % (self.name, self.proc.returncode, self.tail(30))
            )

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # Anything the component left in its group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()

    def tail(self, lines=40):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 200 * lines))
                text = f.read().decode(errors="replace")
        except OSError as e:
            return "(no log: %s)" % e
        return "\n".join(text.splitlines()[-lines:])


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on loopback.

    Attributes after start(): server (https://127.0.0.1:PORT), kubeconfig (admin kubeconfig
    path), ca_file, dir (the temporary directory with certificates, kubeconfigs and logs/),
    work_dir (where what must outlive the control plane goes: the pods' logs), ports (name ->
    port), bin (the tools' directory).

    NAME names work_dir under $VF_E2E_WORK_DIR (ctest sets it to a directory of the test's own
    in the build tree): $VF_E2E_WORK_DIR/NAME, emptied at start() and kept after stop(), so that
    a failed run's pod logs can be read afterwards. Without VF_E2E_WORK_DIR, work_dir is dir."""

    def __init__(self, keep=None, name="controlplane", nodes="fake"):
        if nodes not in ("fake", "kubelet"):
            raise ValueError("nodes: 'fake' or 'kubelet', not %r" % nodes)
        self.keep = keep if keep is not None else bool(os.environ.get("VF_E2E_KEEP"))
        self.name = name
        # "kubelet": real nodes (nodes.RealNodes) will join, whose pods reach the API server
        # through the `kubernetes` Service: it listens on every address and publishes the
        # host's, asks kubelets for logs with a client certificate, and every controller runs.
        self.nodes = nodes
        self.host_ip = None
        self.real_nodes = None
        self.work_dir = None
        self.components = []
        self.dir = None
        self.server = None
        self.kubeconfig = None
        self.ca_file = None
        self.ports = {}
        self.bin = None
        self._stopped = True
        self._ssl = None
        self.pod_runner = None
        self.pod_log_dir = None

    # ---------------------------------------------------------------- lifecycle

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self, timeout=START_TIMEOUT):
        self.bin = bin_dir()
        for tool in (
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubectl",
        ):
            if not os.access(os.path.join(self.bin, tool), os.X_OK):
                raise RuntimeError("%s not found in %s; run %s" % (tool, self.bin, BUILD_SCRIPT))
        self.dir = tempfile.mkdtemp(prefix="vf-e2e-")
        self.logs = os.path.join(self.dir, "logs")
        os.mkdir(self.logs)
        self.work_dir = self.dir
        if os.environ.get("VF_E2E_WORK_DIR"):
            self.work_dir = os.path.join(os.environ["VF_E2E_WORK_DIR"], self.name)
            shutil.rmtree(self.work_dir, ignore_errors=True)  # an earlier run's
            os.makedirs(self.work_dir)
        self._stopped = False
        atexit.register(self.stop)
        _install_signal_handlers()
        _LIVE.add(self)
        try:
            for attempt in range(1, START_ATTEMPTS + 1):
                try:
                    self._start(timeout)
                    break
                except BaseException:
                    # Ports are picked free and bound by the components a moment later; another
                    # process (a test's worker on an ephemeral port) may take one in between.
                    if attempt == START_ATTEMPTS or not self._lost_a_port():
                        raise
                    sys.stderr.write(
                        "control plane: a component's port was taken before it "
                        "bound it; starting again on new ports\n"
                    )
                    for component in reversed(self.components):
                        component.stop()
                        os.replace(component.log_path, "%s.%d" % (component.log_path, attempt))
                    self.components = []
                    shutil.rmtree(self._path("etcd-data"), ignore_errors=True)
        except BaseException:
            sys.stderr.write("control plane failed to start; component logs:\n")
            self.dump_logs()
            self.stop()
            raise
        return self

    def _start(self, timeout):
        deadline = time.monotonic() + timeout
        left = lambda: max(5, deadline - time.monotonic())  # noqa: E731
        self.ports = {
            name: free_port()
            for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")
        }
        if self.nodes == "kubelet":
            from nodes import host_ip

            self.host_ip = host_ip()
        self._certificates()
        self.server = "https://127.0.0.1:%d" % self.ports["apiserver"]
        self.kubeconfig = self._write_kubeconfig("admin")
        for user in ("controller-manager", "scheduler"):
            self._write_kubeconfig(user)

        etcd = self._start_etcd()
        _wait("etcd /health", lambda: etcd.check_alive() or self._etcd_healthy(), left())
        apiserver = self._start_apiserver()
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self._ssl.load_cert_chain(self._path("admin.crt"), self._path("admin.key"))

        def ready():
            apiserver.check_alive()
            try:
                return self.request("GET", "/readyz") == "ok"
            except (ApiError, OSError):
                return False

        _wait("kube-apiserver /readyz", ready, left())

        manager = self._start_controller_manager()
        scheduler = self._start_scheduler()
        for component in (manager, scheduler):
            port = self.ports[component.name]
            _wait(
                "%s /healthz" % component.name,
                lambda component=component, port=port: (
                    component.check_alive() or self._healthz(port)
                ),
                left(),
            )
        # The namespace comes from the API server, the service account from the controller
        # manager; pods cannot be created in a namespace before its `default` service account.
        # A component that died after its /healthz answered (or whose port something else
        # answers on) fails the start at once instead of at the timeout.
        _wait(
            "namespace default",
            lambda: self.check_alive() or self.get("/api/v1/namespaces/default"),
            left(),
        )
        _wait(
            "service account default/default",
            lambda: (
                self.check_alive() or self.get("/api/v1/namespaces/default/serviceaccounts/default")
            ),
            left(),
        )
        self.check_alive()

    def _lost_a_port(self):
        """True when a component exited because its port was taken."""
        return any(
            not c.alive() and "address already in use" in c.tail(30) for c in self.components
        )

    def stop(self):
        """Stops every component (scheduler and controller manager first, etcd last) and removes
        the temporary directory (kept when VF_E2E_KEEP is set). Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        _LIVE.discard(self)
        # The pod runner first, while the API server is still there: it kills its pods'
        # processes (SIGTERM, then SIGKILL) before it exits. Real nodes too, and the host is
        # put back as it was.
        self.stop_pod_runner()
        if self.real_nodes:
            left = self.real_nodes.stop()
            if left:
                sys.stderr.write("real nodes: the host is not as it was: %s\n" % "; ".join(left))
        for component in reversed(self.components):
            component.stop()
        self.components = []
        if self.dir and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)
        elif self.dir:
            sys.stderr.write("control plane files kept in %s\n" % self.dir)

    def check_alive(self):
        """Raises RuntimeError (with the end of its log) when a component has exited."""
        for component in self.components:
            component.check_alive()

    def dump_logs(self, lines=40, stream=None):
        """Prints the end of every component's log."""
        stream = stream or sys.stderr
        for component in self.components:
            state = "running" if component.alive() else "exited %s" % component.proc.returncode
            stream.write(
                "----- %s (%s), %s -----\n%s\n"
                % (component.name, state, component.log_path, component.tail(lines))
            )
        stream.flush()

    # ---------------------------------------------------------------- certificates

    def _path(self, name):
        return os.path.join(self.dir, name)

    def _openssl(self, *args):
        proc = subprocess.run(
            ["openssl", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError("openssl %s failed:\n%s" % (" ".join(args), proc.stdout))

    def _key(self, name):
        self._openssl(
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            self._path(name + ".key"),
        )

    def _cert(self, name, subject, extensions):
        """Signs NAME.crt for NAME.key with the CA; extensions: lines of an x509v3 section."""
        self._key(name)
        ext = self._path(name + ".ext")
        with open(ext, "w") as f:
            f.write("[v3]\n" + "\n".join(extensions) + "\n")
        self._openssl(
            "req",
            "-new",
            "-key",
            self._path(name + ".key"),
            "-subj",
            subject,
            "-out",
            self._path(name + ".csr"),
        )
        self._openssl(
            "x509",
            "-req",
            "-in",
            self._path(name + ".csr"),
            "-CA",
            self.ca_file,
            "-CAkey",
            self._path("ca.key"),
            "-set_serial",
            str(int(time.time() * 1e6)),
            "-days",
            "30",
            "-sha256",
            "-extfile",
            ext,
            "-extensions",
            "v3",
            "-out",
            self._path(name + ".crt"),
        )

    def _certificates(self):
        self.ca_file = self._path("ca.crt")
        cnf = self._path("ca.cnf")
        with open(cnf, "w") as f:
            f.write(
                "[req]\ndistinguished_name = dn\nx509_extensions = v3\nprompt = no\n"
                "[dn]\nCN = virtualflow-e2e-ca\n"
                "[v3]\nbasicConstraints = critical, CA:TRUE\n"
                "keyUsage = critical, keyCertSign, cRLSign, digitalSignature\n"
                "subjectKeyIdentifier = hash\n"
            )
        self._key("ca")
        self._openssl(
            "req",
            "-x509",
            "-new",
            "-key",
            self._path("ca.key"),
            "-config",
            cnf,
            "-days",
            "30",
            "-sha256",
            "-out",
            self.ca_file,
        )
        client = self._client_extensions()
        sans = ["IP:127.0.0.1", "IP:" + SERVICE_IP] + ["DNS:" + n for n in API_DNS_NAMES]
        if self.host_ip:
            sans.append("IP:" + self.host_ip)
        self._cert(
            "apiserver",
            "/CN=kube-apiserver",
            [
                "basicConstraints = critical, CA:FALSE",
                "keyUsage = critical, digitalSignature, keyEncipherment",
                "extendedKeyUsage = serverAuth",
                "subjectAltName = " + ", ".join(sans),
            ],
        )
        self._cert("admin", "/O=system:masters/CN=virtualflow-e2e-admin", client)
        # The identities the default RBAC policy grants the two components.
        self._cert("controller-manager", "/CN=system:kube-controller-manager", client)
        self._cert("scheduler", "/CN=system:kube-scheduler", client)
        if self.nodes == "kubelet":  # what the API server shows itself to kubelets with
            self._cert("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver", client)
        # Service-account tokens: signed by the API server (TokenRequest) with sa.key, verified
        # with sa.pub; the controller manager uses the same key for legacy token Secrets.
        self._key("sa")
        self._openssl("pkey", "-in", self._path("sa.key"), "-pubout", "-out", self._path("sa.pub"))

    def user_kubeconfig(self, user, subject):
        """A kubeconfig of a client certificate for SUBJECT ("/O=group/CN=name"), signed by the
        cluster's CA; USER names the files. Returns its path."""
        self._cert(user, subject, self._client_extensions())
        return self._write_kubeconfig(user)

    def node_credentials(self, node, ip):
        """(kubeconfig, serving certificate, serving key) of the kubelet of NODE at IP: its
        client certificate as system:node:NODE (what the Node authorizer and NodeRestriction
        expect) and a serving certificate for IP, signed by the CA the API server checks
        kubelets with."""
        kubeconfig = self.user_kubeconfig("node-" + node, "/O=system:nodes/CN=system:node:" + node)
        name = "node-%s-serving" % node
        self._cert(
            name,
            "/CN=" + node,
            [
                "basicConstraints = critical, CA:FALSE",
                "keyUsage = critical, digitalSignature, keyEncipherment",
                "extendedKeyUsage = serverAuth",
                "subjectAltName = IP:%s, DNS:%s" % (ip, node),
            ],
        )
        return kubeconfig, self._path(name + ".crt"), self._path(name + ".key")

    @staticmethod
    def _client_extensions():
        return [
            "basicConstraints = critical, CA:FALSE",
            "keyUsage = critical, digitalSignature, keyEncipherment",
            "extendedKeyUsage = clientAuth",
        ]

    def _write_kubeconfig(self, user):
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(self.ca_file),
                    },
                }
            ],
            "users": [
                {
                    "name": user,
                    "user": {
                        "client-certificate-data": _b64(self._path(user + ".crt")),
                        "client-key-data": _b64(self._path(user + ".key")),
                    },
                }
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
            "current-context": "e2e",
        }
        path = self._path(user + ".kubeconfig")
        with open(path, "w") as f:
            json.dump(config, f, indent=2)  # JSON is YAML
        os.chmod(path, 0o600)
        return path

    # ---------------------------------------------------------------- components

    def _spawn(self, name, argv):
        component = Component(name, argv, os.path.join(self.logs, name + ".log"))
        self.components.append(component)
        return component

    def _start_etcd(self):
        client = "http://127.0.0.1:%d" % self.ports["etcd"]
        peer = "http://127.0.0.1:%d" % self.ports["etcd-peer"]
        return self._spawn(
            "etcd",
            [
                os.path.join(self.bin, "etcd"),
                "--name=e2e",
                "--data-dir=" + self._path("etcd-data"),
                "--listen-client-urls=" + client,
                "--advertise-client-urls=" + client,
                "--listen-peer-urls=" + peer,
                "--initial-advertise-peer-urls=" + peer,
                "--initial-cluster=e2e=" + peer,
                "--initial-cluster-state=new",
                # A throwaway database: no fsync, and no snapshots of history.
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

    def _etcd_healthy(self):
        url = "http://127.0.0.1:%d/health" % self.ports["etcd"]
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return json.load(r).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _apiserver_network_flags(self):
        if self.nodes == "kubelet":
            return [
                # Pods reach it at the `kubernetes` Service, which kube-proxy leads to the host.
                "--bind-address=0.0.0.0",
                "--advertise-address=" + self.host_ip,
                "--kubelet-client-certificate=" + self._path("apiserver-kubelet-client.crt"),
                "--kubelet-client-key=" + self._path("apiserver-kubelet-client.key"),
                "--kubelet-certificate-authority=" + self.ca_file,
                "--kubelet-preferred-address-types=InternalIP",
            ]
        return [
            "--bind-address=127.0.0.1",
            # The `kubernetes` Service's endpoint would be 127.0.0.1, which Endpoints reject;
            # nothing here routes Service IPs anyway, so the API server does not publish one.
            "--advertise-address=127.0.0.1",
            "--endpoint-reconciler-type=none",
        ]

    def _start_apiserver(self):
        return self._spawn(
            "apiserver",
            [
                os.path.join(self.bin, "kube-apiserver"),
                "--etcd-servers=http://127.0.0.1:%d" % self.ports["etcd"],
                "--secure-port=%d" % self.ports["apiserver"],
                *self._apiserver_network_flags(),
                "--cert-dir=" + self._path("apiserver-certs"),
                "--tls-cert-file=" + self._path("apiserver.crt"),
                "--tls-private-key-file=" + self._path("apiserver.key"),
                "--client-ca-file=" + self.ca_file,
                "--service-account-issuer=" + SA_ISSUER,
                "--service-account-key-file=" + self._path("sa.pub"),
                "--service-account-signing-key-file=" + self._path("sa.key"),
                "--service-cluster-ip-range=" + SERVICE_CIDR,
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )

    def _start_controller_manager(self):
        kubeconfig = self._path("controller-manager.kubeconfig")
        return self._spawn(
            "controller-manager",
            [
                os.path.join(self.bin, "kube-controller-manager"),
                "--kubeconfig=" + kubeconfig,
                "--authentication-kubeconfig=" + kubeconfig,
                "--authorization-kubeconfig=" + kubeconfig,
                "--bind-address=127.0.0.1",
                "--secure-port=%d" % self.ports["controller-manager"],
                "--cert-dir=" + self._path("controller-manager-certs"),
                "--authentication-skip-lookup=true",
                "--leader-elect=false",
                # Real kubelets post heartbeats: every controller runs.
                "--controllers=" + ("*" if self.nodes == "kubelet" else CONTROLLERS),
                # Each controller acts as its own service account (as kubeadm sets it up), so the
                # default RBAC policy for controllers is what is exercised.
                "--use-service-account-credentials=true",
                "--service-account-private-key-file=" + self._path("sa.key"),
                "--root-ca-file=" + self.ca_file,
                "--cluster-signing-cert-file=" + self.ca_file,
                "--cluster-signing-key-file=" + self._path("ca.key"),
                "--service-cluster-ip-range=" + SERVICE_CIDR,
                "--profiling=false",
                "--v=1",
            ],
        )

    def _start_scheduler(self):
        kubeconfig = self._path("scheduler.kubeconfig")
        return self._spawn(
            "scheduler",
            [
                os.path.join(self.bin, "kube-scheduler"),
                "--kubeconfig=" + kubeconfig,
                "--authentication-kubeconfig=" + kubeconfig,
                "--authorization-kubeconfig=" + kubeconfig,
                "--bind-address=127.0.0.1",
                "--secure-port=%d" % self.ports["scheduler"],
                "--cert-dir=" + self._path("scheduler-certs"),
                # No front proxy: nothing to look up for request-header authentication.
                "--authentication-skip-lookup=true",
                "--leader-elect=false",
                "--profiling=false",
                "--v=2",  # logs every binding decision
            ],
        )

    def _healthz(self, port):
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # self-signed serving certificates in their cert dirs
        try:
            with urllib.request.urlopen(
                "https://127.0.0.1:%d/healthz" % port, context=ctx, timeout=2
            ) as r:
                return r.read() == b"ok"
        except OSError:
            return False

    # ---------------------------------------------------------------- API access

    def request(self, method, path, body=None, content_type="application/json", timeout=30):
        """One request to the API server as the admin user. Returns the decoded JSON (or the text
        when it is not JSON); raises ApiError for an HTTP error status."""
        data = None
        headers = {"Accept": "application/json"}
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, e.read().decode(errors="replace")) from None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def stream(self, path, timeout=None):
        """GET PATH as the admin user and return the open response, unread: a watch to read
        line by line (one JSON event a line). The caller closes it."""
        req = urllib.request.Request(self.server + path, headers={"Accept": "application/json"})
        return urllib.request.urlopen(req, context=self._ssl, timeout=timeout)

    def get(self, path):
        """GET PATH, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def patch(self, path, patch, kind="merge"):
        types = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "json": "application/json-patch+json",
        }
        return self.request("PATCH", path, patch, content_type=types[kind])

    def kubectl(self, *args, input=None, check=False, timeout=120, token=None):
        """Runs the built kubectl with the admin kubeconfig (or, given TOKEN, as that token's
        bearer and nothing else); returns the CompletedProcess (text). With check=True a non-zero
        exit raises CalledProcessError carrying stderr."""
        if token is None:
            auth = ["--kubeconfig", self.kubeconfig]
        else:
            auth = [
                "--kubeconfig",
                os.devnull,
                "--server",
                self.server,
                "--certificate-authority",
                self.ca_file,
                "--token",
                token,
            ]
        proc = subprocess.run(
            [os.path.join(self.bin, "kubectl"), *auth, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(
                proc.returncode, proc.args, proc.stdout, proc.stderr
            )
        return proc

    def env(self):
        """Environment for a tool run by hand against this control plane (KUBECONFIG, PATH)."""
        env = dict(os.environ)
        env["KUBECONFIG"] = self.kubeconfig
        env["PATH"] = self.bin + os.pathsep + env.get("PATH", "")
        return env

    # ---------------------------------------------------------------- namespaces, accounts

    def apply(self, *objects):
        """`kubectl apply` of OBJECTS (dicts), as one List; raises CalledProcessError on
        failure."""
        items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        return self.kubectl("apply", "-f", "-", input=json.dumps(items), check=True)

    def create_namespace(self, name, timeout=60):
        """Creates namespace NAME (if missing) and waits for its `default` service account, without
        which pods cannot be created there."""
        try:
            self.request(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
            )
        except ApiError as e:
            if e.status != 409:
                raise
        self.wait_for_service_account("default", name, timeout)

    def wait_for_service_account(self, name, namespace="default", timeout=60):
        return _wait(
            "service account %s/%s" % (namespace, name),
            lambda: self.get("/api/v1/namespaces/%s/serviceaccounts/%s" % (namespace, name)),
            timeout,
        )

    def token(self, service_account, namespace="default", seconds=3600):
        """A token for SERVICE_ACCOUNT from the TokenRequest API (what `kubectl create token`
        does, and what a kubelet mounts into a pod)."""
        result = self.request(
            "POST",
            "/api/v1/namespaces/%s/serviceaccounts/%s/token" % (namespace, service_account),
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        return result["status"]["token"]

    def service_account_dir(self, path, service_account, namespace="default"):
        """Writes what a kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount (token,
        ca.crt, namespace) into PATH; returns the environment variables an in-cluster client
        reads besides those files (KUBERNETES_SERVICE_HOST/PORT)."""
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "token"), "w") as f:
            f.write(self.token(service_account, namespace))
        shutil.copyfile(self.ca_file, os.path.join(path, "ca.crt"))
        with open(os.path.join(path, "namespace"), "w") as f:
            f.write(namespace)
        return {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.ports["apiserver"]),
        }

    # ---------------------------------------------------------------- fake GPU nodes

    def add_gpu_node(
        self,
        name,
        gpus,
        product=DEFAULT_GPU_PRODUCT,
        cpu="64",
        memory="256Gi",
        pods="110",
        labels=None,
        pod_runner=True,
    ):
        """Creates Node NAME advertising GPUS nvidia.com/gpu of PRODUCT and marks it Ready, so that
        the scheduler binds pods to it. With POD_RUNNER (the default) the node carries the label
        virtualflow.io/pod-runner=true, so that a pod runner (start_pod_runner) runs its pods.
        Returns the Node."""
        node_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            GPU_PRODUCT_LABEL: product,
        }
        if pod_runner:
            node_labels[POD_RUNNER_LABEL] = "true"
        node_labels.update(labels or {})
        self.request(
            "POST",
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": node_labels}},
        )
        resources = {
            GPU_RESOURCE: str(gpus),
            "cpu": str(cpu),
            "memory": str(memory),
            "pods": str(pods),
        }
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            {
                "type": t,
                "status": s,
                "reason": r,
                "message": "fake node (e2e tests)",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for t, s, r in (
                ("Ready", "True", "KubeletReady"),
                ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                ("PIDPressure", "False", "KubeletHasSufficientPID"),
            )
        ]
        self.patch(
            "/api/v1/nodes/%s/status" % name,
            {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "conditions": conditions,
                    "addresses": [
                        {"type": "InternalIP", "address": "127.0.0.1"},
                        {"type": "Hostname", "address": name},
                    ],
                    "nodeInfo": {
                        "architecture": "amd64",
                        "operatingSystem": "linux",
                        "kubeletVersion": "fake",
                        "containerRuntimeVersion": "fake://0",
                    },
                }
            },
        )
        # The TaintNodesByCondition admission plugin taints every new node not-ready; the node
        # lifecycle controller would lift it once the node is Ready, and it does not run here.
        return self._untaint_not_ready(name)

    def _untaint_not_ready(self, name):
        for _ in range(10):
            node = self.request("GET", "/api/v1/nodes/" + name)
            taints = node["spec"].get("taints") or []
            kept = [t for t in taints if not t["key"].startswith("node.kubernetes.io/not-ready")]
            if kept == taints:
                return node
            spec_patch = [
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": node["metadata"]["resourceVersion"],
                },
                {"op": "replace", "path": "/spec/taints", "value": kept},
            ]
            try:
                return self.patch("/api/v1/nodes/" + name, spec_patch, kind="json")
            except ApiError as e:
                if e.status not in (409, 422):
                    raise
        raise RuntimeError("could not remove the not-ready taint from node " + name)

    def cordon(self, name):
        """Marks node NAME unschedulable (kubectl cordon)."""
        return self.patch("/api/v1/nodes/" + name, {"spec": {"unschedulable": True}})

    def uncordon(self, name):
        return self.patch("/api/v1/nodes/" + name, {"spec": {"unschedulable": None}})

    def pods_on(self, node, namespace=None):
        """The pods bound to NODE (all namespaces unless NAMESPACE), as API objects."""
        base = "/api/v1/namespaces/%s/pods" % namespace if namespace else "/api/v1/pods"
        selector = urllib.parse.quote("spec.nodeName=" + node)
        return self.request("GET", base + "?fieldSelector=" + selector)["items"]

    def drain(self, name, grace_period_seconds=0, timeout=60):
        """kubectl drain: cordons NAME, evicts its pods through the Eviction API (which honours
        PodDisruptionBudgets; a 429 is retried until TIMEOUT) and waits until none is left.
        With no kubelet to confirm a graceful shutdown, the default grace period is 0 so that
        eviction deletes at once; a larger one needs a pod runner to finish the deletion."""
        self.cordon(name)
        deadline = time.monotonic() + timeout
        while True:
            pods = self.pods_on(name)
            if not pods:
                return
            for pod in pods:
                meta = pod["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                try:
                    self.request(
                        "POST",
                        "/api/v1/namespaces/%s/pods/%s/eviction"
                        % (meta["namespace"], meta["name"]),
                        {
                            "apiVersion": "policy/v1",
                            "kind": "Eviction",
                            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                            "deleteOptions": {"gracePeriodSeconds": grace_period_seconds},
                        },
                    )
                except ApiError as e:
                    if e.status not in (404, 429):
                        raise
            if time.monotonic() > deadline:
                raise TimeoutError(
                    "node %s still has pods after %ss: %s"
                    % (name, timeout, [p["metadata"]["name"] for p in pods])
                )
            time.sleep(0.5)

    def delete_node(self, name):
        """Deletes Node NAME. Its pods stay bound to it until the pod garbage collector (part of
        kube-controller-manager) deletes them, about 40 s later; drain() first to avoid that."""
        try:
            self.request("DELETE", "/api/v1/nodes/" + name)
        except ApiError as e:
            if e.status != 404:
                raise

    # ---------------------------------------------------------------- the pod runner

    # After start_pod_runner: the pods' network. pod_gateway is the host's address as pods see
    # it (the bridge's), where a pod reaches anything listening on the host on 0.0.0.0 or that
    # address (127.0.0.1 inside a pod is the pod itself); 127.0.0.1 with pod_network="host".
    pod_gateway = None
    pod_cidr = None
    pod_bridge = None

    def start_pod_runner(self, bin_dir, path=None, log_dir=None, timeout=60, pod_network="netns"):
        """Starts vf-pod-runner from BIN_DIR as the kubelet of every node labelled
        virtualflow.io/pod-runner=true, with the admin kubeconfig, and waits until it has listed
        the nodes and pods. PATH (a directory or a list of them; default: BIN_DIR) goes first on
        the PATH of the pods' commands, so that a pod whose command is `virtualflow-agent` runs
        the freshly built one. Each container's output goes to LOG_DIR (default: pods/ in
        work_dir, which outlives the control plane under ctest) as
        <namespace>_<pod>_<container>.log. The runner is a
        component like the others: it dies with the test, dump_logs() shows its log, and stop()
        stops it (and so every pod's process) first. Returns the Component.

        POD_NETWORK "netns" (needs root) gives every pod a network namespace and an address of
        its own on a bridge of its own (a free one of vfpods0..vfpods11, with 10.244.0.0/16 ..
        10.255.0.0/16, kept across restarts of this control plane's runner); pod_gateway is then
        the bridge's address. "host" runs every pod in the host's network at 127.0.0.1."""
        if self.pod_runner is not None:
            raise RuntimeError("a pod runner is already running")
        binary = os.path.join(bin_dir, "vf-pod-runner")
        if not os.access(binary, os.X_OK):
            raise RuntimeError(
                "vf-pod-runner not found in %s; build the vf-pod-runner target" % bin_dir
            )
        if path is None:
            path = [bin_dir]
        elif isinstance(path, str):
            path = [path]
        self.pod_log_dir = log_dir or os.path.join(self.work_dir, "pods")
        os.makedirs(self.pod_log_dir, exist_ok=True)
        log_path = os.path.join(self.logs, "pod-runner.log")
        offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0  # a restart appends
        argv = [
            binary,
            "--kubeconfig",
            self.kubeconfig,
            "--log-dir",
            self.pod_log_dir,
            "--path",
            os.pathsep.join(os.path.abspath(p) for p in path),
            "--pod-network",
            pod_network,
        ]
        if pod_network == "netns":
            if self.pod_bridge is None:
                self.pod_bridge, self.pod_cidr, self.pod_gateway = _free_pod_bridge()
            argv += ["--bridge", self.pod_bridge, "--pod-cidr", self.pod_cidr]
        else:
            self.pod_bridge, self.pod_cidr, self.pod_gateway = None, None, "127.0.0.1"
        runner = self._spawn("pod-runner", argv)
        self.pod_runner = runner

        def synced():
            runner.check_alive()
            with open(runner.log_path, "rb") as f:
                f.seek(offset)
                return b" synced: " in f.read()

        self.wait_for("vf-pod-runner to list nodes and pods", synced, timeout)
        return runner

    def stop_pod_runner(self, timeout=15):
        """Stops the pod runner (SIGTERM: it SIGTERMs its pods' processes, SIGKILLs them a few
        seconds later and exits). Returns its exit status (0 for a clean stop), or None when none
        runs. Pods keep the status they had, as when a kubelet stops."""
        runner, self.pod_runner = self.pod_runner, None
        if runner is None:
            return None
        runner.stop(timeout=timeout)
        if runner in self.components:
            self.components.remove(runner)  # stopped on purpose: check_alive() must not fail
        return runner.proc.returncode

    kueue = None

    KUEUE_CRDS = (
        "admissionchecks",
        "clusterqueues",
        "cohorts",
        "localqueues",
        "multikueueclusters",
        "multikueueconfigs",
        "provisioningrequestconfigs",
        "resourceflavors",
        "topologies",
        "workloadpriorityclasses",
        "workloads",
    )

    def install_kueue_crds(self, plurals=KUEUE_CRDS):
        """Installs Kueue's CRDs (from the pinned Kueue module, beside the tools) named by
        PLURALS, as start_kueue() needs them (see there), and waits until they are served."""
        crds = os.path.join(os.path.dirname(self.bin), "kueue-crds")
        if not os.path.isdir(crds):
            raise RuntimeError(
                "Kueue's CRDs not found beside %s; run %s" % (self.bin, BUILD_SCRIPT)
            )
        files = [os.path.join(crds, "kueue.x-k8s.io_%s.yaml" % p) for p in plurals]
        # Server-side: the Workload CRD is too large for kubectl's last-applied annotation;
        # --force-conflicts: again after the patches below, it takes the fields back.
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            *["-f=" + f for f in files],
            check=True,
            timeout=180,
        )
        for plural in set(plurals) & {
            "localqueues",
            "clusterqueues",
            "cohorts",
            "workloads",
            "multikueueclusters",
        }:
            path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/%s.kueue.x-k8s.io" % (
                plural
            )
            # Only the stored version is served: the API server keeps a watch cache per served
            # version, and one for v1beta1 would call the conversion webhook for every object.
            versions = [v["name"] for v in self.get(path)["spec"]["versions"]]
            self.patch(
                path,
                [
                    {"op": "test", "path": "/spec/versions/%d/name" % i, "value": name}
                    for i, name in enumerate(versions)
                ]
                + [
                    {"op": "replace", "path": "/spec/versions/%d/served" % i, "value": False}
                    for i, name in enumerate(versions)
                    if name != "v1beta2"
                ],
                kind="json",
            )
            self.patch(
                path,
                {
                    "spec": {
                        "conversion": {
                            "strategy": "Webhook",
                            "webhook": {
                                "conversionReviewVersions": ["v1"],
                                "clientConfig": {
                                    "service": {
                                        "namespace": "kueue-system",
                                        "name": "kueue-webhook-service",
                                        "path": "/convert",
                                    }
                                },
                            },
                        }
                    }
                },
            )

        def established(plural):
            crd = (
                self.get(
                    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                    "%s.kueue.x-k8s.io" % plural
                )
                or {}
            )
            return any(
                c["type"] == "Established" and c["status"] == "True"
                for c in crd.get("status", {}).get("conditions", [])
            )

        self.wait_for("Kueue's CRDs to be established", lambda: all(map(established, plurals)))

    def start_kueue(self, timeout=120, wait_for_pods_ready=None):
        """Installs Kueue's CRDs and starts Kueue's controller manager (`kueue`, built from its
        upstream source beside the other tools, CRDs from the same module) against this control
        plane, as the admin, and waits until it is ready. Returns the Component.

        As Kueue's release manifests install it, except where a component would have to reach
        it over a service network, which this control plane has none of: its webhook server
        runs (on a free loopback port, with the certificates Kueue's own rotator makes and
        keeps in the Secret kueue-system/kueue-webhook-server-cert), but the webhook
        configurations are not installed, so the API server never calls it: Kueue validates and
        defaults nothing at admission, and clients must write complete objects. The CRDs that
        have a conversion webhook in the release keep it (Kueue's rotator injects its CA there
        and waits for that before it starts), but serve only their stored version, v1beta2, so
        that the API server never converts (it would for the watch cache of a second served
        version, v1beta1, which Kueue itself no longer uses). This method plays the
        kubelet's part for the certificates: it writes the Secret's keys into the directory
        Kueue reads them from (the Secret volume of its pod). No leader election; the
        visibility API server (VisibilityOnDemand, an aggregated API) is off; metrics and
        health on free loopback ports (self.ports["kueue-metrics"], ["kueue-health"]).

        VirtualFlowJob is registered in integrations.externalFrameworks, as docs/operations.md
        tells an administrator to. WAIT_FOR_PODS_READY (seconds) turns on Kueue's
        waitForPodsReady with that timeout (as Kueue v0.19 does by default, with 30 minutes):
        an admitted Workload whose PodsReady condition is not True by then is evicted."""
        if self.kueue is not None:
            raise RuntimeError("Kueue is already running")
        binary = os.path.join(self.bin, "kueue")
        if not os.access(binary, os.X_OK):
            raise RuntimeError("kueue not found in %s; run %s" % (self.bin, BUILD_SCRIPT))
        self.install_kueue_crds()
        self.create_namespace("kueue-system")
        # As in the release manifests: the rotator fills this Secret, it does not create it.
        self.request(
            "POST",
            "/api/v1/namespaces/kueue-system/secrets",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "kueue-webhook-server-cert", "namespace": "kueue-system"},
            },
        )
        for name in ("kueue-metrics", "kueue-health", "kueue-webhook"):
            self.ports[name] = free_port()
        cert_dir = self._path("kueue-certs")
        os.makedirs(cert_dir, exist_ok=True)
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": "127.0.0.1:%d" % self.ports["kueue-health"]},
            "metrics": {"bindAddress": "127.0.0.1:%d" % self.ports["kueue-metrics"]},
            "webhook": {
                "host": "127.0.0.1",
                "port": self.ports["kueue-webhook"],
                "certDir": cert_dir,
            },
            "leaderElection": {"leaderElect": False},
            "featureGates": {"VisibilityOnDemand": False},
            "integrations": {"externalFrameworks": ["VirtualFlowJob.v1alpha1.virtualflow.io"]},
        }
        if wait_for_pods_ready is not None:
            config["waitForPodsReady"] = {
                "timeout": "%ds" % wait_for_pods_ready,
                "blockAdmission": False,
                "recoveryTimeout": "%ds" % wait_for_pods_ready,
            }
        config_path = self._path("kueue-config.yaml")
        with open(config_path, "w") as f:
            json.dump(config, f, indent=2)  # JSON is YAML
        self.kueue = Component(
            "kueue",
            [binary, "--config", config_path],
            os.path.join(self.logs, "kueue.log"),
            env={"KUBECONFIG": self.kubeconfig, "PATH": os.environ["PATH"]},
        )
        self.components.append(self.kueue)

        def mount_certificates():
            """What a kubelet does for Kueue's pod: the Secret's keys as files in the cert dir
            (the rotator waits for them there before it starts the webhook server)."""
            if os.path.exists(os.path.join(cert_dir, "tls.crt")):
                return
            secret = self.get("/api/v1/namespaces/kueue-system/secrets/kueue-webhook-server-cert")
            data = (secret or {}).get("data") or {}
            if not all(key in data for key in ("ca.crt", "tls.crt", "tls.key")):
                return
            for key in ("ca.crt", "tls.key", "tls.crt"):  # tls.crt last: the rotator looks for it
                with open(os.path.join(cert_dir, key), "wb") as f:
                    f.write(base64.b64decode(data[key]))

        def ready():
            self.kueue.check_alive()
            mount_certificates()
            try:
                with urllib.request.urlopen(
                    "http://127.0.0.1:%d/readyz" % self.ports["kueue-health"], timeout=2
                ) as r:
                    return r.status == 200
            except OSError:
                return False

        self.wait_for("Kueue to be ready", ready, timeout)
        return self.kueue

    def pod_log(self, namespace, pod, container):
        """What the pod runner captured of a container's stdout and stderr ("" if nothing)."""
        try:
            with open(
                os.path.join(self.pod_log_dir, "%s_%s_%s.log" % (namespace, pod, container)),
                errors="replace",
            ) as f:
                return f.read()
        except (OSError, TypeError):
            return ""

    def wait_for(self, what, predicate, timeout=60, interval=0.25):
        """Polls PREDICATE until truthy (returned); on timeout raises TimeoutError. Fails fast
        when a component has died."""

        def check():
            self.check_alive()
            return predicate()

        return _wait(what, check, timeout, interval)


# ---------------------------------------------------------------- pod networks

# Where vf-pod-runner keeps each bridge's state; a runner holds DIR/<bridge>/lock while it runs.
POD_RUNNER_STATE = "/var/lib/vf-pod-runner"


def _free_pod_bridge():
    """(bridge, cidr, gateway) of a pod network no running vf-pod-runner holds, so that control
    planes of concurrent test runs do not share one."""
    import fcntl

    for i in range(12):
        bridge = "vfpods%d" % i
        lock = os.path.join(POD_RUNNER_STATE, bridge, "lock")
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            fd = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            finally:
                os.close(fd)  # closing drops the lock again
        return bridge, "10.%d.0.0/16" % (244 + i), "10.%d.0.1" % (244 + i)
    raise RuntimeError("every pod bridge vfpods0..vfpods11 is held by a running vf-pod-runner")


# ---------------------------------------------------------------- process-wide cleanup

_LIVE = set()
_handlers_installed = False


def _install_signal_handlers():
    """On SIGTERM/SIGINT (ctest's timeout, ^C) stop the control planes before exiting. A handler
    someone else installed is left alone."""
    global _handlers_installed
    if _handlers_installed or threading.current_thread() is not threading.main_thread():
        return
    _handlers_installed = True

    def handler(signum, frame):
        for cp in list(_LIVE):
            cp.stop()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, handler)


class ControlPlaneTestCase(unittest.TestCase):
    """Starts one control plane for the test class (self.cp / cls.cp) and, when a test fails or
    errs, prints the end of every component's log."""

    cp = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cp = ControlPlane(name=cls.__name__).start()

    @classmethod
    def tearDownClass(cls):
        if cls.cp:
            cls.cp.stop()
        super().tearDownClass()

    def run(self, result=None):
        result = result if result is not None else self.defaultTestResult()
        before = len(result.failures) + len(result.errors)
        out = super().run(result)
        if self.cp and len(result.failures) + len(result.errors) > before:
            sys.stderr.write("\n%s failed; control plane logs:\n" % self.id())
            self.cp.dump_logs()
        return out
