"""The transformer example's quality: validation loss through VirtualFlow against plain PyTorch.

examples/torch/gpt.py is trained two ways on the same model, data, global batch, optimizer and
learning-rate schedule:

- plain PyTorch: one process, a whole batch of 64 windows a step, the data order a random
  permutation of the training windows each epoch (torch.Generator seeded per run), dropout from
  PyTorch's global generator;
- VirtualFlow: `vf run examples/torch-gpt.yaml` (8 virtual nodes of 8 windows) on --workers
  workers, the job's seed changed per run.

Each side runs once per seed; the spread of one side's runs is the run-to-run noise that the
difference between the two sides is compared with. The model's initial weights are the
example's own (torch.manual_seed(0) before building it) on both sides; only the data order and
dropout differ between runs.

    PYTHONPATH=build/python ~/.cache/virtualflow/py/bin/python3 bench/torch/gpt_quality.py \\
        --seeds 1 2 3 --workers 2 --out gpt-quality.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
GPT_PATH = ROOT / "examples" / "torch" / "gpt.py"
JOB = ROOT / "examples" / "torch-gpt.yaml"
BATCH = 64


def gpt_module() -> types.ModuleType:
    """examples/torch/gpt.py as a module (its main() is not run)."""
    spec = importlib.util.spec_from_file_location("vf_bench_gpt", GPT_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plain(seed: int, steps: int) -> dict[str, float]:
    """One plain PyTorch run: the example's model and schedule, a whole batch a step."""
    torch.set_num_threads(1)
    g = gpt_module()
    train, val = g.load_corpus()
    samples = (len(train) - 1) // g.CONTEXT
    torch.manual_seed(0)  # the example's initial weights
    model = g.GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, g.warmup_cosine(steps, max(1, steps // 20)))
    torch.manual_seed(seed)  # dropout
    order = torch.Generator().manual_seed(seed)
    perm = torch.randperm(samples, generator=order)
    pos = 0
    started = time.monotonic()
    for _ in range(steps):
        if pos + BATCH > samples:
            perm, pos = torch.randperm(samples, generator=order), 0
        idx = perm[pos : pos + BATCH]
        pos += BATCH
        model.train()
        x, y = g.windows(train, idx)
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
    return {"validation_loss": g.validation_loss(model, val), "seconds": time.monotonic() - started}


def virtualflow(seed: int, steps: int, workers: int, vf: Path) -> dict[str, float]:
    """One `vf run` of the example with the job's seed set to `seed`."""
    text = JOB.read_text()
    lines = [
        f"  seed: {seed}" if line.startswith("  seed:") else line for line in text.splitlines()
    ]
    lines = [f"  steps: {steps}" if line.startswith("  steps:") else line for line in lines]
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "gpt.yaml"
        job.write_text("\n".join(lines) + "\n")
        summary = Path(tmp) / "summary.json"
        started = time.monotonic()
        run = subprocess.run(
            [
                str(vf),
                "run",
                str(job),
                "--workers",
                str(workers),
                "--progress-interval",
                "0",
                "--summary-json",
                str(summary),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - started
        if run.returncode != 0:
            sys.exit(f"vf run failed:\n{run.stdout}\n{run.stderr}")
        result = json.loads(summary.read_text())
    return {
        "validation_loss": result["test_loss"],
        "seconds": seconds,
        "weights_sha256": result["weights_sha256"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1, 2, 3],
        help="one run of each side per seed (default: 1 2 3)",
    )
    ap.add_argument("--steps", type=int, default=1000, help="steps of every run (the example's)")
    ap.add_argument("--workers", type=int, default=2, help="VirtualFlow workers (default 2)")
    ap.add_argument("--vf", type=Path, default=ROOT / "build" / "bin" / "vf", help="the vf binary")
    ap.add_argument("--out", type=Path, help="write the results here as JSON")
    args = ap.parse_args()
    if len(args.seeds) < 2:
        ap.error("--seeds: at least two, to measure the noise")

    runs: dict[str, list[dict[str, float]]] = {"plain": [], "virtualflow": []}
    for seed in args.seeds:
        for side in runs:
            r = (
                plain(seed, args.steps)
                if side == "plain"
                else virtualflow(seed, args.steps, args.workers, args.vf)
            )
            runs[side].append({"seed": seed, **r})
            print(
                f"{side:12s} seed {seed}: validation loss {r['validation_loss']:.4f} "
                f"({r['seconds']:.0f} s)",
                flush=True,
            )
    losses = {side: [r["validation_loss"] for r in rs] for side, rs in runs.items()}
    mean = {side: statistics.mean(v) for side, v in losses.items()}
    noise = max(statistics.stdev(v) for v in losses.values())
    difference = mean["virtualflow"] - mean["plain"]
    # Two standard deviations of the noisier side's runs: the difference between two means of
    # that many runs stays inside it unless the sides differ.
    within = abs(difference) <= 2 * noise
    print(
        f"mean validation loss: plain {mean['plain']:.4f}, VirtualFlow {mean['virtualflow']:.4f}; "
        f"difference {difference:+.4f}; run-to-run standard deviation {noise:.4f}: "
        f"{'within' if within else 'OUTSIDE'} the noise (|difference| <= 2 sd)"
    )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "runs": runs,
                    "mean": mean,
                    "noise_sd": noise,
                    "difference": difference,
                    "within_noise": within,
                    "steps": args.steps,
                    "workers": args.workers,
                    "threads": 1,
                },
                indent=2,
            )
            + "\n"
        )
    sys.exit(0 if within else 1)


if __name__ == "__main__":
    main()
