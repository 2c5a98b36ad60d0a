#!/usr/bin/env python3
"""ResNet-50 and GPT-2 small through virtualflow.torch against plain PyTorch, deterministic
PyTorch, torch.compile and DDP, on one GPU, in one call (bench/gpu/big.sh runs it there).

  1. Weights: each model for --sha-steps steps through the library (V=8, exact reduction) on 1
     worker, on 2 workers sharing the GPU, and on 1 worker with the fold as separate PyTorch
     operations (VF_TORCH_FOLD_KERNEL=torch): the three SHA-256 must be equal. Meanwhile, in the
     background, torch.compile fills its on-disk cache with the compile side's graphs, so that
     the timed runs do not wait for the compiler.
  2. Step times: per (model, micro-batch), one `vf run` whose worker (big_worker.py) runs the
     library, the library with the eager fold, plain PyTorch, deterministic PyTorch and
     torch.compile in the same process, round by round in a rotating order.
  3. DDP over 2 processes sharing the GPU (torchrun, Gloo), per (model, micro-batch).
  4. A table: ms per step, and the library's time over each baseline's.

Every stage is skipped once --budget seconds have gone, so a call cut short still returns what
it measured; results go to --out (big.jsonl: one JSON object per line; big.log).

usage: python3 bench/torch/big.py --vf .gpu-py/bin/vf --out DIR [--budget S] [--tiny]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "big_worker.py"
DDP = HERE / "big_ddp.py"

# (model, micro-batch): the targets' configurations first.
CONFIGS = [("resnet50", 32), ("gpt2", 4), ("resnet50", 64), ("gpt2", 8)]
VNODES = 8

JOB = """apiVersion: virtualflow.io/v1alpha1
kind: VirtualFlowJob
metadata: {{name: big-{model}}}
spec:
  virtualNodes: {vnodes}
  globalBatchSize: {batch}
  replicas: {{min: 1, max: {workers}}}
  steps: {steps}
  reduction: exact
  seed: 7
  elasticity: {{policy: elastic, cooldownSeconds: 0}}
  template:
    spec:
      containers:
        - name: worker
          command: [python3, {worker}, --model, {model}, --micro-batch, "{micro}",
                    --out, {out}{more}]
"""


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.out / "big.jsonl"
        self.log = open(self.out / "big.log", "a", encoding="utf-8")  # noqa: SIM115
        self.t0 = time.monotonic()
        self.tmp = Path(tempfile.mkdtemp(prefix="vf-big-"))

    def left(self) -> float:
        return float(self.a.budget) - (time.monotonic() - self.t0)

    def say(self, text: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f} s] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def run(self, cmd: list[str], *, timeout: float, env: dict[str, str] | None = None) -> int:
        """Runs cmd with its output in big.log; its exit status (124 when it ran out of time)."""
        self.log.write("$ " + " ".join(cmd) + "\n")
        self.log.flush()
        try:
            p = subprocess.run(
                cmd,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                timeout=max(timeout, 5),
                env=env,
                check=False,
            )
            return p.returncode
        except subprocess.TimeoutExpired:
            return 124

    def vf_run(
        self,
        model: str,
        micro: int,
        *,
        steps: int,
        workers: int,
        more: str = "",
        env: dict[str, str] | None = None,
        timeout: float,
    ) -> tuple[int, dict[str, Any]]:
        job = self.tmp / f"{model}-{micro}-{workers}-{time.monotonic_ns()}.yaml"
        job.write_text(
            JOB.format(
                model=model,
                vnodes=VNODES,
                batch=VNODES * micro,
                steps=steps,
                workers=workers,
                worker=WORKER,
                micro=micro,
                out=self.jsonl,
                more=more,
            )
        )
        summary = job.with_suffix(".json")
        cmd = [self.a.vf, "run", str(job), "--workers", str(workers), "--timeout", "300"]
        cmd += ["--summary-json", str(summary), "--progress-interval", "0"]
        rc = self.run(cmd, timeout=timeout, env=env)
        data: dict[str, Any] = {}
        if summary.exists():
            data = json.loads(summary.read_text())
        return rc, data

    def record(self, **fields: Any) -> None:
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(fields) + "\n")


def tiny_args(a: argparse.Namespace) -> str:
    return ", --tiny" if a.tiny else ""


def warm_compile(b: Bench, configs: list[tuple[str, int]]) -> list[subprocess.Popen[bytes]]:
    """Background processes that compile the compile side's graphs into the on-disk cache."""
    procs = []
    for model in dict.fromkeys(m for m, _ in configs):
        micros = ",".join(str(mb) for m, mb in configs if m == model)
        cmd = [sys.executable, str(HERE / "big_warm.py"), "--model", model, "--micro-batches"]
        cmd += [micros, "--vnodes", str(VNODES)] + (["--tiny"] if b.a.tiny else [])
        log = open(b.out / f"warm-{model}.log", "w", encoding="utf-8")  # noqa: SIM115
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
    return procs


def stage_weights(b: Bench, models: list[str]) -> None:
    micro = {m: mb for m, mb in reversed(CONFIGS)}  # each model's smaller micro-batch
    for model in models:
        runs = {
            "1": ("1 worker", 1, None),
            "2": ("2 workers", 2, None),
            "1e": ("1 worker, eager fold", 1, {**os.environ, "VF_TORCH_FOLD_KERNEL": "torch"}),
        }
        for label, workers, env in (runs[k] for k in b.a.weights_workers.split(",")):
            if b.left() < 35:
                b.say(f"weights {model} {label}: skipped (time)")
                continue
            rc, summary = b.vf_run(
                model,
                micro[model],
                steps=b.a.sha_steps,
                workers=workers,
                more=", --mode, sha" + tiny_args(b.a),
                env=env,
                timeout=min(150, b.left() - 5),
            )
            sha = summary.get("weights_sha256", "")
            b.record(event="weights", model=model, label=label, rc=rc, sha256=sha)
            b.say(f"weights {model} {label}: rc {rc} sha256 {sha[:16]}")


def stage_timed(b: Bench, configs: list[tuple[str, int]]) -> None:
    a = b.a
    steps = a.warmup + 3 * a.rounds * a.round_steps  # up to three library sides
    for model, micro in configs:
        if b.left() < 45:
            b.say(f"timed {model} micro-batch {micro}: skipped (time)")
            continue
        more = f", --warmup, '{a.warmup}', --rounds, '{a.rounds}', --round-steps, '{a.round_steps}'"
        more += f", --sides, '{a.sides}'"
        rc, _ = b.vf_run(
            model,
            micro,
            steps=steps,
            workers=1,
            more=more + tiny_args(a),
            timeout=min(200, b.left() - 15),
        )
        b.say(f"timed {model} micro-batch {micro}: rc {rc}")


def stage_ddp(b: Bench, configs: list[tuple[str, int]]) -> None:
    for model, micro in configs:
        if b.left() < 30:
            b.say(f"ddp {model} micro-batch {micro}: skipped (time)")
            continue
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
        cmd += ["2", str(DDP), "--model", model, "--micro-batch", str(micro)]
        cmd += ["--vnodes", str(VNODES), "--out", str(b.jsonl)] + (["--tiny"] if b.a.tiny else [])
        rc = b.run(cmd, timeout=min(90, b.left() - 10))
        b.say(f"ddp {model} micro-batch {micro}: rc {rc}")


def table(jsonl: Path) -> str:
    """ms per step of each side per configuration, and the library's ratios."""
    rows = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()]
    rounds: dict[tuple[str, int], dict[str, list[float]]] = {}
    ddp: dict[tuple[str, int], float] = {}
    params: dict[str, int] = {}
    for r in rows:
        key = (r.get("model", ""), int(r.get("micro_batch", 0)))
        if r.get("event") == "round":
            rounds.setdefault(key, {}).setdefault(r["side"], []).append(r["step_seconds"])
        elif r.get("event") == "ddp":
            ddp[key] = r["step_seconds"]
        elif r.get("event") == "model":
            params[r["model"]] = r["parameters"]
    sides = ["library", "library-eager", "library-host-mean", "plain", "deterministic", "compile"]
    lines = ["ms per step (median over rounds), V=8, bfloat16 autocast"]
    head = f"{'model':<9} {'mb':>3} " + " ".join(f"{s:>13}" for s in sides + ["ddp-2"])
    lines.append(head)
    ratios = []
    for key in CONFIGS:
        got = rounds.get(key, {})
        if not got and key not in ddp:
            continue
        med = {s: statistics.median(v) for s, v in got.items()}
        if key in ddp:
            med["ddp-2"] = ddp[key]
        cells = " ".join(
            f"{med[s] * 1e3:>13.1f}" if s in med else f"{'-':>13}" for s in sides + ["ddp-2"]
        )
        lines.append(f"{key[0]:<9} {key[1]:>3} {cells}")
        lib = med.get("library")
        if lib:
            for s in sides[1:] + ["ddp-2"]:
                if s in med:
                    # Per-round ratios where both sides ran in the same round.
                    ratios.append(f"{key[0]} mb {key[1]}: library / {s} = {lib / med[s]:.3f}")
    lines.append("ratios (library's median over the side's median; < 1: the library is faster)")
    lines += ["  " + r for r in ratios]
    weights: dict[str, list[str]] = {}
    for r in rows:
        if r.get("event") == "weights":
            weights.setdefault(r["model"], []).append(f"{r['label']}: {r['sha256'][:16] or 'none'}")
    for model, shas in weights.items():
        same = len({s.split(": ")[1] for s in shas}) == 1 and "none" not in shas[0]
        lines.append(f"weights {model} ({params.get(model, '?')} parameters): {'; '.join(shas)}")
        lines.append(f"  {'the same' if same else 'DIFFERENT'} on every run")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vf", default=shutil.which("vf") or "vf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=420)
    ap.add_argument("--tiny", action="store_true", help="small models: a dry run on a CPU")
    ap.add_argument("--models", default="resnet50,gpt2")
    ap.add_argument("--configs", default="", help="MODEL:MICRO,... (default: all four)")
    ap.add_argument("--weights-workers", default="1,2,1e", help="1, 2, 1e (1, eager fold)")
    ap.add_argument("--stages", default="weights,timed,ddp")
    ap.add_argument("--sha-steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--round-steps", type=int, default=3)
    ap.add_argument("--sides", default="plain,deterministic,compile", help="baselines to time")
    ap.add_argument("--table", help="only print the table of this big.jsonl")
    a = ap.parse_args()
    if a.table:
        print(table(Path(a.table)))
        return
    b = Bench(a)
    models = [m for m in a.models.split(",") if m]
    configs = [(m, mb) for m, mb in CONFIGS if m in models]
    if a.configs:
        wanted = {(c.split(":")[0], int(c.split(":")[1])) for c in a.configs.split(",")}
        configs = [c for c in configs if c in wanted]
    stages = a.stages.split(",")
    b.say(f"big.py: {configs}, stages {stages}, budget {a.budget:.0f} s")
    compiled = "timed" in stages and "compile" in a.sides.split(",")
    warmers = warm_compile(b, configs) if compiled else []
    # The weights' runs where --stages puts them: before the timed runs (the default, while
    # the compiler fills its cache) or after them.
    weights_first = "weights" in stages and (
        "timed" not in stages or stages.index("weights") < stages.index("timed")
    )
    if weights_first:
        stage_weights(b, models)
        stages.remove("weights")
    for p in warmers:
        try:
            p.wait(timeout=max(1, min(240, b.left() - 120)))
        except subprocess.TimeoutExpired:
            b.say("compile warm-up still running: the timed runs compile what it has not")
            p.kill()
    if warmers:
        b.say("compile warm-up done")
    if "timed" in stages:
        stage_timed(b, configs)
    if "weights" in stages:  # asked for after the timed runs
        stage_weights(b, models)
    if "ddp" in stages:
        stage_ddp(b, configs)
    text = table(b.jsonl)
    (b.out / "table.txt").write_text(text + "\n")
    b.say("done")
    print(text)


if __name__ == "__main__":
    main()
