"""Storage faults: a checkpoint that cannot be written (a full file system, a read-only one) is
said and retried, training goes on, and the run ends with the weights of an undisturbed run;
only final weights that cannot be saved fail the job, saying so. The faults are real: a small
tmpfs filled up (ENOSPC) or remounted read-only (EROFS), which needs root and mount(2)."""

import os
import subprocess
import tempfile
import textwrap
import threading
import unittest

from harness import SOURCE_DIR, VF, VfTestCase, read_state, vf, write

PYTHON = os.environ.get("VF_PYTHON", "")

# A small model, so that one checkpoint (its parameters and the momentum slot, about 100 KiB)
# fits the tmpfs twice over (the old file and the new one while it is renamed in).
HIDDEN = "{name: mlp, hiddenSizes: [16]}"
TMPFS_SIZE = "256k"
FILLER_BYTES = 248 * 1024  # leaves too little room for one checkpoint
STEPS = 120
EVERY = 5


def mount_tmpfs(path):
    """Mounts a TMPFS_SIZE tmpfs at PATH; the reason it cannot, or None."""
    run = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + TMPFS_SIZE, "tmpfs", path],
                         capture_output=True, text=True)
    if run.returncode != 0:
        return "cannot mount a tmpfs (needs root and mount(2)): " + run.stderr.strip()
    return None


class CheckpointFaultTest(VfTestCase):
    def setUp(self):
        super().setUp()
        self.mnt = tempfile.mkdtemp(prefix="vf-faults-")
        why = mount_tmpfs(self.mnt)
        if why:
            os.rmdir(self.mnt)
            self.skipTest(why)

    def tearDown(self):
        subprocess.run(["umount", self.mnt], check=True)
        os.rmdir(self.mnt)
        super().tearDown()

    def checkpoint_job(self, name):
        ckpt = os.path.join(self.mnt, "job.ckpt")
        return self.job(name, model=HIDDEN, steps=str(STEPS),
                        checkpoint="{path: %s, everySteps: %d}" % (ckpt, EVERY)), ckpt

    def test_full_disk_is_retried_and_the_run_keeps_its_weights(self):
        straight = vf("run", self.job("straight.yaml", model=HIDDEN, steps=str(STEPS)),
                      "--workers", "2", "--progress-interval", "0")
        self.assertSucceeded(straight)

        job, ckpt = self.checkpoint_job("full.yaml")
        filler = os.path.join(self.mnt, "filler")
        with open(filler, "wb") as f:
            f.write(b"\0" * FILLER_BYTES)
        # Paced (a sleep per virtual node; the weights do not change) so that the space freed
        # after the first failure is there long before the last step.
        proc = subprocess.Popen([VF, "run", job, "--workers", "2", "--progress-interval", "0",
                                 "--vnode-delay-ms", "10"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stderr = []
        freed = threading.Event()

        def read():
            for line in proc.stderr:
                stderr.append(line)
                if "not written" in line and not freed.is_set():
                    os.remove(filler)  # the operator of the disk makes room
                    freed.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        stdout = proc.stdout.read()  # stderr is the reader's alone
        proc.wait(timeout=600)
        reader.join(60)
        text = "".join(stderr)
        self.assertEqual(proc.returncode, 0, "vf failed:\n%s\n%s" % (stdout, text))
        self.assertTrue(freed.is_set(), "no checkpoint failure was reported:\n" + text)
        # The first checkpoint found the disk full.
        self.assertIn("vf: warning: checkpoint at step %d not written" % EVERY, text)
        self.assertIn("No space left on device", text)
        self.assertIn("vf: checkpoint written again at step", text)
        sha = [l.split()[-1] for l in stdout.splitlines() if l.startswith("weights sha256")]
        self.assertEqual(sha, [straight.summary["weights_sha256"]])
        self.assertEqual(read_state(ckpt)["step"], STEPS)

    def test_final_weights_that_cannot_be_saved_fail_the_job_saying_so(self):
        job, ckpt = self.checkpoint_job("readonly.yaml")
        subprocess.run(["mount", "-o", "remount,ro", self.mnt], check=True)
        run = vf("run", job, "--workers", "2", "--steps", "12", "--progress-interval", "0")
        self.assertNotEqual(run.returncode, 0, "vf succeeded without saving:\n" + run.stdout)
        self.assertLess(run.returncode, 128, "vf died from a signal")
        # The periodic checkpoints were said and training went on to the end.
        self.assertIn("vf: warning: checkpoint at step 5 not written", run.stderr)
        self.assertIn("vf: warning: checkpoint at step 10 not written", run.stderr)
        last = [l for l in run.stderr.splitlines() if l.strip()][-1]
        self.assertTrue(last.startswith("vf: error: the final weights could not be saved"), last)
        self.assertIn("Read-only file system", last)
        self.assertFalse(os.path.exists(ckpt))

    @unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
    def test_the_torch_library_goes_on_after_a_failed_checkpoint_and_fails_on_the_final_one(self):
        ckpt = os.path.join(self.mnt, "cnn.ckpt")
        job = write(os.path.join(self.tmp, "cnn.yaml"), textwrap.dedent("""\
            apiVersion: virtualflow.io/v1alpha1
            kind: VirtualFlowJob
            metadata: {name: torch-faults}
            spec:
              virtualNodes: 4
              globalBatchSize: 64
              replicas: {min: 1, max: 2}
              steps: 7
              seed: 11
              checkpoint: {path: %s, everySteps: 3}
              template:
                command: [python3, examples/torch/cnn.py]
            """) % ckpt)
        subprocess.run(["mount", "-o", "remount,ro", self.mnt], check=True)
        env = {**os.environ, "PATH": os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"]}
        run = subprocess.run([VF, "run", job, "--workers", "1", "--progress-interval", "0"],
                             capture_output=True, text=True, timeout=600, cwd=SOURCE_DIR, env=env)
        self.assertNotEqual(run.returncode, 0, "vf succeeded without saving:\n" + run.stdout)
        self.assertLess(run.returncode, 128, "vf died from a signal")
        self.assertIn("vf: warning: checkpoint at step 3 not written", run.stderr)
        self.assertIn("vf: warning: checkpoint at step 6 not written", run.stderr)
        last = [l for l in run.stderr.splitlines() if l.strip()][-1]
        self.assertIn("the final weights could not be saved", last)
        self.assertIn("Read-only file system", last)


if __name__ == "__main__":
    unittest.main()
