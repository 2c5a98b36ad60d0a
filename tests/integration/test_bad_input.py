"""Bad input gets one clear error line and a non-zero exit, never a crash or a hang."""

import gzip
import os
import shutil
import subprocess
import unittest

from harness import BIN_DIR, DATASET_DIR, VfTestCase, vf, write


class BadInputTest(VfTestCase):
    def dataset_copy(self):
        d = os.path.join(self.tmp, "fmnist")
        shutil.copytree(DATASET_DIR, d)
        return d

    def test_missing_job_file(self):
        self.assertOneLineError(vf("run", os.path.join(self.tmp, "nope.yaml")), "nope.yaml")

    def test_malformed_yaml(self):
        path = os.path.join(self.tmp, "bad.yaml")
        with open(path, "w") as f:
            f.write("apiVersion: virtualflow.io/v1alpha1\nkind: VirtualFlowJob\nspec: [1, 2\n")
        self.assertOneLineError(vf("run", path), "bad.yaml", "line")

    def test_stray_flow_entry_is_malformed_not_a_hang(self):
        # yaml-cpp 0.7's LoadAll never returned on this file (found by runtime/job/spec_fuzz.cc).
        path = os.path.join(self.tmp, "comma.yaml")
        with open(path, "w") as f:
            f.write("# a job\n,\n")
        self.assertOneLineError(vf("run", path), "comma.yaml", "line 2, column 1", "','")

    def test_batch_not_divisible_by_virtual_nodes(self):
        self.assertOneLineError(
            vf("run", self.job(globalBatchSize="250")),
            "spec.globalBatchSize",
            "divisible",
            "spec.virtualNodes",
        )

    def test_more_workers_than_virtual_nodes(self):
        self.assertOneLineError(
            vf("run", self.job(), "--workers", "9"), "--workers 9", "virtualNodes"
        )

    def test_suspended_job_is_refused(self):
        self.assertOneLineError(
            vf("run", self.job(suspend="true")),
            "spec.suspend is true",
            "suspended job runs no workers",
        )

    def test_unknown_model(self):
        self.assertOneLineError(
            vf("run", self.job(model="{name: resnet50}")), "spec.model.name", "resnet50"
        )

    def test_unknown_optimizer(self):
        self.assertOneLineError(
            vf("run", self.job(optimizer="{name: lamb, learningRate: 0.1}")),
            "spec.optimizer.name",
            "lamb",
        )

    def test_missing_dataset(self):
        run = vf("run", self.job(dataset="{name: fashion-mnist, path: %s/none}" % self.tmp))
        self.assertOneLineError(run, "not found", "dataset-fashion-mnist")

    def test_truncated_dataset_file(self):
        d = self.dataset_copy()
        path = os.path.join(d, "train-labels-idx1-ubyte.gz")
        with gzip.open(path, "rb") as f:
            raw = f.read()
        with gzip.open(path, "wb") as f:
            f.write(raw[: len(raw) // 2])
        run = vf("run", self.job(dataset="{name: fashion-mnist, path: %s}" % d))
        self.assertOneLineError(run, "train-labels-idx1-ubyte", "truncated")

    def test_corrupt_gzip_dataset_file(self):
        d = self.dataset_copy()
        path = os.path.join(d, "t10k-images-idx3-ubyte.gz")
        with open(path, "r+b") as f:
            f.seek(4000)
            f.write(b"\xff" * 64)
        run = vf("run", self.job(dataset="{name: fashion-mnist, path: %s}" % d))
        self.assertOneLineError(run, "t10k-images-idx3-ubyte")

    def test_wrong_idx_magic(self):
        d = self.dataset_copy()
        # Swap images and labels: both are valid gzip, but the magic numbers are wrong.
        os.replace(os.path.join(d, "train-labels-idx1-ubyte.gz"), os.path.join(d, "tmp.gz"))
        shutil.copy(
            os.path.join(d, "train-images-idx3-ubyte.gz"),
            os.path.join(d, "train-labels-idx1-ubyte.gz"),
        )
        run = vf("run", self.job(dataset="{name: fashion-mnist, path: %s}" % d))
        self.assertOneLineError(run, "train-labels-idx1-ubyte", "magic")

    def make_checkpoint(self):
        ckpt = os.path.join(self.tmp, "state.ckpt")
        job = self.job(checkpoint="{path: %s, everySteps: 5}" % ckpt, steps="10")
        self.assertSucceeded(vf("run", job, "--workers", "2", "--progress-interval", "0"))
        self.assertTrue(os.path.exists(ckpt))
        return job, ckpt

    def test_truncated_checkpoint(self):
        job, ckpt = self.make_checkpoint()
        size = os.path.getsize(ckpt)
        with open(ckpt, "r+b") as f:
            f.truncate(size - 1000)
        self.assertOneLineError(vf("run", job), "state.ckpt", "truncated")

    def test_tampered_checkpoint(self):
        job, ckpt = self.make_checkpoint()
        with open(ckpt, "r+b") as f:
            f.seek(os.path.getsize(ckpt) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x01]))
        self.assertOneLineError(vf("run", job), "state.ckpt", "checksum")

    def test_checkpoint_of_another_job(self):
        job, ckpt = self.make_checkpoint()
        other = self.job("other.yaml", seed="43", checkpoint="{path: %s}" % ckpt)
        self.assertOneLineError(vf("run", other), "state.ckpt", "different job")

    def test_nan_gradients_from_an_absurd_learning_rate(self):
        job = self.job(optimizer="{name: sgd, learningRate: 1.0e+30, momentum: 0.0}")
        run = vf("run", job, "--workers", "2", "--steps", "20")
        self.assertOneLineError(run, "step ", "NaN", "learning rate")

    def test_a_program_that_always_fails_at_start_ends_the_run_saying_why(self):
        # Each replacement fails the same way: after five in a row with no step done, vf gives
        # up with the last worker's message instead of replacing workers until its stall limit.
        path = os.path.join(self.tmp, "crash.yaml")
        write(
            path,
            """apiVersion: virtualflow.io/v1alpha1
kind: VirtualFlowJob
metadata: {name: crash}
spec:
  virtualNodes: 4
  globalBatchSize: 64
  replicas: {min: 1, max: 2}
  steps: 5
  template:
    spec:
      containers:
        - name: worker
          command: [python3, -c,
                    "import sys; print('no module named my_model', file=sys.stderr); sys.exit(1)"]
""",
        )
        self.assertOneLineError(
            vf("run", path, "--workers", "2"),
            "5 workers in a row failed",
            "no progress",
            "exited with code 1",
            "no module named my_model",
        )

    def agent(self, *args, env=None):
        """virtualflow-agent for this test's job, with a coordinator nobody serves; `env` is
        added to this process's environment."""
        return subprocess.run(
            [
                os.path.join(BIN_DIR, "virtualflow-agent"),
                "--job",
                self.job(),
                "--coordinator",
                "http://127.0.0.1:1",
                "--worker",
                "w0",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **(env or {})},
        )

    def test_a_comm_thread_nice_value_out_of_range_fails_the_job_saying_why(self):
        token = write(os.path.join(self.tmp, "token"), "t0\n")
        for value in ("20", "-1", "high", "5x"):
            run = self.agent("--token-file", token, env={"VF_COMM_THREAD_NICE": value})
            # Exit 3: the same setting would fail every replacement the same way.
            self.assertEqual(run.returncode, 3, run.stderr)
            self.assertIn(
                "error: VF_COMM_THREAD_NICE must be a whole number 0..19, got '%s'" % value,
                run.stderr,
            )

    def test_unreadable_token_or_ca_file_is_waited_for_then_the_worker_is_replaced(self):
        # Exit 1 (its pod is replaced), not 3 (the job fails): the kubelet mounts the volume
        # afresh for a new pod.
        missing = os.path.join(self.tmp, "missing")
        run = self.agent("--token-file", missing, "--timeout", "1")
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertIn(
            "cannot read this worker's token file %s (No such file or directory); "
            "trying again for up to 1 s" % missing,
            run.stderr,
        )
        self.assertIn("error: cannot read this worker's token file " + missing, run.stderr)
        token = write(os.path.join(self.tmp, "token"), "t0\n")
        run = self.agent("--token-file", token, "--ca-file", missing, "--timeout", "1")
        self.assertEqual(run.returncode, 1, run.stderr)
        self.assertIn("error: cannot read the coordinator's CA file " + missing, run.stderr)

    def test_a_token_file_that_appears_while_waited_for_is_read(self):
        token = os.path.join(self.tmp, "token")
        proc = subprocess.Popen(
            [
                os.path.join(BIN_DIR, "virtualflow-agent"),
                "--job",
                self.job(),
                "--coordinator",
                "http://127.0.0.1:1",
                "--worker",
                "w0",
                "--token-file",
                token,
                "--timeout",
                "3",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        first = proc.stderr.readline()  # it has found no file, and says it waits
        self.assertIn("cannot read this worker's token file", first)
        write(token, "t0\n")
        _, rest = proc.communicate(timeout=60)
        self.assertIn("read this worker's token file " + token, rest)
        # Then it waits for the coordinator nobody serves, and exits 1 at its timeout.
        self.assertEqual(proc.returncode, 1, rest)
        self.assertIn("registering", rest)


class OperatorFlagsTest(unittest.TestCase):
    """The operator's own command line: a bad value is one line naming the flag."""

    def operator(self, *args):
        return subprocess.run(
            [os.path.join(BIN_DIR, "virtualflow-operator"), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def test_api_budget_must_be_positive(self):
        for flag, value in (
            ("--kube-api-qps", "0"),
            ("--kube-api-qps", "-5"),
            ("--kube-api-burst", "0"),
        ):
            run = self.operator(flag, value)
            self.assertEqual(run.returncode, 2, run.stderr)
            self.assertEqual(
                run.stderr.strip(),
                "virtualflow-operator: error: %s: must be greater than 0, got %s" % (flag, value),
            )

    def test_help_names_the_api_budget(self):
        run = self.operator("--help")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("--kube-api-qps FLOAT", run.stdout)
        self.assertIn("--kube-api-burst INT", run.stdout)


if __name__ == "__main__":
    unittest.main()
