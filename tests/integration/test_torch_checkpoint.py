"""virtualflow.torch's checkpoints written in the background (rank 0 copies the state to host
memory at the step boundary and writes the copy while training goes on): rank 0 killed with
SIGKILL halfway through such a write leaves the previous checkpoint whole, and the job resumed
from it ends with the weights of a static run; so does a job whose every process was killed with
SIGKILL, resumed from its background checkpoint on another worker count."""

import os
import re
import signal
import subprocess
import textwrap
import time
import unittest

from harness import SOURCE_DIR, VF, VfTestCase, vf, write

PYTHON = os.environ.get("VF_PYTHON", "")
STEPS = 12


def cnn_job(path, steps=STEPS, checkpoint=None, replicas_min=1):
    """The CNN example (8 nodes of 32 images) as a job; `checkpoint`: (path, every steps)."""
    extra = "  checkpoint: {path: %s, everySteps: %d}\n" % checkpoint if checkpoint else ""
    return write(
        path,
        textwrap.dedent("""\
        apiVersion: virtualflow.io/v1alpha1
        kind: VirtualFlowJob
        metadata: {name: torch-checkpoint}
        spec:
          virtualNodes: 8
          globalBatchSize: 256
          replicas: {min: %d, max: 4}
          steps: %d
          seed: 11
          template:
            spec:
              containers: [{name: worker, command: [python3, examples/torch/cnn.py]}]
        """)
        % (replicas_min, steps)
        + extra,
    )


@unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
class TorchCheckpointTest(VfTestCase):
    def setUp(self):
        super().setUp()
        self._environ = dict(os.environ)
        os.environ["PATH"] = os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"]
        os.environ["CNN_TEST_SAMPLES"] = "500"  # no test here reads the accuracy
        os.environ["CNN_DEVICE"] = "cpu"
        self._cwd = os.getcwd()
        os.chdir(SOURCE_DIR)  # the example's command path is relative to the checkout

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self._environ)
        os.chdir(self._cwd)
        super().tearDown()

    def run_ok(self, job, workers):
        run = vf("run", job, "--workers", str(workers), "--progress-interval", "0")
        self.assertSucceeded(run)
        return run

    def static_weights(self):
        """weights_sha256 of a static run of 2 workers, made once for the class."""
        cls = type(self)
        if not hasattr(cls, "_static"):
            job = cnn_job(os.path.join(self.tmp, "static.yaml"), replicas_min=2)
            cls._static = self.run_ok(job, 2).summary["weights_sha256"]
        return cls._static

    def checkpoint_step(self, path):
        """The step of the checkpoint at `path`, from its header line."""
        with open(path, "rb") as f:
            head = f.read(4096)
        m = re.search(rb'"step": (\d+)', head)
        self.assertIsNotNone(m, "no header in %s" % path)
        return int(m.group(1))

    def test_rank_0_killed_during_a_background_write_resumes_to_the_static_weights(self):
        want = self.static_weights()
        ckpt = os.path.join(self.tmp, "killed", "cnn.ckpt")
        job = cnn_job(os.path.join(self.tmp, "killed.yaml"), checkpoint=(ckpt, 3))
        # worker-0, the only member, writes step 3's checkpoint in the background, then dies
        # with SIGKILL halfway through writing step 6's (half of it in the temporary file) while
        # its training thread runs step 7. Its replacement finds no member to take the state
        # from: it resumes from the checkpoint, which must still be step 3's, whole.
        os.environ["VF_FAULT_INJECT"] = "worker-0:checkpoint-write@6"
        run = self.run_ok(job, 1)
        out = run.stdout + run.stderr
        self.assertIn("worker-0 was killed by signal 9", out)
        self.assertIn("fault injection: killing this worker at checkpoint-write", out)
        self.assertRegex(out, r"resuming from checkpoint \S+ at step 3\b")
        self.assertEqual(run.summary["steps"], STEPS)
        self.assertEqual(run.summary["weights_sha256"], want)
        # The last checkpoint is the final one, whole; the killed write's half is left beside
        # it, never read.
        self.assertEqual(self.checkpoint_step(ckpt), STEPS)
        self.assertTrue(any(".tmp." in n for n in os.listdir(os.path.dirname(ckpt))))

    def test_a_job_killed_whole_resumes_on_another_worker_count_to_the_static_weights(self):
        want = self.static_weights()
        ckpt = os.path.join(self.tmp, "resumed", "cnn.ckpt")
        job = cnn_job(os.path.join(self.tmp, "resumed.yaml"), checkpoint=(ckpt, 2))
        # 3 workers write background checkpoints every 2 steps; once one of step 4 or later is
        # there, `vf run` and its workers are all killed with SIGKILL (the machine lost).
        run = subprocess.Popen(
            [VF, "run", job, "--workers", "3", "--progress-interval", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 300
        step = 0
        while step < 4 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            step = self.checkpoint_step(ckpt) if os.path.exists(ckpt) else 0
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        # Resumed on 1 worker from the checkpoint there now (a later one may have landed).
        at = self.checkpoint_step(ckpt)
        self.assertGreaterEqual(step, 4)
        self.assertLess(at, STEPS, "the run ended before it was killed")
        second = self.run_ok(job, 1)
        self.assertRegex(
            second.stdout + second.stderr, r"resuming from checkpoint \S+ at step %d\b" % at
        )
        self.assertEqual(second.summary["weights_sha256"], want)
        self.assertEqual(self.checkpoint_step(ckpt), STEPS)


if __name__ == "__main__":
    unittest.main()
