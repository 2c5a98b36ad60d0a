#!/usr/bin/env python3
"""Resize pause: in-place (membership switch between two steps) against checkpoint-restart
(stop every worker, write a checkpoint, start the new set of processes, load it, first step),
both measured in this run, for the reference MLP and for a ~100M-parameter state; then the
step rate of the existing workers while a joiner warms up.

usage: bench/resize.py [--vf build/bin/vf] [--skip-big]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MLP = """apiVersion: virtualflow.io/v1alpha1
kind: VirtualFlowJob
metadata: {name: resize-mlp}
spec:
  virtualNodes: 8
  globalBatchSize: 256
  replicas: {min: 1, max: 4}
  model: {name: mlp, hiddenSizes: [512, 256]}
  dataset: {name: fashion-mnist, path: /usr/share/datasets/fashion-mnist}
  optimizer: {name: sgd, learningRate: 0.05, momentum: 0.9}
  steps: %(steps)d
  reduction: exact
  seed: 1
  elasticity: {policy: elastic, cooldownSeconds: 0}
%(checkpoint)s"""

# 784*8192 + 8192*8192 + 8192*4096 + 4096*10 (+ biases) = 107M parameters; with momentum the
# state is ~860 MB.
BIG = """apiVersion: virtualflow.io/v1alpha1
kind: VirtualFlowJob
metadata: {name: resize-big}
spec:
  virtualNodes: 4
  globalBatchSize: 4
  replicas: {min: 1, max: 2}
  model: {name: mlp, hiddenSizes: [8192, 8192, 4096]}
  dataset: {name: synthetic, trainSamples: 4096, testSamples: 16}
  optimizer: {name: sgd, learningRate: 0.0001, momentum: 0.9}
  steps: %(steps)d
  reduction: exact
  seed: 1
  elasticity: {policy: elastic, cooldownSeconds: 0}
%(checkpoint)s"""


def run(vf, job, *args):
    with tempfile.TemporaryDirectory() as tmp:
        summary = os.path.join(tmp, "s.json")
        p = subprocess.run(
            [vf, "run", job, "--summary-json", summary, "--progress-interval", "0", *args],
            capture_output=True,
            text=True,
        )
        if p.returncode != 0:
            sys.exit("vf run failed:\n%s\n%s" % (p.stdout, p.stderr))
        with open(summary) as f:
            return json.load(f), p.stdout


def in_place(vf, template, tmp, schedule, steps, at):
    job = os.path.join(tmp, "inplace.yaml")
    with open(job, "w") as f:
        f.write(template % {"steps": steps, "checkpoint": ""})
    summary, out = run(vf, job, "--capacity", schedule)
    pauses = [r["pause_seconds"] for r in summary["resizes"]]
    if len(pauses) != 1:
        sys.exit("expected one resize with %s, got %s\n%s" % (schedule, summary["resizes"], out))
    return pauses[0]


def checkpoint_restart(vf, template, tmp, before, after, at, steps):
    """Train `at` steps on `before` workers and checkpoint; then time a restart on `after`."""
    ckpt = os.path.join(tmp, "restart.ckpt")
    if os.path.exists(ckpt):
        os.remove(ckpt)
    job = os.path.join(tmp, "restart.yaml")
    with open(job, "w") as f:
        f.write(template % {"steps": steps, "checkpoint": "  checkpoint: {path: %s}" % ckpt})
    # Phase 1: the old set trains and writes the checkpoint at its last step.
    p = subprocess.run(
        [
            vf,
            "run",
            job,
            "--workers",
            str(before),
            "--steps",
            str(at),
            "--progress-interval",
            "0",
            "--quiet",
        ],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        sys.exit(p.stdout + p.stderr)
    write_seconds = checkpoint_write_seconds(vf, job, ckpt)
    # Phase 2: the new set starts from nothing, loads the checkpoint and trains 3 steps.
    launch = time.time()
    summary, _ = run(vf, job, "--workers", str(after), "--steps", str(at + 3), "--quiet")
    results = summary["worker_results"]
    first = [r for r in results if r.get("steps_trained", 0) >= 2]
    if not first:
        sys.exit("no worker result captured")
    r = first[0]
    step = (r["last_step_unix"] - r["first_step_unix"]) / (r["steps_trained"] - 1)
    return write_seconds + (r["first_step_unix"] - launch) - step, write_seconds


def checkpoint_write_seconds(vf, job, ckpt):
    """Time to write this job's checkpoint, as the agent does it (read it back, write it)."""
    bench = os.path.join(os.path.dirname(vf), "vf-bench")
    p = subprocess.run(
        [bench, "checkpoint-write", "--checkpoint", ckpt], capture_output=True, text=True
    )
    if p.returncode != 0:
        sys.exit(p.stdout + p.stderr)
    return float(p.stdout.strip().split()[-1])


def warmup_rate(vf, tmp):
    """Samples/s of the existing workers before, during and after a joiner's warm-up: the
    capacity grows from 2 to 3 slots 4 s after launch; the joiner starts then, loads the data
    and builds its model while the two members keep training, and joins at a step boundary."""
    job = os.path.join(tmp, "warm.yaml")
    with open(job, "w") as f:
        f.write(MLP % {"steps": 1500, "checkpoint": ""})
    launch = time.monotonic()
    p = subprocess.Popen(
        [vf, "run", job, "--capacity", "0s:2,4s:3", "--progress-interval", "0.25"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    samples = []  # (seconds since launch, step, samples/s, workers)
    resize_at = None
    for line in p.stdout:
        t = time.monotonic() - launch
        m = re.match(r"step\s+(\d+)/\d+\s+loss \S+\s+(\d+) workers\s+(\d+) samples/s", line)
        if m:
            samples.append((t, int(m.group(1)), float(m.group(3)), int(m.group(2))))
        elif line.startswith("resize at step") and resize_at is None:
            resize_at = t
    p.wait()
    if p.returncode != 0 or resize_at is None:
        sys.exit("warm-up run failed:\n" + p.stderr.read())

    def window(lo, hi):
        rates = [r for t, _, r, w in samples if lo <= t < hi]
        return statistics.median(rates) if rates else float("nan"), len(rates)

    before = window(1.5, 4.0)
    during = window(4.0, resize_at)
    after = window(resize_at + 0.5, resize_at + 6.0)
    return (
        "%-34s %12s %8s\n" % ("window (seconds after launch)", "samples/s", "lines")
        + "%-34s %12.0f %8d\n" % ("2 workers, before (1.5-4.0)", *before)
        + "%-34s %12.0f %8d\n" % ("2 workers, joiner warming (4.0-%.1f)" % resize_at, *during)
        + "%-34s %12.0f %8d\n"
        % ("3 workers, after (%.1f-%.1f)" % (resize_at + 0.5, resize_at + 6), *after)
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vf", default=os.path.join(ROOT, "build", "bin", "vf"))
    ap.add_argument("--skip-big", action="store_true", help="only the MLP")
    a = ap.parse_args()
    print("resize pause: in-place vs checkpoint-restart (seconds, measured in this run)")
    print(
        "%-26s %-7s %10s %12s %10s %8s"
        % ("state", "resize", "in-place", "ckpt-restart", "(write)", "ratio")
    )
    cases = [("MLP 0.5M params", MLP, 600, 200)]
    if not a.skip_big:
        cases.append(("MLP 107M params (~860MB)", BIG, 24, 3))
    with tempfile.TemporaryDirectory() as tmp:
        for name, template, steps, at in cases:
            for before, after in ((1, 2), (2, 1)):  # grow, shrink
                pause = in_place(a.vf, template, tmp, "0:%d,%d:%d" % (before, at, after), steps, at)
                restart, write = checkpoint_restart(a.vf, template, tmp, before, after, at, steps)
                print(
                    "%-26s %-7s %10.3f %12.3f %10.3f %8.3f"
                    % (name, "%d->%d" % (before, after), pause, restart, write, pause / restart)
                )
                sys.stdout.flush()
        print()
        print("step rate of 2 workers while a third warms up (capacity 2 -> 3 at 4 s):")
        print(warmup_rate(a.vf, tmp), end="")


if __name__ == "__main__":
    main()
