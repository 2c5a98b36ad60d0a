#!/usr/bin/env python3
"""virtualflow.torch against plain PyTorch, DDP and torchrun elastic, on the example CNN.

Every comparison runs its baseline and VirtualFlow in the same invocation, interleaved round by
round (the order alternates), and reports the median of the per-round ratios. Step times come
from inside the training scripts (each step's end, wall clock, written to $VF_BENCH_TIMES):

  overhead  one worker, V=8 exact reduction, global batch 256 in micro-batches of 32, against
            plain PyTorch accumulating the same 8 micro-batches (loss/8, one optimizer step)
            and against plain PyTorch on the whole batch of 256 at once.
  ddp       2 and 4 workers against DDP (Gloo, one process per rank, torchrun --standalone):
            V = workers (B = 32 x workers, one micro-batch of 32 per rank and step) and V=8
            (B=256, DDP accumulating 8/workers micro-batches per rank under no_sync()).
  resize    from a membership change to the end of the next step: a worker SIGKILLed in the
            middle of a step (2 workers), and a worker added (1 -> 2); VirtualFlow in place
            (vf run, --capacity for the addition) against torchrun elastic (c10d rendezvous,
            --nnodes=1:4, --max-restarts=3, one agent per worker) restarting the script from
            its checkpoint (written after every step). With --patch, VirtualFlow's side runs
            the library with the patch applied (kill_redo_all.patch: survivors compute every
            node of the failed step again, as before they kept their own).

  profile   (alone) where a step's time goes: the library's C++ calls, node.backward(), the
            forward passes, the optimizer, untimed Python; the baselines likewise.
  ab        (alone) the built library against a copy with --patch applied to torch.py:
            step time, CPU time, and whether the final weights keep their bits.

The step time is the median interval between successive step ends of rank 0 after --warmup
steps (exact reduction computes the first step twice, and every process warms its caches). The
CPU ratio beside it compares CPU time per step summed over the job's processes (all threads),
which other work on the machine disturbs much less than wall time. Threads: --threads (default
1) intra-op threads in every process (VirtualFlow's init() reads VF_THREADS; the baselines call
torch.set_num_threads with VF_BENCH_THREADS). Every worker process of both sides runs in a
session of its own, as torchrun starts DDP's ranks (see bench_env).

usage: PATH=$HOME/.cache/virtualflow/py/bin:$PATH python3 bench/torch/bench.py \
           [all|overhead|ddp|resize|profile|ab] [--repeats N] [--threads T] [--out F]

The environment reaches every worker: VF_TORCH_FOLD=device with `ab --patch
bench/torch/gpu_host_fold.patch` measures, on the CPU, the device fold (built) against the
host's fold (patched) in one run.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VF_WORKER = HERE / "vf_worker.py"
PLAIN = HERE / "plain_loop.py"
DDP = HERE / "ddp_loop.py"
ELASTIC = HERE / "elastic_cnn.py"

SAME_SESSIONS = True  # --shared-session turns it off (see bench_env)
DEVICE = "cpu"  # --device: where the CNN trains, on every side (CNN_DEVICE)
THREADS = 1  # --threads: intra-op threads of every process, both sides

JOB = """apiVersion: virtualflow.io/v1alpha1
kind: VirtualFlowJob
metadata: {{name: {name}}}
spec:
  virtualNodes: {vnodes}
  globalBatchSize: {batch}
  replicas: {{min: 1, max: {max_workers}}}
  steps: {steps}
  reduction: {reduction}
  seed: 42
  elasticity: {{policy: elastic, cooldownSeconds: 0}}
  template:
    spec:
      containers:
        - name: worker
          image: virtualflow/torch-agent:0.1.0
          command: [python3, {script}]
"""


# Running things -------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one run left: the step records of $VF_BENCH_TIMES and, for vf run, its summary."""

    records: list[dict[str, Any]]
    summary: dict[str, Any] | None = None
    wall: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bench_env(times: Path, **more: str) -> dict[str, str]:
    env = dict(os.environ)
    env["VF_BENCH_TIMES"] = str(times)
    env["VF_BENCH_THREADS"] = str(THREADS)
    env["VF_THREADS"] = str(THREADS)
    env["OMP_NUM_THREADS"] = str(THREADS)
    # Every worker process of either side in a session of its own (torchrun starts each rank
    # with start_new_session=True; vf_worker.py calls setsid(); the plain loop is started so):
    # with autogroup scheduling the kernel shares CPU time between sessions first, so on a
    # machine other work also uses, both sides must be split the same way.
    env["VF_BENCH_SETSID"] = "1" if SAME_SESSIONS else "0"
    env.pop("VF_BENCH_KILL_STEP", None)
    env["CNN_DEVICE"] = DEVICE  # where every side's model and data live (cnn.device())
    env.update(more)
    return env


def check(p: subprocess.CompletedProcess[str], what: str) -> None:
    if p.returncode != 0:
        sys.exit(f"{what} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")


def run_vf(
    vf: str,
    tmp: Path,
    *,
    vnodes: int,
    batch: int,
    steps: int,
    max_workers: int,
    workers: int = 0,
    capacity: str = "",
    env_more: dict[str, str] | None = None,
    reduction: str = "exact",
) -> Outcome:
    job = tmp / "job.yaml"
    job.write_text(
        JOB.format(
            name="bench-torch-cnn",
            vnodes=vnodes,
            batch=batch,
            steps=steps,
            max_workers=max_workers,
            reduction=reduction,
            script=VF_WORKER,
        )
    )
    times, summary = tmp / "vf.jsonl", tmp / "summary.json"
    for f in (times, summary):
        f.unlink(missing_ok=True)
    cmd = [vf, "run", str(job), "--summary-json", str(summary), "--progress-interval", "0"]
    cmd += ["--capacity", capacity] if capacity else ["--workers", str(workers)]
    t0 = time.time()
    p = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env=bench_env(times, **(env_more or {}))
    )
    check(p, " ".join(cmd))
    return Outcome(
        read_records(times), json.loads(summary.read_text()), time.time() - t0, {"stdout": p.stdout}
    )


def run_plain(
    tmp: Path, *, mode: str, steps: int, env_more: dict[str, str] | None = None
) -> Outcome:
    times = tmp / "plain.jsonl"
    times.unlink(missing_ok=True)
    cmd = [sys.executable, str(PLAIN), "--mode", mode, "--steps", str(steps)]
    t0 = time.time()
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=bench_env(times, **(env_more or {})),
        start_new_session=SAME_SESSIONS,
    )
    check(p, " ".join(cmd))
    return Outcome(read_records(times), wall=time.time() - t0)


def torchrun() -> str:
    exe = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if not exe:
        sys.exit(
            "torchrun not found: run with the venv's python3 "
            "(PATH=$HOME/.cache/virtualflow/py/bin:$PATH)"
        )
    return exe


def run_ddp(
    tmp: Path, *, world: int, batch: int, steps: int, env_more: dict[str, str] | None = None
) -> Outcome:
    times = tmp / "ddp.jsonl"
    times.unlink(missing_ok=True)
    cmd = [
        torchrun(),
        "--standalone",
        f"--nproc-per-node={world}",
        str(DDP),
        "--global-batch",
        str(batch),
        "--steps",
        str(steps),
    ]
    t0 = time.time()
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=bench_env(times, **(env_more or {}))
    )
    check(p, " ".join(cmd))
    return Outcome(read_records(times), wall=time.time() - t0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_agent(
    tmp: Path,
    times: Path,
    ckpt: Path,
    *,
    host: bool,
    port: int,
    run_id: str,
    steps: int,
    after: int,
    log: str,
    env_more: dict[str, str],
) -> subprocess.Popen[str]:
    cmd = [
        torchrun(),
        "--nnodes=1:4",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        "--max-restarts=3",
        f"--rdzv-conf=last_call_timeout=1,is_host={1 if host else 0}",
        str(ELASTIC),
        "--checkpoint",
        str(ckpt),
        "--steps",
        str(steps),
        "--after-restart",
        str(after),
    ]
    out = open(tmp / log, "w")
    # With the agent's TCP store shared (torch's default), an agent joining a running job waits
    # forever for the new round's MASTER_ADDR: the old rank 0 has built its store information
    # already and does not publish it again (see pytorch/pytorch#135712 for the same sharing and
    # restarts). The documented opt-out makes every round publish it.
    env = bench_env(times, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **env_more)
    return subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )


def wait_agents(agents: list[subprocess.Popen[str]], tmp: Path, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    for i, a in enumerate(agents):
        try:
            a.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for b in agents:
                if b.poll() is None:
                    os.killpg(b.pid, signal.SIGKILL)
            sys.exit(f"torchrun agents did not finish in {timeout:.0f} s; logs in {tmp}")
        if a.returncode != 0:
            logs = "".join(
                (tmp / f).read_text()[-2000:]
                for f in ("agent0.log", "agent1.log")
                if (tmp / f).exists()
            )
            sys.exit(f"torchrun agent {i} failed ({a.returncode}):\n{logs}")


# Step times -----------------------------------------------------------------------------------


def rank0_steps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    steps = [r for r in records if r.get("event") == "step" and r.get("rank") == 0]
    return sorted(steps, key=lambda r: r["t_end"])


def step_time(o: Outcome, warmup: int) -> float:
    """Median interval between successive step ends of rank 0, after `warmup` steps."""
    steps = rank0_steps(o.records)[warmup:]
    gaps: list[float] = [
        b["t_end"] - a["t_end"] for a, b in itertools.pairwise(steps) if b["step"] == a["step"] + 1
    ]
    if len(gaps) < 3:
        sys.exit(f"too few steps recorded ({len(steps)} after warm-up)")
    return statistics.median(gaps)


def step_cpu(o: Outcome, warmup: int) -> float:
    """Median CPU time per step summed over the job's processes (each process's user + system
    time between successive step ends, all its threads), after `warmup` steps. Far less
    sensitive than wall time to other work on the machine; excludes the `vf` launcher process
    (0.2% of a core in steady state) and torchrun's agent."""
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for r in o.records:
        if r.get("event") == "step" and "cpu" in r:
            by_pid.setdefault(r["pid"], []).append(r)
    per_step: dict[int, float] = {}
    for recs in by_pid.values():
        recs.sort(key=lambda r: r["step"])
        for a, b in itertools.pairwise(recs):
            if b["step"] == a["step"] + 1 and a["step"] >= warmup:
                per_step[b["step"]] = per_step.get(b["step"], 0.0) + b["cpu"] - a["cpu"]
    if len(per_step) < 3:
        sys.exit("too few steps recorded for CPU time")
    return statistics.median(per_step.values())


def load_average() -> float:
    return os.getloadavg()[0]


def interleaved(
    rounds: int, warmup: int, sides: dict[str, Callable[[], Outcome]]
) -> dict[str, list[float]]:
    """Runs each side once per round, rotating the order. Returns for each side its wall-clock
    step times (key = side) and CPU times per step (key = side + "_cpu"), and "load"."""
    names = list(sides)
    values: dict[str, list[float]] = {n: [] for n in names}
    values.update({n + "_cpu": [] for n in names})
    values["load"] = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            o = sides[n]()
            values[n].append(step_time(o, warmup))
            values[n + "_cpu"].append(step_cpu(o, warmup))
        values["load"].append(load_average())
        print(
            f"  round {r + 1}/{rounds}: "
            + ", ".join(
                f"{n} {1000 * values[n][-1]:.1f} ms (cpu {1000 * values[n + '_cpu'][-1]:.1f})"
                for n in names
            )
            + f" (load {values['load'][-1]:.2f})",
            flush=True,
        )
    return values


def compare(values: dict[str, list[float]], vf: str, base: str) -> dict[str, Any]:
    """The row fields of one comparison: medians, median of per-round ratios, wall and CPU."""
    return {
        "vf_s": med(values[vf]),
        "base_s": med(values[base]),
        "ratio": med(ratios(values[vf], values[base])),
        "ratios": ratios(values[vf], values[base]),
        "vf_cpu_s": med(values[vf + "_cpu"]),
        "base_cpu_s": med(values[base + "_cpu"]),
        "cpu_ratio": med(ratios(values[vf + "_cpu"], values[base + "_cpu"])),
        "cpu_ratios": ratios(values[vf + "_cpu"], values[base + "_cpu"]),
        "load": values["load"],
        "vf_all": values[vf],
        "base_all": values[base],
    }


def ratios(num: list[float], den: list[float]) -> list[float]:
    return [a / b for a, b in zip(num, den, strict=True)]


def med(xs: list[float]) -> float:
    return statistics.median(xs)


# Benchmarks -----------------------------------------------------------------------------------


def bench_overhead(a: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    steps = a.warmup + a.steps
    print(
        f"overhead: 1 worker, B=256, micro-batch 32, {a.steps} timed steps after {a.warmup}, "
        f"{a.repeats} rounds",
        flush=True,
    )
    sides = {
        "vf": lambda: run_vf(a.vf, tmp, vnodes=8, batch=256, steps=steps, max_workers=1, workers=1),
        "accum": lambda: run_plain(tmp, mode="accum", steps=steps),
        "whole": lambda: run_plain(tmp, mode="whole", steps=steps),
    }
    if a.device == "cuda":
        # virtualflow.init() turns on torch.use_deterministic_algorithms (bitwise identity
        # needs it), which costs a GPU's kernels more than a CPU's: the same plain loop with it
        # on separates that price from the library's own.
        sides["accum_det"] = lambda: run_plain(
            tmp, mode="accum", steps=steps, env_more={"VF_BENCH_DETERMINISTIC": "1"}
        )
    v = interleaved(a.repeats, a.warmup, sides)
    rows = [
        {
            "bench": "overhead",
            "case": "1 worker, V=8 exact vs plain accumulation of 8 x 32",
            "baseline": "plain PyTorch, 8 micro-batches of 32, loss/8",
            "target": 1.05,
            **compare(v, "vf", "accum"),
        },
        {
            "bench": "overhead",
            "case": "1 worker, V=8 exact vs plain whole batch of 256",
            "baseline": "plain PyTorch, one batch of 256",
            "target": None,
            **compare(v, "vf", "whole"),
        },
    ]
    if "accum_det" in v:
        rows.insert(
            1,
            {
                "bench": "overhead",
                "case": "1 worker, V=8 exact vs plain accumulation, deterministic",
                "baseline": "plain PyTorch, 8 x 32, use_deterministic_algorithms(True)",
                "target": None,
                **compare(v, "vf", "accum_det"),
            },
        )
    return rows


def bench_ddp(a: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for world in a.workers:
        for vnodes in (world, 8):
            batch = 32 * vnodes
            # Short steps need more of them to time well.
            steps = a.warmup + (a.steps if batch >= 256 else 2 * a.steps)
            label = f"{world} workers, V={vnodes}, B={batch}, {vnodes // world} x 32 per rank" + (
                " (oversubscribed: 2 cores)" if world > 2 else ""
            )
            print(f"ddp: {label}, {a.repeats} rounds", flush=True)
            v = interleaved(
                a.repeats,
                a.warmup,
                {
                    "vf": functools.partial(
                        run_vf,
                        a.vf,
                        tmp,
                        vnodes=vnodes,
                        batch=batch,
                        steps=steps,
                        max_workers=world,
                        workers=world,
                    ),
                    "ddp": functools.partial(run_ddp, tmp, world=world, batch=batch, steps=steps),
                },
            )
            rows.append(
                {
                    "bench": "ddp",
                    "case": label,
                    "workers": world,
                    "vnodes": vnodes,
                    "batch": batch,
                    "baseline": "DDP Gloo" + (" + no_sync" if vnodes > world else ""),
                    "target": 1.10,
                    **compare(v, "vf", "ddp"),
                }
            )
    return rows


def first_end_after(records: list[dict[str, Any]], t: float) -> dict[str, Any]:
    after = [r for r in records if r.get("event") == "step" and r["t_end"] > t]
    if not after:
        sys.exit("no step ended after the change")
    return min(after, key=lambda r: r["t_end"])


def run_vf_resize(
    a: argparse.Namespace, tmp: Path, *, steps: int, env_more: dict[str, str], **kw: Any
) -> Outcome:
    """A resize comparison's VirtualFlow run (V=8, B=256, at most 2 workers), with the library
    patched by --patch if it was given."""
    if a.patch:
        if not hasattr(a, "resize_library"):
            a.resize_library = str(patched_library(tmp / "resize-lib", a.vf, Path(a.patch)))
        env_more = {**env_more, "VF_BENCH_LIBRARY": a.resize_library}
    return run_vf(
        a.vf, tmp, vnodes=8, batch=256, steps=steps, max_workers=2, env_more=env_more, **kw
    )


def vf_kill(a: argparse.Namespace, tmp: Path) -> dict[str, float]:
    at = a.warmup + 3
    (tmp / "vf.kill").unlink(missing_ok=True)
    o = run_vf_resize(
        a,
        tmp,
        steps=at + 8,
        workers=2,
        env_more={
            "VF_BENCH_KILL_STEP": str(at),
            "VF_BENCH_KILL_MARK": str(tmp / "vf.kill"),
            "VF_BENCH_NODE_TIMES": "1",
        },
    )
    (tmp / "vf.kill").unlink(missing_ok=True)
    kill = [r for r in o.records if r.get("event") == "kill"]
    if len(kill) != 1:
        sys.exit(f"expected one kill, got {kill}")
    t_kill = kill[0]["t"]
    nxt = first_end_after(o.records, t_kill)
    assert o.summary is not None
    failure = [r for r in o.summary["resizes"] if r["from"] == 2 and r["to"] == 1]
    pause = failure[0]["pause_seconds"] if failure else float("nan")
    # The survivor's nodes of the redone step (under the new plan): when the first began (the
    # survivor finished its own nodes, its reduction failed, it followed the plan without the
    # dead worker) and how many it computed.
    redo = [
        r
        for r in o.records
        if r.get("event") == "node"
        and r["step"] == nxt["step"]
        and r["pid"] == nxt["pid"]
        and r["t"] > t_kill
        and r["world"] == nxt.get("world")
    ]
    resumed = min(r["t"] for r in redo) if redo else float("nan")
    return {
        "seconds": nxt["t_end"] - t_kill,
        "pause": pause,
        "to_recompute_start": resumed - t_kill,
        "recomputed_nodes": len(redo),
        "recompute": nxt["t_end"] - resumed,
        "world_after": nxt.get("world", 0),
        "recoveries": o.summary["recoveries"],
    }


def vf_add(a: argparse.Namespace, tmp: Path) -> dict[str, float]:
    at = a.warmup + 3
    o = run_vf_resize(a, tmp, steps=at + 30, capacity=f"0:1,{at}:2", env_more={})
    assert o.summary is not None
    grow = [r for r in o.summary["resizes"] if r["from"] == 1 and r["to"] == 2]
    if len(grow) != 1:
        sys.exit(f"expected one 1 -> 2 resize, got {o.summary['resizes']}")
    steps = rank0_steps(o.records)
    i = next((k for k, r in enumerate(steps) if r.get("world") == 2), None)
    if not i:
        sys.exit("the added worker never trained")
    before, after = steps[i - 1], steps[i]
    return {
        "seconds": after["t_end"] - before["t_end"],
        "pause": grow[0]["pause_seconds"],
        "next_step": after["t_end"] - after["t_start"],
        "joined_at_step": after["step"],
    }


def torchrun_kill(a: argparse.Namespace, tmp: Path) -> dict[str, float]:
    times, ckpt = tmp / "tr.jsonl", tmp / "tr.ckpt"
    for f in (times, ckpt, tmp / "tr.kill"):
        f.unlink(missing_ok=True)
    at = a.warmup + 3
    port, run_id = free_port(), f"kill{time.time_ns()}"
    env = {"VF_BENCH_KILL_STEP": str(at), "VF_BENCH_KILL_MARK": str(tmp / "tr.kill")}
    agents = [
        start_agent(
            tmp,
            times,
            ckpt,
            host=i == 0,
            port=port,
            run_id=run_id,
            steps=200,
            after=4,
            log=f"agent{i}.log",
            env_more=env,
        )
        for i in range(2)
    ]
    wait_agents(agents, tmp)
    rec = read_records(times)
    kill = [r for r in rec if r.get("event") == "kill"]
    if len(kill) != 1:
        sys.exit(f"expected one kill, got {kill}; logs in {tmp}")
    t_kill = kill[0]["t"]
    nxt = first_end_after(rec, t_kill)
    starts = [r["t"] for r in rec if r.get("event") == "start" and r["t"] > t_kill]
    ready = [r["t"] for r in rec if r.get("event") == "ready" and r["t"] > t_kill]
    return {
        "seconds": nxt["t_end"] - t_kill,
        "restart_at": min(starts) - t_kill if starts else -1,
        "ready_at": max(ready) - t_kill if ready else -1,
        "next_step": nxt["t_end"] - nxt["t_start"],
        "world_after": nxt.get("world", 0),
    }


def torchrun_add(a: argparse.Namespace, tmp: Path) -> dict[str, float]:
    times, ckpt = tmp / "tr.jsonl", tmp / "tr.ckpt"
    for f in (times, ckpt):
        f.unlink(missing_ok=True)
    port, run_id = free_port(), f"add{time.time_ns()}"
    at = a.warmup + 3
    first = start_agent(
        tmp,
        times,
        ckpt,
        host=True,
        port=port,
        run_id=run_id,
        steps=200,
        after=4,
        log="agent0.log",
        env_more={},
    )
    deadline = time.time() + 120
    while len([r for r in read_records(times) if r.get("event") == "step"]) < at:
        if first.poll() is not None or time.time() > deadline:
            sys.exit(f"the first torchrun agent did not train; logs in {tmp}")
        time.sleep(0.05)
    t_launch = time.time()
    second = start_agent(
        tmp,
        times,
        ckpt,
        host=False,
        port=port,
        run_id=run_id,
        steps=200,
        after=4,
        log="agent1.log",
        env_more={},
    )
    wait_agents([first, second], tmp)
    rec = read_records(times)
    old = [r for r in rec if r.get("event") == "step" and r.get("world") == 1]
    new = [r for r in rec if r.get("event") == "step" and r.get("world") == 2]
    if not old or not new:
        sys.exit(f"the job did not grow from 1 to 2 ranks; logs in {tmp}")
    last_old = max(old, key=lambda r: r["t_end"])
    first_new = min(new, key=lambda r: r["t_end"])
    term = [r["t"] for r in rec if r.get("event") == "sigterm"]
    t_stop = min(term) if term else last_old["t_end"]
    return {
        "seconds": first_new["t_end"] - last_old["t_end"],
        "from_stop": first_new["t_end"] - t_stop,
        "agent_launch_to_stop": t_stop - t_launch,
        "next_step": first_new["t_end"] - first_new["t_start"],
    }


def bench_resize(a: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for event, vf_fn, tr_fn, label in (
        ("kill", vf_kill, torchrun_kill, "worker SIGKILLed mid-step (2 workers)"),
        ("add", vf_add, torchrun_add, "worker added (1 -> 2)"),
    ):
        print(f"resize: {label}, {a.repeats} rounds", flush=True)
        got: dict[str, list[dict[str, float]]] = {"vf": [], "torchrun": []}
        loads = []
        for r in range(a.repeats):
            order = [("vf", vf_fn), ("torchrun", tr_fn)]
            for name, fn in order if r % 2 == 0 else order[::-1]:
                got[name].append(fn(a, tmp))
            loads.append(load_average())

            def show(d: dict[str, float]) -> str:
                return " ".join(
                    f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in d.items()
                )

            print(
                f"  round {r + 1}/{a.repeats} (load {loads[-1]:.2f}):\n"
                f"    vf       {show(got['vf'][-1])}\n    torchrun {show(got['torchrun'][-1])}",
                flush=True,
            )
        vf_s = [x["seconds"] for x in got["vf"]]
        tr_s = [x["seconds"] for x in got["torchrun"]]
        rows.append(
            {
                "bench": "resize",
                "case": label,
                "event": event,
                "baseline": "torchrun elastic, checkpoint restart",
                "vf_s": med(vf_s),
                "base_s": med(tr_s),
                "ratio": med(ratios(vf_s, tr_s)),
                "ratios": ratios(vf_s, tr_s),
                "target": 0.1,
                "target_vf_under_s": 1.0,
                "load": loads,
                "vf_all": got["vf"],
                "base_all": got["torchrun"],
            }
        )
    return rows


def profile_of(o: Outcome, warmup: int) -> dict[str, float]:
    """Mean seconds per step of each timed component (rank 0, after the warm-up), the mean step
    period over the same steps, and what no timer covers ("rest": the period less the timed
    parts; means, so that the parts add up)."""
    recs = [r for r in o.records if r.get("event") == "profile" and r.get("rank", 0) == 0]
    recs = sorted(recs, key=lambda r: r["step"])[warmup:]
    skip = {
        "event",
        "step",
        "rank",
        "world",
        "pid",
        "system",
        "threads",
        "worker",
        "micro_batches_per_rank",
    }
    keys = sorted({k for r in recs for k in r if k not in skip})
    out = {k: statistics.fmean([r.get(k, 0.0) for r in recs]) for k in keys}
    steps = rank0_steps(o.records)[warmup:]
    out["step period"] = (steps[-1]["t_end"] - steps[0]["t_end"]) / (len(steps) - 1)
    out["rest (untimed Python)"] = out["step period"] - sum(out[k] for k in keys)
    return out


def bench_profile(a: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """Where the time goes: VirtualFlow's step split into the library's C++ calls, node.backward(),
    the user's forward and optimizer step, and untimed Python; the baseline's likewise."""
    env = {"VF_BENCH_PROFILE": "1"}
    steps = a.warmup + a.steps
    cases: list[tuple[str, Callable[[], Outcome], Callable[[], Outcome], int]] = [
        (
            "1 worker, V=8, B=256 vs plain accumulation",
            lambda: run_vf(
                a.vf, tmp, vnodes=8, batch=256, steps=steps, max_workers=1, workers=1, env_more=env
            ),
            lambda: run_plain(tmp, mode="accum", steps=steps, env_more=env),
            8,
        ),
        (
            "2 workers, V=2, B=64 vs DDP",
            lambda: run_vf(
                a.vf,
                tmp,
                vnodes=2,
                batch=64,
                steps=a.warmup + 2 * a.steps,
                max_workers=2,
                workers=2,
                env_more=env,
            ),
            lambda: run_ddp(tmp, world=2, batch=64, steps=a.warmup + 2 * a.steps, env_more=env),
            1,
        ),
        (
            "2 workers, V=8, B=256 vs DDP + no_sync",
            lambda: run_vf(
                a.vf, tmp, vnodes=8, batch=256, steps=steps, max_workers=2, workers=2, env_more=env
            ),
            lambda: run_ddp(tmp, world=2, batch=256, steps=steps, env_more=env),
            4,
        ),
        (
            "4 workers, V=4, B=128 vs DDP (oversubscribed)",
            lambda: run_vf(
                a.vf,
                tmp,
                vnodes=4,
                batch=128,
                steps=a.warmup + 2 * a.steps,
                max_workers=4,
                workers=4,
                env_more=env,
            ),
            lambda: run_ddp(tmp, world=4, batch=128, steps=a.warmup + 2 * a.steps, env_more=env),
            1,
        ),
    ]
    if DEVICE == "cuda":
        cases = cases[:1]  # one GPU holds no DDP world
    rows = []
    for label, vf_fn, base_fn, nodes in cases:
        print(f"profile: {label}, {a.repeats} rounds", flush=True)
        vfs: list[dict[str, float]] = []
        bases: list[dict[str, float]] = []
        for r in range(a.repeats):
            pair = [(vfs, vf_fn), (bases, base_fn)]
            for dest, fn in pair if r % 2 == 0 else pair[::-1]:
                dest.append(profile_of(fn(), a.warmup))
        vf_p = {k: med([p.get(k, 0.0) for p in vfs]) for k in vfs[0]}
        base_p = {k: med([p.get(k, 0.0) for p in bases]) for k in bases[0]}
        print(f"  {'ms per step (median of rounds)':<34} {'VirtualFlow':>12} {'baseline':>10}")
        for k in sorted(set(vf_p) | set(base_p), key=lambda k: (k == "step period", k)):
            v = f"{1000 * vf_p[k]:.2f}" if k in vf_p else ""
            b = f"{1000 * base_p[k]:.2f}" if k in base_p else ""
            print(f"  {k:<34} {v:>12} {b:>10}")
        print(f"  ({nodes} virtual nodes / micro-batches per worker and step)", flush=True)
        rows.append(
            {
                "bench": "profile",
                "case": label,
                "nodes_per_worker": nodes,
                "vf_ms": {k: 1000 * x for k, x in vf_p.items()},
                "base_ms": {k: 1000 * x for k, x in base_p.items()},
                "vf_rounds": vfs,
                "base_rounds": bases,
            }
        )
    return rows


def patched_library(tmp: Path, vf: str, patch: Path) -> Path:
    """A copy of the built virtualflow package (its C++ extension linked, not copied) with
    `patch` applied to torch.py (paths a/python/virtualflow/...)."""
    built = Path(vf).resolve().parents[1] / "python" / "virtualflow"
    lib = tmp / "patched"
    shutil.rmtree(lib, ignore_errors=True)
    (lib / "virtualflow").mkdir(parents=True)
    for f in built.iterdir():
        if f.suffix == ".so":
            (lib / "virtualflow" / f.name).symlink_to(f)
        elif f.is_file():
            shutil.copy(f, lib / "virtualflow" / f.name)
    p = subprocess.run(
        ["patch", "-p3", "-d", str(lib / "virtualflow"), "-i", str(patch.resolve())],
        capture_output=True,
        text=True,
    )
    check(p, f"patch -i {patch}")
    return lib


def bench_ab(a: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """The built library against the same with --patch applied, interleaved: step time, CPU
    time, and whether the final weights are bitwise the same."""
    a.patch = a.patch or str(HERE / "gpu_node_host.patch")
    lib = patched_library(tmp, a.vf, Path(a.patch))
    return [ab_row(a, tmp, lib, world, vnodes=8, batch=256) for world in a.worlds]


def ab_row(
    a: argparse.Namespace, tmp: Path, lib: Path, world: int, vnodes: int, batch: int
) -> dict[str, Any]:
    """bench_ab's comparison on `world` workers."""
    steps = a.warmup + a.steps
    label = f"{world} worker{'s' if world > 1 else ''}, V={vnodes}, B={batch}: patched / built"
    print(f"ab: {label}, {a.repeats} rounds ({a.patch})", flush=True)
    shas: dict[str, set[str]] = {"built": set(), "patched": set()}

    def run(which: str) -> Outcome:
        o = run_vf(
            a.vf,
            tmp,
            vnodes=vnodes,
            batch=batch,
            steps=steps,
            max_workers=world,
            workers=world,
            env_more={"VF_BENCH_LIBRARY": str(lib)} if which == "patched" else {},
        )
        assert o.summary is not None
        shas[which].add(o.summary["weights_sha256"])
        return o

    v = interleaved(
        a.repeats, a.warmup, {"built": lambda: run("built"), "patched": lambda: run("patched")}
    )
    same = len(shas["built"]) == 1 and shas["built"] == shas["patched"]
    print(
        f"  final weights: {'bitwise the same' if same else 'DIFFERENT'} "
        f"({', '.join(sorted(shas['built'] | shas['patched']))[:80]})",
        flush=True,
    )
    return {
        "bench": "ab",
        "case": label,
        "baseline": "built library",
        "target": None,
        "same_weights": same,
        **compare(v, "patched", "built"),
    }


# Output ---------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch  # noqa: PLC0415 (only for the versions)

    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else None
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads_per_process": THREADS,
        "device": DEVICE,
        "gpu": gpu,
        "load_at_end": os.getloadavg(),
    }


def verdict(row: dict[str, Any]) -> str:
    t = row.get("target")
    if row["bench"] == "ab":
        return "same bits" if row["same_weights"] else "BITS DIFFER"
    if t is None:
        return "(no target)"
    ok = row["ratio"] <= t and row["vf_s"] < row.get("target_vf_under_s", float("inf"))
    return "met" if ok else "NOT met"


def print_table(rows: list[dict[str, Any]]) -> None:
    print()
    print(
        f"{'benchmark':<9} {'case':<66} {'VF s':>7} {'base s':>7} {'ratio':>6} "
        f"{'per round':<36} {'target':>7} {'verdict':<7} {'CPU ratio':>9}"
    )
    for r in rows:
        if r["bench"] == "profile":
            continue
        per = ",".join(f"{x:.3f}" for x in r["ratios"])
        t = "" if r.get("target") is None else f"<={r['target']:.2f}"
        cpu = f"{r['cpu_ratio']:.3f}" if "cpu_ratio" in r else ""
        print(
            f"{r['bench']:<9} {r['case']:<66} {r['vf_s']:>7.3f} {r['base_s']:>7.3f} "
            f"{r['ratio']:>6.3f} {per:<36} {t:>7} {verdict(r):<7} {cpu:>9}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=(
            "virtualflow.torch against plain PyTorch, DDP and torchrun elastic (the example CNN)"
        ),
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "which",
        nargs="?",
        default="all",
        choices=["all", "overhead", "ddp", "resize", "profile", "ab"],
        help="which comparison (all: overhead, ddp, resize; profile and ab run alone)",
    )
    ap.add_argument("--vf", default=str(ROOT / "build" / "bin" / "vf"), help="the vf binary")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds per comparison")
    ap.add_argument(
        "--steps",
        type=int,
        default=12,
        help="timed steps per run (B=256; twice as many at smaller global batches)",
    )
    ap.add_argument("--warmup", type=int, default=4, help="steps skipped before timing")
    ap.add_argument(
        "--patch",
        help="ab: the change to python/virtualflow/torch.py to measure (one that "
        "applies to the current torch.py; bench/torch/gpu_*.patch; default "
        "gpu_node_host.patch); resize: run VirtualFlow's side with it "
        "(bench/torch/kill_redo_all.patch)",
    )
    ap.add_argument(
        "--shared-session",
        action="store_true",
        help="leave VirtualFlow's workers and the plain loop in this session (torchrun "
        "still gives each rank its own): shows the autogroup effect",
    )
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4], help="ddp: worker counts")
    ap.add_argument(
        "--worlds", type=int, nargs="+", default=[1, 2], help="ab: worker counts (V=8, B=256 each)"
    )
    ap.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="where every side trains (cuda: overhead and profile only, since one GPU "
        "cannot hold DDP's or torchrun's ranks: NCCL refuses two on one device)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads of every process of both sides (VF_THREADS, "
        "VF_BENCH_THREADS, OMP_NUM_THREADS)",
    )
    ap.add_argument("--out", help="write every measurement as JSON to this file")
    a = ap.parse_args()
    global SAME_SESSIONS, DEVICE, THREADS
    SAME_SESSIONS = not a.shared_session
    DEVICE = a.device
    THREADS = a.threads
    if DEVICE == "cuda" and a.which not in ("overhead", "profile", "ab"):
        sys.exit("--device cuda runs overhead, profile or ab (one GPU holds no DDP world)")
    if not Path(a.vf).exists():
        sys.exit(f"{a.vf} not found: build first (scripts/build.sh)")
    started = time.time()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="vf-bench-torch-") as t:
        tmp = Path(t)
        if a.which in ("all", "overhead"):
            rows += bench_overhead(a, tmp)
        if a.which in ("all", "ddp"):
            rows += bench_ddp(a, tmp)
        if a.which in ("all", "resize"):
            rows += bench_resize(a, tmp)
        if a.which == "profile":
            rows += bench_profile(a, tmp)
        if a.which == "ab":
            rows += bench_ab(a, tmp)
    print_table(rows)
    info = machine()
    on = f", on {info['gpu']}" if info["gpu"] else ""
    print(
        f"\n{info['nproc']} x {info['cpu']}{on}, torch {info['torch']}, 1 thread per process, "
        f"{time.time() - started:.0f} s, load average at end {info['load_at_end'][0]:.2f}"
    )
    if a.out:
        Path(a.out).write_text(
            json.dumps(
                {"machine": info, "args": vars(a), "rows": rows, "seconds": time.time() - started},
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
