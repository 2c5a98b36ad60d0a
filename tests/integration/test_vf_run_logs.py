"""`vf run` keeps every worker's output: one file per worker process in --logs DIR (or a new
directory in the temporary directory, whose path it prints), never deleted; it shows the lines
of a user program's rank 0 as they come, prefixed with the worker's name, and when a worker
fails the job, that worker's last lines. --quiet prints only the result."""

import os
import re
import shutil
import textwrap
import unittest

from harness import vf, write
from test_torch import PYTHON, PythonOnPathTestCase, torch_job

# Prints a known line per step, with its worker and rank, and one more after the last step;
# with FAIL_AT set, the worker of rank 1 raises there; with KILL_AT, worker-0 kills itself there.
SCRIPT = textwrap.dedent("""\
    import os, signal, torch, torch.nn.functional as F
    import virtualflow.torch as vf

    worker = os.environ["VF_WORKER"]
    print("hello from", worker)
    # What it was given besides its standard streams: no socket of vf run's.
    sockets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink("/proc/self/fd/" + fd).startswith("socket:"):
                sockets.append(int(fd))
        except OSError:
            pass  # the directory's own, closed by now
    print("inherited sockets", worker, sorted(sockets))
    job = vf.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 4)
    y = torch.randint(0, 2, (64,))
    for step in job.steps(vf.State(model=model, optimizer=opt), dataset_size=64):
        if KILL_AT is not None and step.index == KILL_AT and worker == "worker-0":
            os.kill(os.getpid(), signal.SIGKILL)
        for node in step.virtual_nodes():
            node.backward(F.cross_entropy(model(x[node.indices]), y[node.indices]))
        opt.step()
        opt.zero_grad()
        print("marker step=%d rank=%d worker=%s" % (step.index, job.rank, worker))
        if FAIL_AT is not None and step.index == FAIL_AT and job.rank == 1:
            raise ValueError("boom at step %d on %s" % (step.index, worker))
    print("done on", worker)
    job.finish()
    """)

STEPS = 4


@unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
class VfRunLogsTest(PythonOnPathTestCase):
    def job(self, fail_at=None, kill_at=None):
        script = write(
            os.path.join(self.tmp, "script.py"),
            "FAIL_AT = %r\nKILL_AT = %r\n" % (fail_at, kill_at) + SCRIPT,
        )
        # replicas.min 2: both workers train every step, so each prints every step.
        path = torch_job(
            os.path.join(self.tmp, "job.yaml"),
            ["python3", script],
            STEPS,
            virtual_nodes=4,
            batch=16,
        )
        with open(path) as f:
            text = f.read()
        return write(path, text.replace("replicas: {min: 1, max: 4}", "replicas: {min: 2, max: 2}"))

    def markers(self, text):
        """(step, rank, worker) of each marker line in `text`."""
        return [
            (int(m.group(1)), int(m.group(2)), m.group(3))
            for m in re.finditer(r"marker step=(\d+) rank=(\d+) worker=(worker-\d+)", text)
        ]

    def read(self, path):
        with open(path) as f:
            return f.read()

    def test_logs_dir_keeps_each_workers_lines_and_rank_0s_are_shown_once(self):
        logs = os.path.join(self.tmp, "logs")
        run = vf("run", self.job(), "--workers", "2", "--logs", logs, "--progress-interval", "0")
        self.assertSucceeded(run)
        self.assertEqual(run.summary["logs"], logs)
        self.assertIn("worker logs: %s\n" % logs, run.stdout)
        self.assertEqual(
            sorted(os.listdir(logs)), ["plans.log", "worker-0.log", "worker-1.log"], run.stdout
        )
        ranks = {}
        for worker in ("worker-0", "worker-1"):
            text = self.read(os.path.join(logs, worker + ".log"))
            self.assertIn("hello from %s\n" % worker, text)
            # The coordinator's listening socket was one before vf run closed them for it.
            self.assertIn("inherited sockets %s []\n" % worker, text)
            self.assertIn("done on %s\n" % worker, text)
            markers = self.markers(text)
            self.assertEqual([m[0] for m in markers], list(range(STEPS)), text)
            self.assertEqual({m[2] for m in markers}, {worker}, text)
            ranks[worker] = {m[1] for m in markers}
        self.assertEqual(sorted(ranks.values(), key=min), [{0}, {1}])
        rank0 = [w for w, r in ranks.items() if r == {0}][0]
        plans = self.read(os.path.join(logs, "plans.log"))
        self.assertRegex(plans, r"plan 1 at step 0 \(.*\): rank 0 %s" % rank0)
        # On stdout: rank 0's lines, each once and prefixed; none of rank 1's.
        shown = [line for line in run.stdout.splitlines() if "marker" in line]
        self.assertEqual(
            shown,
            ["[%s] marker step=%d rank=0 worker=%s" % (rank0, s, rank0) for s in range(STEPS)],
            run.stdout,
        )
        self.assertIn("[%s] done on %s\n" % (rank0, rank0), run.stdout)

    def test_without_logs_they_are_kept_where_it_says(self):
        run = vf("run", self.job(), "--workers", "2", "--progress-interval", "0", default_logs=True)
        self.assertSucceeded(run)
        m = re.search(r"^worker logs: (\S+)$", run.stdout, re.M)
        self.assertIsNotNone(m, run.stdout)
        logs = m.group(1)
        self.addCleanup(shutil.rmtree, logs, ignore_errors=True)
        self.assertEqual(run.summary["logs"], logs)
        self.assertTrue(os.path.basename(logs).startswith("vf-logs-torch-test-"), logs)
        for worker in ("worker-0", "worker-1"):
            markers = self.markers(self.read(os.path.join(logs, worker + ".log")))
            self.assertEqual([m[0] for m in markers], list(range(STEPS)))
        self.assertEqual(len([line for line in run.stdout.splitlines() if "marker" in line]), STEPS)

    def test_quiet_prints_only_the_result_and_still_keeps_the_logs(self):
        logs = os.path.join(self.tmp, "logs")
        run = vf("run", self.job(), "--workers", "2", "--logs", logs, "--quiet")
        self.assertSucceeded(run)
        self.assertEqual(
            [line.split()[0] for line in run.stdout.splitlines()],
            ["finished", "final", "weights"],
            run.stdout,
        )
        self.assertEqual(len(self.markers(self.read(os.path.join(logs, "worker-1.log")))), STEPS)

    def test_when_rank_0_dies_the_next_rank_0s_lines_are_shown(self):
        logs = os.path.join(self.tmp, "logs")
        run = vf(
            "run", self.job(kill_at=2), "--workers", "2", "--logs", logs, "--progress-interval", "0"
        )
        self.assertSucceeded(run)
        self.assertIn("worker-0 was killed by signal 9; recovering without it", run.stdout)
        # worker-0's file keeps what it printed before it died; the replacement has a file too.
        first = self.markers(self.read(os.path.join(logs, "worker-0.log")))
        self.assertEqual(first, [(0, 0, "worker-0"), (1, 0, "worker-0")])
        self.assertTrue(os.path.exists(os.path.join(logs, "worker-2.log")), os.listdir(logs))
        plans = self.read(os.path.join(logs, "plans.log")).splitlines()
        self.assertGreaterEqual(len(plans), 2, plans)
        self.assertNotIn("worker-0", plans[-1])
        # Every step's line from whichever worker was rank 0 then, each step once.
        shown = self.markers(
            "\n".join(line for line in run.stdout.splitlines() if line.startswith("["))
        )
        self.assertEqual([m[0] for m in shown], list(range(STEPS)), run.stdout)
        self.assertEqual({m[1] for m in shown}, {0}, run.stdout)
        self.assertEqual(shown[:2], first)
        self.assertNotEqual(shown[-1][2], "worker-0")
        for line in run.stdout.splitlines():
            m = re.match(r"\[(worker-\d+)\] marker step=\d+ rank=0 worker=(worker-\d+)$", line)
            if m:
                self.assertEqual(m.group(1), m.group(2), line)

    def test_a_failing_workers_last_lines_are_shown_and_kept(self):
        logs = os.path.join(self.tmp, "logs")
        # An earlier run's file of a name vf run writes is replaced; a user's own file stays.
        os.makedirs(logs)
        write(os.path.join(logs, "worker-7.log"), "stale\n")
        write(os.path.join(logs, "notes.txt"), "mine\n")
        run = vf(
            "run", self.job(fail_at=2), "--workers", "2", "--logs", logs, "--progress-interval", "0"
        )
        line = self.assertOneLineError(run, "ValueError: boom at step 2")
        failed = re.search(r"boom at step 2 on (worker-\d+)", line).group(1)
        log = os.path.join(logs, failed + ".log")
        self.assertIn("(%s's output: %s)" % (failed, log), line)
        text = self.read(log)
        self.assertIn("Traceback", text)
        self.assertIn("marker step=2 rank=1 worker=%s" % failed, text)
        # Its traceback on stdout, prefixed, and where all of it is.
        self.assertIn("[%s] ValueError: boom at step 2 on %s\n" % (failed, failed), run.stdout)
        self.assertIn("[%s] Traceback (most recent call last):" % failed, run.stdout)
        self.assertIn("worker logs: %s\n" % logs, run.stdout)
        self.assertFalse(os.path.exists(os.path.join(logs, "worker-7.log")))
        self.assertEqual(self.read(os.path.join(logs, "notes.txt")), "mine\n")


if __name__ == "__main__":
    unittest.main()
