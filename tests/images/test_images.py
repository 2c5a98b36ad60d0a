"""The images scripts/images.sh builds, started with runc as a cluster would start them (read-only
root file system, the image's non-root user): the agent image trains the example to the weights
of the host's build; the operator image reconciles a VirtualFlowJob against a real control plane
(its worker pods are created); the PyTorch agent image trains the CNN example to the host's
weights. Every image holds its annotations, its user and only libraries that resolve.

Needs root (runc) and the images (the images.build test, scripts/images.sh, makes them); the
binaries come from $VF_BIN_DIR and the Python package from beside it, as ctest sets.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import oci

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))

from controlplane import ControlPlane  # noqa: E402

SOURCE_DIR = oci.SOURCE_DIR
BIN_DIR = os.environ.get("VF_BIN_DIR", os.path.join(SOURCE_DIR, "build", "bin"))
PYTHON = os.environ.get("VF_PYTHON", "")
USER = "65532:65532"
# The PyTorch image is built where there is a Python environment with PyTorch (VF_PYTHON).
IMAGES = ("operator", "agent") + (("torch-agent",) if PYTHON else ())
# The environment of a run on the host and in a container alike: OpenBLAS picks its kernels from
# the environment, and bitwise identity needs the same kernels.
RUN_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOSTNAME": "local"}

T = TypeVar("T")


def concurrently(*calls: Callable[[], T]) -> list[T]:
    """The results of CALLS, run at the same time (a container and the host's run of the same
    job do not wait for each other)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def host_run(
    job: str,
    args: list[str],
    cwd: str,
    path: list[str],
    pythonpath: str | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    """The summary of `vf run JOB ARGS` of the host's build (ENV added to RUN_ENV)."""
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "summary.json")
        run_env = dict(RUN_ENV, **(env or {}))
        run_env["PATH"] = os.pathsep.join(path + [RUN_ENV["PATH"]])
        if pythonpath:
            run_env["PYTHONPATH"] = pythonpath
        run = subprocess.run(
            [os.path.join(BIN_DIR, "vf"), "run", job, *args, "--summary-json", summary],
            cwd=cwd,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if run.returncode != 0:
            raise AssertionError("host run failed:\n%s\n%s" % (run.stdout, run.stderr))
        with open(summary) as f:
            return json.load(f)


def container_run(image: str, job: str, args: list[str], env: dict[str, str] | None = None) -> dict:
    """The summary of `vf run JOB ARGS` in IMAGE (JOB mounted read-only at /job/; ENV added to
    RUN_ENV)."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chown(tmp, 65532, 65532)
        target = "/job/" + os.path.basename(job)
        status, out = oci.run(
            image,
            ["vf", "run", target, *args, "--summary-json", "/out/summary.json"],
            env=dict(RUN_ENV, **(env or {})),
            timeout=600,
            mounts=[oci.Mount(job, target), oci.Mount(tmp, "/out", read_only=False)],
        )
        if status != 0:
            raise AssertionError("vf run in %s failed (exit %d):\n%s" % (image, status, out))
        with open(os.path.join(tmp, "summary.json")) as f:
            return json.load(f)


@unittest.skipUnless(os.geteuid() == 0, "runc needs root")
class ImageTest(unittest.TestCase):
    """What every image holds, and the agent image's runs (ctest images.agent)."""

    def test_images_run_as_their_user_with_their_annotations(self):
        revision = subprocess.run(
            ["git", "-C", SOURCE_DIR, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        # One container per image, all at once: its user, then a write to its root (its error
        # on stdout: runc copies a non-root process's stdout and stderr apart, in any order).
        runs = concurrently(
            *[
                lambda image=image: oci.run(
                    image, ["sh", "-c", "id -u && touch /usr/x 2>&1"], timeout=60
                )
                for image in IMAGES
            ]
        )
        for image, (status, out) in zip(IMAGES, runs, strict=True):
            with self.subTest(image):
                _, manifest = oci.manifest(image)
                annotations = manifest.get("annotations", {})
                self.assertEqual(annotations.get("org.opencontainers.image.version"), oci.version())
                self.assertTrue(
                    annotations.get("org.opencontainers.image.revision", "").startswith(revision),
                    annotations,
                )
                self.assertTrue(annotations.get("org.opencontainers.image.source"))
                config = oci.image_config(image)["config"]
                self.assertEqual(config["User"], USER)
                self.assertEqual(
                    config["Labels"]["org.opencontainers.image.version"], oci.version()
                )
                self.assertTrue(out.startswith("65532\n"), out)
                self.assertNotEqual(status, 0)
                self.assertIn("Read-only file system", out)

    def test_agent_image_trains_the_example_to_the_host_builds_weights(self):
        example = os.path.join(SOURCE_DIR, "examples", "fashion-mnist.yaml")
        args = ["--steps", "5", "--workers", "2", "--progress-interval", "0"]
        inside, host = concurrently(
            lambda: container_run("agent", example, args),
            lambda: host_run(example, args, cwd=SOURCE_DIR, path=[BIN_DIR]),
        )
        self.assertEqual(inside["steps"], 5)
        self.assertEqual(inside["weights_sha256"], host["weights_sha256"])

    def test_the_project_layer_is_keyed_by_content_not_path_or_time(self):
        """A clone elsewhere that builds the same bytes reuses the project's layer; a binary
        with one byte changed does not."""

        def key(build_dir: str) -> str:
            return subprocess.run(
                [os.path.join(SOURCE_DIR, "scripts", "images.sh"), "--files-key", "operator"],
                env=dict(os.environ, VF_BUILD_DIR=build_dir),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()

        here = key(os.path.dirname(BIN_DIR))
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "bin", "virtualflow-operator")
            os.makedirs(os.path.dirname(copy))
            shutil.copy(os.path.join(BIN_DIR, "virtualflow-operator"), copy)  # a new time
            self.assertEqual(key(tmp), here)
            with open(copy, "ab") as f:
                f.write(b"\0")
            self.assertNotEqual(key(tmp), here)

    def test_agent_image_finds_the_cuda_libraries(self):
        status, out = oci.run("agent", ["ldd", "/usr/local/bin/libvirtualflow-cuda.so"], timeout=60)
        self.assertEqual(status, 0, out)
        for lib in ("libcudart.so.13", "libcublas.so.13", "libnccl.so.2"):
            self.assertRegex(out, r"%s => /usr/local/lib/virtualflow-cuda/" % lib)
        self.assertNotIn("not found", out)


@unittest.skipUnless(os.geteuid() == 0, "runc needs root")
@unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
class TorchImageTest(unittest.TestCase):
    """The PyTorch agent image (ctest images.torch_agent)."""

    def test_torch_image_trains_the_cnn_example_to_the_host_builds_weights(self):
        # One step: the weights after it depend on every layer's forward and backward pass and
        # on the optimizer, as after more.
        # The accuracy on 1,000 test images, not 10,000: evaluating the full test set is most
        # of a one-step run's time, and the weights are computed before it.
        example = os.path.join(SOURCE_DIR, "examples", "torch-cnn.yaml")
        args = ["--steps", "1", "--workers", "1", "--progress-interval", "0"]
        env = {"CNN_TEST_SAMPLES": "1000"}
        inside, host = concurrently(
            lambda: container_run("torch-agent", example, args, env=env),
            lambda: host_run(
                example,
                args,
                cwd=SOURCE_DIR,
                path=[os.path.dirname(PYTHON), BIN_DIR],
                pythonpath=os.path.join(os.path.dirname(BIN_DIR), "python"),
                env=env,
            ),
        )
        self.assertEqual(inside["steps"], 1)
        self.assertEqual(inside["weights_sha256"], host["weights_sha256"])

    def test_torch_image_loads_its_cuda_plugin_on_pytorchs_libraries(self):
        # NCCL collectives (VF_TORCH_COLLECTIVES=nccl) need the CUDA plugin, which the image
        # names in VF_CUDA_PLUGIN. It loads without a GPU, on the CUDA runtime, cuBLAS and NCCL
        # that `import torch` brought in from PyTorch's wheels.
        code = "import torch\nimport virtualflow\nprint(virtualflow.cuda_plugin())"
        status, out = oci.run("torch-agent", ["python3", "-c", code], env=RUN_ENV, timeout=120)
        self.assertEqual(status, 0, out)
        self.assertEqual(out.strip().splitlines()[-1], "/usr/local/bin/libvirtualflow-cuda.so")
        # The same with no plugin there fails, saying where it looked.
        missing = dict(RUN_ENV, VF_CUDA_PLUGIN="/usr/local/bin/none.so")
        status, out = oci.run("torch-agent", ["python3", "-c", code], env=missing, timeout=120)
        self.assertNotEqual(status, 0, out)
        self.assertIn("Error: no CUDA support: /usr/local/bin/none.so not found", out)


@unittest.skipUnless(os.geteuid() == 0, "runc needs root")
class OperatorImageTest(unittest.TestCase):
    """The operator image against a real control plane: a job's worker pods get created (ctest
    images.operator)."""

    def wait_for_pods(self, cp: ControlPlane, operator: oci.Container) -> list[dict]:
        """The example job's pods, once the operator has created them; fails at once when the
        operator exits."""

        def pods():
            assert operator.proc is not None
            if operator.proc.poll() is not None:
                return "exited"
            return cp.request(
                "GET",
                "/api/v1/namespaces/training/pods?labelSelector=virtualflow.io/job%3Dfashion-mnist",
            )["items"]

        found = cp.wait_for("the job's worker pods", pods, timeout=120)
        self.assertNotEqual(found, "exited", "the operator exited")
        return found

    def test_operator_image_creates_a_jobs_pods(self):
        with ControlPlane() as cp, tempfile.TemporaryDirectory() as tmp:
            # The operator runs as the image's user; the control plane's files stay root's.
            cp.create_namespace("training")
            cp.kubectl(
                "apply", "-f", os.path.join(SOURCE_DIR, "crds", "virtualflowjob.yaml"), check=True
            )
            cp.wait_for(
                "virtualflowjobs to be served",
                lambda: cp.kubectl("get", "vfj", "-A").returncode == 0,
            )
            cp.add_gpu_node("gpu-a", gpus=2, pod_runner=False)
            kubeconfig = os.path.join(tmp, "kubeconfig")
            with open(cp.kubeconfig) as src, open(kubeconfig, "w") as dst:
                dst.write(src.read())
            os.chown(kubeconfig, 65532, 65532)
            os.chmod(tmp, 0o755)  # the operator's user reads the kubeconfig in it
            operator = oci.Container(
                "operator",
                [
                    "/usr/local/bin/virtualflow-operator",
                    "--kubeconfig",
                    "/config/kubeconfig",
                    "--coordinator-listen",
                    "127.0.0.1:0",
                    "--http-listen",
                    "127.0.0.1:0",
                    "--agent-metrics-port",
                    "0",
                    "--leader-election-namespace",
                    "default",
                    "--identity",
                    "image-test",
                ],
                mounts=[oci.Mount(tmp, "/config")],
            )
            log = open(os.path.join(tmp, "operator.log"), "w+")
            operator.start(stdout=log)
            try:
                cp.kubectl(
                    "apply",
                    "-n",
                    "training",
                    "-f",
                    os.path.join(SOURCE_DIR, "examples", "fashion-mnist.yaml"),
                    check=True,
                )
                created = self.wait_for_pods(cp, operator)
                self.assertEqual(
                    created[0]["spec"]["containers"][0]["image"], "virtualflow/agent:0.1.0"
                )
            except BaseException:
                log.seek(0)
                sys.stderr.write("operator log:\n%s\n" % log.read()[-4000:])
                raise
            finally:
                operator.stop()
                log.close()


if __name__ == "__main__":
    unittest.main()
