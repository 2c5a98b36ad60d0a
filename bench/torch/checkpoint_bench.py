#!/usr/bin/env python3
"""A checkpoint of a model of more than 1 GiB of state, written in the background against the
synchronous write of before, in one `vf run` of one worker on the CPU.

The model: an MLP of --layers layers of --width x --width float32 weights (9 x 4096^2: 151M
parameters, 0.60 GB) with SGD momentum (another 0.60 GB): 1.21 GB of state. The job checkpoints
every --every steps; the worker alternates the mode at each checkpoint (virtualflow.torch's
_CHECKPOINT_IN_BACKGROUND: background, then synchronous, then background...), so both are
measured in the same process, interleaved. A step's time runs from the start of its loop body
to the start of the next: it includes the step boundary where the library takes the checkpoint.

Reported, in ms (medians, with the maximum of the background's): a plain step (no checkpoint at
its boundary, no write in flight); the step at whose boundary a background checkpoint is taken
(the copy to host memory); the steps that run while that write is in flight; the step at whose
boundary a synchronous checkpoint is written. Each over a plain step, and each such step over
the plain steps near it (*_over_nearby_plain: a shared machine's load drifts during the run);
writer_seconds: the writer thread's serialization and seal-and-write, per background checkpoint.
The first checkpoint interval is left out (the first copy allocates its buffers).

With --kill, instead: the same job run twice, a static run and one whose rank 0 is killed with
SIGKILL halfway through writing its second background checkpoint (at step 3 x --every, by the
library's fault injection, VF_FAULT_INJECT=worker-0:checkpoint-write@STEP: half the file is
written beside the checkpoint, then the process kills itself). The job resumes from the
checkpoint before it (the synchronous one at 2 x --every), which must be whole, and must end
with the static run's weights SHA-256. Exits 1 if it does not.

usage: nice python3 bench/torch/checkpoint_bench.py --vf build/bin/vf --out DIR
       [--steps 42] [--every 8] [--layers 9] [--width 4096] [--micro-batch 16] [--kill]
(PYTHONPATH must reach the built package, build/python, and python3 have PyTorch.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

JOB = """apiVersion: virtualflow.io/v1alpha1
kind: VirtualFlowJob
metadata: {{name: checkpoint-bench}}
spec:
  virtualNodes: 2
  globalBatchSize: {batch}
  replicas: {{min: 1, max: 1}}
  steps: {steps}
  reduction: exact
  seed: 5
  checkpoint: {{path: {ckpt}, everySteps: {every}}}
  template:
    spec:
      containers:
        - name: worker
          command: [{python}, {worker}, --worker, --out, {records}, --layers, "{layers}",
                    --width, "{width}"]
"""


def worker(args: argparse.Namespace) -> None:
    import torch

    import virtualflow.torch as vf

    job = vf.init()
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    state = vf.State(model=model, optimizer=opt)
    every = int(job.spec["checkpoint_every_steps"])
    timings: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **kw: Any) -> Any:
            t0 = time.monotonic()
            try:
                return fn(*a, **kw)
            finally:
                timings[name] = time.monotonic() - t0

        return run

    # The writer thread's parts, by the names its closure looks up when it runs.
    writer: dict[str, float] = {}

    def timed_writer(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **kw: Any) -> Any:
            t0 = time.monotonic()
            try:
                return fn(*a, **kw)
            finally:
                writer[name] = writer.get(name, 0.0) + time.monotonic() - t0

        return run

    core = vf._core  # type: ignore[attr-defined]
    for owner, attr, name in (
        (vf, "_encode_state", "serialize"),
        (core, "write_checkpoint", "seal_and_write"),
    ):
        setattr(owner, attr, timed_writer(name, getattr(owner, attr)))
    for attr, name in (("_start_checkpoint", "snapshot"), ("_write_checkpoint", "sync_write")):
        setattr(job, attr, timed(name, getattr(job, attr)))

    def writing() -> bool:
        thread = job._background_write._thread
        return thread is not None and thread.is_alive()

    records: list[dict[str, Any]] = []
    last = None
    for step in job.steps(state, dataset_size=1 << 20):
        now = time.monotonic()
        if last is not None:
            records[-1]["seconds"] = now - last
            records[-1]["in_flight_after"] = writing()
            records[-1].update(timings)
            records[-1].update({"writer_" + k: v for k, v in writer.items()})
        timings.clear()
        writer.clear()
        last = now
        # The mode of the checkpoint at this step's end: background at odd checkpoints.
        checkpoint = (step.index + 1) % every == 0
        background = (step.index + 1) // every % 2 == 1
        vf._CHECKPOINT_IN_BACKGROUND = background
        in_flight = writing()
        records.append(
            {
                "step": step.index,
                "checkpoint": ("background" if background else "sync") if checkpoint else "",
                "in_flight_before": in_flight,
            }
        )
        for node in step.virtual_nodes():
            with node.rng():
                x = torch.randn(len(node.indices), args.width)
            node.backward(model(x).square().mean())
        opt.step()
        opt.zero_grad()
    records.pop()  # the last step's end is the final checkpoint, not measured
    job.finish()
    with open(args.out, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def summarize(records: list[dict[str, Any]], every: int) -> dict[str, Any]:
    warm = [r for r in records if r["step"] >= every]  # from the first checkpoint on
    plain = [
        r["seconds"]
        for r in warm
        if not r["checkpoint"] and not r["in_flight_before"] and not r["in_flight_after"]
    ]
    bg = [r for r in warm if r["checkpoint"] == "background"]
    sync = [r for r in warm if r["checkpoint"] == "sync"]
    overlapped = [r["seconds"] for r in warm if not r["checkpoint"] and (r["in_flight_before"])]
    base = statistics.median(plain)

    def local(r: dict[str, Any]) -> float:
        """The ratio of step r to the plain steps nearest it (within two checkpoint intervals):
        the machine's load drifts over a run, and this follows it."""
        near = [
            x["seconds"]
            for x in warm
            if abs(x["step"] - r["step"]) <= 2 * every
            and not x["checkpoint"]
            and not x["in_flight_before"]
            and not x["in_flight_after"]
        ]
        return round(r["seconds"] / statistics.median(near), 3) if near else float("nan")

    while_writing = [r for r in warm if not r["checkpoint"] and r["in_flight_before"]]

    def ms(xs: list[float]) -> float | None:
        return round(1000 * statistics.median(xs), 1) if xs else None

    return {
        "plain_step_ms": ms(plain),
        "plain_steps": len(plain),
        "background_checkpoint_step_ms": ms([r["seconds"] for r in bg]),
        "background_checkpoint_step_max_ms": round(1000 * max(r["seconds"] for r in bg), 1),
        "background_checkpoint_step_over_plain": round(
            statistics.median(r["seconds"] for r in bg) / base, 3
        ),
        "background_checkpoint_step_max_over_plain": round(max(r["seconds"] for r in bg) / base, 3),
        "background_snapshot_ms": ms([r["snapshot"] for r in bg if "snapshot" in r]),
        "background_checkpoints": len(bg),
        "steps_while_writing_ms": ms(overlapped),
        "steps_while_writing_max_over_plain": round(max(overlapped) / base, 3)
        if overlapped
        else None,
        "steps_while_writing": len(overlapped),
        "sync_checkpoint_step_ms": ms([r["seconds"] for r in sync]),
        "sync_checkpoint_step_over_plain": round(
            statistics.median(r["seconds"] for r in sync) / base, 3
        ),
        "sync_write_ms": ms([r["sync_write"] for r in sync if "sync_write" in r]),
        "sync_checkpoints": len(sync),
        "background_checkpoint_step_over_nearby_plain": [local(r) for r in bg],
        "steps_while_writing_over_nearby_plain": [local(r) for r in while_writing],
        "sync_checkpoint_step_over_nearby_plain": [local(r) for r in sync],
        "writer_seconds": [
            round(
                sum(
                    r.get(k, 0.0) for r in warm if r["step"] in range(b["step"], b["step"] + every)
                ),
                2,
            )
            for b in bg
            for k in ("writer_serialize", "writer_seal_and_write")
        ],
    }


def write_job(args: argparse.Namespace, out: Path, name: str) -> tuple[Path, Path]:
    """OUT/NAME.yaml, the job, checkpointing to OUT/NAME.ckpt (both returned), stale files gone."""
    ckpt, records = out / f"{name}.ckpt", out / f"{name}.jsonl"
    for stale in (ckpt, records, *out.glob(f"{name}.ckpt.tmp.*")):
        stale.unlink(missing_ok=True)
    job = out / f"{name}.yaml"
    job.write_text(
        JOB.format(
            batch=2 * args.micro_batch,
            steps=args.steps,
            every=args.every,
            ckpt=ckpt,
            python=sys.executable,
            worker=HERE,
            records=records,
            layers=args.layers,
            width=args.width,
        )
    )
    return job, ckpt


def kill(args: argparse.Namespace) -> int:
    """The --kill check: 0 if the killed and resumed run ends with the static run's weights."""
    killed_at, previous = 3 * args.every, 2 * args.every
    if args.steps <= killed_at:
        sys.exit(f"--kill needs --steps over 3 x --every ({killed_at})")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    for name, fault in (("static", ""), ("killed", f"worker-0:checkpoint-write@{killed_at}")):
        job, ckpt = write_job(args, out, name)
        t0 = time.monotonic()
        run = subprocess.run(
            [args.vf, "run", str(job), "--progress-interval", "0"],
            env={**os.environ, "VF_FAULT_INJECT": fault},
            capture_output=True,
            text=True,
        )
        text = run.stdout + run.stderr
        print(f"--- {name} ({time.monotonic() - t0:.0f} s)\n{text}", flush=True)
        sha = re.search(r"^weights sha256 ([0-9a-f]{64})$", text, re.M)
        resumed = re.search(r"resuming from checkpoint \S+ at step (\d+)", text)
        runs[name] = {
            "status": run.returncode,
            "weights_sha256": sha.group(1) if sha else None,
            "resumed_from_step": int(resumed.group(1)) if resumed else None,
            "half_written_files": len(list(out.glob(f"{name}.ckpt.tmp.*"))),
            "checkpoint_bytes": ckpt.stat().st_size if ckpt.exists() else 0,
            "seconds": round(time.monotonic() - t0, 1),
        }
        ckpt.unlink(missing_ok=True)
        for part in out.glob(f"{name}.ckpt.tmp.*"):
            part.unlink()
    static, killed = runs["static"], runs["killed"]
    ok = (
        static["status"] == killed["status"] == 0
        and static["weights_sha256"] is not None
        and killed["weights_sha256"] == static["weights_sha256"]
        and killed["resumed_from_step"] == previous
        and killed["half_written_files"] == 1
    )
    summary = {"killed_at_step": killed_at, "runs": runs, "same_weights_after_the_kill": ok}
    print(json.dumps(summary, indent=2))
    return 0 if ok else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--vf", default="build/bin/vf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=42)
    ap.add_argument("--every", type=int, default=8)
    ap.add_argument("--layers", type=int, default=9)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--kill", action="store_true", help="kill rank 0 during a write, resume")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.kill:
        sys.exit(kill(args))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    job, ckpt = write_job(args, out, "bench")
    records = out / "bench.jsonl"
    params = args.layers * (args.width * args.width + args.width)
    print(
        f"MLP {args.layers} x {args.width}^2: {params / 1e6:.0f}M parameters, "
        f"{2 * 4 * params / 2**30:.2f} GiB of state with SGD momentum; load average "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )
    t0 = time.monotonic()
    subprocess.run([args.vf, "run", str(job), "--progress-interval", "0"], check=True)
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    summary = summarize(rows, args.every)
    summary["checkpoint_bytes"] = ckpt.stat().st_size
    summary["seconds"] = round(time.monotonic() - t0, 1)
    summary["load_average_after"] = round(os.getloadavg()[0], 2)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    ckpt.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
