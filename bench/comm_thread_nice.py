#!/usr/bin/env python3
"""Workers sharing few cores: `vf run` of the built-in MLP with Gloo's event thread at nice 0
and at nice 19 (VF_COMM_THREAD_NICE), alternating, in the same run; prints each run's wall
time and CPU time (user + system, of vf run and all its workers) and the medians' ratios.
--busy N runs N busy loops beside every run, as other work on the machine would.

usage: bench/comm_thread_nice.py [--vf build/bin/vf] [--workers 4] [--steps 900] [--runs 3]
                                 [--busy 0]
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

JOB = """apiVersion: virtualflow.io/v1alpha1
kind: VirtualFlowJob
metadata: {name: comm-thread-nice}
spec:
  virtualNodes: 8
  globalBatchSize: 256
  replicas: {min: 1, max: %(workers)d}
  model: {name: mlp, hiddenSizes: [128]}
  dataset: {name: fashion-mnist}
  optimizer: {name: sgd, learningRate: 0.05, momentum: 0.9}
  steps: %(steps)d
  seed: 7
"""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(vf: str, job: str, workers: int, nice: int) -> tuple[float, float]:
    """Wall seconds and CPU seconds of one `vf run` with VF_COMM_THREAD_NICE=nice."""
    env = dict(os.environ, VF_COMM_THREAD_NICE=str(nice))
    cpu = children_cpu()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as logs:
        run = subprocess.run(
            [vf, "run", job, "--workers", str(workers), "--progress-interval", "0"]
            + ["--logs", logs],
            env=env,
            capture_output=True,
            text=True,
        )
    wall = time.monotonic() - start
    if run.returncode != 0:
        sys.exit("vf run failed (nice %d):\n%s" % (nice, run.stderr))
    return wall, children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vf", default=os.path.join(ROOT, "build", "bin", "vf"))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--runs", type=int, default=3, help="runs at each nice value")
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside every run")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        measure(args)
    finally:
        for loop in busy:
            loop.kill()
            loop.wait()


def measure(args: argparse.Namespace) -> None:
    results: dict[int, list[tuple[float, float]]] = {0: [], 19: []}
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.yaml")
        with open(job, "w") as f:
            f.write(JOB % {"workers": args.workers, "steps": args.steps})
        cores = os.cpu_count() or 0
        print(
            "%d workers, %d steps, %d cores, %d busy loops"
            % (args.workers, args.steps, cores, args.busy)
        )
        for i in range(args.runs):
            for nice in (0, 19):
                wall, cpu = run_once(args.vf, job, args.workers, nice)
                results[nice].append((wall, cpu))
                print("run %d  nice %2d  %6.2f s wall  %6.2f CPU-s" % (i + 1, nice, wall, cpu))
    median = {
        nice: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for nice, runs in results.items()
    }
    for nice, (wall, cpu) in median.items():
        print("median  nice %2d  %6.2f s wall  %6.2f CPU-s" % (nice, wall, cpu))
    print(
        "nice 19 / nice 0: wall %.2f, CPU %.2f"
        % (median[19][0] / median[0][0], median[19][1] / median[0][1])
    )


if __name__ == "__main__":
    main()
