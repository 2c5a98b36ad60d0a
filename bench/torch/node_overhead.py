#!/usr/bin/env python3
"""The library's host time per virtual node, which the example CNN's compute hides on a CPU.

A model as small as a node can be (five Linear(8, 8) + BatchNorm1d blocks and a head: 22
parameters, 10 float and 5 integer buffers, close to the CNN's 23 parameters and 7 BatchNorm
layers), V=8 nodes of 4 samples, exact reduction, one worker: a step is then mostly what the
library does per node (restoring and storing buffers, seeding, the fold, node.backward()'s
checks) and per step. Runs the built library and a copy with --patch applied to torch.py
(as `bench.py ab` does), alternating, and prints each round's median step time and the median
of the per-round ratios (patched / built), with the final weights' SHA-256 of each side.

  PATH=$HOME/.cache/virtualflow/py/bin:$PATH python3 bench/torch/node_overhead.py \
      --patch bench/torch/gpu_node_host.patch --repeats 5

Started by `vf run` (VF_WORKER set) it is the worker.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

JOB = """apiVersion: virtualflow.io/v1alpha1
kind: VirtualFlowJob
metadata: {{name: bench-node-overhead}}
spec:
  virtualNodes: 8
  globalBatchSize: 32
  replicas: {{min: 1, max: 1}}
  steps: {steps}
  reduction: exact
  seed: 7
  template:
    spec:
      containers: [{{name: worker, command: [python3, {script}]}}]
"""


def worker() -> None:
    if os.environ.get("VF_BENCH_LIBRARY"):
        sys.path.insert(0, os.environ["VF_BENCH_LIBRARY"])
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    import virtualflow.torch as vf  # noqa: PLC0415

    job = vf.init()
    torch.manual_seed(0)
    blocks: list[torch.nn.Module] = []
    for _ in range(5):
        blocks += [torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU()]
    model = torch.nn.Sequential(*blocks, torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(4096, 8), torch.randint(0, 4, (4096,))
    ends = []
    for step in job.steps(vf.State(model=model, optimizer=opt), dataset_size=len(x)):
        for node in step.virtual_nodes():
            idx = torch.as_tensor(node.indices)  # a list before the indices were a tensor
            node.backward(F.cross_entropy(model(x[idx]), y[idx]))
        opt.step()
        opt.zero_grad()
        ends.append(time.perf_counter())
    with open(os.environ["VF_BENCH_TIMES"], "w", encoding="utf-8") as f:
        json.dump(ends, f)
    job.finish()


def patched_library(tmp: Path, vf: str, patch: Path) -> Path:
    built = Path(vf).resolve().parents[1] / "python" / "virtualflow"
    lib = tmp / "patched" / "virtualflow"
    lib.mkdir(parents=True)
    for f in built.iterdir():
        if f.suffix == ".so":
            (lib / f.name).symlink_to(f)
        elif f.is_file():
            (lib / f.name).write_bytes(f.read_bytes())
    subprocess.run(["patch", "-s", "-p3", "-d", str(lib), "-i", str(patch.resolve())], check=True)
    return lib.parent


def run(a: argparse.Namespace, tmp: Path, lib: Path | None) -> tuple[float, str]:
    job, times, summary = tmp / "job.yaml", tmp / "times.json", tmp / "summary.json"
    job.write_text(JOB.format(steps=a.warmup + a.steps, script=Path(__file__).resolve()))
    env = dict(os.environ, VF_BENCH_TIMES=str(times), VF_THREADS="1", OMP_NUM_THREADS="1")
    env.pop("VF_BENCH_LIBRARY", None)
    if lib is not None:
        env["VF_BENCH_LIBRARY"] = str(lib)
    subprocess.run(
        [
            a.vf,
            "run",
            str(job),
            "--workers",
            "1",
            "--progress-interval",
            "0",
            "--summary-json",
            str(summary),
        ],
        check=True,
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
    )
    ends = json.loads(times.read_text())[a.warmup :]
    step = statistics.median(b - e for e, b in itertools.pairwise(ends))
    return step, json.loads(summary.read_text())["weights_sha256"]


def main() -> None:
    if os.environ.get("VF_WORKER"):
        worker()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vf", default=str(ROOT / "build" / "bin" / "vf"))
    ap.add_argument("--patch", default=str(HERE / "gpu_node_host.patch"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vf-node-overhead-") as t:
        tmp = Path(t)
        lib = patched_library(tmp, a.vf, Path(a.patch))
        ratios, shas = [], set()
        for r in range(a.repeats):
            got = {}
            for which in ("built", "patched") if r % 2 == 0 else ("patched", "built"):
                got[which], sha = run(a, tmp, lib if which == "patched" else None)
                shas.add(sha)
            ratios.append(got["patched"] / got["built"])
            print(
                f"round {r + 1}/{a.repeats}: built {got['built'] * 1e3:.3f} ms, patched "
                f"{got['patched'] * 1e3:.3f} ms per step (8 nodes), load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
        print(
            f"patched / built: {statistics.median(ratios):.3f} (rounds "
            f"{', '.join(f'{x:.3f}' for x in ratios)}); final weights "
            f"{'bitwise the same' if len(shas) == 1 else 'DIFFERENT'} "
            f"({', '.join(sorted(shas))[:80]})"
        )


if __name__ == "__main__":
    main()
