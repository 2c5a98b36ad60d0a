#!/usr/bin/env python3
"""NodeLoader against torch's DataLoader, on examples/torch/images.py (PNG files decoded and
randomly cropped and flipped per sample), one worker each, in one run.

For each number of loader processes k (--loaders, default 0,1,2), each round runs:
  vf     `vf run examples/torch-images.yaml --workers 1 --steps S` with IMAGES_LOADERS=k: the
         example as it is, its nodes loaded by vf.NodeLoader(num_workers=k);
  plain  the same dataset, model, optimizer and global batch (8 micro-batches of 32 per step,
         the gradients accumulated, one optimizer step) in a plain PyTorch loop whose batches
         come from DataLoader(batch_size=32, shuffle=True, num_workers=k, pin_memory=False).
The rounds interleave the two sides and alternate their order. A side's step time is the median
interval between step ends after --warmup steps (the first holds exact reduction's second pass;
the vf side's step ends are taken in its worker, which runs images.py's main() as it is).
Reported per k: the medians, the median of the per-round ratios vf / plain (the target is at
most 1.05), vf's gain over loading in the training process (vf at k=0 / vf at k), and each
side's wait: the median time per step its training process spent waiting for batches
(NodeLoader.batch, next() of the DataLoader's iterator; at k=0 that is the loading itself).
When both sides wait next to nothing, the step is bound by the training process's own work.

usage: PATH=$HOME/.cache/virtualflow/py/bin:$PATH python3 bench/torch/data_bench.py \
           [--rounds 3] [--steps 40] [--warmup 5] [--loaders 0,1,2] [--samples 8192] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "torch")
VF = os.environ.get("VF", os.path.join(ROOT, "build", "bin", "vf"))
BATCH, NODES = 256, 8


def step_time(ends: list[float], warmup: int) -> float:
    """The median interval between step ends after `warmup` steps."""
    tail = ends[warmup:] if len(ends) > warmup + 2 else ends[1:]
    return statistics.median(b - a for a, b in zip(tail, tail[1:], strict=False))


def vf_worker() -> None:
    """A worker of the vf side: examples/torch/images.py's main() as it is, each step's end
    (when the script asks for the next step) written to $VF_BENCH_TIMES as a JSON list."""
    sys.path.insert(0, EXAMPLE)
    import images

    import virtualflow.torch as vf

    ends: list[float] = []
    waits: list[float] = []
    steps = vf.Job.steps
    batch = vf.NodeLoader.batch

    def timed(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for step in steps(self, *args, **kwargs):
            waits.append(0.0)
            yield step
            ends.append(time.time())

    def waited(self: Any, node: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return batch(self, node)
        finally:
            waits[-1] += time.perf_counter() - t0

    vf.Job.steps = timed  # type: ignore[method-assign]
    vf.NodeLoader.batch = waited  # type: ignore[method-assign]
    images.main()
    with open(os.environ["VF_BENCH_TIMES"], "w", encoding="utf-8") as f:
        json.dump({"ends": ends, "waits": waits[: len(ends)]}, f)


def waiting(waits: list[float], warmup: int) -> float:
    """The median time per step spent waiting for batches, after `warmup` steps."""
    return statistics.median(waits[warmup:] if len(waits) > warmup else waits)


def plain(loaders: int, steps: int, warmup: int) -> tuple[float, float]:
    """The plain loop, in this process; its step time (step_time) and wait (waiting)."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, EXAMPLE)
    import images  # examples/torch/images.py: its dataset and model

    torch.set_num_threads(int(os.environ.get("VF_THREADS", "1") or 1))
    root = os.environ["IMAGES_DIR"]
    train_set = images.PngFolder(
        images.write_pngs(root, int(os.environ["IMAGES_SAMPLES"])), augment=True
    )
    torch.manual_seed(0)
    model = images.Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    loader = torch.utils.data.DataLoader(
        train_set,
        batch_size=BATCH // NODES,
        shuffle=True,
        drop_last=True,
        num_workers=loaders,
        pin_memory=False,
        generator=torch.Generator().manual_seed(0),
    )
    it = iter(loader)
    ends, waits = [], []
    for _ in range(steps):
        model.train()
        waits.append(0.0)
        for _ in range(NODES):
            t0 = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(loader)
                x, y = next(it)
            waits[-1] += time.perf_counter() - t0
            (F.cross_entropy(model(x), y) / NODES).backward()
        opt.step()
        opt.zero_grad()
        ends.append(time.time())
    return step_time(ends, warmup), waiting(waits, warmup)


def run_plain(loaders: int, steps: int, warmup: int, env: dict[str, str]) -> tuple[float, float]:
    out = subprocess.run(
        [sys.executable, __file__, "plain", "--loaders", str(loaders), "--steps", str(steps)]
        + ["--warmup", str(warmup)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    step, wait = out.stdout.strip().splitlines()[-1].split()
    return float(step), float(wait)


def run_vf(
    loaders: int, steps: int, warmup: int, env: dict[str, str], tmp: str
) -> tuple[float, float]:
    """examples/torch-images.yaml on one worker, its command this script's vf_worker."""
    with open(os.path.join(ROOT, "examples", "torch-images.yaml"), encoding="utf-8") as f:
        text = f.read()
    old = "command: [python3, examples/torch/images.py]"
    if old not in text:
        sys.exit(f"examples/torch-images.yaml: no '{old}'")
    job = os.path.join(tmp, "job.yaml")
    with open(job, "w", encoding="utf-8") as f:
        f.write(text.replace(old, f"command: [python3, {os.path.abspath(__file__)}, vfworker]"))
    times = os.path.join(tmp, "times.json")
    subprocess.run(
        [VF, "run", job, "--workers", "1", "--steps", str(steps), "--progress-interval", "0"],
        env={**env, "IMAGES_LOADERS": str(loaders), "VF_BENCH_TIMES": times},
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    with open(times, encoding="utf-8") as f:
        got = json.load(f)
    return step_time(got["ends"], warmup), waiting(got["waits"], warmup)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", nargs="?", default="bench", choices=["bench", "plain", "vfworker"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--loaders", default="0,1,2")
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--out", default="")
    a = p.parse_args()
    if a.mode == "plain":
        print(*plain(int(a.loaders), a.steps, a.warmup))
        return
    if a.mode == "vfworker":
        vf_worker()
        return
    ks = [int(k) for k in a.loaders.split(",")]
    cache = os.path.join(os.path.expanduser("~/.cache"), "virtualflow")
    env = dict(os.environ)
    # The plain loop imports examples/torch/images.py, which imports the package (as vf run's
    # workers do, from the build tree).
    package = os.path.join(os.path.dirname(os.path.dirname(VF)), "python")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package, env.get("PYTHONPATH")]))
    env.setdefault("IMAGES_DIR", os.path.join(cache, "fashion-mnist-png"))
    env.update(IMAGES_SAMPLES=str(a.samples), IMAGES_TEST_SAMPLES="100", IMAGES_DEVICE="cpu")
    times: dict[tuple[str, int], list[float]] = {}
    waits: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for k in ks:
                sides = ["vf", "plain"] if (r + k) % 2 == 0 else ["plain", "vf"]
                for side in sides:
                    t, w = (
                        run_vf(k, a.steps, a.warmup, env, tmp)
                        if side == "vf"
                        else run_plain(k, a.steps, a.warmup, env)
                    )
                    times.setdefault((side, k), []).append(t)
                    waits.setdefault((side, k), []).append(w)
                    print(
                        f"round {r + 1} k={k} {side}: {1000 * t:.1f} ms/step, "
                        f"{1000 * w:.1f} ms waiting for batches",
                        flush=True,
                    )
    load = os.getloadavg()
    rows = []
    for k in ks:
        vf_t, plain_t = times["vf", k], times["plain", k]
        ratios = [v / q for v, q in zip(vf_t, plain_t, strict=True)]
        row = {
            "loaders": k,
            "vf_ms": 1000 * statistics.median(vf_t),
            "plain_ms": 1000 * statistics.median(plain_t),
            "ratio": statistics.median(ratios),
            "vf_wait_ms": 1000 * statistics.median(waits["vf", k]),
            "plain_wait_ms": 1000 * statistics.median(waits["plain", k]),
            "gain_over_in_process": (
                statistics.median(times["vf", 0]) / statistics.median(vf_t)
                if ("vf", 0) in times
                else None
            ),
        }
        rows.append(row)
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {a.rounds} rounds")
    print("k  vf ms/step  plain ms/step  vf/plain  vf gain over k=0  waiting ms/step vf, plain")
    for row in rows:
        gain = row["gain_over_in_process"]
        print(
            f"{row['loaders']}  {row['vf_ms']:10.1f}  {row['plain_ms']:13.1f}  "
            f"{row['ratio']:8.3f}  {'' if gain is None else f'{gain:.2f}x':>16}  "
            f"{row['vf_wait_ms']:.1f}, {row['plain_wait_ms']:.1f}"
        )
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "rows": rows,
                    "times": {f"{s}-{k}": v for (s, k), v in times.items()},
                    "waits": {f"{s}-{k}": v for (s, k), v in waits.items()},
                },
                f,
            )


if __name__ == "__main__":
    main()
