"""A ResNet-style CNN with BatchNorm on Fashion-MNIST, trained as a VirtualFlow job.

Ordinary PyTorch: what VirtualFlow changes in a training loop is the job (`vf.init`, `vf.State`,
`job.steps`, `job.finish`), the node loop (`step.virtual_nodes`, `node.indices`,
`node.backward`) in place of the batch loop, and the batch size, epochs and shuffle moving into
the job file. Start it with `vf run examples/torch-cnn.yaml` (see docs/user-guide.md).

CNN_AUTOCAST chooses mixed precision (the parameters stay float32): `bf16` runs the forward
pass under `torch.autocast(dtype=torch.bfloat16)` on the CPU or a GPU; `fp16` under float16 with
a `torch.amp.GradScaler`, on a GPU only. Unset (or `off`), everything is float32.
"""

from __future__ import annotations

import gzip
import os
import struct
import sys
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import virtualflow.torch as vf

DATA = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")


def device() -> torch.device:
    """CNN_DEVICE (cpu, cuda, cuda:1), else the GPU when there is one: a pod given
    `nvidia.com/gpu: 1` sees its GPU as cuda:0."""
    return torch.device(
        os.environ.get("CNN_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    )


def load(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Images as float tensors (N, 1, 28, 28), normalized; labels as int64."""
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(f"{DATA}/{prefix}-images-idx3-ubyte.gz") as f:
        _, n, rows, cols = struct.unpack(">IIII", f.read(16))
        pixels = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, 1, rows, cols)
    with gzip.open(f"{DATA}/{prefix}-labels-idx1-ubyte.gz") as f:
        _, n_labels = struct.unpack(">II", f.read(8))
        labels = np.frombuffer(f.read(), dtype=np.uint8)
    if n_labels != n:
        sys.exit(f"{DATA}: {n} images but {n_labels} labels")
    x = torch.from_numpy(pixels.astype(np.float32) / 255.0)
    return (x - 0.2860) / 0.3530, torch.from_numpy(labels.astype(np.int64))


class Block(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a shortcut (a 1x1 projection when the shape
    changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(1, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        )
        self.layer1 = Block(32, 64, 2)  # 14 x 14
        self.layer2 = Block(64, 128, 2)  # 7 x 7
        self.fc = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        # Global average pooling as a mean: adaptive_avg_pool2d's CUDA backward has no
        # deterministic implementation, and the weights must repeat bit for bit.
        logits: torch.Tensor = self.fc(x.mean(dim=(2, 3)))
        return logits


def augment(x: torch.Tensor) -> torch.Tensor:
    """Random horizontal flips and 2-pixel shifts, drawn from the virtual node's CPU generator
    (the same numbers whichever device trains)."""
    flip = (torch.rand(x.shape[0]) < 0.5).to(x.device)
    x = torch.where(flip[:, None, None, None], x.flip(3), x)
    padded = F.pad(x, (2, 2, 2, 2))
    dx, dy = torch.randint(0, 5, (2,))
    return padded[:, :, int(dy) : int(dy) + 28, int(dx) : int(dx) + 28]


def precision(dev: torch.device) -> tuple[torch.dtype | None, torch.amp.GradScaler | None]:
    """CNN_AUTOCAST's dtype for autocast (None: float32 throughout) and, for float16, the
    GradScaler that keeps its small gradients from flushing to zero."""
    chosen = os.environ.get("CNN_AUTOCAST", "")
    if chosen in ("", "off"):
        return None, None
    if chosen == "bf16":
        return torch.bfloat16, None
    if chosen == "fp16":
        if dev.type != "cuda":
            sys.exit("CNN_AUTOCAST=fp16 needs a GPU (CNN_DEVICE=cuda); on the CPU use bf16")
        # A scale that does not overflow: an overflowed node ends the job (NumericalError)
        # instead of making the scaler skip the step (docs/user-guide.md, "Mixed precision").
        return torch.float16, torch.amp.GradScaler("cuda", init_scale=2.0**10)
    sys.exit(f"CNN_AUTOCAST={chosen!r}: expected bf16, fp16 or off")


def train_mixed(
    job: vf.Job,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sched: Any,
    train: tuple[torch.Tensor, torch.Tensor],
    dtype: torch.dtype,
    scaler: torch.amp.GradScaler | None,
) -> None:
    """main()'s loop with the forward under autocast(dtype) and, for float16, a GradScaler."""
    x_train, y_train = train
    dev = x_train.device
    # The scaler's scale changes while training: it travels in the state's `extra` (to joiners
    # and checkpoints; a joiner's dict is filled in place) and is loaded from there each step.
    extra: dict[str, Any] = {"scaler": scaler.state_dict()} if scaler is not None else {}
    state = vf.State(model=model, optimizer=opt, scheduler=sched, extra=extra)
    for step in job.steps(state, dataset_size=len(x_train)):
        model.train()
        if scaler is not None:
            scaler.load_state_dict(extra["scaler"])
        for node in step.virtual_nodes():
            idx = node.indices.to(dev)
            with torch.autocast(dev.type, dtype=dtype):
                loss = F.cross_entropy(model(augment(x_train[idx])), y_train[idx])
            # With a scaler, each node's gradients are of the scaled loss; the library sums
            # them and .grad holds their mean, which unscale_ divides by the scale below.
            node.backward(scaler.scale(loss) if scaler is not None else loss)
        if scaler is not None:
            scaler.unscale_(opt)  # after the reduction: every worker sees the same inf check
            scaler.step(opt)
            scaler.update()
            extra["scaler"] = scaler.state_dict()
        else:
            opt.step()
        sched.step()
        opt.zero_grad()


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():  # no graph to keep: a forward pass only
        for i in range(0, len(x), 1000):
            out = model(x[i : i + 1000])
            loss += float(F.cross_entropy(out, y[i : i + 1000], reduction="sum"))
            correct += int((out.argmax(1) == y[i : i + 1000]).sum())
    return correct / len(x), loss / len(x)


def main() -> None:
    job = vf.init()
    dev = device()
    gpu = f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""
    print(f"cnn: {job.worker_name} trains on {dev}{gpu}", flush=True)
    x_train, y_train = (t.to(dev) for t in load("train"))
    x_test, y_test = (t.to(dev) for t in load("test"))
    torch.manual_seed(0)
    model = Net().to(dev)
    lr = float(os.environ.get("CNN_LR", "0.1"))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    total = job.total_steps(len(x_train))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total)
    dtype, scaler = precision(dev)
    if dtype is not None:
        train_mixed(job, model, opt, sched, (x_train, y_train), dtype, scaler)
    else:
        state = vf.State(model=model, optimizer=opt, scheduler=sched)

        for step in job.steps(state, dataset_size=len(x_train)):
            model.train()
            for node in step.virtual_nodes():
                idx = node.indices.to(dev)
                loss = F.cross_entropy(model(augment(x_train[idx])), y_train[idx])
                node.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            if job.rank == 0 and (step.index + 1) % 100 == 0:
                print(f"step {step.index + 1}/{total} loss {step.loss:.4f}", flush=True)

    # CNN_TEST_SAMPLES: evaluate on the first N test images (default all 10,000; the test of a
    # few steps' weights needs no accuracy).
    n_test = int(os.environ.get("CNN_TEST_SAMPLES", len(x_test)))
    accuracy, test_loss = (
        evaluate(model, x_test[:n_test], y_test[:n_test]) if job.rank == 0 else (None, None)
    )
    if accuracy is not None:
        print(f"test accuracy {100 * accuracy:.2f}%, test loss {test_loss:.4f}", flush=True)
    job.finish(test_accuracy=accuracy, test_loss=test_loss)


if __name__ == "__main__":
    main()
