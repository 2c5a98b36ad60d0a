"""The two models of the GPU benchmark at the sizes people train: ResNet-50 on 224x224 images
and GPT-2 small (124M parameters, sequence 1024), with synthetic data that lives on the device.

Both are written here in plain PyTorch (no torchvision, no transformers) so that every side of
bench/torch/big.py trains the very same network, on a machine that has only PyTorch:

- ResNet-50: torchvision's layout (bottleneck blocks 3-4-6-3, stride on the 3x3 convolution,
  zero-initialised last BatchNorm of each block as its recipe does), 25,557,032 parameters. Its
  global average pooling is a mean: adaptive_avg_pool2d's CUDA backward has no deterministic
  implementation, and virtualflow.init() turns PyTorch's deterministic algorithms on.
- GPT-2 small: 12 layers, 12 heads, width 768, vocabulary 50,257, 1,024 positions, the output
  layer tied to the token embedding (124,439,808 parameters), pre-LayerNorm blocks with GELU,
  causal attention through F.scaled_dot_product_attention, no dropout (as GPT-2's pre-training
  recipes of today run it).

`tiny=True` shrinks both (32x32 images and one block per stage; 2 layers of width 64 on
sequences of 32) for a dry run of the whole benchmark on a CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

MODELS = ("resnet50", "gpt2")


# ResNet-50 -------------------------------------------------------------------------------------


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand, each with BatchNorm; a projected shortcut where
    the shape changes."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        nn.init.zeros_(self.bn3.weight)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.down(x))


def max_pool_3x3_s2(x: torch.Tensor) -> torch.Tensor:
    """ResNet's stem pooling (3x3, stride 2, padding 1) as the maximum of nine strided slices:
    elementwise maxima and slices only, whose backward is deterministic on every device. Used
    where max_pool2d's own backward is refused under deterministic algorithms."""
    h, w = x.shape[-2:]
    p = F.pad(x, (1, 1, 1, 1), value=float("-inf"))
    oh, ow = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    out = None
    for dy in range(3):
        for dx in range(3):
            s = p[..., dy : dy + 2 * oh - 1 : 2, dx : dx + 2 * ow - 1 : 2]
            out = s if out is None else torch.maximum(out, s)
    assert out is not None
    return out


class ResNet50(nn.Module):
    def __init__(self, classes: int = 1000, *, tiny: bool = False, slice_pool: bool = False):
        super().__init__()
        self.slice_pool = slice_pool
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        blocks = (1, 1, 1, 1) if tiny else (3, 4, 6, 3)
        layers: list[nn.Module] = []
        cin = 64
        for i, (n, width) in enumerate(zip(blocks, (64, 128, 256, 512), strict=True)):
            for j in range(n):
                layers.append(Bottleneck(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = max_pool_3x3_s2(x) if self.slice_pool else F.max_pool2d(x, 3, 2, 1)
        x = self.layers(x)
        out: torch.Tensor = self.fc(x.mean((2, 3)))
        return out


def max_pool_backward_is_deterministic(device: torch.device) -> bool:
    """Whether max_pool2d's backward runs under torch.use_deterministic_algorithms(True) here
    (some PyTorch builds refuse it on CUDA)."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        x = torch.randn(1, 2, 8, 8, device=device, requires_grad=True)
        F.max_pool2d(x, 3, 2, 1).sum().backward()
        return True
    except RuntimeError:
        return False
    finally:
        torch.use_deterministic_algorithms(was)


# GPT-2 small -----------------------------------------------------------------------------------


# True where the fused attention kernels' backward is refused under deterministic algorithms:
# every side then runs PyTorch's math attention (set by attention_is_deterministic's caller).
MATH_ATTENTION = False


def attention_is_deterministic(device: torch.device) -> bool:
    """Whether causal attention's backward in bfloat16 runs under deterministic algorithms."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        q = torch.randn(1, 2, 64, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
        F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
        return True
    except RuntimeError:
        return False
    finally:
        torch.use_deterministic_algorithms(was)


@dataclass(frozen=True)
class GptConfig:
    vocab: int = 50257
    seq: int = 1024
    width: int = 768
    layers: int = 12
    heads: int = 12


class Block(nn.Module):
    def __init__(self, c: GptConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.width)
        self.qkv = nn.Linear(c.width, 3 * c.width)
        self.proj = nn.Linear(c.width, c.width)
        self.ln2 = nn.LayerNorm(c.width)
        self.fc = nn.Linear(c.width, 4 * c.width)
        self.out = nn.Linear(4 * c.width, c.width)
        # GPT-2's scaled initialisation of the residual projections.
        for lin in (self.proj, self.out):
            nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * c.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if MATH_ATTENTION:
            with sdpa_kernel(SDPBackend.MATH):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return out


class Gpt2(nn.Module):
    def __init__(self, c: GptConfig) -> None:
        super().__init__()
        self.config = c
        self.tok = nn.Embedding(c.vocab, c.width)
        self.pos = nn.Embedding(c.seq, c.width)
        self.blocks = nn.Sequential(*(Block(c) for _ in range(c.layers)))
        self.ln = nn.LayerNorm(c.width)
        self.head = nn.Linear(c.width, c.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2's
        for m in self.modules():
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
            if isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(pos))
        logits: torch.Tensor = self.head(self.ln(x))
        return logits


# The benchmark's view of a model ----------------------------------------------------------------


@dataclass
class Workload:
    """A model with its synthetic data (on the device), its optimizer and its loss."""

    name: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    dataset_size: int
    data: dict[str, torch.Tensor]
    tiny: bool

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples of `idx` (an int64 tensor on any device)."""
        if self.name == "resnet50":
            images, labels = self.data["images"], self.data["labels"]
            i = idx.to(images.device, non_blocking=True) % images.shape[0]
            return images[i], labels[i]
        tokens, offsets = self.data["tokens"], self.data["offsets"]
        starts = idx.to(tokens.device, non_blocking=True) * self.seq
        pos = starts[:, None] + offsets[None, :]
        return tokens[pos], tokens[pos + 1]

    @property
    def seq(self) -> int:
        return int(self.data["offsets"].numel())

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The mean loss of one micro-batch, the forward under bfloat16 autocast."""
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            out = self.model(x)
            if self.name == "gpt2":
                out = out.view(-1, out.shape[-1])
                y = y.reshape(-1)
            return F.cross_entropy(out.float(), y)


def parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build(
    name: str, device: torch.device, *, tiny: bool = False, slice_pool: bool = False, seed: int = 0
) -> Workload:
    """The model `name` with fixed initial weights (`seed`) and its data on `device`. Data: 256
    distinct images of 224x224 with labels (sample i is image i mod 256), or a stream of random
    tokens cut into 4,096 sequences."""
    g = torch.Generator().manual_seed(1234)
    data: dict[str, torch.Tensor] = {}
    torch.manual_seed(seed)
    model: nn.Module
    if name == "resnet50":
        side = 32 if tiny else 224
        model = ResNet50(classes=10 if tiny else 1000, tiny=tiny, slice_pool=slice_pool).to(device)
        data["images"] = torch.randn(256, 3, side, side, generator=g).to(device)
        data["labels"] = torch.randint(0, 10 if tiny else 1000, (256,), generator=g).to(device)
        dataset_size = 65536
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-5
        )
    elif name == "gpt2":
        c = GptConfig(vocab=512, seq=32, width=64, layers=2, heads=4) if tiny else GptConfig()
        model = Gpt2(c).to(device)
        dataset_size = 4096
        data["tokens"] = torch.randint(
            0, c.vocab, (dataset_size * c.seq + 1,), generator=g, dtype=torch.int64
        ).to(device)
        data["offsets"] = torch.arange(c.seq, device=device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    else:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    return Workload(name, model, optimizer, dataset_size, data, tiny)


def describe(w: Workload) -> dict[str, Any]:
    return {"model": w.name, "parameters": parameters(w.model), "tiny": w.tiny}
