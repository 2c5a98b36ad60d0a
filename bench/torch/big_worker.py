#!/usr/bin/env python3
"""One worker of bench/torch/big.py, started by `vf run` (the command of the job's worker
container), that trains ResNet-50 or GPT-2 small through virtualflow.torch and, in the same
process and on the same GPU, the baselines, interleaved round by round:

  library         virtualflow.torch, exact reduction, V virtual nodes of --micro-batch each, its
                  fold on the GPU by its fused kernel (where the library has one)
  library-eager   the same job's steps with the fold as separate PyTorch operations (the A/B of
                  the kernel: both give the same bits, so the job's weights do not depend on it)
  plain           plain PyTorch accumulating the same V micro-batches (loss / V, one optimizer
                  step), PyTorch's default algorithms
  deterministic   the same with torch.use_deterministic_algorithms(True), as the library runs
  compile         the plain loop with the model under torch.compile (default mode)

Every side has its own copy of the model (the same initial weights) and optimizer and runs
--round-steps steps per round; the sides take turns, in an order that rotates every round.
Every forward runs under bfloat16 autocast. A side's step time in a round is the round's wall
time over its steps, with the GPU synchronised at both ends. With --mode sha only the library
trains (the job's weights' SHA-256 is what `vf run` prints and its summary holds).

Results: one JSON object per line appended to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import big_models  # noqa: E402
import common  # noqa: E402


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_step_fn(
    w: big_models.Workload, sampler: common.Sampler, vnodes: int, micro: int
) -> Callable[[int], None]:
    """One step of plain PyTorch accumulating `vnodes` micro-batches of `micro` samples."""

    def step(i: int) -> None:
        batch = sampler.batch(i)
        for k in range(vnodes):
            x, y = w.batch(batch[k * micro : (k + 1) * micro])
            (w.loss(x, y) / vnodes).backward()
        w.optimizer.step()
        w.optimizer.zero_grad()

    return step


def counted(fn: Callable[[int], None]) -> Callable[[], object]:
    """fn(0), fn(1), ... on successive calls."""
    counter = iter(range(1 << 62))

    def run() -> object:
        fn(next(counter))
        return None

    return run


Setting = Callable[[Callable[[], object]], Callable[[], object]]


def library_sides(job: Any, fold: Any) -> dict[str, Setting]:
    """The library's sides: its defaults, and each of its GPU speed-ups turned off alone (where
    this version of the library has it): the fused fold kernel, and the mean made on the device
    in a world of one. Each wraps a step so that it runs with its setting; the defaults are
    restored after it, so the job's last steps run as a user's would."""
    kernel = fold is not None and bool(getattr(fold, "use_kernel", False))
    local = fold is not None and bool(getattr(job, "_local_mean", False))

    def setting(use_kernel: bool, local_mean: bool) -> Setting:
        def wrap(run: Callable[[], object]) -> Callable[[], object]:
            def step() -> object:
                if kernel:
                    fold.use_kernel = use_kernel
                if local:
                    job._local_mean = local_mean
                try:
                    return run()
                finally:
                    if kernel:
                        fold.use_kernel = True
                    if local:
                        job._local_mean = True

            return step

        return wrap

    sides = {"library": setting(True, True)}
    if kernel:
        sides["library-eager"] = setting(False, True)
    if local:
        sides["library-host-mean"] = setting(True, False)
    return sides


def library_steps(job: Any, w: big_models.Workload) -> Iterator[float]:
    """The job's steps, one per next(): each yields once its optimizer step is done."""
    import virtualflow.torch as vf  # noqa: PLC0415

    state = vf.State(model=w.model, optimizer=w.optimizer)
    for step in job.steps(state, dataset_size=w.dataset_size):
        for node in step.virtual_nodes():
            x, y = w.batch(node.indices)
            node.backward(w.loss(x, y))
        w.optimizer.step()
        w.optimizer.zero_grad()
        yield step.loss


def timed_round(
    device: torch.device, deterministic: bool, steps: int, run: Callable[[], object]
) -> float:
    """Seconds per step of `steps` calls of `run`, the GPU idle at both ends."""
    torch.use_deterministic_algorithms(deterministic)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    sync(device)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=big_models.MODELS, required=True)
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--mode", choices=["timed", "sha"], default="timed")
    ap.add_argument("--sides", default="plain,deterministic,compile")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per side first")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--round-steps", type=int, default=3)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    import virtualflow.torch as vf  # noqa: PLC0415

    job = vf.init()
    vnodes = int(job.spec["virtual_nodes"])
    if int(job.spec["global_batch_size"]) != vnodes * a.micro_batch:
        raise SystemExit("the job's global batch must be virtualNodes x --micro-batch")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # ResNet's stem pooling as slices only where max_pool2d's backward is refused under
    # deterministic algorithms (the same network on every side either way).
    slice_pool = not big_models.max_pool_backward_is_deterministic(device)
    big_models.MATH_ATTENTION = not big_models.attention_is_deterministic(device)
    out = open(a.out, "a", encoding="utf-8")  # noqa: SIM115

    def record(**fields: Any) -> None:
        fields.update(model=a.model, micro_batch=a.micro_batch, vnodes=vnodes, t=time.time())
        out.write(json.dumps(fields) + "\n")
        out.flush()

    record(
        event="start",
        device=str(device),
        slice_pool=slice_pool,
        math_attention=big_models.MATH_ATTENTION,
        pid=os.getpid(),
    )
    lib = big_models.build(a.model, device, tiny=a.tiny, slice_pool=slice_pool)
    record(event="model", **big_models.describe(lib))

    sides: dict[str, tuple[bool, Callable[[], object]]] = {}
    if a.mode == "timed":
        for name in [s for s in a.sides.split(",") if s]:
            w = big_models.build(a.model, device, tiny=a.tiny, slice_pool=slice_pool)
            if name == "compile":
                w.model = torch.compile(w.model, dynamic=False)  # type: ignore[assignment]
            fn = plain_step_fn(
                w, common.Sampler(lib.dataset_size, vnodes * a.micro_batch), vnodes, a.micro_batch
            )
            sides[name] = (name == "deterministic", counted(fn))
        # Every baseline warmed (torch.compile compiles here, before the job's first step).
        for name, (det, run) in sides.items():
            t0 = time.perf_counter()
            timed_round(device, det, a.warmup, run)
            record(event="warm", side=name, seconds=time.perf_counter() - t0)

    steps = library_steps(job, lib)
    t0 = time.perf_counter()
    torch.use_deterministic_algorithms(True)
    for _ in range(a.warmup):
        if next(steps, None) is None:
            break
    record(event="warm", side="library", seconds=time.perf_counter() - t0)
    fold = getattr(job, "_device_fold", None)
    if a.mode == "timed":
        for name, setting in library_sides(job, fold).items():
            sides[name] = (True, setting(lambda: next(steps)))
        names = list(sides)
        for r in range(a.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                det, run = sides[name]
                seconds = timed_round(device, det, a.round_steps, run)
                record(event="round", side=name, round=r, step_seconds=seconds)
    torch.use_deterministic_algorithms(True)
    for _ in steps:  # the job's remaining steps, if any, and its end
        pass
    if device.type == "cuda":
        record(event="memory", peak_bytes=torch.cuda.max_memory_allocated(device))
    record(
        event="end",
        sha256=vf.weights_sha256(lib.model),
        fold_kernel=bool(getattr(fold, "use_kernel", False)),
        device_mean=bool(getattr(job, "_local_mean", False)),
    )
    job.finish()


if __name__ == "__main__":
    main()
