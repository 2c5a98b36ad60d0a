#!/usr/bin/env python3
"""PyTorch DDP (Gloo), one process per rank, started by torchrun: each rank takes its share of
the global batch in micro-batches; all but the last run under `no_sync()` (gradient
accumulation), each loss divided by the rank's micro-batch count; DDP averages over the ranks,
so every step applies the mean gradient over the whole global batch. Writes each step's start
and end to $VF_BENCH_TIMES (with VF_BENCH_PROFILE=1 also each step's forward, backward and
optimizer time).

usage: torchrun --standalone --nproc-per-node W bench/torch/ddp_loop.py --global-batch B ...
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import common


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    threads = common.set_threads()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = a.global_batch // world
    if per_rank * world != a.global_batch or per_rank % a.micro_batch:
        raise SystemExit(
            f"global batch {a.global_batch} does not split into {world} ranks of "
            f"micro-batches of {a.micro_batch}"
        )
    k = per_rank // a.micro_batch
    cnn = common.cnn_module(with_virtualflow=False)
    x_train, y_train = cnn.load("train")
    torch.manual_seed(0)
    model = DDP(cnn.Net())
    opt, sched = common.make_optimizer(model, a.steps)
    sampler = common.Sampler(len(x_train), a.global_batch)
    torch.manual_seed(1000 + rank)  # augmentation differs per rank
    rec = common.Recorder(
        system="ddp", rank=rank, world=world, threads=threads, micro_batches_per_rank=k
    )
    dist.barrier()
    profile = os.environ.get("VF_BENCH_PROFILE", "") == "1"
    times: dict[str, float] = {}
    for step in range(a.steps):
        t0 = time.time()
        model.train()
        mine = sampler.batch(step)[rank * per_rank : (rank + 1) * per_rank]
        for i in range(k):
            idx = mine[i * a.micro_batch : (i + 1) * a.micro_batch]
            sync = contextlib.nullcontext() if i == k - 1 else model.no_sync()
            with sync:
                t1 = time.perf_counter()
                loss = F.cross_entropy(model(cnn.augment(x_train[idx])), y_train[idx])
                t2 = time.perf_counter()
                (loss / k if k > 1 else loss).backward()  # the last one all-reduces too
                times["forward"] = times.get("forward", 0.0) + t2 - t1
                times["backward"] = times.get("backward", 0.0) + time.perf_counter() - t2
        t1 = time.perf_counter()
        opt.step()
        sched.step()
        opt.zero_grad()
        times["optimizer"] = time.perf_counter() - t1
        if profile:
            rec.write(event="profile", step=step, **times)
        times.clear()
        rec.step(step, t0, time.time(), loss=float(loss.detach()))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
