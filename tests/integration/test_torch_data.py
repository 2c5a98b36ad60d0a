"""virtualflow.torch's NodeLoader in real jobs: examples/torch/images.py, whose samples are PNG
files decoded and randomly augmented in loader processes, trains to bitwise the same weights on
1, 2 and 3 workers with 0, 1 and 2 loader processes each, through three resizes and through a
kill -9 of a worker (whose loader processes end with it); a dataset's error in a loader process
ends the job with one line that carries its traceback."""

import os
import signal
import tempfile
import textwrap
import time
import unittest
import uuid

from harness import SOURCE_DIR, VfTestCase, processes_whose, vf, write
from test_torch import (
    GROW_THEN_SHRINK,
    PYTHON,
    Background,
    assertGrewThenShrank,
    pace_ms,
    static_job,
    torch_job,
)

STEPS = 40
# 8 nodes of 16 images from 1,024 PNG files: a step costs little beside the loading.
BATCH = 128
ELASTIC = "  elasticity: {policy: elastic, cooldownSeconds: 0}\n"


def processes_with(marker):
    """pids of live processes whose environment holds `marker` (loader processes included)."""
    return processes_whose("environ", lambda environ: marker.encode() in environ)


@unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
class TorchDataTest(VfTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # The PNG files, written by the first run's workers, read by all the others.
        cls._images = tempfile.mkdtemp(prefix="vf-images-")
        cls._reference = None

    @classmethod
    def tearDownClass(cls):
        import shutil

        shutil.rmtree(cls._images, ignore_errors=True)
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        self._environ = dict(os.environ)
        os.environ["PATH"] = os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"]
        # A marker in every worker's environment (and so its loader processes'): what is left
        # alive with it after a run is an orphan.
        self.marker = "VF_DATA_TEST_RUN=" + uuid.uuid4().hex
        name, value = self.marker.split("=")
        os.environ.update(
            {
                name: value,
                "IMAGES_DIR": self._images,
                "IMAGES_SAMPLES": "1024",
                "IMAGES_TEST_SAMPLES": "200",
                "IMAGES_DEVICE": "cpu",
            }
        )
        self._cwd = os.getcwd()
        os.chdir(SOURCE_DIR)

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self._environ)
        os.chdir(self._cwd)
        super().tearDown()

    def job(self, extra=""):
        return torch_job(
            os.path.join(self.tmp, "images.yaml"),
            ["python3", "examples/torch/images.py"],
            STEPS,
            batch=BATCH,
            extra=extra,
        )

    def run_ok(self, job, loaders, *args):
        os.environ["IMAGES_LOADERS"] = loaders
        if "--workers" in args and "--capacity" not in args:
            # A static run: its first step waits for all its workers, so that one slow to start
            # on a busy machine cannot miss the run (it did, on 2 cores beside 2 other tests).
            job = static_job(job, int(args[args.index("--workers") + 1]))
        run = vf("run", job, "--progress-interval", "0", *args)
        self.assertSucceeded(run)
        self.assertNoOrphans()
        return run

    def assertNoOrphans(self):
        deadline = time.monotonic() + 10
        while processes_with(self.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(processes_with(self.marker), [], "processes outlived the run")

    def reference(self):
        """The static run on one worker loading in its own process: the weights to match."""
        if TorchDataTest._reference is None:
            run = self.run_ok(self.job(), "0", "--workers", "1")
            self.assertEqual(run.summary["steps"], STEPS)
            TorchDataTest._reference = run.summary["weights_sha256"]
        return TorchDataTest._reference

    def test_the_same_weights_on_1_2_and_3_workers_with_0_1_and_2_loader_processes(self):
        expected = self.reference()
        self.assertRegex(expected, r"^[0-9a-f]{64}$")
        # 2 workers with 1 loader process each; 3 workers with 0, 1 and 2 (worker-N the N-th).
        for workers, loaders in ((2, "1"), (3, "0,1,2")):
            with self.subTest(workers=workers, loaders=loaders):
                run = self.run_ok(self.job(), loaders, "--workers", str(workers))
                self.assertEqual(run.summary["workers"], workers)
                self.assertEqual(run.summary["weights_sha256"], expected)

    def test_resized_three_times_with_loader_processes_keeps_the_weights(self):
        # Each plan's change drops the nodes prefetched for the old plan and loads the new one's.
        expected = self.reference()
        # The schedule of the CNN's resize test: a growth from 1 worker to 4 while that one
        # worker computes all 8 nodes of a step, then two shrinks. This example's steps are short
        # (a small CNN on 128 images) and its joiners start loader processes too, so it is paced
        # at twice the CNN test's delay, 240 ms a node: steps 1 to 30 sleep 56 s before any
        # loading.
        run = self.run_ok(
            self.job(ELASTIC),
            "2,1",
            *GROW_THEN_SHRINK,
            "--vnode-delay-ms",
            str(4 * pace_ms("images")),
        )
        assertGrewThenShrank(self, run.summary["resizes"], run.stdout)
        self.assertEqual(run.summary["weights_sha256"], expected)

    def test_a_kill_9_of_a_worker_keeps_the_weights_and_leaves_no_loader_process(self):
        expected = self.reference()
        os.environ["IMAGES_LOADERS"] = "2,1"
        summary_path = os.path.join(self.tmp, "kill.json")
        bg = Background(
            [
                self.job(ELASTIC),
                "--workers",
                "2",
                "--vnode-delay-ms",
                str(pace_ms("images")),
                "--summary-json",
                summary_path,
            ]
        )
        self.assertTrue(bg.wait_for_step(8, workers=2), "".join(bg.out))
        live = bg.workers()
        self.assertEqual(len(live), 2, live)
        time.sleep(0.1)  # into the step
        victim = min(live, key=lambda name: int(name.rsplit("-", 1)[1]))
        # Its loader processes (children of its forkserver) must not outlive it.
        before = set(processes_with(self.marker))
        os.kill(live[victim], signal.SIGKILL)
        code, out, err = bg.wait()
        self.assertEqual(code, 0, out + err)
        self.assertIn("%s was killed by signal 9" % victim, out)
        import json

        with open(summary_path) as f:
            summary = json.load(f)
        self.assertGreaterEqual(summary["recoveries"], 1, out)
        self.assertEqual(summary["weights_sha256"], expected)
        self.assertGreater(len(before), 2, "no loader processes seen: %s" % before)
        self.assertNoOrphans()

    def test_a_dataset_error_in_a_loader_process_ends_the_job_with_its_traceback(self):
        script = write(
            os.path.join(self.tmp, "broken.py"),
            textwrap.dedent("""\
                import torch, torch.nn.functional as F
                import virtualflow.torch as vf


                class Broken(torch.utils.data.Dataset):
                    def __len__(self):
                        return 64

                    def __getitem__(self, i):
                        if i == 13:
                            raise ValueError("sample 13 cannot be decoded")
                        return torch.full((4,), float(i)), i % 2


                if __name__ == "__main__":
                    job = vf.init()
                    data = Broken()
                    loader = vf.NodeLoader(job, data, num_workers=2)
                    torch.manual_seed(0)
                    model = torch.nn.Linear(4, 2)
                    opt = torch.optim.SGD(model.parameters(), lr=0.1)
                    for step in job.steps(vf.State(model=model, optimizer=opt), dataset_size=64):
                        for node in step.virtual_nodes():
                            x, y = loader.batch(node)
                            node.backward(F.cross_entropy(model(x), y))
                        opt.step()
                        opt.zero_grad()
                    job.finish()
                """),
        )
        job = torch_job(
            os.path.join(self.tmp, "broken.yaml"), ["python3", script], 6, virtual_nodes=4, batch=16
        )
        run = vf("run", job, "--workers", "2", "--progress-interval", "0", timeout=300)
        line = self.assertOneLineError(
            run, "LoaderError", "ValueError: sample 13 cannot be decoded", "__getitem__"
        )
        self.assertIn("Traceback", line)
        self.assertNoOrphans()


if __name__ == "__main__":
    unittest.main()
