"""Train your own PyTorch model on VirtualFlow's virtual nodes.

A worker process is started by `vf run job.yaml` or by the operator with the job in its
environment; the user's script stays ordinary PyTorch::

    import virtualflow.torch as vf

    job = vf.init()
    model, opt = Net(), torch.optim.AdamW(...)
    state = vf.State(model=model, optimizer=opt)
    for step in job.steps(state, dataset_size=len(train_set)):
        for node in step.virtual_nodes():
            x, y = collate(train_set, node.indices)  # an int64 tensor
            node.backward(F.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
    job.finish(test_accuracy=evaluate(model))

What the library guarantees, and what it asks of the script, is in docs/user-guide.md
("Train your PyTorch model"). In short: the data order, the random numbers of every virtual
node and the gradient sum depend only on (seed, epoch, step, virtual node), never on how many
workers there are, so the final weights are bitwise the same on 1, 2 or 8 workers, across
resizes and after lost workers.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import copy
import hashlib
import io
import json
import math
import operator
import os
import secrets
import signal
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from virtualflow import _core
from virtualflow._core import CollectiveError, Error, JobMismatchError, NumericalError
from virtualflow.data import LoaderError, NodeLoader, sample_seed

__all__ = [
    "CollectiveError",
    "DivergenceError",
    "Error",
    "Job",
    "JobMismatchError",
    "LoaderError",
    "MisuseError",
    "Node",
    "NodeLoader",
    "NumericalError",
    "State",
    "Step",
    "init",
    "sample_seed",
    "weights_sha256",
]

_STATE_FORMAT = "virtualflow-torch-state-2"

# How rank 0 writes a periodic checkpoint. True: it copies the state to host memory at the step
# boundary and a background thread serializes and writes the copy while training goes on (at
# most one write in flight: the next checkpoint waits for the previous one). False: training
# waits for the whole write, as before. The final checkpoint and the one on leave are always
# written before the process goes on. bench/torch/checkpoint_bench.py flips it to measure both.
_CHECKPOINT_IN_BACKGROUND = True


class MisuseError(Error):
    """The training script used the library in a way that would silently change the weights."""


class DivergenceError(Error):
    """Check mode found workers whose parameters differ after the same step."""


def weights_sha256(module_or_state: torch.nn.Module | dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state_dict in VirtualFlow's documented byte layout.

    For each entry in the state_dict's order: the name in UTF-8, a NUL byte, the dtype's name
    (e.g. ``float32``), a NUL byte, the number of dimensions and each dimension as little-endian
    int64, then the tensor's elements, contiguous, in little-endian byte order.
    """
    sd = (
        module_or_state.state_dict()
        if isinstance(module_or_state, torch.nn.Module)
        else module_or_state
    )
    h = hashlib.sha256()
    for name, tensor in sd.items():
        t = tensor.detach().to("cpu").contiguous()
        h.update(name.encode("utf-8") + b"\0")
        h.update(str(t.dtype).removeprefix("torch.").encode("ascii") + b"\0")
        h.update(struct.pack("<q", t.dim()))
        h.update(struct.pack(f"<{t.dim()}q", *t.shape))
        if t.numel() > 0:
            h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class State:
    """Everything a joiner receives and a checkpoint holds: the model's, optimizer's and LR
    scheduler's state_dicts, plus `extra` (anything torch.save can store with weights_only).
    The data position is the step, which the library keeps."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None
    extra: dict[str, Any] | None = None


def _signature(model: torch.nn.Module) -> list[tuple[str, list[int], str]]:
    return [(n, list(t.shape), str(t.dtype)) for n, t in model.state_dict().items()]


def _signature_difference(mine: list[Any], theirs: list[Any]) -> str:
    mine_d = {n: (s, d) for n, s, d in mine}
    theirs_d = {n: (s, d) for n, s, d in theirs}
    for n in theirs_d:
        if n not in mine_d:
            return f"the job's model has '{n}', this worker's has not"
    for n in mine_d:
        if n not in theirs_d:
            return f"this worker's model has '{n}', the job's has not"
    for n, (s, d) in mine_d.items():
        if theirs_d[n] != (s, d):
            return f"'{n}' is {d} {s} here but {theirs_d[n][1]} {theirs_d[n][0]} in the job"
    return "the parameters are in a different order"


def _copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    """dst[i].copy_(src[i]) for all i, in one multi-tensor operation where PyTorch has one."""
    foreach = getattr(torch, "_foreach_copy_", None)
    if foreach is not None:
        foreach(dst, src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


# A node's loss until node.backward() gives it one (read only, never written in place).
_NO_LOSS = torch.tensor(float("nan"))


def _one_device(model: torch.nn.Module, tensors: list[torch.Tensor]) -> torch.device:
    """The one device the model's parameters and buffers are on (the CPU or one CUDA device),
    with the settings a GPU needs for bitwise-repeatable gradients checked."""
    devices = sorted({str(t.device) for t in tensors})
    if len(devices) > 1:
        raise MisuseError(
            f"the model's tensors are on several devices ({', '.join(devices)}): move the whole "
            "model to one device (model.to(device)) before job.steps()"
        )
    device = torch.device(devices[0]) if devices else torch.device("cpu")
    if device.type not in ("cpu", "cuda"):
        raise MisuseError(f"the model is on {device}: this version trains on the CPU or CUDA")
    if device.type == "cuda" and torch.backends.cudnn.benchmark:
        raise MisuseError(
            "torch.backends.cudnn.benchmark is True: it lets each process pick its own "
            "convolution algorithms, so gradients differ between workers; leave it False"
        )
    return device


def _tensor_buffer(t: torch.Tensor) -> Any:
    """The bytes of a contiguous CPU tensor, lent without a copy (a NumPy array of its memory)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def _is_dense(t: torch.Tensor) -> bool:
    """Whether a tensor's bytes are written apart from the skeleton (see _encode_state)."""
    return t.layout == torch.strided and not t.is_quantized


def _strip(obj: Any, tensors: list[torch.Tensor], seen: dict[tuple[Any, ...], int]) -> Any:
    """`obj` with each dense tensor replaced by its number in `tensors` (a 0-d int64 tensor),
    where its contiguous CPU copy (itself, when it already is one) is appended. Tensors that
    share memory (tied weights) get one number."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if not _is_dense(t):
            return t.to("cpu")  # sparse or quantized: torch.save stores it in the skeleton
        key = (t.device, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in seen:
            seen[key] = len(tensors)
            tensors.append(t.to("cpu").contiguous())
        return torch.tensor(seen[key], dtype=torch.int64)
    if isinstance(obj, dict):
        out: dict[Any, Any] = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for k, v in obj.items():
            out[k] = _strip(v, tensors, seen)
        metadata = getattr(obj, "_metadata", None)  # a state_dict's module versions
        if metadata is not None:
            out._metadata = metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, (list, tuple)):
        items = [_strip(v, tensors, seen) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def _encode_state(header: dict[str, Any], payload: dict[str, Any]) -> list[Any]:
    """What a checkpoint and a joiner's state hold, before seal(), as pieces that follow one
    another: the header as one JSON line, which also gives the layout of the rest; torch.save's
    bytes of the payload with each dense tensor replaced by its number (the skeleton); then each
    of those tensors' bytes, lent where they lie. So a checkpoint's writer thread pickles only
    the small skeleton with the GIL held, and _core.write_checkpoint hashes and writes the
    tensors' memory without it (torch.save of the whole state held the GIL for seconds against
    the training thread, for a model of a few GiB)."""
    tensors: list[torch.Tensor] = []
    skeleton = _strip(payload, tensors, {})
    buf = io.BytesIO()
    torch.save(skeleton, buf)
    layout = {
        "skeleton_bytes": buf.tell(),
        "tensors": [[str(t.dtype).removeprefix("torch."), list(t.shape)] for t in tensors],
    }
    line = json.dumps({**header, "layout": layout}).encode() + b"\n"
    return [line, buf.getvalue(), *(_tensor_buffer(t) for t in tensors)]


def _decode_state(header: dict[str, Any], body: memoryview, source: str) -> dict[str, Any]:
    """The payload _encode_state wrote, from the header line and the bytes after it; its tensors
    are new CPU tensors. Raises ValueError naming `source` if the layout does not fit the bytes."""
    layout = header.get("layout")
    if not isinstance(layout, dict):
        raise ValueError(f"{source}: no layout in its header")
    at = int(layout["skeleton_bytes"])
    skeleton = torch.load(io.BytesIO(body[:at]), weights_only=True, map_location="cpu")
    tensors: list[torch.Tensor] = []
    for name, shape in layout["tensors"]:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{source}: unknown dtype {name!r}")
        size = math.prod(shape) * dtype.itemsize
        if at + size > len(body):
            raise ValueError(f"{source}: its tensors need more bytes than it holds")
        t = torch.from_numpy(np.frombuffer(body, np.uint8, size, at).copy())
        tensors.append(t.view(dtype).reshape(shape) if size else torch.empty(shape, dtype=dtype))
        at += size
    if at != len(body):
        raise ValueError(f"{source}: {len(body) - at} bytes after its tensors")
    return _restore(skeleton, tensors, source)  # type: ignore[no-any-return]


def _restore(obj: Any, tensors: list[torch.Tensor], source: str) -> Any:
    """The skeleton `obj` with each number _strip put in place of a dense tensor replaced by
    that tensor, in place where it can be (dicts keep their type and state_dict metadata)."""
    if isinstance(obj, torch.Tensor):
        if not _is_dense(obj):
            return obj
        if obj.dim() != 0 or obj.dtype != torch.int64 or not 0 <= int(obj) < len(tensors):
            raise ValueError(f"{source}: a tensor of the skeleton is not a tensor's number")
        return tensors[int(obj)]
    if isinstance(obj, dict):
        for k, v in obj.items():
            obj[k] = _restore(v, tensors, source)
        return obj
    if isinstance(obj, list):
        obj[:] = [_restore(v, tensors, source) for v in obj]
        return obj
    if isinstance(obj, tuple):
        return tuple(_restore(v, tensors, source) for v in obj)
    return obj


class _Snapshot:
    """A copy in host memory of a checkpoint's payload, taken at a step boundary so that it can
    be written while training changes the live tensors. Its tensors are buffers kept from one
    checkpoint to the next (pinned for a GPU's tensors, copied with non_blocking and one wait per
    device), so a checkpoint allocates nothing once the first has been taken."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}

    # Host copies of at least this many bytes in all are shared out between threads, in pieces
    # of at most _PIECE bytes: one thread copies about 4.6 GB/s on this project's 2-core test
    # machine, two about 10 (docs/benchmarks.md), and the training thread waits for the copy.
    _THREADED = 64 << 20
    _PIECE = 32 << 20

    def take(self, obj: Any) -> Any:
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        out = self._walk(obj, (), copies, {})
        devices = set()
        host = []
        for dst, src in copies:
            if src.is_cuda:
                dst.copy_(src, non_blocking=True)
                devices.add(src.device)
            else:
                host.append((dst, src))
        self._copy_on_host(host)
        for device in devices:
            torch.cuda.current_stream(device).synchronize()
        return out

    def _copy_on_host(self, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """dst.copy_(src) for each pair, on as many threads as this process has cores (at most
        8) when there is enough to copy; copy_ lets go of the GIL while it copies."""
        total = sum(src.nbytes for _, src in copies)
        threads = min(len(os.sched_getaffinity(0)), 8)
        if threads < 2 or total < self._THREADED:
            for dst, src in copies:
                dst.copy_(src)
            return
        pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
        for dst, src in copies:
            if not (src.is_contiguous() and dst.is_contiguous()) or src.nbytes <= self._PIECE:
                pieces.append((dst, src))
                continue
            d, s = dst.view(-1), src.view(-1)
            step = max(1, self._PIECE // src.element_size())
            pieces += [(d[i : i + step], s[i : i + step]) for i in range(0, s.numel(), step)]
        with concurrent.futures.ThreadPoolExecutor(threads, "virtualflow-snapshot") as pool:
            for done in [pool.submit(dst.copy_, src) for dst, src in pieces]:
                done.result()

    def _buffer(self, path: tuple[Any, ...], t: torch.Tensor) -> torch.Tensor:
        have = self._buffers.get(path)
        if have is None or have.shape != t.shape or have.dtype != t.dtype:
            have = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda)
            self._buffers[path] = have
        return have

    def _walk(
        self,
        obj: Any,
        path: tuple[Any, ...],
        copies: list[tuple[torch.Tensor, torch.Tensor]],
        seen: dict[tuple[Any, ...], torch.Tensor],
    ) -> Any:
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            if t.layout != torch.strided or t.device.type not in ("cpu", "cuda"):
                return t.to("cpu", copy=True)
            # Tensors that share memory (tied weights) stay one tensor in the copy.
            key = (t.device, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
            if key not in seen:
                seen[key] = self._buffer(path, t)
                copies.append((seen[key], t))
            return seen[key]
        if isinstance(obj, dict):
            out: dict[Any, Any] = OrderedDict() if isinstance(obj, OrderedDict) else {}
            for k, v in obj.items():
                out[k] = self._walk(v, (*path, k), copies, seen)
            metadata = getattr(obj, "_metadata", None)  # a state_dict's module versions
            if metadata is not None:
                out._metadata = copy.deepcopy(metadata)  # type: ignore[attr-defined]
            return out
        if isinstance(obj, (list, tuple)):
            items = [self._walk(v, (*path, i), copies, seen) for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        return copy.deepcopy(obj)


class _BackgroundWrite:
    """At most one checkpoint write in flight, in a thread of its own. Its outcome is collected by
    the training thread (wait, poll), which tells the agent: the agent's calls are made from the
    training thread only, as with a synchronous write."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._step = 0
        self._error = ""
        self._exception: BaseException | None = None

    def start(self, step: int, write: Callable[[], None]) -> None:
        assert self._thread is None, "a checkpoint write is already in flight"
        self._step, self._error, self._exception = step, "", None

        def run() -> None:
            try:
                write()
            except Error as e:  # the file system's refusal: reported, training goes on
                self._error = " ".join(str(e).split()) or type(e).__name__
            except BaseException as e:  # the script's state cannot be saved: raised by wait()
                self._exception = e

        self._thread = threading.Thread(target=run, name="virtualflow-checkpoint", daemon=True)
        self._thread.start()

    def in_flight(self) -> bool:
        return self._thread is not None

    def wait(self, *, block: bool = True) -> tuple[int, str] | None:
        """(step, error) of the write started last, once it has ended; None if there is none, or
        (block=False) while it still runs."""
        if self._thread is None or (not block and self._thread.is_alive()):
            return None
        self._thread.join()
        self._thread = None
        if self._exception is not None:
            e, self._exception = self._exception, None
            raise e
        return self._step, self._error


def _armed_fault(point: str, worker: str) -> int | None:
    """The step at which VF_FAULT_INJECT (worker-N:point[@step],..., as the agent reads it) arms
    `point` for this worker (-1: the first time), or None."""
    armed = None
    for item in os.environ.get(_core.ENV_FAULT_INJECT, "").split(","):
        name, _, rest = item.partition(":")
        where, _, at = rest.partition("@")
        if name == worker and where == point:
            armed = int(at) if at else -1
    return armed


def _crash_mid_write(path: str, blob: list[Any]) -> None:
    """Tests only: a crash of this process halfway through writing the checkpoint `blob` (the
    pieces of _encode_state) to `path`, as write_checkpoint writes it (beside it, in a temporary
    file of a random name)."""
    sealed = _core.seal(blob)
    with open(f"{path}.tmp.{secrets.token_hex(8)}", "wb") as f:
        f.write(sealed[: len(sealed) // 2])
        f.flush()
        os.fsync(f.fileno())
    print("fault injection: killing this worker at checkpoint-write", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _check_parameter_dtypes(model: torch.nn.Module) -> None:
    """Refuses a trainable parameter that is not float32: each node's gradient is summed exactly
    as float32 values (in 64-bit fixed point), and the mean written back into .grad, which must
    have the parameter's dtype."""
    for name, p in model.named_parameters():
        if p.requires_grad and p.dtype != torch.float32:
            raise MisuseError(
                f"parameter '{name}' is {p.dtype}: this version reduces float32 parameters "
                "only, since its exact reduction sums every node's float32 gradients; keep the "
                "parameters float32 and compute in lower precision under torch.autocast (the "
                "weights stay float32 master weights), see docs/user-guide.md, 'Mixed precision'"
            )


class _Holder:
    """The worker's training state as the agent library moves it (called from C++)."""

    def __init__(self, job: Job, state: State) -> None:
        self._job = job
        self._state = state
        self._has_state = False
        self.step_done = 0

    # TrainingStateHolder ------------------------------------------------------------------
    def has_state(self) -> bool:
        return self._has_state

    def step(self) -> int:
        return self.step_done

    def initialize(self) -> None:
        path = self._job.spec["checkpoint_path"]
        if path and os.path.exists(path):
            blob = _core.seal(_core.read_checkpoint(path))
            problem = self._check(blob, f"checkpoint {path}")
            if problem:
                raise JobMismatchError(f"checkpoint {path}: {problem}")
            self._load(blob)
            print(
                f"virtualflow: resuming from checkpoint {path} at step {self.step_done}",
                file=sys.stderr,
                flush=True,
            )
        else:
            self.step_done = 0
        self._has_state = True

    def metadata(self) -> bytes:
        return self._serialize()

    def check_metadata(self, blob: bytes) -> str:
        return self._check(blob, "state")

    def invalidate(self) -> None:
        self._has_state = False

    def adopt(self, blob: bytes) -> None:
        self._load(blob)
        self._has_state = True

    # Serialization ------------------------------------------------------------------------
    def _serialize(self) -> bytes:
        return _core.seal(_encode_state(*self._contents()))

    def _contents(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The state's header and payload, referring to the live tensors."""
        s = self._state
        header = {
            "format": _STATE_FORMAT,
            "fingerprint": self._job.spec["fingerprint"],
            "signature": _signature(s.model),
            "step": self.step_done,
        }
        payload = {
            "model": s.model.state_dict(),
            "optimizer": s.optimizer.state_dict() if s.optimizer is not None else None,
            "scheduler": s.scheduler.state_dict() if s.scheduler is not None else None,
            "extra": s.extra,
            "exponents": self._job._worker.exponents(),
            "step": self.step_done,
        }
        return header, payload

    def _split(self, blob: bytes, source: str) -> tuple[dict[str, Any], memoryview]:
        """The header line and a view of the bytes after it (a state of GiBs is not copied)."""
        raw = _core.unseal(blob, source)
        end = raw.find(b"\n")
        if end < 0:
            raise ValueError(f"{source}: no header line")
        return json.loads(raw[:end]), memoryview(raw)[end + 1 :]

    def _check(self, blob: bytes, source: str) -> str:
        header, _ = self._split(blob, source)
        if header.get("format") != _STATE_FORMAT:
            return f"not a PyTorch worker's state (format {header.get('format')!r})"
        if header.get("fingerprint") != self._job.spec["fingerprint"]:
            return (
                "it belongs to a different job (its program, virtual nodes, global batch, "
                "reduction or seed differ)"
            )
        if header.get("signature") != [list(x) for x in _signature(self._state.model)]:
            diff = _signature_difference(_signature(self._state.model), header["signature"])
            return (
                f"this worker builds a different model than the job's: {diff}; "
                "every worker must build the same model"
            )
        return ""

    def _load(self, blob: bytes) -> None:
        header, body = self._split(blob, "state")
        # Onto the CPU first: the sender's tensors may be on a device this worker does not have
        # (cuda:3 there, cuda:0 here); load_state_dict copies them to where ours are.
        payload = _decode_state(header, body, "state")
        s = self._state
        s.model.load_state_dict(payload["model"])
        if s.optimizer is not None and payload["optimizer"] is not None:
            s.optimizer.load_state_dict(payload["optimizer"])
        if s.scheduler is not None and payload["scheduler"] is not None:
            s.scheduler.load_state_dict(payload["scheduler"])
        if s.extra is not None and payload["extra"] is not None:
            s.extra.clear()
            s.extra.update(payload["extra"])
        if payload["exponents"]:
            self._job._worker.set_exponents(payload["exponents"])
        self.step_done = int(payload["step"])


class Node:
    """One virtual node of the current step on this worker: its number and its sample indices
    (`indices`, an int64 tensor on the CPU). Not thread-safe: the training thread's."""

    def __init__(self, step: Step, vnode: int, indices: torch.Tensor) -> None:
        self._step = step
        self.index = vnode
        self.indices = indices
        self._done = False
        self._loss = _NO_LOSS

    @property
    def seed(self) -> int:
        """The node's random seed, a function of (job seed, step, virtual node)."""
        return self._step._job._node_seed(self._step.index, self.index)

    @contextlib.contextmanager
    def rng(self) -> Iterator[None]:
        """Seeds PyTorch's generators for this node (dropout, augmentation); the library already
        does so before each node, so this only matters for code that reseeds in between."""
        self._step._job._seed_generators(self.seed)
        yield

    def backward(self, loss: torch.Tensor) -> None:
        """Computes this node's gradients from its loss (the mean over its micro-batch) and
        folds them into the step's sum. Call it once per node."""
        if self._done:
            raise MisuseError(f"node.backward() called twice for virtual node {self.index}")
        self._step._job._backward(self, loss)
        self._done = True


class Step:
    """One training step: this worker's virtual nodes and, when their loop ends, the reduction
    across workers that leaves the mean gradient over all V nodes in each parameter's .grad."""

    def __init__(self, job: Job, index: int) -> None:
        self._job = job
        self.index = index
        self.reduced = False
        self.loss = float("nan")
        self._compute_seconds = 0.0
        self._agreed_epoch = 0

    def virtual_nodes(self) -> Iterator[Node]:
        yield from self._job._run_nodes(self)


# Gradient buffers in flight on a GPU: while the host folds virtual node k into the exact sum,
# the GPU computes node k+1 into the other buffer. 1 would make every node wait for its own
# copy to the host (bench/torch/bench.py ab measures the difference).
_GPU_SLOTS = 2


@dataclass
class _InFlight:
    """A node whose gradients are on their way to the host."""

    slot: int
    loss: torch.Tensor
    event: Any  # torch.cuda.Event, or None on the CPU


class _Staging:
    """Where each virtual node's gradients are computed and how they reach the reducer, which
    reads host memory. Every node's gradients (and float buffers) go to a flat buffer on the
    model's device whose views are the parameters' .grad. Folded where they are (_DeviceFold),
    or on the CPU by the reducer reading them in place, they need one slot and no copy. Folded by
    the host from a GPU, each node's buffer goes by one asynchronous copy to pinned host memory;
    with two slots the host folds one node while the GPU computes the next. VF_TORCH_STAGING=2
    runs that two-slot path on the CPU too, which is how the tests check it without a GPU.
    Not thread-safe: the training thread's."""

    def __init__(
        self, device: torch.device, tensors: list[torch.Tensor], n_params: int, *, host_fold: bool
    ) -> None:
        sizes = [t.numel() for t in tensors]
        total = sum(sizes)
        self.device = device
        forced = int(os.environ.get(_core.ENV_TORCH_STAGING, "0") or 0) if host_fold else 0
        copies = host_fold and (device.type != "cpu" or forced > 0)
        self.slots = (forced or _GPU_SLOTS) if copies else 1
        pin = device.type == "cuda"
        self.grads = [
            torch.zeros(total, dtype=torch.float32, device=device) for _ in range(self.slots)
        ]
        self.host = (
            [torch.zeros(total, dtype=torch.float32, pin_memory=pin) for _ in range(self.slots)]
            if copies
            else self.grads
        )
        # The reducer writes the step's mean here (host memory); the parameters' .grad views it
        # afterwards.
        on_host = copies or device.type != "cpu"
        self.mean = (
            torch.zeros(total, dtype=torch.float32, pin_memory=pin) if on_host else self.grads[0]
        )
        self.param_views: list[list[torch.Tensor]] = []
        self.buffer_views: list[list[torch.Tensor]] = []
        for g in self.grads:
            views, offset = [], 0
            for t, n in zip(tensors, sizes):
                views.append(g[offset : offset + n].view_as(t))
                offset += n
            self.param_views.append(views[:n_params])
            self.buffer_views.append(views[n_params:])
        self.in_flight: list[_InFlight] = []
        self._events = [torch.cuda.Event() for _ in range(self.slots)] if pin and copies else []

    def send(self, slot: int, loss: torch.Tensor) -> None:
        """Starts a node's gradients (already in grads[slot]) on their way to host[slot]."""
        event = None
        if self.host is not self.grads:
            self.host[slot].copy_(self.grads[slot], non_blocking=self.device.type == "cuda")
            if self._events:
                event = self._events[slot]
                event.record()
        self.in_flight.append(_InFlight(slot, loss, event))

    def arrived(self) -> tuple[torch.Tensor, float]:
        """Waits for the oldest node in flight: its gradients in host memory, and its loss."""
        f = self.in_flight.pop(0)
        if f.event is not None:
            f.event.synchronize()
        return self.host[f.slot], float(f.loss)

    def publish_mean(self) -> list[torch.Tensor]:
        """The step's mean (in `mean`) where the parameters are: slot 0's flat views."""
        if self.mean is not self.grads[0]:
            self.grads[0].copy_(self.mean)
        return self.param_views[0]


# Exact reduction's number format (runtime/reduce/reducer.h): the largest |value * 2^e| one
# virtual node may add, and the exponent of a bucket that has no scale yet.
_FIXED_POINT_LIMIT = float(1 << 50)
_UNSET_EXPONENT = -(1 << 31)
_INF_BITS = 0x7F80_0000

# Exact reduction folds each node's gradients where they are (_DeviceFold): on a GPU by default,
# on the CPU with VF_TORCH_FOLD=device. False: every node goes through the host's fold, as before
# the device fold existed (bench/torch/gpu_host_fold.patch measures the difference).
_DEVICE_FOLD = True


def _fold_on_device(device: torch.device, reduction: str) -> bool:
    """Whether this worker folds its nodes with _DeviceFold rather than handing each node's
    gradients to the C++ reducer: on a GPU by default, where the host's fold needs a copy of
    every node's gradients and a wait for it; on the CPU, where the C++ reducer reads them in
    place in one fused pass, only with VF_TORCH_FOLD=device (the tests' way to run the GPU's
    path without one). VF_TORCH_FOLD=host keeps the host's fold. Exact reduction only."""
    choice = os.environ.get(_core.ENV_TORCH_FOLD, "")
    if choice not in ("", "device", "host"):
        raise Error(
            f"{_core.ENV_TORCH_FOLD}={choice!r}: set it to 'device' or 'host', or leave it unset"
        )
    if not _DEVICE_FOLD or reduction != "exact":
        return False
    if choice:
        return choice == "device"
    return device.type == "cuda"


def _collectives(device: torch.device) -> str:
    """How this worker's collectives run: 'gloo' (the default: over the network from host
    memory, the gradients' sums copied off a GPU once per step) or, with
    VF_TORCH_COLLECTIVES=nccl, 'nccl' on the model's own GPU. NCCL needs a GPU of its own for
    every worker (it refuses two ranks on one GPU, so not `vf run`'s workers sharing one) and the
    same setting on every worker of the job; its buffers are still the host's sums, staged
    through the GPU."""
    choice = os.environ.get(_core.ENV_TORCH_COLLECTIVES, "")
    if choice not in ("", "gloo", "nccl"):
        raise Error(
            f"VF_TORCH_COLLECTIVES={choice!r}: set it to 'gloo' or 'nccl', or leave it unset (gloo)"
        )
    if choice == "nccl" and device.type != "cuda":
        raise MisuseError(
            f"VF_TORCH_COLLECTIVES=nccl, but the model is on {device}: NCCL reduces between "
            "GPUs; move the model to its GPU, or leave VF_TORCH_COLLECTIVES unset for Gloo"
        )
    return choice or "gloo"


# How _DeviceFold folds a node where Triton runs (a GPU): 'triton' (the default) with one fused
# kernel (virtualflow/_fold_kernel.py), 'torch' with PyTorch's operations. Both give the same
# bits, so the choice never changes the weights; only the time and the device memory differ.
_ENV_TORCH_FOLD_KERNEL = _core.ENV_TORCH_FOLD_KERNEL


def _fold_kernel_choice() -> str:
    """VF_TORCH_FOLD_KERNEL: 'triton', 'torch', or "" (unset: Triton's kernel where it runs)."""
    choice = os.environ.get(_ENV_TORCH_FOLD_KERNEL, "")
    if choice not in ("", "triton", "torch"):
        raise Error(
            f"{_ENV_TORCH_FOLD_KERNEL}={choice!r}: set it to 'triton' (one fused kernel) or "
            "'torch' (PyTorch's operations), or leave it unset (Triton's kernel on a GPU)"
        )
    return choice


def _fold_kernel(device: torch.device) -> tuple[Any, str]:
    """virtualflow._fold_kernel where it can fold on `device`, else None and why not. Imported
    only here: importing it imports Triton, which a worker without one does not need."""
    try:
        from virtualflow import _fold_kernel as kernel
    except ImportError as e:
        return None, f"Triton does not import ({e})"
    reason = kernel.unavailable_reason(device)
    return (None, reason) if reason else (kernel, "")


class _DeviceFold:
    """A step's exact fold done on the gradients' own device, bit for bit what the C++
    reducer's Add computes (Device::FoldBuckets), handed to it once per step
    (Worker.add_folded): one copy to the host per step instead of one per node, and no wait for
    the host between nodes. On a GPU one Triton kernel per node folds it (_fold_kernel.py: one
    pass, 20 bytes of memory traffic per element); elsewhere, or with VF_TORCH_FOLD_KERNEL=torch,
    PyTorch's operations (the same code on the CPU and on a GPU: some nine passes, about 146
    bytes per element). Both give the same bits; `use_kernel` says which the next begin() picks.

    Per element v = x * 2^e in float64, e the bucket's exponent of the step: a float32 times a
    power of two is exact in float64 for every exponent ExponentFor gives (|e| <= 960), subnormal
    x included, just as the C++ fold computes it (float32 could not hold 2^e beyond 2^127, nor
    keep every bit of a subnormal product). Rounded half to even; an element with |v| > 2^50, or
    NaN, adds nothing and flags the step (from the bucket's maximum, which exceeds the limit
    exactly when some element does, as in the C++ fold); a bucket without an exponent is only
    measured. Per bucket the largest |x| as the float's bit pattern (NaN above +Inf): with the
    kernel, an atomic maximum per bucket; with PyTorch's operations, an elementwise running
    maximum over the nodes, reduced per bucket once per step.
    Device memory per gradient element: with the kernel 8 bytes (the sums), with PyTorch's
    operations 32 bytes in its buffers (made at the first step that uses them) and 17 more in a
    node's temporaries. Not thread-safe: the training thread's."""

    def __init__(
        self, device: torch.device, buckets: list[tuple[int, int]], total: int, max_nodes: int
    ) -> None:
        self._sizes = [size for _, size in buckets]
        if [offset for offset, _ in buckets] != [sum(self._sizes[:i]) for i in range(len(buckets))]:
            raise Error("the reducer's gradient buckets do not tile the flat gradient")
        self._n, nb = total, len(buckets)
        self._buckets = list(buckets)
        self._device = device
        self._device_sizes = torch.tensor(self._sizes, dtype=torch.int64, device=device)
        # The step's results in one int64 buffer, copied to the host at once: the sums, each
        # bucket's largest bit pattern, the overflow flag (what Worker.add_folded reads), then
        # each node's loss as a float64.
        self._packed = torch.zeros(total + nb + 1 + max_nodes, dtype=torch.int64, device=device)
        self._host = self._packed
        if device.type != "cpu":
            self._host = torch.zeros(self._packed.numel(), dtype=torch.int64, pin_memory=True)
        self._acc = self._packed[:total]
        self._max_slots = self._packed[total : total + nb]
        self._bad_slot = self._packed[total + nb]
        self._loss_slots = self._packed[total + nb + 1 :].view(torch.float64)
        self._zero = torch.zeros((), dtype=torch.float64, device=device)
        self._losses: list[torch.Tensor] = []
        # PyTorch's operations' buffers, made by the first step that folds with them.
        self._max_bits: torch.Tensor | None = None  # running elementwise maximum
        self._bits: torch.Tensor | None = None
        self._scaled: torch.Tensor | None = None
        self._scale: torch.Tensor | None = None  # each element's scale
        # The kernel's: its module, its blocks (made at its first step), each bucket's maximum.
        self._kernel: Any = None
        self._blocks: Any = None
        self._bucket_max = torch.zeros(nb, dtype=torch.int32, device=device)
        choice = _fold_kernel_choice()
        # Where Triton's kernel runs and VF_TORCH_FOLD_KERNEL allows it. A benchmark may flip
        # it between steps (begin() reads it); both ways give the same bits.
        self.use_kernel = False
        if choice != "torch" and device.type == "cuda":
            self._kernel, why_not = _fold_kernel(device)
            self.use_kernel = self._kernel is not None
            if why_not and choice == "triton":
                print(
                    f"virtualflow: {_ENV_TORCH_FOLD_KERNEL}=triton, but {why_not}: folding "
                    "with PyTorch's operations",
                    file=sys.stderr,
                    flush=True,
                )
        elif choice == "triton":
            print(
                f"virtualflow: {_ENV_TORCH_FOLD_KERNEL}=triton, but the gradients are on "
                f"{device}: folding with PyTorch's operations",
                file=sys.stderr,
                flush=True,
            )
        self._fused = False  # this step's way, fixed by begin()
        self._set_exponents([_UNSET_EXPONENT] * nb)

    def _set_exponents(self, exponents: list[int]) -> None:
        """Each bucket's scale 2^e (0 where unset), on the device; each element's is made when
        PyTorch's operations need it."""
        # Python's float is a double: 2^e exactly, as the C++ fold's ldexp(1.0, min(e, 1000)).
        scales = [0.0 if e == _UNSET_EXPONENT else 2.0 ** min(e, 1000) for e in exponents]
        device = self._acc.device
        self._bucket_scale = torch.tensor(scales, dtype=torch.float64).to(device)
        self._bucket_set = torch.tensor([e != _UNSET_EXPONENT for e in exponents]).to(device)
        self._scale = None
        self._exponents = list(exponents)

    def _kernel_ready(self) -> bool:
        """Whether this step can fold with the kernel (use_kernel, and it runs here); makes
        its blocks the first time."""
        if not self.use_kernel:
            return False
        if self._kernel is None:
            self._kernel, _ = _fold_kernel(self._device)
            if self._kernel is None:
                return False
        if self._blocks is None:
            self._blocks = self._kernel.blocks(self._buckets, self._device)
        return True

    def _eager_buffers(self) -> None:
        """PyTorch's operations' buffers and each element's scale, where not made yet."""
        if self._max_bits is None:
            device, n = self._device, self._n
            self._max_bits = torch.zeros(n, dtype=torch.int32, device=device)
            self._bits = torch.zeros(n, dtype=torch.int32, device=device)
            self._scaled = torch.zeros(n, dtype=torch.float64, device=device)
        if self._scale is None:
            self._scale = torch.repeat_interleave(
                self._bucket_scale, self._device_sizes, output_size=self._n
            )

    def begin(self, exponents: list[int]) -> None:
        """Starts a step (or its redo) with the reducer's exponents of this step, and fixes how
        its nodes are folded (use_kernel)."""
        if exponents != self._exponents:
            self._set_exponents(exponents)
        self._fused = self._kernel_ready()
        self._acc.zero_()
        if self._fused:
            self._bucket_max.zero_()
        else:
            self._eager_buffers()
            assert self._max_bits is not None
            self._max_bits.zero_()
        self._losses.clear()

    def add(self, grad: torch.Tensor, loss: torch.Tensor) -> None:
        """Folds one node's flat float32 gradient; its loss is read once per step."""
        if self._fused:
            # The kernel reads N elements from the pointer: no shape checks of PyTorch's here.
            if grad.dtype != torch.float32 or grad.numel() != self._n or not grad.is_contiguous():
                raise Error(f"a node's gradient must be {self._n} contiguous float32 values")
            self._kernel.fold(grad, self._acc, self._bucket_scale, self._bucket_max, self._blocks)
            self._losses.append(loss)
            return
        assert self._scale is not None and self._scaled is not None
        assert self._bits is not None and self._max_bits is not None
        v = torch.mul(grad, self._scale, out=self._scaled)
        v.round_()
        torch.where(v.abs() <= _FIXED_POINT_LIMIT, v, self._zero, out=v)  # NaN fails it too
        self._acc.add_(v.to(torch.int64))
        bits = torch.bitwise_and(grad.view(torch.int32), 0x7FFF_FFFF, out=self._bits)
        torch.maximum(self._max_bits, bits, out=self._max_bits)
        self._losses.append(loss)

    def finish(self, *, keep_sums: bool = False) -> tuple[torch.Tensor, list[float]]:
        """The step's sums, maxima and flag in host memory, for Worker.add_folded, and the
        nodes' losses in their order. With `keep_sums` (a world of one) only the maxima and the
        flag, for Worker.add_folded_flags: the sums stay here for write_mean."""
        if self._sizes:
            if self._fused:
                maxima = self._bucket_max
            else:
                assert self._max_bits is not None
                parts = list(self._max_bits.split(self._sizes))
                foreach_max = getattr(torch, "_foreach_max", None)  # one kernel for every bucket
                maxima = torch.stack(
                    foreach_max(parts) if foreach_max else [p.max() for p in parts]
                )
            self._max_slots.copy_(maxima)
            magnitude = maxima.view(torch.float32).to(torch.float64) * self._bucket_scale
            over = (maxima >= _INF_BITS) | (magnitude > _FIXED_POINT_LIMIT)
            # A bucket without an exponent is only measured.
            self._bad_slot.copy_((over & self._bucket_set).any())
        k = len(self._losses)
        if k:
            self._loss_slots[:k].copy_(torch.stack(self._losses))
        head = self._n + len(self._sizes) + 1
        first = self._n if keep_sums else 0
        if self._host is not self._packed:
            # Waits for the device: once per step. Kept sums stay on the device: for a model of
            # 124M parameters their trip to the host and the mean's trip back took 300 ms a step
            # on an H200, over most of the step's own time.
            self._host[first:].copy_(self._packed[first:])
        losses = self._host[head : head + k].view(torch.float64).tolist()
        return self._host[first:head], losses

    def write_mean(self, out: torch.Tensor, virtual_nodes: int) -> None:
        """The step's mean gradient from the kept sums, into `out` (flat float32, on this
        device): per element float32((sum * 2^-e) * (1/V)), each operation rounded on its own,
        which is the reducer's conversion (Device::FixedToFloat) bit for bit."""
        inv_v = 1.0 / float(virtual_nodes)
        offset = 0
        for size, e in zip(self._sizes, self._exponents, strict=True):
            chunk = self._acc[offset : offset + size].to(torch.float64)
            chunk.mul_(math.ldexp(1.0, -e)).mul_(inv_v)
            out[offset : offset + size].copy_(chunk)
            offset += size


class Job:
    """This worker's handle on the job: created by init()."""

    def __init__(self, spec_text: str, source: str) -> None:
        self.spec: dict[str, Any] = _core.parse_job(spec_text, source)
        self._spec_text = spec_text
        env = os.environ
        missing = [k for k in (_core.ENV_COORDINATOR, _core.ENV_WORKER) if not env.get(k)]
        if missing:
            raise Error(
                f"{', '.join(missing)} not set: this script is a VirtualFlow worker; start it with "
                "`vf run JOB.yaml` (its template's worker container names the script) or through "
                "the operator"
            )
        timeout = float(env.get(_core.ENV_TIMEOUT, "60") or 60)
        token = env.get(_core.ENV_JOB_TOKEN, "")
        if not token and env.get(_core.ENV_JOB_TOKEN_FILE):
            # Mounted from a Secret for the pod's life: a file missing at start is the pod's
            # fault, not the job's. Read again for up to the timeout, then CollectiveError
            # (exit 1: the pod is replaced), never exit 3.
            token = _core.read_credential_file(
                env[_core.ENV_JOB_TOKEN_FILE],
                "this worker's token file",
                env[_core.ENV_WORKER],
                timeout,
            ).strip()
        if not token:
            raise Error(
                "no coordinator credential for this worker (VF_JOB_TOKEN_FILE or VF_JOB_TOKEN)"
            )
        if env.get(_core.ENV_STEPS):
            self.spec["steps"], self.spec["epochs"] = int(env[_core.ENV_STEPS]), 0
        self.worker_name = env[_core.ENV_WORKER]
        self.job_id = env.get(_core.ENV_JOB_ID) or f"{self.spec['namespace']}/{self.spec['name']}"
        self._result_path = env.get(_core.ENV_RESULT, "")
        self._check_every = int(env.get(_core.ENV_CHECK_EVERY, "0") or 0)
        # Experiments (vf run --slowdown, VF_VNODE_DELAY_MS): a slower device, simulated.
        self._slowdown = float(env.get(_core.ENV_SLOWDOWN, "1") or 1)
        self._vnode_delay = float(env.get(_core.ENV_VNODE_DELAY_MS, "0") or 0) / 1000.0
        self._worker = _core.Worker(
            coordinator=env[_core.ENV_COORDINATOR],
            job_id=self.job_id,
            worker=self.worker_name,
            token=token,
            fingerprint=self.spec["fingerprint"],
            build=_core.BUILD,
            timeout=timeout,
            report_interval=float(env.get(_core.ENV_REPORT_INTERVAL, "1") or 1),
            metrics_port=int(env.get(_core.ENV_METRICS_PORT, "-1") or -1),
            # The pod's own address on Kubernetes, where the other workers reach this one.
            host=env.get(_core.ENV_POD_IP) or "127.0.0.1",
            # The operator's CA, when the coordinator serves https (the operator mounts it).
            ca_file=env.get(_core.ENV_COORDINATOR_CA_FILE, ""),
            # Where the final report is left for an operator restarted before it recorded it.
            termination_message_path=env.get(_core.ENV_TERMINATION_MESSAGE_PATH, ""),
        )
        # The agent's threads (its plan watcher polls the coordinator) stop before the
        # interpreter finalizes, whatever ends the script: finish() closes it, and so does exit.
        atexit.register(self._worker.close)
        self._holder: _Holder | None = None
        self._membership: Any = None
        self._params: list[torch.nn.Parameter] = []
        self._float_buffers: list[torch.Tensor] = []
        self._int_buffers: list[torch.Tensor] = []
        # Where each step's nodes restart from: the buffers as the step began (filled per step).
        self._start_floats: list[torch.Tensor] = []
        self._start_ints: list[torch.Tensor] = []
        self._staging: _Staging | None = None
        self._device_fold: _DeviceFold | None = None
        self._device = torch.device("cpu")
        self._collectives = "gloo"
        # The generators a node's seed sets: the CPU's and, for a model on a GPU, that GPU's.
        self._generators: list[torch.Generator] = [torch.default_generator]
        self._views: list[torch.Tensor] = []  # the current node's .grad views
        self._step: Step | None = None
        self._in_backward = False
        self._total = 0
        self._started = time.monotonic()
        self._first_step_unix = 0.0
        self._last_step_unix = 0.0
        self._steps_trained = 0
        # Steps whose nodes ran again because exact reduction chose a new scale (the first step,
        # a gradient that grew past the scale's headroom): in the result file.
        self._recomputed_steps = 0
        self._kept_nodes = 0  # nodes of failed steps not computed again (_begin_nodes)
        self._failed_steps: list[dict[str, int]] = []  # each failed step: nodes kept, computed
        self._last_loss = float("nan")
        self._finished = False
        self._done = False
        self._checkpoint_seconds = 0.0
        # Periodic checkpoints written in the background (_start_checkpoint): the host copy of
        # the state, kept for the next, and the write in flight.
        self._snapshot = _Snapshot()
        self._background_write = _BackgroundWrite()
        self._checkpoint_fault = _armed_fault("checkpoint-write", self.worker_name)
        # A world of one folding on its device keeps the step's sums there and converts them to
        # the mean there (_DeviceFold.write_mean); False sends them through the host's reducer
        # as a world of several does (the same bits: bench/torch/big.py measures both).
        self._local_mean = True
        self._device_mean_steps = 0  # steps whose mean was made that way (in the result file)

    # Public -------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """This worker's rank in the current plan (-1 before the first)."""
        return self._membership.rank if self._membership is not None else -1

    @property
    def world_size(self) -> int:
        return self._membership.world if self._membership is not None else 0

    @property
    def virtual_nodes(self) -> list[int]:
        """This worker's virtual nodes in the current plan, in the order it runs them (empty
        before the first plan); changes on a resize or a recovery (NodeLoader prefetches them)."""
        return [int(v) for v in self._membership.virtual_nodes] if self._membership else []

    def total_steps(self, dataset_size: int) -> int:
        """The job's length in steps on a training set of `dataset_size` samples (for LR
        schedules): spec.steps, or spec.epochs times the steps of one epoch."""
        if self.spec["steps"] > 0:  # VF_STEPS may have replaced the job's length
            return int(self.spec["steps"])
        return int(_core.total_steps(self._spec_text, int(dataset_size)))

    def steps(self, state: State, *, dataset_size: int) -> Iterator[Step]:
        """The job's steps from wherever it stands (a joiner starts at the members' step). Between
        two steps it follows membership plans: rebuilds the communicator, sends the state to
        joiners, writes checkpoints. A worker asked to leave exits here, with status 0."""
        self._prepare(state, dataset_size)
        assert self._holder is not None
        self._worker.ready()
        while True:
            self._membership = self._next()
            if self._holder.step_done >= self._total:
                break
            if self._check_every and self._holder.step_done % self._check_every == 0:
                self._check_divergence()
            step = Step(self, self._holder.step_done)
            self._step = step
            started = time.monotonic()
            yield step
            if not step.reduced:
                raise MisuseError(
                    f"step {step.index + 1} ended without its reduction: run the whole "
                    "`for node in step.virtual_nodes()` loop every step"
                )
            self._step = None
            self._holder.step_done += 1
            self._steps_trained += 1
            now = time.time()
            if self._steps_trained == 1:
                self._first_step_unix = now
            self._last_step_unix = now
            self._last_loss = step.loss
            last = self._holder.step_done >= self._total
            # How a background write went rides on this step's report; on the last step the
            # write is awaited, so that its outcome is reported before the job's end (a failed
            # periodic checkpoint is a warning the user must see, also when the final one fails).
            self._checkpoint_written(block=last)
            self._worker.completed(
                self._holder.step_done,
                step.loss,
                time.monotonic() - started,
                step._compute_seconds,
                int(self.spec["global_batch_size"]),
                step._agreed_epoch,
                last,
            )
            every = int(self.spec["checkpoint_every_steps"])
            if self.rank == 0 and every > 0 and self._holder.step_done % every == 0 and not last:
                # A periodic checkpoint that cannot be written (a full disk, a read-only volume)
                # does not stop training: the agent reports it and the next interval tries again.
                if _CHECKPOINT_IN_BACKGROUND:
                    self._start_checkpoint()
                else:
                    self._write_checkpoint()
        self._done = True
        # The final checkpoint replaces the periodic ones: none may still be writing after it.
        self._checkpoint_written()
        if self.rank == 0 and self.spec["checkpoint_path"]:
            t0 = time.monotonic()
            error = self._write_checkpoint()
            if error:
                # The trained weights exist nowhere else once the workers exit.
                raise Error(f"the final weights could not be saved, so the job fails: {error}")
            self._checkpoint_seconds = time.monotonic() - t0

    def finish(self, *, test_accuracy: float | None = None, test_loss: float | None = None) -> None:
        """Ends this worker's part after the last step: rank 0 reports the outcome (the weights'
        SHA-256 and, if given, the test accuracy), every worker writes its result file, and the
        worker's agent is closed (its threads stop; the job's other calls fail after this)."""
        if self._finished:
            return
        self._finished = True
        if not self._done:
            raise MisuseError("job.finish() before the last step: call it after the steps() loop")
        assert self._holder is not None
        self._checkpoint_written()
        sha = weights_sha256(self._holder._state.model)
        if self.rank == 0:
            acc = float("nan") if test_accuracy is None else float(test_accuracy)
            if not self._worker.finish_job(self._holder.step_done, self._last_loss, sha, acc):
                print(
                    f"virtualflow: {self.worker_name}: warning: final report not delivered",
                    file=sys.stderr,
                )
        if self._result_path:
            result = {
                "worker": self.worker_name,
                "epoch": self._membership.epoch if self._membership is not None else 0,
                "rank": self.rank,
                "steps": self._holder.step_done,
                "steps_trained": self._steps_trained,
                "seconds": time.monotonic() - self._started,
                "first_step_unix": self._first_step_unix,
                "last_step_unix": self._last_step_unix,
                "checkpoint_write_seconds": self._checkpoint_seconds,
                "final_loss": None if self._steps_trained == 0 else self._last_loss,
                "weights_sha256": sha,
                "virtual_nodes": int(self.spec["virtual_nodes"]),
                "virtual_nodes_held": list(self._membership.virtual_nodes)
                if self._membership
                else [],
                "gradient_fold": "device" if self._device_fold is not None else "host",
                "device_mean_steps": self._device_mean_steps,
                "collectives": self._collectives,
                "recomputed_steps": self._recomputed_steps,
                "kept_nodes": self._kept_nodes,
                "failed_steps": self._failed_steps,
            }
            if self.rank == 0 and test_accuracy is not None:
                result["test_accuracy"] = float(test_accuracy)
            if self.rank == 0 and test_loss is not None:
                result["test_loss"] = float(test_loss)
            tmp = self._result_path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=2)
            os.replace(tmp, self._result_path)
        self._worker.close()

    # Steps --------------------------------------------------------------------------------
    def _prepare(self, state: State, dataset_size: int) -> None:
        if self._holder is not None:
            raise MisuseError("job.steps() can run only once per process")
        _core.Sharder.check(
            int(dataset_size), int(self.spec["global_batch_size"]), int(self.spec["virtual_nodes"])
        )
        self._sharder = _core.Sharder(
            int(self.spec["seed"]),
            int(dataset_size),
            int(self.spec["global_batch_size"]),
            int(self.spec["virtual_nodes"]),
        )
        self._total = self.total_steps(dataset_size)
        self._worker.set_total_steps(self._total)
        self._holder = _Holder(self, state)
        self._attach(state)

    def _attach(self, state: State) -> None:
        model = state.model
        self._params = [p for p in model.parameters() if p.requires_grad]
        _check_parameter_dtypes(model)
        self._float_buffers, self._int_buffers = [], []
        for _, b in model.named_buffers():
            (self._float_buffers if b.is_floating_point() else self._int_buffers).append(b)
        for b in self._float_buffers:
            if b.dtype != torch.float32:
                raise MisuseError(f"buffer of dtype {b.dtype}: only float32 buffers are averaged")
        self._device = _one_device(model, self._params + self._float_buffers)
        index = -1  # the model's CUDA device
        if self._device.type == "cuda":
            index = (
                self._device.index
                if self._device.index is not None
                else torch.cuda.current_device()
            )
            self._generators = [torch.default_generator, torch.cuda.default_generators[index]]
        self._collectives = _collectives(self._device)
        if self._collectives == "nccl":
            self._worker.collectives_on_nccl(index)
        self._start_floats = [torch.empty_like(t) for t in self._float_buffers]
        self._start_ints = [torch.empty_like(t) for t in self._int_buffers]
        tensors = self._params + self._float_buffers
        sizes = [t.numel() for t in tensors]
        self._worker.configure_reducer(
            self.spec["reduction"], sizes, int(self.spec["virtual_nodes"])
        )
        if _fold_on_device(self._device, self.spec["reduction"]):
            self._device_fold = _DeviceFold(
                self._device, self._worker.buckets(), sum(sizes), int(self.spec["virtual_nodes"])
            )
        self._staging = _Staging(
            self._device, tensors, len(self._params), host_fold=self._device_fold is None
        )
        for p in self._params:
            p.register_post_accumulate_grad_hook(self._grad_hook)
        if state.optimizer is not None:
            state.optimizer.register_step_pre_hook(self._optimizer_hook)

    def _seed_generators(self, seed: int) -> None:
        """Seeds the CPU's generator and, for a model on a GPU, that GPU's: what
        torch.manual_seed does to them, without visiting every other backend it knows (on a GPU
        that took a large share of a small node's time)."""
        for g in self._generators:
            g.manual_seed(seed)

    def _grad_hook(self, _param: torch.Tensor) -> None:
        if self._step is not None and not self._in_backward:
            raise MisuseError(
                "backward() outside a virtual node: inside `for node in step.virtual_nodes()` "
                "call node.backward(loss) instead of loss.backward()"
            )

    def _optimizer_hook(self, *_args: Any) -> None:
        if self._step is not None and not self._step.reduced:
            raise MisuseError(
                "optimizer.step() before the step's reduction: call it after the "
                "`for node in step.virtual_nodes()` loop has finished"
            )

    def _next(self) -> Any:
        """The next membership, called where the live state is that of the last step trained:
        between steps, or after a failed step's partial state was discarded. Rank 0 may write
        it as it leaves."""
        assert self._holder is not None
        m = self._worker.next(self._holder)
        if m is None:
            # Asked to leave and let go by the plan (or deleted before it ever counted). A
            # checkpoint still being written is finished first: the process ends here.
            self._checkpoint_written()
            self._checkpoint_on_leave()
            raise SystemExit(0)
        return m

    def _checkpoint_on_leave(self) -> None:
        """Rank 0 of the last plan, leaving on SIGTERM a job its coordinator no longer knows
        (suspended, deleted, drained), writes the state of the last step it trained, so that
        the resumed job redoes none. Every member holds the same state after a step; rank 0
        alone writes it. A worker leaving a job that goes on (a drain of its node, a scale-in)
        writes nothing: the members that stay checkpoint as usual, and an older state must not
        replace their newer one."""
        assert self._holder is not None
        path = self.spec["checkpoint_path"]
        if (
            not path
            or self.rank != 0
            or self._steps_trained == 0
            or self._holder.step_done >= self._total
            or not self._worker.left_untold_on_request()
        ):
            return
        payload = _encode_state(*self._holder._contents())  # write_checkpoint seals it
        try:
            _core.write_checkpoint(path, payload)
            how = "written"
        except Error as e:
            how = "not written: " + (" ".join(str(e).split()) or type(e).__name__)
        print(
            f"virtualflow: {self.worker_name}: leaving; checkpoint at step "
            f"{self._holder.step_done} {how}",
            file=sys.stderr,
            flush=True,
        )

    def _node_seed(self, step: int, vnode: int) -> int:
        return _core.mix_key(int(self.spec["seed"]), step, vnode) & 0x7FFF_FFFF_FFFF_FFFF

    def _run_nodes(self, step: Step) -> Iterator[Node]:
        """Yields this worker's nodes, then reduces. Recomputes them when exact reduction picks a
        new scale, and after a failed collective follows the next plan and runs the nodes it
        adds (_begin_nodes: with exact reduction the nodes already summed here are kept)."""
        staging = self._staging
        assert staging is not None
        if step.reduced:
            raise MisuseError(f"step {step.index + 1}'s virtual nodes were already run")
        # Every node starts from the step's buffers, also when the nodes are run again.
        start_buffers, start_ints = self._start_floats, self._start_ints
        with torch.no_grad():
            if start_buffers:
                _copy_all(start_buffers, self._float_buffers)
            if start_ints:
                _copy_all(start_ints, self._int_buffers)
        summed: list[int] = []  # this step's nodes already in the reducer's sums, in their order
        snapshots: list[torch.Tensor] = []  # their integer buffers (see _compute_nodes)
        failed = False  # the last try's reduction failed (a member lost)
        while True:
            todo = self._begin_nodes(step, summed, snapshots, failed)
            failed = False
            t0 = time.monotonic()
            # Every node seeds the generators itself; their states are saved once and restored
            # when the nodes end, as a fork_rng around each node would leave them.
            saved = [g.get_state() for g in self._generators]
            try:
                yield from self._compute_nodes(step, todo, start_buffers, start_ints, snapshots)
            finally:
                for g, state in zip(self._generators, saved):
                    g.set_state(state)
            summed += todo
            compute = time.monotonic() - t0
            try:
                if self._keeps_sums():
                    redo, loss_sum, samples, agreed = self._worker.finish_kept()
                else:
                    redo, loss_sum, samples, agreed = self._worker.finish(staging.mean)
            except CollectiveError as e:
                # A member died or stalled; nothing of the step was applied here. Follow the plan
                # without it (state comes along if needed) and finish the step. The model's
                # buffers go back to the step's start first (every node starts from there
                # anyway): the state this worker hands a joiner, or writes if it is asked to
                # leave now, is then the last whole step's, not its nodes' partial one.
                self._worker.failed(step.index, str(e))
                with torch.no_grad():
                    if start_buffers:
                        _copy_all(self._float_buffers, start_buffers)
                    if start_ints:
                        _copy_all(self._int_buffers, start_ints)
                self._membership = self._next()
                if self._holder is not None and self._holder.step_done != step.index:
                    # A peer had finished this step before the failure and its newer state was
                    # adopted; the script's optimizer and scheduler calls for this step would
                    # apply it twice. This worker leaves (a replacement joins with the state).
                    raise CollectiveError(
                        f"fell behind its peers in a recovery at step {step.index + 1}; leaving so "
                        "that a replacement joins with their state"
                    ) from e
                failed = True
                continue
            if redo:
                self._recomputed_steps += 1
                summed.clear()
                continue
            break
        node_ints = self._agreed_ints(snapshots)
        if self._keeps_sums():
            assert self._device_fold is not None
            self._device_fold.write_mean(staging.grads[0], int(self.spec["virtual_nodes"]))
            self._device_mean_steps += 1
            self._views = staging.param_views[0]
        else:
            self._views = staging.publish_mean()
        if self._float_buffers:
            _copy_all(self._float_buffers, staging.buffer_views[0])
        for t, a in zip(self._int_buffers, node_ints):
            t.copy_(a)
        for p, view in zip(self._params, self._views):
            p.grad = view
        step.loss = loss_sum / samples if samples else float("nan")
        step._compute_seconds = compute
        step._agreed_epoch = agreed
        step.reduced = True

    def _begin_nodes(
        self, step: Step, summed: list[int], snapshots: list[torch.Tensor], failed: bool
    ) -> list[int]:
        """Which of the plan's nodes to run now. With exact reduction, a step whose collective
        failed goes on from the sums this worker had made (the reducer leaves them as they were,
        runtime/reduce/reducer.h), when the next plan still gives it those nodes: only the nodes
        it adds are computed, and integer sums do not depend on the order they were added in, so
        the result is the one of computing them all again. Otherwise (the first try, a redo at a
        new scale, fast reduction, or a plan that moved one of those nodes elsewhere) the step
        starts from nothing. After a failure it says which, on stderr and in the result's
        failed_steps."""
        plan = list(self._membership.virtual_nodes)
        done = set(summed)
        keep = bool(done) and self.spec["reduction"] == "exact" and done <= set(plan)
        kept = len(summed) if keep else 0
        if not keep:
            done.clear()
            summed.clear()
            snapshots.clear()
            self._worker.begin()
            if self._device_fold is not None:
                self._device_fold.begin(self._worker.exponents())
        elif self._device_fold is not None:
            # The device fold still holds the kept nodes and hands the reducer the whole step.
            self._worker.begin()
        todo = [v for v in plan if v not in done]
        if failed:
            self._kept_nodes += kept
            self._failed_steps.append({"step": step.index + 1, "kept": kept, "computed": len(todo)})
            print(
                f"virtualflow: {self.worker_name}: step {step.index + 1}: a member was lost; "
                f"keeping the {kept} nodes summed here and computing {len(todo)}",
                file=sys.stderr,
                flush=True,
            )
        return todo

    def _compute_nodes(
        self,
        step: Step,
        nodes: list[int],
        start_buffers: list[torch.Tensor],
        start_ints: list[torch.Tensor],
        snapshots: list[torch.Tensor],
    ) -> Iterator[Node]:
        """Yields each of `nodes` of `step` to the script and folds its gradients into the
        reducer, in their order. Appends to `snapshots` each node's integer buffers as it left
        them (they must agree: a counter like BatchNorm's num_batches_tracked).

        Per node it launches as few small operations as it can (one multi-tensor copy per
        group of buffers, one snapshot of the integer buffers, compared once per step) and
        runs as little Python as it can: on a GPU a step of small nodes is bound by the host."""
        staging = self._staging
        assert staging is not None
        b = int(self.spec["micro_batch"])
        floats, ints = self._float_buffers, self._int_buffers
        # The integer buffers as flat views, taken once: a node's snapshot is then one cat.
        flat_ints = (
            [t.detach().view(-1) for t in ints] if all(t.is_contiguous() for t in ints) else None
        )
        for i, v in enumerate(nodes):
            t0 = time.monotonic()
            slot = i % staging.slots
            if floats:
                _copy_all(floats, start_buffers)
            if ints:
                _copy_all(ints, start_ints)
            staging.grads[slot].zero_()
            self._views = staging.param_views[slot]
            for p, view in zip(self._params, self._views):
                p.grad = view
            indices = torch.tensor(self._sharder.indices(step.index, v), dtype=torch.int64)
            node = Node(step, v, indices)
            self._seed_generators(node.seed)
            yield node
            if not node._done:
                raise MisuseError(
                    f"virtual node {v} of step {step.index + 1} ended without node.backward(loss)"
                )
            if ints:
                parts = (
                    flat_ints if flat_ints is not None else [t.detach().reshape(-1) for t in ints]
                )
                snapshots.append(torch.cat(parts).to(torch.int64))
            if floats:
                _copy_all(staging.buffer_views[slot], floats)
            if self._device_fold is not None:
                self._device_fold.add(staging.grads[slot], node._loss)
            else:
                staging.send(slot, node._loss)
                while len(staging.in_flight) >= staging.slots:
                    self._fold(staging, b)
            if self._slowdown > 1 or self._vnode_delay > 0:
                elapsed = time.monotonic() - t0
                time.sleep(elapsed * max(0.0, self._slowdown - 1) + self._vnode_delay)
        while staging.in_flight:
            self._fold(staging, b)
        if self._device_fold is not None:
            self._hand_over_fold(self._device_fold, b)

    def _agreed_ints(self, snapshots: list[torch.Tensor]) -> list[torch.Tensor]:
        """The integer buffers as every node of the step left them; they must agree."""
        ints = self._int_buffers
        if not snapshots:
            return []
        stacked = torch.stack(snapshots)
        if not bool((stacked == stacked[0]).all()):
            raise MisuseError("an integer buffer changed differently across virtual nodes")
        return [c.view_as(t) for c, t in zip(snapshots[0].split([t.numel() for t in ints]), ints)]

    def _fold(self, staging: _Staging, micro_batch: int) -> None:
        """Adds the oldest node in flight to the step's sum."""
        grads, loss = staging.arrived()
        self._worker.add(grads)
        self._worker.add_loss(loss * micro_batch, micro_batch)

    def _keeps_sums(self) -> bool:
        """Whether this step's sums stay on the model's device (a world of one, folding there):
        the reducer then only decides the step, and the mean is made where the sums are."""
        return self._device_fold is not None and self._local_mean and self.world_size == 1

    def _hand_over_fold(self, fold: _DeviceFold, micro_batch: int) -> None:
        """Gives the reducer the step's nodes as _DeviceFold summed them, with their losses in
        the nodes' order (as _fold adds them)."""
        keep = self._keeps_sums()
        folded, losses = fold.finish(keep_sums=keep)
        for loss in losses:
            self._worker.add_loss(loss * micro_batch, micro_batch)
        if keep:
            self._worker.add_folded_flags(folded)
        else:
            self._worker.add_folded(folded)

    def _backward(self, node: Node, loss: torch.Tensor) -> None:
        if self._step is None or node._step is not self._step:
            raise MisuseError("node.backward() outside the step its node belongs to")
        if loss.dim() != 0:
            raise MisuseError(
                f"node.backward() takes the scalar loss, got shape {list(loss.shape)}"
            )
        self._in_backward = True
        try:
            loss.backward()
        finally:
            self._in_backward = False
        node._loss = loss.detach()  # read when the node's gradients reach the host
        # Autograd accumulates into the .grad views in place, so each .grad is still its view;
        # only where one was replaced (a .grad set to None in between, say) is it copied back.
        if all(map(operator.is_, [p.grad for p in self._params], self._views)):
            return
        for p, view in zip(self._params, self._views):
            if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
                p.grad = view

    def _check_divergence(self) -> None:
        assert self._holder is not None
        digest = hashlib.sha256()
        for p in self._holder._state.model.parameters():
            t = p.detach().to("cpu").contiguous()
            digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
        mine = int.from_bytes(digest.digest()[:8], "little", signed=True)
        everyone = self._worker.all_gather(mine)
        names = self._membership.members
        for rank, h in enumerate(everyone):
            if h != everyone[0]:
                raise DivergenceError(
                    f"after step {self._holder.step_done} worker {names[rank]} (rank {rank}) holds "
                    f"different parameters than worker {names[0]} (rank 0): the training script "
                    "is not deterministic (see docs/user-guide.md, 'What must stay deterministic')"
                )

    def _start_checkpoint(self) -> None:
        """Copies the state to host memory and writes the copy in a background thread; the agent
        is told how it went at a later step boundary (_checkpoint_written). The previous write,
        if it is still running, is waited for first: one write at a time."""
        assert self._holder is not None
        self._checkpoint_written()
        header, live = self._holder._contents()
        payload = self._snapshot.take(live)
        path, step = self.spec["checkpoint_path"], self._holder.step_done
        crash = self._checkpoint_fault is not None and self._checkpoint_fault in (-1, step)

        def write() -> None:
            blob = _encode_state(header, payload)
            if crash:
                _crash_mid_write(path, blob)
            _core.write_checkpoint(path, blob)

        self._background_write.start(step, write)

    def _checkpoint_written(self, *, block: bool = True) -> None:
        """Tells the agent how the background write went, once it has ended (block: waits for
        it). A state the script gave that torch.save cannot store is raised here, as a
        synchronous write would raise it."""
        done = self._background_write.wait(block=block)
        if done is not None:
            self._worker.checkpoint_written(*done)

    def _write_checkpoint(self) -> str:
        """Writes the checkpoint and tells the agent how it went; the error, or "". A background
        write still running is finished first, so that an older state never lands last."""
        assert self._holder is not None
        self._checkpoint_written()
        payload = _encode_state(*self._holder._contents())  # write_checkpoint seals it
        try:
            _core.write_checkpoint(self.spec["checkpoint_path"], payload)
            error = ""
        except Error as e:
            error = " ".join(str(e).split()) or type(e).__name__
        self._worker.checkpoint_written(self._holder.step_done, error)
        return error


def _read_spec() -> tuple[str, str]:
    text = os.environ.get(_core.ENV_JOB_SPEC, "")
    if text:
        return text, "$" + _core.ENV_JOB_SPEC
    path = os.environ.get(_core.ENV_JOB, "")
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read(), path
    raise Error(
        "no job: VF_JOB_SPEC (the manifest) or VF_JOB (its path) is not set; start this script "
        "with `vf run JOB.yaml` (its template's worker container names it) or through the operator"
    )


# Exit status of a worker whose job cannot go on (as virtualflow-agent's): `vf run` and the
# operator then fail the job with the worker's last line instead of replacing the worker, which
# would only fail again the same way.
EXIT_JOB_FAILED = 3


def _install_excepthook(worker: str) -> None:
    """An uncaught exception in the training script is deterministic (the same script on the
    same data): it ends the job with one line naming it, after the usual traceback. A lost
    peer (CollectiveError) is not: that worker just fails and is replaced."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        if issubclass(kind, CollectiveError):
            return
        message = " ".join(str(value).split()) or kind.__name__
        print(
            f"virtualflow: {worker}: error: {kind.__name__}: {message}", file=sys.stderr, flush=True
        )
        # Refused for running another build than the job's workers: the pod ran the wrong
        # image, which the operator replaces with the job's own; the job goes on.
        if issubclass(kind, JobMismatchError) and _core.ANOTHER_BUILD_REFUSAL in message:
            os._exit(_core.EXIT_ANOTHER_BUILD)
        os._exit(EXIT_JOB_FAILED)

    sys.excepthook = hook


def _use_deterministic_algorithms() -> None:
    """torch.use_deterministic_algorithms(True) without its import of TorchInductor, made only to
    set Inductor's own flag: that import (TorchDynamo, SymPy) was 4.2 s of every worker's start
    on a CPU, a joiner's included. Inductor reads the flag from TORCHINDUCTOR_DETERMINISTIC when
    it is first imported (a torch.compile later on), so it is set there; where Inductor is
    already loaded, PyTorch's own call sets both at no extra cost."""
    if "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(True)
        return
    os.environ["TORCHINDUCTOR_DETERMINISTIC"] = "1"
    torch._C._set_deterministic_algorithms(True, warn_only=False)


def init(*, threads: int | None = None) -> Job:
    """Joins the job described by the environment `vf run` or the operator set.

    Sets PyTorch's intra-op threads (VF_THREADS, default 1): a node's gradient has the same bits
    on every worker only if every worker computes it with the same number of threads.
    """
    parent = os.environ.get(_core.ENV_EXIT_WITH_PARENT)
    if parent:
        _core.exit_with_parent(int(parent))
    torch.set_num_threads(threads or int(os.environ.get(_core.ENV_THREADS, "1") or 1))
    # cuBLAS is deterministic only with a fixed workspace, set before its first handle.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    _use_deterministic_algorithms()
    # In C, not with the signal module: a Python handler would wait for the interpreter, and a
    # joiner spends its wait inside the library.
    _core.leave_on_sigterm()
    _install_excepthook(os.environ.get(_core.ENV_WORKER, "worker"))
    text, source = _read_spec()
    return Job(text, source)
