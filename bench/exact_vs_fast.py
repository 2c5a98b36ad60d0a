#!/usr/bin/env python3
"""Whole-step time of exact against fast reduction, with real worker processes.

Trains the example job with `vf run` in both reduction modes, alternating them so that
slow drifts of the machine hit both alike, and reports the steady-state time per step of each
and their ratio. The time per step is (wall time of a long run - wall time of a short run) /
(difference in steps), so process start-up and dataset loading cancel out.

    python3 bench/exact_vs_fast.py --vf build/bin/vf [--workers 4] [--rounds 3]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job_with(base, reduction, global_batch):
    text = open(base, encoding="utf-8").read()
    text, n = re.subn(r"(?m)^(\s*reduction:\s*)\S+", r"\g<1>" + reduction, text)
    if n != 1:
        sys.exit(f"{base}: expected one 'reduction:' line, found {n}")
    if global_batch:
        text, n = re.subn(r"(?m)^(\s*globalBatchSize:\s*)\d+", r"\g<1>" + str(global_batch), text)
        if n != 1:
            sys.exit(f"{base}: expected one 'globalBatchSize:' line, found {n}")
    return text


def timed_run(vf, job, workers, steps):
    start = time.monotonic()
    proc = subprocess.run(
        [vf, "run", job, "--workers", str(workers), "--steps", str(steps), "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"vf run {job} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vf", default=os.path.join(ROOT, "build", "bin", "vf"), help="vf binary")
    p.add_argument("--job", default=os.path.join(ROOT, "examples", "fashion-mnist.yaml"))
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=0, help="override globalBatchSize")
    p.add_argument("--steps", type=int, default=1500, help="steps of the long run")
    p.add_argument("--short-steps", type=int, default=100, help="steps of the short run")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.steps <= args.short_steps:
        sys.exit("--steps must be larger than --short-steps")

    per_step = {"fast": [], "exact": []}
    with tempfile.TemporaryDirectory() as tmp:
        jobs = {}
        for mode in per_step:
            jobs[mode] = os.path.join(tmp, f"{mode}.yaml")
            with open(jobs[mode], "w", encoding="utf-8") as f:
                f.write(job_with(args.job, mode, args.global_batch))
        for r in range(args.rounds):
            for mode in ("fast", "exact") if r % 2 == 0 else ("exact", "fast"):
                long_s = timed_run(args.vf, jobs[mode], args.workers, args.steps)
                short_s = timed_run(args.vf, jobs[mode], args.workers, args.short_steps)
                ms = (long_s - short_s) * 1000.0 / (args.steps - args.short_steps)
                per_step[mode].append(ms)
                print(
                    f"round {r + 1}/{args.rounds}  {mode:5s}  {ms:6.2f} ms/step  "
                    f"({args.steps} steps in {long_s:.1f} s)",
                    flush=True,
                )

    fast = statistics.median(per_step["fast"])
    exact = statistics.median(per_step["exact"])
    print()
    print(
        f"workers {args.workers}, global batch {args.global_batch or 'as in the job'}, "
        f"median of {args.rounds} rounds"
    )
    print("| fast ms/step | exact ms/step | exact / fast |")
    print("|---:|---:|---:|")
    print(f"| {fast:.2f} | {exact:.2f} | {exact / fast:.3f} |")
    print(
        "per-round ratios: "
        + ", ".join(
            f"{e / f:.3f}" for e, f in zip(per_step["exact"], per_step["fast"], strict=True)
        )
    )


if __name__ == "__main__":
    main()
