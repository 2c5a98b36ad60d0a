"""Shared helpers for the multi-process integration tests: run the real `vf` binary, which
starts real worker processes that talk Gloo over loopback, and read what it reports."""

import json
import os
import struct
import subprocess
import tempfile
import time
import unittest

BIN_DIR = os.environ.get("VF_BIN_DIR", os.path.join(os.getcwd(), "build"))
SOURCE_DIR = os.environ.get(
    "VF_SOURCE_DIR", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
VF = os.path.join(BIN_DIR, "vf")
EXAMPLE = os.path.join(SOURCE_DIR, "examples", "fashion-mnist.yaml")
DATASET_DIR = "/usr/share/datasets/fashion-mnist"

# Upper bound for any single `vf run` in these tests; hitting it is a hang, and a failure.
RUN_TIMEOUT = 600


class Run:
    """The outcome of one `vf` invocation."""

    def __init__(self, proc, summary, seconds, log_tails=""):
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.summary = summary
        self.seconds = seconds
        # The last lines of each worker's log, read before the run's folder went: what a
        # failed assertion about the run prints beside its stdout.
        self.log_tails = log_tails

    def report(self):
        """stdout, then the workers' last log lines: an assertion's message."""
        return self.stdout + self.log_tails


def log_tails(logs, lines=40, span=16384):
    """The last LINES lines of each file in LOGS (a `vf run --logs` folder), each under its
    name; "" when there is none. Every run pays for this, so each file is read from its last
    SPAN bytes only, not whole."""
    if not os.path.isdir(logs):
        return ""
    out = []
    for name in sorted(os.listdir(logs)):
        path = os.path.join(logs, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - span))
            tail = f.read().decode(errors="replace").splitlines(keepends=True)[-lines:]
        out.append("\n--- the last %d lines of %s ---\n%s" % (len(tail), name, "".join(tail)))
    return "".join(out)


def vf(*args, timeout=RUN_TIMEOUT, default_logs=False):
    """Runs `vf ARGS`, adding --summary-json; returns a Run. A `vf run` keeps its workers'
    output in the run's own temporary folder (--logs), removed with it, unless ARGS name their
    own --logs or `default_logs` asks for vf run's default place."""
    with tempfile.TemporaryDirectory() as tmp:
        summary_path = os.path.join(tmp, "summary.json")
        cmd = [VF, *args]
        if args and args[0] == "run":
            cmd += ["--summary-json", summary_path]
            if "--logs" not in args and not default_logs:
                cmd += ["--logs", os.path.join(tmp, "logs")]
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        seconds = time.monotonic() - start
        summary = None
        if os.path.exists(summary_path):
            with open(summary_path) as f:
                summary = json.load(f)
        return Run(proc, summary, seconds, log_tails(os.path.join(tmp, "logs")))


def job_yaml(**overrides):
    """The example job's text with `spec` fields replaced. Keys use dotted paths relative to
    spec (e.g. "optimizer.learningRate"); values are inserted verbatim as YAML."""
    spec = {
        "virtualNodes": "8",
        "globalBatchSize": "256",
        "replicas": "{min: 1, max: 8}",
        "model": "{name: mlp, hiddenSizes: [512, 256]}",
        "dataset": "{name: fashion-mnist, path: %s}" % DATASET_DIR,
        "optimizer": "{name: sgd, learningRate: 0.05, momentum: 0.9, weightDecay: 0.0001}",
        "steps": "30",
        "reduction": "exact",
        "seed": "42",
    }
    spec.update(overrides)
    lines = [
        "apiVersion: virtualflow.io/v1alpha1",
        "kind: VirtualFlowJob",
        "metadata:",
        "  name: integration",
        "spec:",
    ]
    for key, value in spec.items():
        if value is not None:
            lines.append("  %s: %s" % (key, value))
    return "\n".join(lines) + "\n"


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def processes_whose(name, test):
    """pids of live processes whose /proc/PID/NAME (environ, stat, ...), read as bytes,
    passes `test`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/%s" % (pid, name), "rb") as f:
                if test(f.read()):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def read_state(path):
    """Decodes a training-state file (layout in runtime/state/training_state.h) into a dict."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"VFSTATE1", "bad magic"
    pos = 8 + 4 + 8

    def take(fmt):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return values

    def vector(code):
        (n,) = take("Q")
        return list(take("%d%s" % (n, code))) if n else []

    (n,) = take("Q")
    fingerprint = data[pos : pos + n].decode()
    pos += n
    seed, step, data_epoch, membership_epoch, optimizer_steps = take("Qqqqq")
    exponents = vector("i")
    params = vector("f")
    (slots,) = take("Q")
    optimizer_slots = [vector("f") for _ in range(slots)]
    return {
        "fingerprint": fingerprint,
        "step": step,
        "parameters": params,
        "optimizer_slots": optimizer_slots,
        "exponents": exponents,
    }


class VfTestCase(unittest.TestCase):
    def setUp(self):
        self.assertTrue(os.access(VF, os.X_OK), "vf binary not found at %s" % VF)
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def job(self, name="job.yaml", **overrides):
        return write(os.path.join(self.tmp, name), job_yaml(**overrides))

    def assertSucceeded(self, run):
        self.assertEqual(
            run.returncode, 0, "vf failed:\n%s\n%s%s" % (run.stdout, run.stderr, run.log_tails)
        )
        self.assertIsNotNone(run.summary)

    def assertOneLineError(self, run, *fragments):
        """vf failed with exactly one line on stderr, `vf: error: ...`, containing each
        fragment (case-insensitive)."""
        self.assertNotEqual(run.returncode, 0, "vf unexpectedly succeeded:\n%s" % run.stdout)
        self.assertLess(run.returncode, 128, "vf died from a signal")
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        self.assertEqual(len(lines), 1, "expected one error line, got:\n%s" % run.stderr)
        self.assertTrue(lines[0].startswith("vf: error: "), lines[0])
        for fragment in fragments:
            self.assertIn(fragment.lower(), lines[0].lower())
        return lines[0]
