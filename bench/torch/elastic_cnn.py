#!/usr/bin/env python3
"""The example CNN as a torchrun elastic job (DDP, Gloo): restarts from its checkpoint.

Each (re)start loads Fashion-MNIST, joins the process group torchrun's rendezvous formed, loads
the checkpoint if there is one and trains on. The global batch stays --global-batch, cut into
micro-batches of --micro-batch shared out over however many ranks there are now (`no_sync()`
accumulation, as ddp_loop.py). Rank 0 writes the checkpoint after every step (to a temporary
file, then renamed), so a restart loses at most the step in flight: the best case for
checkpoint-restart. Records to $VF_BENCH_TIMES: `start` (the interpreter began), `ready` (data,
process group and checkpoint loaded), every step, `sigterm` (the agent stopping this process),
`kill` (the $VF_BENCH_KILL_STEP hook).

usage: torchrun --nnodes=1:4 --rdzv-backend=c10d ... bench/torch/elastic_cnn.py --checkpoint F
"""

from __future__ import annotations

import time

T_START = time.time()  # before torch's import: a restart pays for it too

import argparse  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from types import FrameType  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import common  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200, help="the job's length")
    ap.add_argument(
        "--after-restart",
        type=int,
        default=0,
        help="end this many steps after a start from a checkpoint (0: run to the end)",
    )
    a = ap.parse_args()
    threads = common.set_threads()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rec = common.Recorder(system="torchrun", restart=restart, threads=threads)
    rec.write(event="start", t=T_START)

    def on_term(signum: int, _frame: FrameType | None) -> None:
        rec.write(event="sigterm", t=time.time(), signal=signum)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    cnn = common.cnn_module(with_virtualflow=False)
    x_train, y_train = cnn.load("train")
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    rec.fields.update(rank=rank, world=world)
    micro = a.global_batch // a.micro_batch
    if micro % world:
        raise SystemExit(f"{micro} micro-batches do not split over {world} ranks")
    k, per_rank = micro // world, a.global_batch // world
    torch.manual_seed(0)
    net = cnn.Net()
    opt, sched = common.make_optimizer(net, a.steps)
    first = 0
    if os.path.exists(a.checkpoint):
        ckpt = torch.load(a.checkpoint, weights_only=True)
        net.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        first = int(ckpt["step"])
    model = DDP(net)
    last = a.steps if first == 0 or a.after_restart <= 0 else min(a.steps, first + a.after_restart)
    sampler = common.Sampler(len(x_train), a.global_batch)
    torch.manual_seed(1000 * (first + 1) + rank)
    rec.write(event="ready", t=time.time(), first_step=first)
    for step in range(first, last):
        t0 = time.time()
        model.train()
        mine = sampler.batch(step)[rank * per_rank : (rank + 1) * per_rank]
        for i in range(k):
            idx = mine[i * a.micro_batch : (i + 1) * a.micro_batch]
            with contextlib.nullcontext() if i == k - 1 else model.no_sync():
                loss = F.cross_entropy(model(cnn.augment(x_train[idx])), y_train[idx])
                (loss / k if k > 1 else loss).backward()
            if i == 0 and common.kill_requested(step, rank, world):
                common.die(rec, step)
        opt.step()
        sched.step()
        opt.zero_grad()
        if rank == 0:
            tmp = a.checkpoint + ".tmp"
            torch.save(
                {
                    "model": net.state_dict(),
                    "optimizer": opt.state_dict(),
                    "scheduler": sched.state_dict(),
                    "step": step + 1,
                },
                tmp,
            )
            os.replace(tmp, a.checkpoint)
        rec.step(step, t0, time.time(), loss=float(loss.detach()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
