"""Elastic membership: workers join and leave between two steps without restarting, a worker
killed with SIGKILL (at random moments, mid-all-reduce and mid-state-transfer) is replaced and
its step redone, and the final weights are bitwise those of an undisturbed static run."""

import hashlib
import hmac
import json
import os
import random
import re
import signal
import subprocess
import threading
import time
import unittest
import urllib.error
import urllib.request

from harness import VF, VfTestCase, job_yaml, vf, write

# virtualNodes 12 splits unevenly over 1..4 workers. The sleep-based slowdown paces steps at a
# few tens of milliseconds without using CPU, so joiners warm up within a predictable number of
# steps on a loaded 2-core machine.
SLOW = "4"


def credential(info, worker):
    """WORKER's credential in the job `vf run` serves: HMAC-SHA256 of its name keyed with the
    job's secret, as the operator and `vf run` mint it."""
    with open(info["secret_file"], "rb") as f:
        secret = f.read().strip()
    return hmac.new(secret, worker.encode(), hashlib.sha256).hexdigest()


def credential_file(tmp, info, worker):
    """a file holding WORKER's credential, for an agent's --token-file."""
    path = os.path.join(tmp, worker + ".token")
    write(path, credential(info, worker) + "\n")
    return path


def elastic_job(tmp, name="job.yaml", **overrides):
    spec = dict(
        virtualNodes="12",
        globalBatchSize="192",
        replicas="{min: 1, max: 4}",
        elasticity="{policy: elastic, cooldownSeconds: 0}",
        steps="260",
    )
    spec.update(overrides)
    return write(os.path.join(tmp, name), job_yaml(**spec))


def _stop(pid):
    os.kill(pid, signal.SIGSTOP)


def _wake(pid):
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass  # the run wound down and stopped it already


def stop_until_left_out(test, bg, worker, within, silence=_stop, undo=_wake):
    """kill -STOP of `worker` in the run `bg` (a hung member: the process lives but answers
    nobody), or SILENCE(pid) of another kind, a wait of up to `within` seconds for a plan
    without it, SIGCONT (UNDO(pid)), and the run's end: it must succeed, with one resize from the
    members before to one fewer, for the worker's silence. Returns the run's summary."""
    members = len(bg.plan_members())
    victim = bg.workers()[worker]
    silence(victim)
    try:
        deadline = time.monotonic() + within
        while worker in bg.plan_members():
            test.assertLess(time.monotonic(), deadline, "the silent worker stayed a member")
            test.assertIsNone(bg.proc.poll(), "vf run ended while a worker was silent")
            time.sleep(0.5)
    finally:
        undo(victim)
    code, out, err, summary = bg.wait()
    # The survivors went on: the run ends, with every step trained.
    test.assertEqual(code, 0, out + err)
    silent = [r for r in summary["resizes"] if "%s stopped answering" % worker in r["reason"]]
    test.assertEqual(len(silent), 1, out)
    test.assertEqual((silent[0]["from"], silent[0]["to"]), (members, members - 1))
    return summary


class Background:
    """`vf run` in the background, with its run info (coordinator URL, job secret) once
    serving."""

    def __init__(self, tmp, *args, env=None, progress="0"):
        self.info_path = os.path.join(tmp, "run-info.json")
        self.summary_path = os.path.join(tmp, "summary.json")
        cmd = [
            VF,
            "run",
            *args,
            "--run-info",
            self.info_path,
            "--summary-json",
            self.summary_path,
            "--progress-interval",
            progress,
        ]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.out = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.out.append(line)

    def info(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.info_path) and os.path.getsize(self.info_path) > 0:
                with open(self.info_path) as f:
                    return json.load(f)
            if self.proc.poll() is not None:
                raise AssertionError(
                    "vf exited with %d before it served: %s%s"
                    % (self.proc.returncode, "".join(self.out), self.proc.stderr.read())
                )
            time.sleep(0.05)
        raise AssertionError(
            "vf never started serving within %d s; its output so far: %s"
            % (timeout, "".join(self.out))
        )

    def step(self):
        """the newest step a progress line has reported (0 before the first)."""
        for line in reversed(self.out):
            m = re.match(r"step\s+(\d+)/", line)
            if m:
                return int(m.group(1))
        return 0

    def wait_for_step(self, step, timeout=300):
        """blocks until progress reaches `step`; False if the run ended or time ran out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.step() >= step:
                return True
            time.sleep(0.02)
        return False

    def plan_members(self):
        """names of the workers in the coordinator's newest plan."""
        info = self.info()
        req = urllib.request.Request(
            "%s/v1/jobs/%s/plan?after=0&timeout_ms=1000" % (info["coordinator"], info["job"])
        )
        req.add_header("Authorization", "Bearer " + credential(info, "observer"))
        req.add_header("X-VirtualFlow-Worker", "observer")
        with urllib.request.urlopen(req, timeout=30) as resp:
            if resp.status == 204:  # no plan yet
                return set()
            return {m["worker"] for m in json.load(resp)["members"]}

    def workers(self):
        """pids of the live worker processes, by worker name."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid), "-a"], capture_output=True, text=True
        ).stdout
        found = {}
        for line in out.splitlines():
            pid, _, cmd = line.partition(" ")
            if "--worker " in cmd:
                found[cmd.split("--worker ")[1].split()[0]] = int(pid)
        return found

    def wait(self, timeout=600):
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("vf run hung") from None
        self.reader.join(timeout=10)
        err = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        summary = None
        if os.path.exists(self.summary_path):
            with open(self.summary_path) as f:
                summary = json.load(f)
        return self.proc.returncode, "".join(self.out), err, summary


class ElasticTest(VfTestCase):
    # The static runs' weights by the text of their job, each made once for the class: three
    # tests compare against the same job (the default elastic_job), and a static run of the same
    # text has the same weights (the file's name or directory is no part of the training).
    _reference: dict[str, str] = {}

    def reference(self, job):
        with open(job) as f:
            text = f.read()
        if text not in ElasticTest._reference:
            # Unpaced: the slowdown only sleeps, which changes no weight, and a static run has no
            # joiner to pace.
            run = vf("run", job, "--workers", "4", "--progress-interval", "0")
            self.assertSucceeded(run)
            self.assertEqual(run.summary["resizes"], [], "the reference run must be static")
            self.assertEqual(run.summary["workers"], 4)
            ElasticTest._reference[text] = run.summary["weights_sha256"]
        return ElasticTest._reference[text]

    def test_resized_run_matches_static_run_for_momentum_and_adamw(self):
        for name, optimizer in (
            ("sgd", "{name: sgd, learningRate: 0.05, momentum: 0.9}"),
            ("adamw", "{name: adamw, learningRate: 0.002, weightDecay: 0.01}"),
        ):
            with self.subTest(optimizer=name):
                job = elastic_job(self.tmp, name + ".yaml", optimizer=optimizer)
                expected = self.reference(job)
                run = vf(
                    "run",
                    job,
                    "--capacity",
                    "0:2,20:4,120:1,160:3",
                    "--slowdown",
                    SLOW,
                    "--progress-interval",
                    "0.01",
                )
                self.assertSucceeded(run)
                sizes = [(r["from"], r["to"]) for r in run.summary["resizes"]]
                self.assertEqual(sizes, [(2, 4), (4, 1), (1, 3)], run.stdout)
                self.assertEqual(run.summary["recoveries"], 0)
                self.assertEqual(run.summary["weights_sha256"], expected)
                lines = [
                    line for line in run.stdout.splitlines() if line.startswith("resize at step")
                ]
                self.assertEqual(len(lines), 3, run.stdout)
                self.assertRegex(lines[0], r"resize at step \d+: 2 -> 4 workers, pause \d+\.\d\d s")
                for r in run.summary["resizes"]:
                    self.assertGreater(r["pause_seconds"], 0)
                    self.assertTrue(r["reason"])
                # Every progress line shows a trained step, also right after a resize.
                progress = [line for line in run.stdout.splitlines() if line.startswith("step ")]
                self.assertGreater(len(progress), 3, run.stdout)
                for line in progress:
                    m = re.search(r"loss (\S+) .* ([\d.]+) samples/s", line)
                    self.assertIsNotNone(m, line)
                    self.assertGreater(float(m.group(1)), 0, line)
                    self.assertGreater(float(m.group(2)), 0, line)

    def test_chaos_kills_are_survived_with_identical_weights(self):
        job = elastic_job(self.tmp, steps="300")
        expected = self.reference(job)
        seed = int(os.environ.get("VF_CHAOS_SEED", str(random.randrange(1 << 30))))
        rng = random.Random(seed)
        # worker-1 dies between computing and reducing step 40; the first replacement
        # (worker-4) dies while the state is being sent to it.
        faults = "worker-1:allreduce@40,worker-4:state-transfer"
        bg = Background(
            self.tmp,
            job,
            "--workers",
            "3",
            "--slowdown",
            SLOW,
            env={"VF_FAULT_INJECT": faults},
            progress="0.05",
        )
        bg.info()
        # The two random kills land at random steps after the injected faults have played out,
        # paced by the run's own progress rather than by wall time, so a fast or a loaded machine
        # sees the same schedule.
        targets = sorted(rng.sample(range(90, 260), 2))
        killed = []
        for target in targets:
            self.assertTrue(
                bg.wait_for_step(target),
                "chaos seed %d: run ended before step %d:\n%s" % (seed, target, "".join(bg.out)),
            )
            time.sleep(rng.uniform(0.0, 0.5))
            # Only a member of the running plan: killing a joiner that is still warming up
            # would not disturb a collective.
            live = bg.workers()
            members = sorted(set(live) & bg.plan_members())
            self.assertTrue(members, "chaos seed %d: no live member at step %d" % (seed, target))
            victim = rng.choice(members)
            os.kill(live[victim], signal.SIGKILL)
            killed.append(victim)
        code, out, err, summary = bg.wait()
        self.assertEqual(code, 0, "chaos seed %d:\n%s\n%s" % (seed, out, err))
        self.assertGreaterEqual(summary["recoveries"], 3, "chaos seed %d:\n%s" % (seed, out))
        self.assertIn("worker-1 was killed by signal 9", out)
        self.assertIn("worker-4 was killed by signal 9", out)
        self.assertEqual(summary["weights_sha256"], expected, "chaos seed %d" % seed)

    def test_graceful_leave_shrinks_without_redoing_a_step(self):
        job = elastic_job(self.tmp, replicas="{min: 1, max: 3}")
        expected = self.reference(elastic_job(self.tmp, "ref.yaml"))
        bg = Background(self.tmp, job, "--workers", "3", "--slowdown", SLOW)
        bg.info()
        deadline = time.monotonic() + 60
        while len(bg.workers()) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)
        os.kill(bg.workers()["worker-2"], signal.SIGTERM)
        code, out, err, summary = bg.wait()
        self.assertEqual(code, 0, out + err)
        self.assertEqual(summary["recoveries"], 0, out)
        shrink = [r for r in summary["resizes"] if (r["from"], r["to"]) == (3, 2)]
        self.assertEqual(len(shrink), 1, out)
        self.assertIn("leave", shrink[0]["reason"])
        self.assertNotIn("worker-2 was killed", out)
        self.assertEqual(summary["weights_sha256"], expected)

    def test_stopped_member_is_left_out_with_identical_weights(self):
        # SIGSTOP: the process lives (waitpid sees nothing) but answers nobody, as a hung or
        # partitioned worker. The survivors' collective times out (--timeout), the coordinator
        # notices the silence, and the next plan goes on without it; woken, it is heard from
        # again and may rejoin through a state transfer if the job is still running. The stop
        # lands as soon as the three train together, and no step completes while the survivors
        # wait on it: measured at a load average of 9, worker-2 was left out at step 0 and
        # rejoined at step 26, so the steps past that are margin (they were 600, 45 s).
        job = elastic_job(self.tmp, replicas="{min: 1, max: 3}", steps="240")
        expected = self.reference(elastic_job(self.tmp, "ref.yaml", steps="240"))
        # A collective timeout (20 s) past the coordinator's 10 s of silence: the survivors'
        # failed step finds the stopped worker already silent, so one new plan suffices, well
        # within the runner's stall limit (3 x --timeout) even on a loaded machine.
        bg = Background(
            self.tmp, job, "--workers", "3", "--slowdown", SLOW, "--timeout", "20", progress="0.2"
        )
        bg.info()
        deadline = time.monotonic() + 60
        while bg.plan_members() != {"worker-0", "worker-1", "worker-2"}:
            self.assertLess(time.monotonic(), deadline, "3 workers never trained together")
            time.sleep(0.2)
        summary = stop_until_left_out(self, bg, "worker-2", within=90)
        self.assertEqual(summary["weights_sha256"], expected)

    def test_joiner_never_included_ends_at_once_on_sigterm(self):
        # A pod the operator deletes before any plan included it (it scaled back first) gets
        # SIGTERM while its agent waits for a plan; it must end then, not when its wait times
        # out (600 s here), long after the kubelet's grace period. Measured at a load average of
        # 9, the SIGTERM landed at step 20 and the joiner had ended by step 28: the steps after
        # are the margin for a slower start, and the window in which a stray resize or recovery
        # would show.
        job = elastic_job(self.tmp, replicas="{min: 1, max: 2}", steps="300")
        bg = Background(self.tmp, job, "--workers", "2", "--slowdown", SLOW)
        info = bg.info()
        agent = os.path.join(os.path.dirname(VF), "virtualflow-agent")
        extra = subprocess.Popen(
            [
                agent,
                "--job",
                job,
                "--coordinator",
                info["coordinator"],
                "--job-id",
                info["job"],
                "--worker",
                "extra",
                "--token-file",
                credential_file(self.tmp, info, "extra"),
                "--timeout",
                "600",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(extra.stderr), daemon=True)
        reader.start()
        try:
            # It names its device once registered and warmed up; then it waits for a plan.
            deadline = time.monotonic() + 60
            while not any("device cpu" in line for line in lines) and time.monotonic() < deadline:
                self.assertIsNone(extra.poll(), "".join(lines))
                time.sleep(0.05)
            self.assertTrue(any("device cpu" in line for line in lines), "".join(lines))
            time.sleep(2)
            self.assertIsNone(bg.proc.poll(), "".join(bg.out))  # the job still trains
            self.assertIsNone(extra.poll(), "".join(lines))
            self.assertNotIn("extra", bg.plan_members())
            extra.send_signal(signal.SIGTERM)
            extra.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.fail("a joiner in no plan ignored SIGTERM while it waited for a plan")
        finally:
            if extra.poll() is None:
                extra.kill()
                extra.wait()
            reader.join(timeout=10)
            extra.stderr.close()
        self.assertEqual(extra.returncode, 0, "".join(lines))
        code, out, err, summary = bg.wait()
        self.assertEqual(code, 0, out + err)
        self.assertEqual(summary["resizes"], [], out)
        self.assertEqual(summary["recoveries"], 0, out)

    def test_mismatched_joiner_is_refused_without_disturbing_the_job(self):
        job = elastic_job(self.tmp)
        expected = self.reference(job)
        bg = Background(self.tmp, job, "--workers", "2", "--slowdown", SLOW)
        info = bg.info()
        agent = os.path.join(os.path.dirname(VF), "virtualflow-agent")
        for field, value in (("virtualNodes", "6"), ("model", "{name: mlp, hiddenSizes: [64]}")):
            other = elastic_job(self.tmp, "other-%s.yaml" % field, **{field: value})
            rogue = subprocess.run(
                [
                    agent,
                    "--job",
                    other,
                    "--coordinator",
                    info["coordinator"],
                    "--job-id",
                    info["job"],
                    "--worker",
                    "rogue-" + field,
                    "--token-file",
                    credential_file(self.tmp, info, "rogue-" + field),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            self.assertEqual(rogue.returncode, 3, rogue.stderr)
            self.assertIn("refused", rogue.stderr)
            self.assertIn("job spec differs", rogue.stderr)
        code, out, err, summary = bg.wait()
        self.assertEqual(code, 0, out + err)
        self.assertEqual(summary["resizes"], [])
        self.assertEqual(summary["recoveries"], 0)
        self.assertEqual(summary["weights_sha256"], expected)

    def test_bad_coordinator_input_gets_4xx_and_leaves_the_job_alone(self):
        job = elastic_job(self.tmp)
        expected = self.reference(job)
        bg = Background(self.tmp, job, "--workers", "2", "--slowdown", SLOW)
        info = bg.info()
        base = "%s/v1/jobs/%s" % (info["coordinator"], info["job"])

        def call(method, path, body=b"", worker="worker-0", token=None, url=None):
            """the status of a request as WORKER, with its own credential unless TOKEN is given
            ("" for none), and the reply's JSON body (None for none)."""
            req = urllib.request.Request(url or base + path, data=body or None, method=method)
            token = credential(info, worker) if token is None else token
            if token:
                req.add_header("Authorization", "Bearer " + token)
            if worker:
                req.add_header("X-VirtualFlow-Worker", worker)
            req.add_header("Content-Type", "application/json")
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    data = resp.read()
                    return resp.status, json.loads(data) if data else None
            except urllib.error.HTTPError as e:
                data = e.read()
                self.assertIn(b"error", data)
                return e.code, json.loads(data)

        # Wait until training runs under a plan, so that epoch 0 is in the past.
        status, plan = call("GET", "/plan?after=0&timeout_ms=60000")
        self.assertEqual(status, 200)
        rank1 = [m["worker"] for m in plan["members"] if m["rank"] != 0][0]
        report = {
            "worker": rank1,
            "epoch": plan["epoch"],
            "step": 1,
            "loss": 0.1,
            "samplesPerSecond": 1.0,
            "secondsPerVirtualNode": 0.1,
            "hasState": True,
        }
        cases = [
            ("malformed JSON", ("POST", "/report", b"{not json"), 400),
            ("missing credential", ("POST", "/report", b"{}", "worker-0", ""), 401),
            ("wrong credential", ("POST", "/report", b"{}", "worker-0", "nope"), 401),
            ("no worker named", ("POST", "/report", b"{}", ""), 401),
            # Answered as a wrong credential is, so that nobody learns which jobs exist.
            (
                "unknown job",
                (
                    "GET",
                    "",
                    b"",
                    "worker-0",
                    None,
                    info["coordinator"] + "/v1/jobs/default/nosuchjob/plan",
                ),
                401,
            ),
            (
                "one worker's credential presented as another's",
                (
                    "POST",
                    "/leave",
                    b'{"worker": "worker-0"}',
                    "worker-0",
                    credential(info, "worker-1"),
                ),
                401,
            ),
            (
                "a worker acting as another",
                ("POST", "/leave", b'{"worker": "worker-0"}', "worker-1"),
                403,
            ),
            (
                "a failure reported for another worker",
                (
                    "POST",
                    "/failure",
                    json.dumps(
                        {"worker": "worker-1", "epoch": plan["epoch"], "step": 1, "message": "x"}
                    ).encode(),
                ),
                403,
            ),
            (
                "the job reported finished by a rank other than 0",
                (
                    "POST",
                    "/report",
                    json.dumps(dict(report, finished=True, weightsSha256="0" * 64)).encode(),
                    rank1,
                ),
                403,
            ),
            (
                "epoch from the past",
                ("POST", "/report", json.dumps(dict(report, worker="worker-0", epoch=0)).encode()),
                409,
            ),
            ("oversized body", ("POST", "/register", b"x" * (2 << 20)), 413),
            ("store write to a past epoch", ("PUT", "/store/epoch-0/rank-0", b"x"), 409),
            ("store write to an epoch far ahead", ("PUT", "/store/epoch-999/rank-0", b"x"), 409),
            (
                "store write to the next epoch",
                ("PUT", "/store/epoch-%d/rank-0" % (plan["epoch"] + 1), b"x"),
                409,
            ),
            (
                "a rendezvous key planted by a worker outside the plan",
                ("PUT", "/store/epoch-%d/rank-0" % plan["epoch"], b"x", "observer"),
                403,
            ),
            ("store key over 1 KiB", ("PUT", "/store/" + "k" * 2000, b"x"), 400),
            (
                "digest that is not one",
                ("POST", "/report", json.dumps(dict(report, weightsSha256="zz")).encode(), rank1),
                400,
            ),
        ]
        for name, args, status in cases:
            with self.subTest(case=name):
                self.assertEqual(call(*args)[0], status)
        code, out, err, summary = bg.wait()
        self.assertEqual(code, 0, out + err)
        self.assertEqual(summary["recoveries"], 0)
        self.assertEqual(summary["resizes"], [])
        self.assertEqual(summary["weights_sha256"], expected)


if __name__ == "__main__":
    unittest.main()
