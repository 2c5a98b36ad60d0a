#!/usr/bin/env python3
"""Does the way virtualflow.torch holds gradients change how fast the backward passes run? The
example CNN in one process, with the gradients in persistent buffers as the library keeps them
(every node: zero one flat buffer, point each .grad at its view, backward of the node's mean
loss) against plain accumulation (loss / 8 into the .grad tensors that zero_grad() dropped,
set_to_none=True, the default) and plain accumulation without the division. The modes
alternate step by step; prints the median forward and backward time per step of 8
micro-batches of 32. (A check on bench.py profile, where one VirtualFlow worker's backward
passes took less time than plain accumulation's.)

usage: PATH=$HOME/.cache/virtualflow/py/bin:$PATH python3 bench/torch/grad_buffers.py [--steps N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import common


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=45, help="steps in all (the modes alternate)")
    ap.add_argument("--warmup", type=int, default=6, help="steps not timed")
    a = ap.parse_args()
    common.set_threads()
    cnn = common.cnn_module(with_virtualflow=False)
    x, y = cnn.load("train")
    torch.manual_seed(0)
    model = cnn.Net()
    opt, sched = common.make_optimizer(model, a.steps)
    params = list(model.parameters())
    flat = torch.zeros(sum(p.numel() for p in params))
    views, offset = [], 0
    for p in params:
        views.append(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()
    sampler = common.Sampler(len(x), 256)
    modes = [
        "plain accumulation (loss/8)",
        "persistent buffers (as virtualflow.torch)",
        "plain accumulation, loss not divided",
    ]
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for step in range(a.steps):
        mode = modes[step % len(modes)]
        batch = sampler.batch(step)
        fwd = bwd = 0.0
        for k in range(8):
            if mode == modes[1]:
                flat.zero_()
                for p, v in zip(params, views, strict=True):
                    p.grad = v
            idx = batch[k * 32 : (k + 1) * 32]
            t0 = time.perf_counter()
            loss = F.cross_entropy(model(cnn.augment(x[idx])), y[idx])
            t1 = time.perf_counter()
            (loss / 8 if mode == modes[0] else loss).backward()
            bwd += time.perf_counter() - t1
            fwd += t1 - t0
        opt.step()
        sched.step()
        opt.zero_grad()
        if step >= a.warmup:
            times[mode].append((fwd, bwd))
    for m in modes:
        f = statistics.median(t[0] for t in times[m])
        b = statistics.median(t[1] for t in times[m])
        print(
            f"{m:<44} forward {1000 * f:6.1f} ms  backward {1000 * b:6.1f} ms  "
            f"({len(times[m])} steps)"
        )


if __name__ == "__main__":
    main()
