"""Shared pieces of the PyTorch benchmarks: the example CNN, its data, its optimizer, step-time
recording and the kill hook.

The model, augmentation and data loader are examples/torch/cnn.py's own (imported, not copied),
so every side trains the same network on the same Fashion-MNIST tensors. The baselines never use
VirtualFlow: they import cnn.py with a stand-in for `virtualflow.torch`, which cnn.py imports at
the top but only uses in its main().
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
CNN_PATH = ROOT / "examples" / "torch" / "cnn.py"

# Environment variables the scripts read (the driver sets them).
ENV_TIMES = "VF_BENCH_TIMES"  # JSON-lines file: one record per step (appended, O_APPEND)
ENV_KILL_STEP = "VF_BENCH_KILL_STEP"  # the highest rank SIGKILLs itself in this step...
ENV_KILL_MARK = "VF_BENCH_KILL_MARK"  # ...once: this file marks that it happened
ENV_THREADS = "VF_BENCH_THREADS"  # intra-op threads of the baselines (VirtualFlow: VF_THREADS)


def cnn_module(*, with_virtualflow: bool) -> types.ModuleType:
    """examples/torch/cnn.py as a module. Without VirtualFlow, a stand-in satisfies its import."""
    if not with_virtualflow and "virtualflow.torch" not in sys.modules:
        pkg = types.ModuleType("virtualflow")
        sub = types.ModuleType("virtualflow.torch")
        pkg.torch = sub  # type: ignore[attr-defined]
        sys.modules["virtualflow"] = pkg
        sys.modules["virtualflow.torch"] = sub
    spec = importlib.util.spec_from_file_location("vf_bench_cnn", CNN_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def set_threads() -> int:
    """One intra-op thread unless VF_BENCH_THREADS says otherwise (VirtualFlow's init() sets
    VF_THREADS, default 1, the same way)."""
    n = int(os.environ.get(ENV_THREADS, "1") or 1)
    torch.set_num_threads(n)
    return n


def make_optimizer(model: torch.nn.Module, total_steps: int) -> tuple[torch.optim.Optimizer, Any]:
    """cnn.py's optimizer and schedule: SGD with Nesterov momentum, weight decay, OneCycleLR."""
    lr = float(os.environ.get("CNN_LR", "0.1"))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=total_steps)
    return opt, sched


class Sampler:
    """A fresh random permutation per epoch, cut into global batches (the baselines' data order;
    VirtualFlow's sharder does the same with its own generator)."""

    def __init__(self, n: int, global_batch: int, seed: int = 1) -> None:
        self.n, self.b, self.seed = n, global_batch, seed
        self.per_epoch = n // global_batch
        self._epoch = -1
        self._perm = torch.empty(0, dtype=torch.int64)

    def batch(self, step: int) -> torch.Tensor:
        epoch, k = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.n, generator=g)
            self._epoch = epoch
        return self._perm[k * self.b : (k + 1) * self.b]


class Recorder:
    """Appends one JSON object per line to $VF_BENCH_TIMES (several processes may share the
    file: each line is one small O_APPEND write). Wall-clock times (time.time()), so records of
    different processes compare."""

    def __init__(self, **fields: Any) -> None:
        path = os.environ.get(ENV_TIMES, "")
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else -1
        self.fields = dict(fields)
        self.fields["pid"] = os.getpid()

    def write(self, **record: Any) -> None:
        if self._fd < 0:
            return
        line = json.dumps({**self.fields, **record}) + "\n"
        os.write(self._fd, line.encode())

    def step(self, step: int, t_start: float, t_end: float, **extra: Any) -> None:
        """A step's start and end (wall clock), and the process's CPU time (all its threads,
        user + system) at the end."""
        self.write(
            event="step", step=step, t_start=t_start, t_end=t_end, cpu=time.process_time(), **extra
        )


def kill_requested(step: int, rank: int, world: int) -> bool:
    """True once, for the highest rank of a world of 2 or more, in step $VF_BENCH_KILL_STEP."""
    at = os.environ.get(ENV_KILL_STEP, "")
    mark = os.environ.get(ENV_KILL_MARK, "")
    if not at or not mark or world < 2 or rank != world - 1 or step != int(at):
        return False
    try:
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def die(recorder: Recorder, step: int) -> None:
    """SIGKILL this process (mid-step), after recording when."""
    recorder.write(event="kill", step=step, t=time.time())
    os.kill(os.getpid(), signal.SIGKILL)
