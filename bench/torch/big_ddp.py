#!/usr/bin/env python3
"""PyTorch DDP over 2 processes for bench/torch/big.py (started by torchrun): ResNet-50 or GPT-2
small, each rank taking its half of the global batch of V micro-batches (V/2 per rank, all but
the last under no_sync()), bfloat16 autocast, Gloo between the ranks (on one GPU NCCL refuses
two ranks). Rank 0 appends its step time (median of the steps after --warmup, the GPU
synchronised at each step's end) to --out as one JSON line.

usage: torchrun --standalone --nproc-per-node 2 bench/torch/big_ddp.py --model M --micro-batch B
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))

import big_models  # noqa: E402
import common  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=big_models.MODELS, required=True)
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--vnodes", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = a.vnodes // world
    if per_rank * world != a.vnodes:
        raise SystemExit(f"{a.vnodes} micro-batches do not split into {world} ranks")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    w = big_models.build(a.model, device, tiny=a.tiny)
    model = DistributedDataParallel(w.model)
    w.model = model
    sampler = common.Sampler(w.dataset_size, a.vnodes * a.micro_batch)
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        mine = sampler.batch(step)[rank * per_rank * a.micro_batch :]
        for k in range(per_rank):
            sync = contextlib.nullcontext() if k == per_rank - 1 else model.no_sync()
            with sync:
                x, y = w.batch(mine[k * a.micro_batch : (k + 1) * a.micro_batch])
                (w.loss(x, y) / per_rank).backward()
        w.optimizer.step()
        w.optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(a.out, "a", encoding="utf-8") as f:
            record = {
                "event": "ddp",
                "model": a.model,
                "micro_batch": a.micro_batch,
                "vnodes": a.vnodes,
                "world": world,
                "step_seconds": statistics.median(times),
                "steps": len(times),
            }
            f.write(json.dumps(record) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
