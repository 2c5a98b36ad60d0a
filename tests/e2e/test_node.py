"""Real nodes: kubelets on containerd run the project's own images (ctest label `node`).

The control plane is the real one of the other end-to-end tests, started to take real nodes
(ControlPlane(nodes="kubelet")); nodes.RealNodes starts kube-proxy and two kubelets, each on a
containerd of its own with the operator, agent and PyTorch agent images imported from the OCI
layouts scripts/images.sh writes, and the suite's device plugin advertising GPUs. The chart is
installed with `helm install` as a platform engineer would, and its operator pods run from the
operator image: as uid 65532 on a read-only root file system, ready when the kubelet's probes of
/readyz say so, their output in `kubectl logs`. The last test stops everything and checks that
the host's sysctls, iptables rules, mounts, cgroups and network links are as they were.

Needs root, containerd and the images (the `vf_images` fixture); skips otherwise."""

import os
import shutil
import subprocess
import tempfile
import unittest

from controlplane import DEFAULT_GPU_PRODUCT, ControlPlane

SOURCE_DIR = os.environ.get("VF_SOURCE_DIR") or os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
CHART = os.path.join(SOURCE_DIR, "charts", "virtualflow")
CACHE = os.environ.get("VF_CACHE_DIR") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "virtualflow"
)
IMAGES_DIR = os.environ.get("VF_IMAGES_DIR") or os.path.join(CACHE, "images")
NS = "virtualflow-system"
RELEASE = "virtualflow"
GPUS_PER_NODE = 2


def project_version():
    with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
        for line in f:
            if line.startswith("project(VirtualFlow VERSION "):
                return line.split()[2]
    raise RuntimeError("no project version in CMakeLists.txt")


def images():
    """(OCI layout, tag, name) of each image the nodes get, as the chart names them."""
    version = project_version()
    return [
        (os.path.join(IMAGES_DIR, image), version, "docker.io/virtualflow/%s:%s" % (image, version))
        for image in ("operator", "agent", "torch-agent")
    ]


def missing_requirements():
    if os.geteuid() != 0:
        return "real nodes need root"
    for tool in (
        "containerd",
        "ctr",
        "runc",
        "umoci",
        "iptables-save",
        "gcc",
        "unshare",
        "nsenter",
    ):
        if not shutil.which(tool):
            return "real nodes need %s (scripts/setup.sh installs it)" % tool
    for layout, _tag, _name in images():
        if not os.path.exists(os.path.join(layout, "index.json")):
            return "no image at %s (scripts/images.sh builds it)" % layout
    return None


class RealNodeTest(unittest.TestCase):
    """The chart on two real nodes; the host put back afterwards. The tests run in order."""

    cp = None
    nodes = None

    @classmethod
    def setUpClass(cls):
        why = missing_requirements()
        if why:
            raise unittest.SkipTest(why)
        from nodes import RealNodes

        cls.cp = ControlPlane(name=cls.__name__, nodes="kubelet").start()
        cls.nodes = RealNodes(cls.cp)
        cls.cp.real_nodes = cls.nodes
        try:
            cls.nodes.start(images())
            for name in ("node-a", "node-b"):
                cls.nodes.add_node(name, gpus=GPUS_PER_NODE, gpu_product=DEFAULT_GPU_PRODUCT)
        except BaseException:
            cls.dump_node_logs()
            cls.cp.stop()
            raise
        cls.helm_home = tempfile.mkdtemp(prefix="vf-helm-")

    @classmethod
    def tearDownClass(cls):
        if cls.cp:
            cls.cp.stop()
        if getattr(cls, "helm_home", None):
            shutil.rmtree(cls.helm_home, ignore_errors=True)

    @classmethod
    def dump_node_logs(cls, lines=60):
        if not cls.nodes:
            return
        for path in cls.nodes.logs():
            try:
                with open(path, errors="replace") as f:
                    tail = f.readlines()[-lines:]
            except OSError:
                continue
            print("----- %s -----\n%s" % (path, "".join(tail)), flush=True)

    def run(self, result=None):
        result = result if result is not None else self.defaultTestResult()
        before = len(result.failures) + len(result.errors)
        out = super().run(result)
        if self.cp and len(result.failures) + len(result.errors) > before:
            self.cp.dump_logs()
            self.dump_node_logs()
        return out

    def kubectl(self, *args, check=True, timeout=120):
        return self.cp.kubectl(*args, check=check, timeout=timeout)

    def helm(self, *args):
        env = dict(os.environ, KUBECONFIG=self.cp.kubeconfig)
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[var] = os.path.join(self.helm_home, var.lower())
        proc = subprocess.run(
            [os.path.join(self.cp.bin, "helm"), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        self.assertEqual(proc.returncode, 0, "helm %s: %s%s" % (args, proc.stdout, proc.stderr))
        return proc

    def operator_pods(self):
        pods = self.cp.get(
            "/api/v1/namespaces/%s/pods?labelSelector=app.kubernetes.io/name=virtualflow" % NS
        )
        return [
            p
            for p in pods["items"]
            if p["metadata"]["labels"].get("app.kubernetes.io/component") == "operator"
        ]

    def test_1_nodes_advertise_their_gpus_through_the_device_plugin(self):
        for name in ("node-a", "node-b"):
            node = self.cp.get("/api/v1/nodes/" + name)
            self.assertEqual(node["status"]["capacity"].get("nvidia.com/gpu"), str(GPUS_PER_NODE))
            self.assertEqual(
                node["metadata"]["labels"].get("nvidia.com/gpu.product"), DEFAULT_GPU_PRODUCT
            )
            kubelet = node["status"]["nodeInfo"]
            self.assertTrue(kubelet["containerRuntimeVersion"].startswith("containerd://"), kubelet)
            self.assertEqual(kubelet["kubeletVersion"], "v1.37.1")

    def test_2_helm_install_and_the_operator_pods_become_ready(self):
        version = project_version()
        self.cp.create_namespace(NS)
        self.helm(
            "install", RELEASE, CHART, "-n", NS,
            "--set", "image.pullPolicy=Never",
            "--wait", "--timeout", "300s",
        )  # fmt: skip
        pods = self.operator_pods()
        self.assertEqual(len(pods), 2, [p["metadata"]["name"] for p in pods])
        for pod in pods:
            (status,) = pod["status"]["containerStatuses"]
            self.assertTrue(status["ready"], status)
            self.assertEqual(status["image"], "docker.io/virtualflow/operator:" + version)
            self.assertIn(pod["spec"]["nodeName"], ("node-a", "node-b"))
            self.assertTrue(pod["status"]["podIP"].startswith("10.240."), pod["status"])
            container = pod["spec"]["containers"][0]
            self.assertIn("readinessProbe", container)
            self.assertIn("livenessProbe", container)

    def test_3_the_operator_runs_as_65532_on_a_read_only_root(self):
        pod = self.operator_pods()[0]["metadata"]["name"]
        out = self.kubectl("exec", "-n", NS, pod, "--", "id", "-u").stdout.strip()
        self.assertEqual(out, "65532")
        write = self.kubectl("exec", "-n", NS, pod, "--", "touch", "/written", check=False)
        self.assertNotEqual(write.returncode, 0)
        self.assertIn("Read-only file system", write.stderr + write.stdout)

    def test_4_kubectl_logs_shows_the_operators_output(self):
        pod = self.operator_pods()[0]["metadata"]["name"]
        logs = self.kubectl("logs", "-n", NS, pod).stdout
        self.assertIn("virtualflow-operator", logs)

    def test_9_the_host_is_as_before(self):
        left = self.nodes.stop()
        self.assertEqual(left, [], "the host after the nodes stopped")
        # The directories made on the host to mount the nodes' own over are gone.
        for path in self.nodes.guard.made_dirs:
            self.assertFalse(os.path.exists(path), path)


if __name__ == "__main__":
    unittest.main()
