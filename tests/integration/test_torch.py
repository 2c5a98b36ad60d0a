"""A user's own PyTorch training program as a VirtualFlowJob (virtualflow.torch): the examples
train to bitwise the same weights on 1, 2 and 3 worker processes, across resizes and after
workers are killed with SIGKILL, and misuse ends the job with one line naming the problem."""

import json
import os
import re
import signal
import subprocess
import textwrap
import threading
import time
import unittest

from harness import RUN_TIMEOUT, SOURCE_DIR, VF, VfTestCase, vf, write

PYTHON = os.environ.get("VF_PYTHON", "")

# Each example's global batch in the elastic tests: the CNN's 8 nodes of 8 images (a quarter of
# its own job's 256: the tests check weights, which any batch shows, and a step's computing,
# the CPU-seconds a run costs, is a quarter), the GPT's 8 nodes of 8 windows. QUICK_BATCH: the
# 4-step runs' (the CNN's 8 nodes of 8 images, the GPT's of 2 windows).
BATCH = {"cnn": 64, "gpt": 64}
QUICK_BATCH = {"cnn": 64, "gpt": 16}


def _torch_sees_a_gpu():
    """Whether the workers' PyTorch sees a CUDA device, where the examples train by default."""
    if not PYTHON:
        return False
    try:
        probe = subprocess.run(
            [PYTHON, "-c", "import torch; print(torch.cuda.is_available())"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.stdout.strip() == "True"


TORCH_GPU = _torch_sees_a_gpu()


def on_gpu(name):
    """Whether example NAME trains on a GPU: as its DEVICE variable says (CNN_DEVICE=cuda),
    else where PyTorch sees one, as the example itself decides."""
    chosen = os.environ.get(name.upper() + "_DEVICE")
    return chosen.startswith("cuda") if chosen else TORCH_GPU


def pace_ms(name):
    """The delay per virtual node for the elastic tests of example NAME: 60 ms on the CPU, and
    250 ms where it trains on a GPU, whose workers take seconds to start (PyTorch's import, the
    CUDA context) while a step takes a fraction of one. The delay only sleeps, which changes no
    weight."""
    return 250 if on_gpu(name) else 60


def torch_job(path, command, steps, virtual_nodes=8, batch=256, extra=""):
    """A job whose workers run `command` (a list of words), with `steps` steps."""
    return write(
        path,
        textwrap.dedent("""\
        apiVersion: virtualflow.io/v1alpha1
        kind: VirtualFlowJob
        metadata: {name: torch-test}
        spec:
          virtualNodes: %d
          globalBatchSize: %d
          replicas: {min: 1, max: 4}
          steps: %d
          seed: 11
          template:
            spec:
              containers: [{name: worker, command: [%s]}]
        %s""")
        % (virtual_nodes, batch, steps, ", ".join(command), extra),
    )


def static_job(path, workers):
    """The job at `path` as a static run of `workers` workers: its first step waits for all of
    them (replicas.min), where a run of the job as it is starts with the first to join and
    takes the others in as they come; on a busy machine a slow worker's start could then miss
    a short run, and a test that counts workers or resizes would fail for the machine's sake."""
    with open(path) as f:
        text = f.read()
    if "replicas: {min: 1, max: 4}" not in text:
        return path
    out = "%s.static%d.yaml" % (path[: -len(".yaml")] if path.endswith(".yaml") else path, workers)
    return write(
        out, text.replace("replicas: {min: 1, max: 4}", "replicas: {min: %d, max: 4}" % workers)
    )


# A capacity schedule whose only growth comes first, from 1 worker to 4, while that one worker
# computes all 8 nodes of a step (the slowest steps of the run): its 3 joiners, each starting
# PyTorch, have until step 30 to be ready, then the slots go down to 3 and to 2, which needs no
# joiner. At twice the elastic tests' pace (120 ms a node on the CPU) steps 1 to 30 sleep 28 s
# before any computing, and a busy machine that slows a joiner's start slows those steps too.
# The growth comes as soon as the joiners are ready, so the run waits no longer than their
# start takes (alone, the CNN's test took 79 s with its reference run). The old schedule (2, 3
# at step 4, 1 at step 14, 2 at step 22) gave a joiner 10 steps of 2 workers, and on 2 busy
# cores one missed them and the run had to be repeated at twice the pace.
GROW_THEN_SHRINK = ("--capacity", "0:1,1:4,30:3,35:2")


def assertGrewThenShrank(test, resizes, out):
    """RESIZES (a summary's) are GROW_THEN_SHRINK's: growths from 1 to 4 (one, or more should
    the joiners be ready further apart than a plan waits for them), then 4 to 3 and 3 to 2."""
    sizes = [(r["from"], r["to"]) for r in resizes]
    test.assertEqual(sizes[-2:], [(4, 3), (3, 2)], out)
    growths = sizes[:-2]
    test.assertTrue(growths, out)
    test.assertEqual(growths[0][0], 1, out)
    for (a, b), (c, _) in zip(growths, growths[1:] + [(4, 0)], strict=True):
        test.assertTrue(a < b == c, out)


class Background:
    """`vf run` in the background, with its progress lines and its workers' pids."""

    def __init__(self, args):
        self.proc = subprocess.Popen(
            [VF, "run", *args, "--progress-interval", "0.05"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=SOURCE_DIR,
        )
        self.out = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.out.append(line)

    def _last(self, pattern):
        """The number the newest progress line matching `pattern` reports (0 before one)."""
        for line in reversed(self.out):
            m = re.match(pattern, line)
            if m:
                return int(m.group(1))
        return 0

    def step(self):
        return self._last(r"step\s+(\d+)/")

    def world(self):
        """The number of workers on the last progress line."""
        return self._last(r"step\s+\d+/\d+\s+loss\s+\S+\s+(\d+) workers")

    def wait_for_step(self, step, timeout=300, workers=0):
        """Until the run is at `step` or later (with `workers` workers, if given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.step() >= step and (not workers or self.world() == workers):
                return True
            time.sleep(0.02)
        return False

    def workers(self):
        """pids of the live worker processes, by worker name (VF_WORKER in their environment)."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True
        ).stdout
        found = {}
        for pid in out.split():
            try:
                with open("/proc/%s/environ" % pid, "rb") as f:
                    env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            except OSError:
                continue
            if b"VF_WORKER" in env:
                found[env[b"VF_WORKER"].decode()] = int(pid)
        return found

    def wait(self, timeout=RUN_TIMEOUT):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("vf run hung:\n" + "".join(self.out)) from None
        self.reader.join(timeout=10)
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode, "".join(self.out), err


# examples/torch/cnn.py with its loss 10^4 times larger in the last of 4 steps: its gradients
# grow past exact reduction's 64x headroom, so that step is recomputed at a new scale.
SPIKED_CNN = textwrap.dedent("""\
    import sys
    sys.path.insert(0, %r)
    import torch.nn.functional as F
    import virtualflow.torch as vf
    import cnn

    current = [-1]
    run_nodes = vf.Step.virtual_nodes


    def virtual_nodes(self):
        current[0] = self.index
        yield from run_nodes(self)


    class Spiked:
        def __getattr__(self, name):
            return getattr(F, name)

        @staticmethod
        def cross_entropy(*args, **kwargs):
            loss = F.cross_entropy(*args, **kwargs)
            return loss * 1e4 if current[0] == 3 else loss


    vf.Step.virtual_nodes = virtual_nodes
    cnn.F = Spiked()
    cnn.main()
    """) % os.path.join(SOURCE_DIR, "examples", "torch")


@unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
class TorchTest(VfTestCase):
    def setUp(self):
        super().setUp()
        # The workers' python3 is the environment's, as `source .../bin/activate` would make it.
        self._environ = dict(os.environ)
        os.environ["PATH"] = os.path.dirname(PYTHON) + os.pathsep + os.environ["PATH"]
        # No test here reads the accuracy: rank 0 evaluates 500 test images, not all 10,000.
        os.environ["CNN_TEST_SAMPLES"] = "500"
        self._cwd = os.getcwd()
        os.chdir(SOURCE_DIR)  # the examples' command paths are relative to the checkout

    def tearDown(self):
        os.environ.clear()
        os.environ.update(self._environ)
        os.chdir(self._cwd)
        super().tearDown()

    def example(self, name, steps, **kw):
        """The example `name` as a job of `steps` steps (`extra`: more spec lines), with its
        global batch unless `batch` says otherwise."""
        kw.setdefault("batch", BATCH[name])
        return torch_job(
            os.path.join(self.tmp, name + ".yaml"),
            ["python3", "examples/torch/%s.py" % name],
            steps,
            **kw,
        )

    def run_ok(self, job, *args):
        if "--workers" in args and "--capacity" not in args:
            job = static_job(job, int(args[args.index("--workers") + 1]))
        run = vf("run", job, "--progress-interval", "0", *args)
        self.assertSucceeded(run)
        return run

    def test_examples_train_to_the_same_weights_on_1_and_3_workers(self):
        # Even and uneven splits of the 8 nodes: all on one worker, 3-3-2 on three (and the
        # CNN's staged run below, 4-4 on two).
        for name in ("cnn", "gpt"):
            with self.subTest(example=name):
                job = self.example(name, 4, batch=QUICK_BATCH[name])
                digests = {}
                for workers in (1, 3):
                    run = self.run_ok(job, "--workers", str(workers))
                    self.assertEqual(run.summary["workers"], workers)
                    self.assertEqual(run.summary["steps"], 4)
                    digests[workers] = run.summary["weights_sha256"]
                if name == "cnn":
                    # The host's fold of a GPU's nodes, on the CPU: every node's gradients (and
                    # BatchNorm's buffers) in a buffer of their own, copied for the reducer, two
                    # nodes in flight.
                    os.environ.update(VF_TORCH_STAGING="2", VF_TORCH_FOLD="host")
                    try:
                        digests["staged"] = self.run_ok(job, "--workers", "2").summary[
                            "weights_sha256"
                        ]
                    finally:
                        del os.environ["VF_TORCH_STAGING"], os.environ["VF_TORCH_FOLD"]
                self.assertEqual(len(set(digests.values())), 1, "weights differ: %s" % digests)
                self.assertRegex(digests[1], r"^[0-9a-f]{64}$")

    def test_cnn_folded_on_its_device_has_the_weights_of_the_host_fold_through_recomputed_steps(
        self,
    ):
        # A GPU's default (VF_TORCH_FOLD=device: each node folded by PyTorch operations where its
        # gradients are, the reducer given the step's sums once) against the C++ fold of every
        # node on the host, through the first step (no scale yet) and a last step whose
        # gradients overflow the scale: both are recomputed at a new one.
        script = write(os.path.join(self.tmp, "spiked_cnn.py"), SPIKED_CNN)
        job = torch_job(os.path.join(self.tmp, "spiked.yaml"), ["python3", script], 4, batch=64)
        digests, recomputed = {}, set()
        for fold, workers in (("host", 1), ("device", 1), ("device", 2)):
            os.environ["VF_TORCH_FOLD"] = fold
            try:
                summary = self.run_ok(job, "--workers", str(workers)).summary
            finally:
                del os.environ["VF_TORCH_FOLD"]
            results = summary["worker_results"]
            self.assertEqual([r["gradient_fold"] for r in results], [fold] * workers)
            # A world of one folding on its device keeps the sums there and makes the mean
            # there (no trip through the host's reducer); the others go through the reducer.
            kept = [r["device_mean_steps"] > 0 for r in results]
            self.assertEqual(kept, [fold == "device" and workers == 1] * workers, results)
            recomputed |= {r["recomputed_steps"] for r in results}
            digests[(fold, workers)] = summary["weights_sha256"]
        self.assertEqual(len(set(digests.values())), 1, "weights differ: %s" % digests)
        self.assertEqual(len(recomputed), 1, recomputed)
        self.assertGreaterEqual(recomputed.pop(), 2, "the first and the last step are recomputed")

    @unittest.skipUnless(on_gpu("cnn"), "needs the CNN on a GPU")
    def test_cnn_reduced_through_nccl_has_the_weights_of_gloo(self):
        # NCCL takes one rank per GPU, and the machines this runs on have one: a world of one,
        # whose communicator is NCCL's, with the sums staged through the GPU.
        job = self.example("cnn", 4)
        digests = {}
        for collectives in ("gloo", "nccl"):
            os.environ["VF_TORCH_COLLECTIVES"] = collectives
            try:
                summary = self.run_ok(job, "--workers", "1").summary
            finally:
                del os.environ["VF_TORCH_COLLECTIVES"]
            self.assertEqual([r["collectives"] for r in summary["worker_results"]], [collectives])
            digests[collectives] = summary["weights_sha256"]
        self.assertEqual(digests["nccl"], digests["gloo"])

    @unittest.skipUnless(on_gpu("cnn"), "needs the CNN on a GPU")
    def test_nccl_on_two_workers_sharing_a_gpu_ends_the_job_saying_why(self):
        # NCCL refuses two ranks on one GPU. The job must end with that reason and the fix, not
        # go round in failed rendezvous (as it did, silently, until the user gave up).
        os.environ["VF_TORCH_COLLECTIVES"] = "nccl"
        try:
            run = vf("run", self.example("cnn", 4), "--workers", "2", "--progress-interval", "0")
        finally:
            del os.environ["VF_TORCH_COLLECTIVES"]
        self.assertOneLineError(
            run, "NCCL refused the communicator", "one rank per GPU", "with rank", "Gloo"
        )

    def test_cnn_under_bfloat16_autocast_trains_to_the_same_weights_on_1_3_workers_and_resized(
        self,
    ):
        # The forward pass under torch.autocast(dtype=torch.bfloat16), the parameters float32
        # (on the GPU where the CNN trains on one, else on the CPU).
        self.autocast_keeps_the_weights("bf16")

    @unittest.skipUnless(on_gpu("cnn"), "needs the CNN on a GPU")
    def test_cnn_under_float16_autocast_with_a_grad_scaler_keeps_the_weights_too(self):
        # float16 with torch.amp.GradScaler: each node's backward of the scaled loss, the mean of
        # the scaled gradients reduced exactly, then unscale_, the inf check and the step (the
        # scaler's state in State.extra, so that a joiner has it).
        self.autocast_keeps_the_weights("fp16")

    def autocast_keeps_the_weights(self, precision):
        """Trains the CNN under CNN_AUTOCAST=PRECISION on 1 and 3 workers and through a resize
        from 1 to 2: the same weights every time, and not those of float32 (autocast really ran).
        Cheap: 8 steps of 16 images (8 nodes of 2). bfloat16 on a CPU without its instructions
        is emulated, about 4 times float32's time: 12 steps of 64 images took 30 s a run."""
        steps, batch = 8, 16
        job = self.example("cnn", steps, batch=batch)
        os.environ["CNN_AUTOCAST"] = "off"
        float32 = self.run_ok(job, "--workers", "1").summary["weights_sha256"]
        os.environ["CNN_AUTOCAST"] = precision
        digests = {}
        for workers in (1, 3):
            run = self.run_ok(job, "--workers", str(workers))
            self.assertEqual(run.summary["workers"], workers)
            digests[workers] = run.summary["weights_sha256"]
        # One worker, then two from step 1: the state, the scaler's included, goes to a joiner.
        # It has until the run's end to be ready, 7 steps of one worker computing all 8 nodes:
        # paced at 4 times the elastic tests' delay, about 2.5 s a step on the CPU.
        elastic = self.example(
            "cnn", steps, batch=batch, extra="  elasticity: {policy: elastic, cooldownSeconds: 0}\n"
        )
        run = self.run_ok(
            elastic, "--capacity", "0:1,1:2", "--vnode-delay-ms", str(4 * pace_ms("cnn"))
        )
        sizes = [(r["from"], r["to"]) for r in run.summary["resizes"]]
        self.assertEqual(sizes, [(1, 2)], run.stdout)
        digests["resized"] = run.summary["weights_sha256"]
        self.assertEqual(len(set(digests.values())), 1, "weights differ: %s" % digests)
        self.assertNotEqual(digests[1], float32, "%s weights are float32's" % precision)

    # The static runs' weights, made once for the class: the resize and kill -9 tests train the
    # same example for the same steps (the resize test's elasticity settings change no weight,
    # and if they did its comparison would fail, as it should).
    _reference: dict[tuple[str, int], str] = {}

    def elastic_reference(self, steps, name="cnn"):
        if (name, steps) not in TorchTest._reference:
            # Unpaced: the delay only sleeps, which changes no weight, and a static run has no
            # joiner to wait for. On one worker: the weights are those of any worker count, and
            # one worker is the cheapest run (no collective, one PyTorch to start).
            run = self.run_ok(self.example(name, steps), "--workers", "1")
            self.assertEqual(run.summary["resizes"], [], "the reference run must be static")
            TorchTest._reference[name, steps] = run.summary["weights_sha256"]
        return TorchTest._reference[name, steps]

    def test_cnn_resized_three_times_keeps_the_weights_of_a_static_run(self):
        self.resized_three_times("cnn")

    def test_gpt_resized_three_times_keeps_the_weights_of_a_static_run(self):
        # Dropout drawn in each node's own random scope, AdamW's moments and the warm-up and
        # cosine schedule's position all go to the joiners with the state.
        self.resized_three_times("gpt")

    def resized_three_times(self, name):
        """Trains example NAME for 40 steps through a growth from 1 worker to 4, then two shrinks
        (4 to 3 at step 30, 3 to 2 at step 35): the run must make exactly those changes and end
        with the weights of the static run."""
        expected = self.elastic_reference(40, name)
        # No cooldown: each change of the slots is followed as soon as the joiners are ready.
        job = self.example(name, 40, extra="  elasticity: {policy: elastic, cooldownSeconds: 0}\n")
        run = self.run_ok(job, *GROW_THEN_SHRINK, "--vnode-delay-ms", str(2 * pace_ms(name)))
        self.assertEqual(run.summary["recoveries"], 0, run.report())
        assertGrewThenShrank(self, run.summary["resizes"], run.report())
        self.assertEqual(run.summary["weights_sha256"], expected)

    @unittest.skipUnless(on_gpu("cnn"), "needs the CNN on a GPU")
    def test_cnn_through_nccl_between_workers_resized_keeps_the_weights_of_gloo(self):
        # Several NCCL ranks on the one GPU of the machines this runs on: each worker gets an
        # NCCL_HOSTID of its own, so NCCL takes it for a host of its own and connects the ranks
        # through its socket transport instead of refusing two ranks on one GPU (the one thing
        # staged for the test). The rest is NCCL's: the plan's communicator, rebuilt at each
        # resize, the collectives, and the state sent to joiners. Paced as the resize test is.
        expected = self.elastic_reference(40)
        job = torch_job(
            os.path.join(self.tmp, "cnn-nccl.yaml"),
            ["sh", "-c", '"NCCL_HOSTID=$VF_WORKER exec python3 examples/torch/cnn.py"'],
            40,
            extra="  elasticity: {policy: elastic, cooldownSeconds: 0}\n",
        )
        env = {"VF_TORCH_COLLECTIVES": "nccl", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "lo"}
        os.environ.update(env)
        try:
            run = self.run_ok(
                job, "--capacity", "0:2,4:3,14:1,22:2", "--vnode-delay-ms", str(pace_ms("cnn"))
            )
        finally:
            for name in env:
                del os.environ[name]
        results = run.summary["worker_results"]
        self.assertEqual({r["collectives"] for r in results}, {"nccl"}, results)
        self.assertEqual(run.summary["recoveries"], 0, run.report())
        self.assertGreaterEqual(len(run.summary["resizes"]), 3, run.report())
        self.assertEqual(run.summary["weights_sha256"], expected)

    def test_cnn_survives_two_kill_9_with_the_weights_of_a_static_run(self):
        expected = self.elastic_reference(40)
        # Both ways exact reduction folds a node: by the C++ reducer on 2 workers, and by
        # PyTorch on the gradients' device (as on a GPU) on 3 workers, where the plan after a
        # kill must leave both survivors their nodes (a contiguous split of 8 nodes from 3
        # workers to 2 takes the middle rank's: 0-2, 3-5, 6-7 becoming 0-3, 4-7).
        for fold, workers in (("host", 2), ("device", 3)):
            with self.subTest(fold=fold, workers=workers):
                os.environ["VF_TORCH_FOLD"] = fold
                try:
                    summary = self.kill_twice("cnn", workers, fold)
                finally:
                    del os.environ["VF_TORCH_FOLD"]
                self.assertEqual(summary["weights_sha256"], expected)
                self.assertEqual({r["gradient_fold"] for r in summary["worker_results"]}, {fold})

    def test_gpt_survives_two_kill_9_with_the_weights_of_a_static_run(self):
        # The replacements take the state (AdamW's moments, the schedule's position, the
        # generators) from the survivor; the survivor keeps its nodes, dropout masks and all.
        summary = self.kill_twice("gpt", 2, "default")
        self.assertEqual(summary["weights_sha256"], self.elastic_reference(40, "gpt"))

    def kill_twice(self, name, workers, tag):
        """Runs example NAME on WORKERS workers and kills the oldest member mid-step at steps 8
        and 30, each time with every slot's worker a member; returns the summary (written to a
        file named after TAG). Every survivor of a kill that ran to the end kept the nodes it
        had computed in the failed step and computed only the dead worker's share."""
        # No cooldown: the replacement of the first victim joins as soon as it is ready, so that
        # the second kill, too, leaves a member that goes on (with the default cooldown the
        # second victim was the only member, and the job started again from step 0).
        job = self.example(name, 40, extra="  elasticity: {policy: elastic, cooldownSeconds: 0}\n")
        summary_path = os.path.join(self.tmp, "kill-%s-%s-%d.json" % (name, tag, workers))
        # The first victim's replacement must join before the run ends (the second kill waits
        # for it), so the nodes are paced: on a GPU, where a worker takes seconds to start and a
        # step a fraction of one, as in the resize test; on the CPU the CNN's at 3 times the
        # elastic tests' pace, since its batch of 64 computes a quarter of the example's 256:
        # a step of 2 workers then takes about as long as at 256 and 60 ms a node, and what
        # the quarter saves is CPU-seconds, not the replacement's time to join.
        delay = 3 * pace_ms(name) if name == "cnn" and not on_gpu(name) else pace_ms(name)
        bg = Background(
            [
                job,
                "--workers",
                str(workers),
                "--vnode-delay-ms",
                str(delay),
                "--summary-json",
                summary_path,
            ]
        )
        killed, survivors = [], []
        for target in (8, 30):
            self.assertTrue(bg.wait_for_step(target, workers=workers), "".join(bg.out))
            live = bg.workers()
            self.assertEqual(len(live), workers, "live workers at step %d: %s" % (target, live))
            # Into the step that has just begun (each takes 0.3 s or more at 60 ms per node),
            # not at its boundary, where the survivors could switch plans without a failure.
            time.sleep(0.1)
            # The oldest live worker, a member of the running plan, killed mid-step.
            victim = min(live, key=lambda name: int(name.rsplit("-", 1)[1]))
            os.kill(live[victim], signal.SIGKILL)
            killed.append(victim)
            survivors.append((target, set(live) - {victim}))
        code, out, err = bg.wait()
        self.assertEqual(code, 0, out + err)
        for victim in killed:
            self.assertIn("%s was killed by signal 9" % victim, out)
        # The job went on from where it was: a progress line may show the survivor one step
        # behind the victim's last report (the victim had counted a step the survivor had not
        # reported yet), never further back, as a job that started over from step 0 would.
        steps = [int(m) for m in re.findall(r"^step\s+(\d+)/", out, re.M)]
        back = max((max(steps[:i]) - s for i, s in enumerate(steps) if i), default=0)
        self.assertLessEqual(back, 1, "the job went back %d steps:\n%s" % (back, out))
        with open(summary_path) as f:
            summary = json.load(f)
        self.assertGreaterEqual(summary["recoveries"], 2, out)
        results = {r["worker"]: r for r in summary["worker_results"]}
        checked = 0
        for k, (target, names) in enumerate(survivors):
            until = survivors[k + 1][0] if k + 1 < len(survivors) else float("inf")
            for name in names & results.keys():
                failed = [f for f in results[name]["failed_steps"] if target <= f["step"] < until]
                self.assertTrue(
                    failed,
                    "%s saw no failed step after the kill at step %d: %s"
                    % (name, target, results[name]),
                )
                self.assertTrue(all(f["kept"] > 0 for f in failed), results[name])
                checked += 1
        # At least the second kill's survivors ran to the end.
        self.assertGreaterEqual(checked, workers - 1, results)
        return summary


MISUSE = textwrap.dedent("""\
    import os, torch, torch.nn.functional as F
    import virtualflow.torch as vf

    job = vf.init()
    torch.manual_seed(0)
    worker = os.environ["VF_WORKER"]
    out = 3 if (MODE == "model" and worker == "worker-1") else 2
    model = torch.nn.Linear(4, out)
    if MODE == "devices":
        model.bias = torch.nn.Parameter(torch.zeros(out, device="meta"))
    if MODE == "float64":
        model = model.double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(64, 4)
    y = torch.randint(0, 2, (64,))
    for step in job.steps(vf.State(model=model, optimizer=opt), dataset_size=64):
        if MODE == "diverge" and worker == "worker-1" and step.index == 2:
            with torch.no_grad():
                model.weight[0, 0] += 1.0
        rng_before = torch.get_rng_state()
        for node in step.virtual_nodes():
            assert (
                node.indices.dtype == torch.int64 and node.indices.device.type == "cpu"
            ), node.indices
            torch.rand(1)  # the node's own draw: the generator's state from before comes back
            idx = node.indices
            loss = F.cross_entropy(model(x[idx]), y[idx])
            if MODE == "nan":
                loss = loss * float("nan")
            if MODE == "backward":
                loss.backward()
            else:
                node.backward(loss)
            if MODE == "optimizer":
                opt.step()
        assert torch.equal(torch.get_rng_state(), rng_before), "the node loop moved the generator"
        opt.step()
        opt.zero_grad()
    job.finish()
    """)


class PythonOnPathTestCase(VfTestCase):
    """A test whose workers' python3 is the environment's with PyTorch (first on PATH)."""

    def setUp(self):
        super().setUp()
        self._path = os.environ["PATH"]
        os.environ["PATH"] = os.path.dirname(PYTHON) + os.pathsep + self._path

    def tearDown(self):
        os.environ["PATH"] = self._path
        super().tearDown()


@unittest.skipUnless(PYTHON, "no Python environment with PyTorch (scripts/setup-python.sh)")
class TorchMisuseTest(PythonOnPathTestCase):
    def misuse(self, mode, workers=2, env=None):
        script = write(os.path.join(self.tmp, mode + ".py"), "MODE = %r\n" % mode + MISUSE)
        job = torch_job(
            os.path.join(self.tmp, mode + ".yaml"),
            ["python3", script],
            6,
            virtual_nodes=4,
            batch=16,
        )
        saved = dict(os.environ)
        os.environ.update(env or {})
        try:
            return vf(
                "run",
                static_job(job, workers),
                "--workers",
                str(workers),
                "--progress-interval",
                "0",
                timeout=300,
            )
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def test_the_misuse_script_trains_when_used_right(self):
        run = self.misuse("right")
        self.assertSucceeded(run)
        self.assertEqual(run.summary["steps"], 6)
        self.assertEqual([r["collectives"] for r in run.summary["worker_results"]], ["gloo"] * 2)

    def test_nccl_for_a_model_on_the_cpu_is_refused(self):
        self.assertOneLineError(
            self.misuse("right", workers=1, env={"VF_TORCH_COLLECTIVES": "nccl"}),
            "VF_TORCH_COLLECTIVES=nccl, but the model is on cpu",
            "leave VF_TORCH_COLLECTIVES unset",
        )

    def test_backward_outside_a_virtual_node_is_refused(self):
        self.assertOneLineError(
            self.misuse("backward"), "backward() outside a virtual node", "node.backward(loss)"
        )

    def test_an_optimizer_step_before_the_reduction_is_refused(self):
        self.assertOneLineError(
            self.misuse("optimizer"), "optimizer.step() before the step's reduction"
        )

    def test_a_worker_with_a_different_model_is_refused_at_join(self):
        line = self.assertOneLineError(self.misuse("model"), "different model", "weight")
        self.assertIn("[3, 4]", line)

    def test_a_model_on_several_devices_is_refused(self):
        self.assertOneLineError(
            self.misuse("devices", workers=1), "several devices (cpu, meta)", "model.to(device)"
        )

    def test_a_parameter_that_is_not_float32_is_refused(self):
        self.assertOneLineError(
            self.misuse("float64", workers=1),
            "'weight' is torch.float64",
            "float32 parameters only",
        )

    def test_nan_gradients_end_the_job_with_a_numerical_error(self):
        self.assertOneLineError(self.misuse("nan", workers=1), "NumericalError")

    def test_nan_gradients_folded_on_their_device_end_the_job_too(self):
        self.assertOneLineError(
            self.misuse("nan", workers=1, env={"VF_TORCH_FOLD": "device"}), "NumericalError"
        )

    def test_check_mode_names_the_first_step_and_worker_that_diverged(self):
        line = self.assertOneLineError(
            self.misuse("diverge", env={"VF_CHECK_EVERY": "1"}),
            "DivergenceError",
            "after step 3",
            "worker-1",
        )
        self.assertIn("not deterministic", line)


if __name__ == "__main__":
    unittest.main()
