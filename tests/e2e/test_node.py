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

import concurrent.futures
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from controlplane import DEFAULT_GPU_PRODUCT, ControlPlane
from test_operator import local_sha
from test_torch_job import DATASET, cnn_manifest, torch_env

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
# One GPU a node: a job of one worker per GPU grows and shrinks with the nodes.
GPUS_PER_NODE = 1
JOB_NS = "training"
# Where the job's pods see their volume (data and checkpoints).
MOUNT = "/mnt/store"
# The PyTorch job's shape: long enough, in steps paced by a simulated slower device (each
# virtual node sleeps DELAY_MS), to hold a growth, a drain and a pod's replacement even when a
# new pod takes a minute to start on a loaded machine, and small steps (BATCH) so that its
# training and the static run it is compared with cost little CPU.
STEPS = 200
BATCH = 64
DELAY_MS = 120


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

    def kubectl(self, *args, input=None, check=True, timeout=120):
        return self.cp.kubectl(*args, input=input, check=check, timeout=timeout)

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

    # ---------------------------------------------------------------- the PyTorch job

    def job_status(self, name):
        job = self.cp.get(
            "/apis/virtualflow.io/v1alpha1/namespaces/%s/virtualflowjobs/%s" % (JOB_NS, name)
        )
        return (job or {}).get("status") or {}

    def wait_job(self, name, what, predicate, timeout=300):
        """The job's status once PREDICATE holds. Fails at once when the job fails, or when it
        ends before PREDICATE held (the job was too short for what the test waits for); on a
        timeout, the message has the job's last status and where its pods are."""
        seen = {}

        def check():
            status = seen["status"] = self.job_status(name)
            if predicate(status):
                return status
            if status.get("phase") == "Failed":
                raise AssertionError("job %s failed: %s" % (name, status.get("message")))
            if status.get("phase") == "Succeeded":
                raise AssertionError(
                    "job %s ended at step %s before %s" % (name, status.get("step"), what)
                )
            return None

        try:
            return self.cp.wait_for("job %s: %s" % (name, what), check, timeout=timeout)
        except TimeoutError as e:
            raise TimeoutError(
                "%s\nlast status: %s\npods: %s"
                % (e, json.dumps(seen.get("status")), self.pod_places(name))
            ) from None

    def pod_places(self, name):
        """'pod node phase' for each pod of job NAME, for a failure's message."""
        try:
            return "; ".join(
                "%s %s %s" % (p["metadata"]["name"], p["spec"].get("nodeName"),
                              p.get("status", {}).get("phase"))
                for p in self.job_pods(name)
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a message, not the failure
            return "(not listed: %s)" % e

    def wait_workers(self, name, workers, timeout=300):
        return self.wait_job(
            name,
            "%d workers running" % workers,
            lambda s: s.get("workers") == workers and s.get("phase") == "Running",
            timeout,
        )

    def job_pods(self, name):
        return self.cp.get(
            "/api/v1/namespaces/%s/pods?labelSelector=virtualflow.io/job%%3D%s" % (JOB_NS, name)
        )["items"]

    def make_store(self):
        """A hostPath PersistentVolume with Fashion-MNIST in data/ and an empty checkpoints/
        the workers (uid 65532) may write, and a claim the controller manager binds to it."""
        store = os.path.join(self.cp.dir, "store")
        os.makedirs(os.path.join(store, "checkpoints"))
        shutil.copytree(DATASET, os.path.join(store, "data"))
        os.chmod(store, 0o755)
        os.chown(os.path.join(store, "checkpoints"), 65532, 65532)
        self.cp.apply(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": "train-store"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "manual",
                    "hostPath": {"path": store},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "train", "namespace": JOB_NS},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "manual",
                    "volumeName": "train-store",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
        self.cp.wait_for(
            "the claim to be bound",
            lambda: (
                (self.cp.get("/api/v1/namespaces/%s/persistentvolumeclaims/train" % JOB_NS) or {})
                .get("status", {})
                .get("phase")
                == "Bound"
            ),
            timeout=120,
        )
        return store

    def static_sha(self):
        """weights_sha256 of `vf run` of the same job on this host (its PyTorch environment,
        the data from the host's copy, the checkpoint in a temporary directory: neither is part
        of the training math) on one worker (see local_sha)."""
        with tempfile.TemporaryDirectory() as tmp:
            manifest = cnn_manifest(
                "torch-cnn", "default", DATASET, os.path.join(tmp, "cnn.ckpt"), delay_ms=0,
                steps=STEPS, batch=BATCH,
            )  # fmt: skip
            return local_sha(manifest, env=torch_env(), cwd=SOURCE_DIR)

    def kubelet_probe_results(self, node):
        """The kubelet's own count of its probes' results on NODE (its /metrics/probes, through
        the API server's node proxy): {(probe type, pod, result): count}."""
        text = self.kubectl("get", "--raw", "/api/v1/nodes/%s/proxy/metrics/probes" % node).stdout
        out = {}
        for line in text.splitlines():
            if not line.startswith("prober_probe_total{"):
                continue
            labels = dict(
                kv.split("=", 1) for kv in line[line.index("{") + 1 : line.index("}")].split(",")
            )
            labels = {k: v.strip('"') for k, v in labels.items()}
            key = (labels.get("probe_type"), labels.get("pod"), labels.get("result"))
            out[key] = out.get(key, 0) + float(line.rsplit(" ", 1)[1])
        return out

    @unittest.skipUnless(os.environ.get("VF_PYTHON"), "no Python environment with PyTorch")
    def test_5_the_pytorch_job_grows_shrinks_survives_pod_loss_and_matches_vf_run(self):
        name = "torch-cnn"
        self.cp.create_namespace(JOB_NS)
        self.kubectl("label", "namespace", JOB_NS, "pod-security.kubernetes.io/enforce=restricted")
        store = self.make_store()
        # e2e.torch_job's CNN job (the same math as the static run), from the image: its
        # program is the image's copy, the package the image's own.
        manifest = cnn_manifest(
            name, JOB_NS, MOUNT + "/data", MOUNT + "/checkpoints/cnn.ckpt", ("train", MOUNT),
            delay_ms=DELAY_MS, steps=STEPS, batch=BATCH,
        )  # fmt: skip
        pod_spec = manifest["spec"]["template"]["spec"]
        worker = pod_spec["containers"][0]
        worker["image"] = "virtualflow/torch-agent:" + project_version()
        worker["command"] = ["python3", "/opt/virtualflow/examples/torch/cnn.py"]
        del worker["workingDir"]
        worker["env"] = [e for e in worker["env"] if e["name"] != "PYTHONPATH"]
        worker["securityContext"] = {"readOnlyRootFilesystem": True}
        pod_spec["volumes"].append({"name": "tmp", "emptyDir": {}})
        worker["volumeMounts"].append({"name": "tmp", "mountPath": "/tmp"})
        self.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        self.wait_workers(name, 2)
        pods = self.job_pods(name)
        self.assertEqual({p["spec"]["nodeName"] for p in pods}, {"node-a", "node-b"})
        self.wait_job(name, "step >= 10", lambda s: s.get("step", 0) >= 10)

        # In its pods: the image's user, a read-only root, and the training output in the logs.
        pod = pods[0]["metadata"]["name"]
        self.assertEqual(
            self.kubectl("exec", "-n", JOB_NS, pod, "--", "id", "-u").stdout.strip(), "65532"
        )
        write = self.kubectl("exec", "-n", JOB_NS, pod, "--", "touch", "/written", check=False)
        self.assertIn("Read-only file system", write.stderr + write.stdout)
        # Its GPU is the one the kubelet's device manager allocated from the device plugin.
        visible = self.kubectl(
            "exec", "-n", JOB_NS, pod, "--", "printenv", "NVIDIA_VISIBLE_DEVICES"
        )
        self.assertEqual(visible.stdout.strip(), "GPU-0")
        self.assertIn("cnn: %s trains on cpu" % pod, self.kubectl("logs", "-n", JOB_NS, pod).stdout)
        # Its readiness is the kubelet's probe of the agent's /readyz.
        node = pods[0]["spec"]["nodeName"]
        probes = self.kubelet_probe_results(node)
        self.assertGreater(probes.get(("Readiness", pod, "successful"), 0), 0, probes)
        self.assertGreater(probes.get(("Startup", pod, "successful"), 0), 0, probes)

        # A node joins: the job grows onto it between two steps.
        self.nodes.add_node("node-c", gpus=GPUS_PER_NODE, gpu_product=DEFAULT_GPU_PRODUCT)
        self.wait_workers(name, 3)
        # Draining it takes its GPU back: its worker leaves gracefully.
        self.kubectl(
            "drain", "node-c", "--ignore-daemonsets", "--delete-emptydir-data",
            "--grace-period=30", "--timeout=180s", timeout=240,
        )  # fmt: skip
        self.wait_workers(name, 2)
        static = concurrent.futures.ThreadPoolExecutor(1).submit(self.static_sha)
        # A worker pod deleted: its worker leaves, a replacement joins.
        member = self.job_status(name)["assignment"][1]["worker"]
        self.kubectl("delete", "pod", "-n", JOB_NS, member, "--wait=false")
        self.wait_job(
            name,
            "pod %s replaced" % member,
            lambda s: (
                s.get("workers") == 2
                and s.get("phase") == "Running"
                and member not in [a["worker"] for a in s.get("assignment", [])]
            ),
        )
        status = self.wait_job(name, "Succeeded", lambda s: s.get("phase") == "Succeeded", 900)
        self.assertEqual(status["step"], STEPS)
        self.assertEqual(status["finalCheckpoint"]["claimName"], "train")
        on_volume = os.path.join(store, "checkpoints", "cnn.ckpt")
        self.assertGreater(os.path.getsize(on_volume), 0)
        self.assertEqual(status["weightsSha256"], static.result(timeout=900))

    def test_9_the_host_is_as_before(self):
        left = self.nodes.stop()
        self.assertEqual(left, [], "the host after the nodes stopped")
        # The directories made on the host to mount the nodes' own over are gone.
        for path in self.nodes.guard.made_dirs:
            self.assertFalse(os.path.exists(path), path)


if __name__ == "__main__":
    unittest.main()
