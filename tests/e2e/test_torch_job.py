"""A user's own PyTorch program as a VirtualFlowJob on a real control plane, in a namespace that
enforces the restricted Pod Security Standard: the CNN example (examples/torch/cnn.py) runs in
pods of their own network namespace and address, reads Fashion-MNIST from a PersistentVolumeClaim
and checkpoints to it; it grows on a new node, shrinks on a drain, survives a pod deletion and
ends with the weights of `vf run` of the same job on a fixed number of workers, its checkpoint on
the volume. A CPU-only job (gpusPerWorker: 0) runs on the nodes its nodeSelector allows, as many
workers as their CPUs fit."""

import concurrent.futures
import os
import shutil
import tempfile
import unittest

from controlplane import ApiError
from test_operator import BIN_DIR, SOURCE_DIR, OperatorTestCase, job_manifest, local_sha, worker

PYTHON = os.environ.get("VF_PYTHON", "")
DATASET = "/usr/share/datasets/fashion-mnist"
CNN = os.path.join(SOURCE_DIR, "examples", "torch", "cnn.py")
PACKAGE = os.path.join(os.path.dirname(BIN_DIR), "python")  # build/python
STEPS = 60
RESTRICTED = "restricted"


def torch_env() -> dict[str, str]:
    """This process's environment with the PyTorch environment's python3 first on PATH: what a
    local `vf run` of a PyTorch job needs to start its workers."""
    return dict(os.environ, PATH=os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"])


def cnn_manifest(name, ns, data_dir, checkpoint, volume=None, delay_ms=60):
    """The CNN example as a job of STEPS steps whose data and checkpoint are at DATA_DIR and
    CHECKPOINT; with VOLUME = (claim, mount root), both are on that PVC."""
    container = {
        "name": "worker",
        "image": "virtualflow/torch-agent:e2e",
        "command": ["python3", CNN],
        "workingDir": SOURCE_DIR,
        "env": [
            {"name": "PYTHONPATH", "value": PACKAGE},
            {"name": "FASHION_MNIST", "value": data_dir},
            {"name": "VF_VNODE_DELAY_MS", "value": str(delay_ms)},
        ],
    }
    pod: dict = {"containers": [container]}
    if volume:
        claim, root = volume
        pod["volumes"] = [{"name": "store", "persistentVolumeClaim": {"claimName": claim}}]
        container["volumeMounts"] = [
            {"name": "store", "mountPath": root + "/data", "subPath": "data", "readOnly": True},
            {"name": "store", "mountPath": root + "/checkpoints", "subPath": "checkpoints"},
        ]
    spec = {
        "virtualNodes": 8,
        "globalBatchSize": 256,
        "replicas": {"min": 1, "max": 4},
        "gpusPerWorker": 1,
        "steps": STEPS,
        "seed": 42,
        "reduction": "exact",
        "elasticity": {"policy": "elastic", "cooldownSeconds": 0},
        "checkpoint": {"path": checkpoint, "everySteps": 20},
        "template": {"spec": pod},
    }
    return {
        "apiVersion": "virtualflow.io/v1alpha1",
        "kind": "VirtualFlowJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


@unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
class TorchJobTest(OperatorTestCase):
    ns = RESTRICTED

    @classmethod
    def setUpClass(cls):
        cls.pod_path = [BIN_DIR, os.path.dirname(PYTHON)]
        super().setUpClass()
        cls.cp.kubectl(
            "label",
            "namespace",
            cls.ns,
            "--overwrite",
            "pod-security.kubernetes.io/enforce=restricted",
            check=True,
        )
        # A hostPath PersistentVolume (the test's stand-in for a cluster's storage) and a claim
        # that the real controller-manager binds to it.
        cls.store = tempfile.mkdtemp(prefix="vf-e2e-store-")
        os.makedirs(os.path.join(cls.store, "data"))
        os.makedirs(os.path.join(cls.store, "checkpoints"))
        for f in os.listdir(DATASET):
            shutil.copy(os.path.join(DATASET, f), os.path.join(cls.store, "data"))
        cls.cp.request(
            "POST",
            "/api/v1/persistentvolumes",
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": "train-store"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "manual",
                    "hostPath": {"path": cls.store},
                },
            },
        )
        cls.cp.request(
            "POST",
            "/api/v1/namespaces/%s/persistentvolumeclaims" % cls.ns,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "train"},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "manual",
                    "volumeName": "train-store",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
        cls.cp.wait_for(
            "the claim to be bound",
            lambda: (
                (cls.cp.get("/api/v1/namespaces/%s/persistentvolumeclaims/train" % cls.ns) or {})
                .get("status", {})
                .get("phase")
                == "Bound"
            ),
            timeout=120,
        )

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.store, ignore_errors=True)

    def local_sha(self, workers):
        """weights_sha256 of `vf run` of the same job (data from the host's copy, checkpoint in a
        temporary directory: neither is part of the training math) on WORKERS workers."""
        with tempfile.TemporaryDirectory() as tmp:
            manifest = cnn_manifest(
                "torch-cnn", "default", DATASET, os.path.join(tmp, "cnn.ckpt"), delay_ms=0
            )
            return local_sha(manifest, workers, env=torch_env(), cwd=SOURCE_DIR)

    def test_0_the_namespace_enforces_the_restricted_standard(self):
        """Without this the rest would prove nothing about Pod Security."""
        with self.assertRaises(ApiError) as refused:
            self.cp.request(
                "POST",
                "/api/v1/namespaces/%s/pods" % self.ns,
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "privileged"},
                    "spec": {
                        "containers": [
                            {"name": "c", "image": "x", "securityContext": {"privileged": True}}
                        ]
                    },
                },
            )
        self.assertEqual(refused.exception.status, 403)
        self.assertIn("restricted", str(refused.exception))

    def test_1_cnn_grows_shrinks_survives_pod_loss_and_checkpoints_to_its_volume(self):
        name = "torch-cnn"
        root = "/tmp/vf-e2e-mnt-%d" % os.getpid()  # where the pods see the volume
        checkpoint = root + "/checkpoints/cnn.ckpt"
        manifest = cnn_manifest(name, self.ns, root + "/data", checkpoint, ("train", root))
        self.reset_nodes(("gpu-1", 2))
        self.apply(manifest)
        self.wait_workers(name, 2, timeout=240)
        pods = self.pods(name)
        addresses = {p["status"].get("podIP") for p in pods}
        self.assertEqual(len(addresses), 2, "pods share an address: %s" % addresses)
        self.assertNotIn("127.0.0.1", addresses)
        self.wait_step(name, 10)
        # A node joins: the job grows to 4 workers between two steps.
        self.cp.add_gpu_node("gpu-2", gpus=2)
        self.wait_workers(name, 4, timeout=240)
        # Draining it takes the GPUs back: its workers leave gracefully.
        self.cp.drain("gpu-2", grace_period_seconds=30, timeout=180)
        self.wait_workers(name, 2, timeout=240)
        # The static run, while the job goes on (not before: a busy CPU can starve the growth
        # to 4 workers past its wait).
        static = concurrent.futures.ThreadPoolExecutor(1).submit(self.local_sha, 2)
        # A training pod deleted: its worker leaves, a replacement joins.
        member = self.status(name)["assignment"][1]["worker"]
        self.cp.kubectl("delete", "pod", "-n", self.ns, member, "--wait=false", check=True)
        self.wait_status(
            name,
            "pod %s replaced" % member,
            lambda s: (
                s.get("workers") == 2
                and s.get("phase") == "Running"
                and member not in [a["worker"] for a in s.get("assignment", [])]
            ),
            timeout=240,
        )
        status = self.wait_succeeded(name, timeout=900)
        self.assertEqual(status["step"], STEPS)
        resizes = [r for r, _ in self.events(name) if r == "Resized"]
        self.assertGreaterEqual(len(resizes), 2, self.events(name))
        # The trained weights are on the volume, and the status says where.
        self.assertEqual(
            status["finalCheckpoint"],
            {
                "path": checkpoint,
                "volume": "store",
                "claimName": "train",
                "subPath": "checkpoints/cnn.ckpt",
            },
        )
        on_volume = os.path.join(self.store, "checkpoints", "cnn.ckpt")
        self.assertTrue(os.path.getsize(on_volume) > 0, on_volume)
        self.assertFalse(os.path.exists(checkpoint), "written outside the volume")
        self.assertEqual(status["weightsSha256"], static.result(timeout=900))
        self.delete_job(name)

    def test_2_cpu_only_job_runs_on_the_cpu_its_selector_allows(self):
        name = "cpu-only"
        self.reset_nodes(("gpu-c", 2))
        self.cp.add_gpu_node("cpu-1", gpus=0, cpu="4", labels={"pool": "cpu"})
        manifest = job_manifest(name, steps=60, delay_ms=8)
        manifest["metadata"]["namespace"] = self.ns
        manifest["spec"]["gpusPerWorker"] = 0
        manifest["spec"]["template"]["spec"]["nodeSelector"] = {"pool": "cpu"}
        worker(manifest)["resources"] = {"requests": {"cpu": "2"}}
        self.apply(manifest)
        # Four CPUs fit two workers of two CPUs, whatever replicas.max says.
        self.wait_workers(name, 2, timeout=240)
        for pod in self.pods(name):
            self.assertEqual(pod["spec"]["nodeName"], "cpu-1")
            limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
            self.assertNotIn("nvidia.com/gpu", limits)
        status = self.wait_succeeded(name, timeout=600)
        self.assertEqual(status["step"], 60)
        self.delete_job(name)


if __name__ == "__main__":
    unittest.main()
