"""A small decoder-only transformer (GPT-style, byte-level) trained as a VirtualFlow job.

The corpus is Debian's `fortunes` package: about 2 MB of English text (quotations, jokes,
literature and computing lore) written by many hands, in plain files under
/usr/share/games/fortunes. Every machine that installs the package gets the same bytes, the
text is real and varied, and it is small enough for a CPU; the last tenth is held out for
validation. Dropout, AdamW and a linear warm-up followed by a cosine decay are ordinary PyTorch;
VirtualFlow adds the job's lines (`vf.init`, `vf.State`, `job.steps`, `job.finish`), the node
loop in place of the batch loop, the schedule's length from `job.total_steps` and evaluation on
rank 0 (docs/user-guide.md, "From a training loop to a job").
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import virtualflow.torch as vf

CORPUS = Path(os.environ.get("FORTUNES", "/usr/share/games/fortunes"))
CONTEXT = 64


def device() -> torch.device:
    """GPT_DEVICE (cpu, cuda, cuda:1), else the GPU when there is one."""
    return torch.device(
        os.environ.get("GPT_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    )


def load_corpus() -> tuple[torch.Tensor, torch.Tensor]:
    """The fortune files (not their .dat indexes or .u8 links), in name order, as bytes."""
    files = sorted(
        p for p in CORPUS.iterdir() if p.is_file() and not p.is_symlink() and p.suffix != ".dat"
    )
    if not files:
        raise SystemExit(f"{CORPUS}: no fortune files (install Debian's `fortunes` package)")
    data = torch.frombuffer(bytearray(b"".join(p.read_bytes() for p in files)), dtype=torch.uint8)
    cut = len(data) * 9 // 10
    return data[:cut].long(), data[cut:].long()


def windows(data: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample i is the block of CONTEXT bytes at i * CONTEXT and the same block shifted by one."""
    starts = idx * CONTEXT
    offsets = torch.arange(CONTEXT + 1, device=data.device)
    block = data[starts[:, None] + offsets[None, :]]
    return block[:, :-1], block[:, 1:]


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, d)
        x = x + F.dropout(self.proj(y), self.dropout, self.training)
        return x + F.dropout(self.mlp(self.ln2(x)), self.dropout, self.training)


class GPT(nn.Module):
    def __init__(self, d: int = 128, layers: int = 2, heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.tok = nn.Embedding(256, d)
        self.pos = nn.Embedding(CONTEXT, d)
        self.blocks = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, 256, bias=False)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.dropout(
            self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device)),
            self.dropout,
            self.training,
        )
        for block in self.blocks:
            h = block(h)
        logits: torch.Tensor = self.head(self.ln(h))
        return logits


def warmup_cosine(total: int, warmup: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


@torch.no_grad()
def validation_loss(
    model: nn.Module, val: torch.Tensor, batches: int = 16, batch: int = 64
) -> float:
    model.eval()
    n = (len(val) - 1) // CONTEXT
    total = 0.0
    for i in range(batches):
        idx = torch.arange(i * batch, (i + 1) * batch, device=val.device) % n
        x, y = windows(val, idx)
        total += float(F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)))
    return total / batches


def main() -> None:
    job = vf.init()
    dev = device()
    gpu = f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else ""
    print(f"gpt: {job.worker_name} trains on {dev}{gpu}", flush=True)
    train, val = (t.to(dev) for t in load_corpus())
    samples = (len(train) - 1) // CONTEXT
    torch.manual_seed(0)
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    total = job.total_steps(samples)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(total, max(1, total // 20)))
    state = vf.State(model=model, optimizer=opt, scheduler=sched)

    for step in job.steps(state, dataset_size=samples):
        model.train()
        for node in step.virtual_nodes():
            x, y = windows(train, node.indices.to(dev))
            loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
            node.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if job.rank == 0 and (step.index + 1) % 100 == 0:
            print(f"step {step.index + 1}/{total} loss {step.loss:.4f}", flush=True)

    val_loss = validation_loss(model, val) if job.rank == 0 else None
    if val_loss is not None:
        print(f"validation loss {val_loss:.4f}", flush=True)
    job.finish(test_loss=val_loss)


if __name__ == "__main__":
    main()
