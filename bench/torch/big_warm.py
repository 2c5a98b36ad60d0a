#!/usr/bin/env python3
"""Fills torch.compile's on-disk cache with the compile side of bench/torch/big_worker.py: the
same model under torch.compile(dynamic=False), the same bfloat16 autocast, loss and backward,
at each micro-batch, with deterministic algorithms off as that side runs. Started in the
background by bench/torch/big.py while the weights' runs use the GPU; big_worker.py's compile
then finds its graphs compiled."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import big_models  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=big_models.MODELS, required=True)
    ap.add_argument("--micro-batches", required=True)
    ap.add_argument("--vnodes", type=int, default=8)
    ap.add_argument("--tiny", action="store_true")
    a = ap.parse_args()
    # What virtualflow.init() sets in big_worker.py's process before anything compiles.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    slice_pool = not big_models.max_pool_backward_is_deterministic(device)
    big_models.MATH_ATTENTION = not big_models.attention_is_deterministic(device)
    for micro in (int(m) for m in a.micro_batches.split(",")):
        torch._dynamo.reset()
        torch.use_deterministic_algorithms(False)
        t0 = time.perf_counter()
        w = big_models.build(a.model, device, tiny=a.tiny, slice_pool=slice_pool)
        w.model = torch.compile(w.model, dynamic=False)  # type: ignore[assignment]
        idx = torch.arange(micro)
        for _ in range(2):
            x, y = w.batch(idx)
            (w.loss(x, y) / a.vnodes).backward()
            w.optimizer.step()
            w.optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(f"warm {a.model} micro-batch {micro}: {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
