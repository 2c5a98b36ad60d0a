#!/usr/bin/env python3
"""CPU time per training step of local `vf run` jobs, against their wall time.

Runs the Fashion-MNIST example (or --job) with the given workers, virtual nodes and global
batch, and reports for each run: wall milliseconds per step (start-up included), CPU
milliseconds per step of all its processes (user and kernel, from the children's resource
usage), the kernel's share, and the average number of cores in use. On a machine with fewer
cores than workers this shows how much of a step is work and how much is waiting.

  python3 bench/cpu_per_step.py --vf build/bin/vf                  # 1-4 workers, V=8, B=256
  python3 bench/cpu_per_step.py --vf build/bin/vf --config 2:2:64  # workers:V:B
"""

import argparse
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def job_text(base, virtual_nodes, batch):
    text = re.sub(r"virtualNodes:\s*\d+", f"virtualNodes: {virtual_nodes}", base)
    text = re.sub(r"globalBatchSize:\s*\d+", f"globalBatchSize: {batch}", text)
    # A worker holds at least one virtual node.
    return re.sub(
        r"(\n\s+max:\s*)(\d+)",
        lambda m: m.group(1) + str(min(int(m.group(2)), virtual_nodes)),
        text,
        count=1,
    )


def run(vf, base, workers, virtual_nodes, batch, steps):
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(job_text(base, virtual_nodes, batch))
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        p = subprocess.run(
            [vf, "run", f.name, "--workers", str(workers), "--steps", str(steps), "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        sys.exit(f"cpu_per_step: vf run failed: {p.stderr.strip()}")
    user = after.ru_utime - before.ru_utime
    kernel = after.ru_stime - before.ru_stime
    return wall, user + kernel, kernel


def main():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vf", default=os.path.join(ROOT, "build", "bin", "vf"))
    ap.add_argument("--job", default=os.path.join(ROOT, "examples", "fashion-mnist.yaml"))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument(
        "--config",
        action="append",
        help="workers:virtual-nodes:global-batch, repeatable "
        "(default 1:8:256 2:8:256 3:8:256 4:8:256 2:2:64)",
    )
    a = ap.parse_args()
    configs = a.config or ["1:8:256", "2:8:256", "3:8:256", "4:8:256", "2:2:64"]
    base = open(a.job).read()
    print(
        f"{'workers':>7} {'V':>3} {'B':>5} {'wall ms/step':>13} {'cpu ms/step':>12} "
        f"{'kernel ms':>10} {'cores used':>11}"
    )
    for c in configs:
        try:
            workers, v, b = (int(x) for x in c.split(":"))
        except ValueError:
            sys.exit(f"cpu_per_step: --config wants workers:virtual-nodes:global-batch, not {c!r}")
        wall, cpu, kernel = run(a.vf, base, workers, v, b, a.steps)
        print(
            f"{workers:>7} {v:>3} {b:>5} {1e3 * wall / a.steps:>13.2f} "
            f"{1e3 * cpu / a.steps:>12.2f} {1e3 * kernel / a.steps:>10.2f} "
            f"{cpu / wall:>11.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
