"""Image files decoded and randomly augmented in loader processes, as a VirtualFlow job.

Fashion-MNIST, written once as PNG files (one per image, in a folder per class), is read back
through `vf.NodeLoader`: its loader processes open and decode each file with Pillow and crop and
flip it at random, drawing from the generators the loader seeds for every sample. The weights
come out bitwise the same on any number of workers, with any number of loader processes each,
through resizes and lost workers. Start it with `vf run examples/torch-images.yaml`.

Settings (the environment; none changes the weights):
  IMAGES_DIR          where the PNG files are written once and read from
                      (default ~/.cache/virtualflow/fashion-mnist-png)
  IMAGES_SAMPLES      how many training images (default all 60,000)
  IMAGES_LOADERS      loader processes per worker (default 2); a comma-separated list gives
                      worker-N the N-th entry (modulo its length), e.g. 0,1,2
  IMAGES_PREFETCH     steps loaded ahead (default 1)
  IMAGES_DEVICE       cpu, cuda, ... (default: the GPU when there is one)
  IMAGES_TEST_SAMPLES test images rank 0 evaluates on (default all 10,000)
"""

from __future__ import annotations

import gzip
import os
import shutil
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data
from PIL import Image

import virtualflow.torch as vf

DATA = os.environ.get("FASHION_MNIST", "/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530


def read_idx(split: str) -> tuple[np.ndarray, np.ndarray]:
    """Debian's Fashion-MNIST files: images (N, 28, 28) and labels (N,), both uint8."""
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(f"{DATA}/{prefix}-images-idx3-ubyte.gz") as f:
        _, n, rows, cols = struct.unpack(">IIII", f.read(16))
        pixels = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, rows, cols)
    with gzip.open(f"{DATA}/{prefix}-labels-idx1-ubyte.gz") as f:
        _, n_labels = struct.unpack(">II", f.read(8))
        labels = np.frombuffer(f.read(), dtype=np.uint8)
    if n_labels != n:
        sys.exit(f"{DATA}: {n} images but {n_labels} labels")
    return pixels, labels


def write_pngs(root: str, samples: int) -> str:
    """The first `samples` training images as ROOT/train-SAMPLES/<label>/<index>.png, written
    once. Workers that start together each write into a temporary folder and rename it into
    place; the first rename wins and the others throw theirs away."""
    final = os.path.join(root, f"train-{samples}")
    if os.path.isdir(final):
        return final
    os.makedirs(root, exist_ok=True)
    pixels, labels = read_idx("train")
    tmp = tempfile.mkdtemp(prefix=".writing-", dir=root)
    for c in range(10):
        os.mkdir(os.path.join(tmp, str(c)))
    for i in range(samples):
        Image.fromarray(pixels[i]).save(os.path.join(tmp, str(labels[i]), f"{i:05d}.png"))
    try:
        os.rename(tmp, final)
    except OSError:  # another worker's folder is there
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class PngFolder(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """A folder of PNG files, one sub-folder per class. Sample i is the i-th file in sorted
    order, the same on every worker whatever order the file system lists them in."""

    def __init__(self, root: str, *, augment: bool) -> None:
        self.files = sorted(
            (os.path.join(c, name), int(c))
            for c in os.listdir(root)
            for name in os.listdir(os.path.join(root, c))
        )
        self.root = root
        self.augment = augment

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, label = self.files[i]
        with Image.open(os.path.join(self.root, path)) as image:
            pixels = np.asarray(image.convert("L"), dtype=np.uint8)
        x = (torch.from_numpy(pixels.copy()).float().div_(255.0) - MEAN) / STD
        x = x[None]  # (1, 28, 28)
        if self.augment:
            # Drawn from torch's generator, which the loader seeded for this sample
            # (vf.sample_seed()): the same crop and flip whichever process loads it.
            if float(torch.rand(())) < 0.5:
                x = x.flip(2)
            dx, dy = (int(d) for d in torch.randint(0, 5, (2,)))
            x = F.pad(x, (2, 2, 2, 2))[:, dy : dy + 28, dx : dx + 28]
        return x, label


class Net(nn.Module):
    """Three convolutions (the last two with stride 2), global average pooling and a linear
    layer: small enough to train on a CPU core."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 2, 1)  # 14 x 14
        self.conv3 = nn.Conv2d(32, 64, 3, 2, 1)  # 7 x 7
        self.fc = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv3(F.relu(self.conv2(F.relu(self.conv1(x))))))
        logits: torch.Tensor = self.fc(x.mean(dim=(2, 3)))
        return logits


def loaders(worker: str) -> int:
    """IMAGES_LOADERS for this worker (worker-N takes the N-th entry of a list)."""
    choices = [int(c) for c in os.environ.get("IMAGES_LOADERS", "2").split(",")]
    return choices[int(worker.rsplit("-", 1)[-1]) % len(choices)]


@torch.no_grad()
def evaluate(model: nn.Module, dev: torch.device, n: int) -> tuple[float, float]:
    pixels, labels = read_idx("test")
    x = (torch.from_numpy(pixels[:n].astype(np.float32) / 255.0) - MEAN) / STD
    x, y = x[:, None].to(dev), torch.from_numpy(labels[:n].astype(np.int64)).to(dev)
    model.eval()
    correct, loss = 0, 0.0
    for i in range(0, len(x), 1000):
        out = model(x[i : i + 1000])
        loss += float(F.cross_entropy(out, y[i : i + 1000], reduction="sum"))
        correct += int((out.argmax(1) == y[i : i + 1000]).sum())
    return correct / len(x), loss / len(x)


def main() -> None:
    job = vf.init()
    dev = torch.device(
        os.environ.get("IMAGES_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    )
    cache = os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "virtualflow"
    )
    root = os.environ.get("IMAGES_DIR") or os.path.join(cache, "fashion-mnist-png")
    samples = int(os.environ.get("IMAGES_SAMPLES", "60000"))
    train_set = PngFolder(write_pngs(root, samples), augment=True)
    k = loaders(job.worker_name)
    print(f"images: {job.worker_name} trains on {dev} with {k} loader processes", flush=True)
    loader = vf.NodeLoader(
        job,
        train_set,
        num_workers=k,
        pin_memory=dev.type == "cuda",
        prefetch_steps=int(os.environ.get("IMAGES_PREFETCH", "1")),
    )

    torch.manual_seed(0)
    model = Net().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    total = job.total_steps(len(train_set))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=total)
    state = vf.State(model=model, optimizer=opt, scheduler=sched)

    for step in job.steps(state, dataset_size=len(train_set)):
        model.train()
        for node in step.virtual_nodes():
            x, y = loader.batch(node)
            x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
            node.backward(F.cross_entropy(model(x), y))
        opt.step()
        sched.step()
        opt.zero_grad()
        if job.rank == 0 and (step.index + 1) % 100 == 0:
            print(f"step {step.index + 1}/{total} loss {step.loss:.4f}", flush=True)
    loader.close()

    n_test = int(os.environ.get("IMAGES_TEST_SAMPLES", "10000"))
    accuracy, test_loss = evaluate(model, dev, n_test) if job.rank == 0 else (None, None)
    if accuracy is not None:
        print(f"test accuracy {100 * accuracy:.2f}%, test loss {test_loss:.4f}", flush=True)
    job.finish(test_accuracy=accuracy, test_loss=test_loss)


if __name__ == "__main__":
    main()
