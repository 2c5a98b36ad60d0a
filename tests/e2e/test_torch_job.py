"""A VirtualFlowJob of CPUs only on a real control plane with vf-pod-runner's nodes, in a namespace
that enforces the restricted Pod Security Standard: a CPU-only job (gpusPerWorker: 0) runs on the
nodes its nodeSelector allows, as many workers as their CPUs fit.

The PyTorch CNN job that grows, shrinks, survives a pod deletion and ends with the weights of
`vf run` runs from its image on real nodes instead (test_node.py, ctest e2e.node)."""

import os
import unittest

from controlplane import ApiError
from test_operator import BIN_DIR, SOURCE_DIR, OperatorTestCase, job_manifest, worker

PYTHON = os.environ.get("VF_PYTHON", "")
DATASET = "/usr/share/datasets/fashion-mnist"
CNN = os.path.join(SOURCE_DIR, "examples", "torch", "cnn.py")
PACKAGE = os.path.join(os.path.dirname(BIN_DIR), "python")  # build/python
STEPS = 60
RESTRICTED = "restricted"


# Rank 0 of the CNN evaluates this many test images, not all 10,000 (about 20 CPU-seconds a
# run): the tests compare weights, not accuracy.
CNN_TEST_SAMPLES = "500"


def torch_env() -> dict[str, str]:
    """This process's environment with the PyTorch environment's python3 first on PATH: what a
    local `vf run` of a PyTorch job needs to start its workers. `vf run` reads no `env` of the
    job's template, so the CNN's CNN_TEST_SAMPLES (see cnn_manifest) is set here too."""
    return dict(
        os.environ,
        PATH=os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"],
        CNN_TEST_SAMPLES=CNN_TEST_SAMPLES,
    )


def cnn_manifest(name, ns, data_dir, checkpoint, volume=None, delay_ms=60, steps=STEPS, batch=256):
    """The CNN example as a job of STEPS steps of global batch BATCH whose data and checkpoint
    are at DATA_DIR and CHECKPOINT; with VOLUME = (claim, mount root), both are on that PVC."""
    container = {
        "name": "worker",
        "image": "virtualflow/torch-agent:e2e",
        "command": ["python3", CNN],
        "workingDir": SOURCE_DIR,
        "env": [
            {"name": "PYTHONPATH", "value": PACKAGE},
            {"name": "FASHION_MNIST", "value": data_dir},
            {"name": "VF_VNODE_DELAY_MS", "value": str(delay_ms)},
            {"name": "CNN_TEST_SAMPLES", "value": CNN_TEST_SAMPLES},
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
        "globalBatchSize": batch,
        "replicas": {"min": 1, "max": 4},
        "gpusPerWorker": 1,
        "steps": steps,
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
