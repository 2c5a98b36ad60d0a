#!/usr/bin/env python3
"""The reference MLP in PyTorch, timed as `vf-bench throughput` times VirtualFlow's.

Same model (784-512-256-10, ReLU, softmax cross-entropy, float32), same optimizer (SGD,
learning rate 0.05, momentum 0.9), same step: the global batch is split into --virtual-nodes
micro-batches whose gradients add up before one optimizer update, and the step's loss comes back
to the host once per step (VirtualFlow reads its loss statistics every step). The images are
random uint8 rows like Fashion-MNIST's.

--data host (the default) stages every micro-batch as VirtualFlow does: gather the rows from
uint8 images in host memory, normalise to float32 on the host, copy to the GPU. --data device
keeps the whole dataset on the GPU and gathers there, which is what a PyTorch user who fits the
dataset in GPU memory would do.

Prints one line:
  torch mode=eager data=host global_batch=B virtual_nodes=V micro_batch=b ms_per_step=..
  samples_per_second=..
"""

import argparse
import statistics
import sys
import time

# Fashion-MNIST's pixel statistics, as runtime/executor.cc normalises them.
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530
TRAIN_SAMPLES = 60000


def parse_args():
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--global-batch", type=int, default=4096)
    ap.add_argument(
        "--virtual-nodes",
        type=int,
        default=16,
        help="micro-batches per step, gradients accumulated (default 16)",
    )
    ap.add_argument(
        "--mode",
        choices=["eager", "compile"],
        default="eager",
        help="eager PyTorch, or the forward and loss through torch.compile",
    )
    ap.add_argument("--data", choices=["host", "device"], default="host")
    ap.add_argument("--steps", type=int, default=50, help="steps per measurement (default 50)")
    ap.add_argument(
        "--repeats", type=int, default=5, help="measurements; the median is reported (default 5)"
    )
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    ap.add_argument("--device", default="cuda", help="torch device (default cuda)")
    args = ap.parse_args()
    if args.global_batch <= 0 or args.virtual_nodes <= 0 or args.steps <= 0 or args.repeats <= 0:
        ap.error("batches, counts and steps must be positive")
    if args.global_batch % args.virtual_nodes:
        ap.error("--global-batch must be a multiple of --virtual-nodes")
    if args.global_batch > TRAIN_SAMPLES:
        ap.error(f"--global-batch must be at most {TRAIN_SAMPLES}")
    return args


def main():
    args = parse_args()
    try:
        import torch
        from torch import nn
    except ImportError as e:
        sys.exit(f"torch_mlp: error: PyTorch is needed: {e}")
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_mlp: error: no CUDA device")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    gen = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (TRAIN_SAMPLES, 784), dtype=torch.uint8, generator=gen)
    labels = torch.randint(0, 10, (TRAIN_SAMPLES,), dtype=torch.int64, generator=gen)
    if args.data == "device":
        images, labels = images.to(dev), labels.to(dev)

    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")

    def forward_loss(x, y):
        return loss_fn(model(x), y)

    if args.mode == "compile":
        forward_loss = torch.compile(forward_loss)

    b = args.global_batch // args.virtual_nodes
    scale = 1.0 / (255.0 * PIXEL_STD)
    shift = PIXEL_MEAN / PIXEL_STD
    state = {"perm": torch.randperm(TRAIN_SAMPLES, generator=gen), "pos": 0}

    def stage(idx):
        if args.data == "host":
            x = images[idx].float().mul_(scale).sub_(shift).to(dev)
            return x, labels[idx].to(dev)
        idx = idx.to(dev)
        return images[idx].float().mul_(scale).sub_(shift), labels[idx]

    def step():
        if state["pos"] + args.global_batch > TRAIN_SAMPLES:
            state["perm"] = torch.randperm(TRAIN_SAMPLES, generator=gen)
            state["pos"] = 0
        batch = state["perm"][state["pos"] : state["pos"] + args.global_batch]
        state["pos"] += args.global_batch
        opt.zero_grad(set_to_none=False)
        total = torch.zeros((), device=dev)
        for v in range(args.virtual_nodes):
            x, y = stage(batch[v * b : (v + 1) * b])
            loss = forward_loss(x, y)
            (loss / args.global_batch).backward()
            total += loss.detach()
        opt.step()
        return total.item()  # the step's loss on the host, once per step

    for _ in range(args.warmup):
        step()
    sync()
    samples = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        samples.append((time.perf_counter() - t0) / args.steps)
    t = statistics.median(samples)
    print(
        f"torch mode={args.mode} data={args.data} global_batch={args.global_batch} "
        f"virtual_nodes={args.virtual_nodes} micro_batch={b} ms_per_step={1e3 * t:.4f} "
        f"samples_per_second={args.global_batch / t:.1f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
