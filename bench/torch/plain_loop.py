#!/usr/bin/env python3
"""Plain PyTorch, one process: the example CNN trained with gradient accumulation over the
micro-batches of each global batch (loss / micro-batches, one optimizer step), or on the whole
global batch at once. Writes each step's start and end to $VF_BENCH_TIMES
(with VF_BENCH_PROFILE=1 also each step's forward, backward and optimizer time). With
VF_BENCH_DETERMINISTIC=1 it runs with torch.use_deterministic_algorithms(True), as
virtualflow.init() does."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

import common


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--mode",
        choices=["accum", "whole"],
        default="accum",
        help="accum: micro-batches, loss/k each; whole: one batch of --global-batch",
    )
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    threads = common.set_threads()
    if os.environ.get("VF_BENCH_DETERMINISTIC", "") == "1":
        # What virtualflow.init() turns on (bench.py overhead's like-for-like baseline).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    cnn = common.cnn_module(with_virtualflow=False)
    dev = cnn.device()
    x_train, y_train = (t.to(dev) for t in cnn.load("train"))
    torch.manual_seed(0)
    model = cnn.Net().to(dev)
    opt, sched = common.make_optimizer(model, a.steps)
    sampler = common.Sampler(len(x_train), a.global_batch)
    mb = a.micro_batch if a.mode == "accum" else a.global_batch
    k = a.global_batch // mb
    rec = common.Recorder(system=f"plain-{a.mode}", rank=0, world=1, threads=threads)
    profile = os.environ.get("VF_BENCH_PROFILE", "") == "1"
    times: dict[str, float] = {}
    for step in range(a.steps):
        t0 = time.time()
        model.train()
        batch = sampler.batch(step)
        for i in range(k):
            idx = batch[i * mb : (i + 1) * mb].to(dev)
            t1 = time.perf_counter()
            loss = F.cross_entropy(model(cnn.augment(x_train[idx])), y_train[idx])
            t2 = time.perf_counter()
            (loss / k if k > 1 else loss).backward()
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


if __name__ == "__main__":
    main()
