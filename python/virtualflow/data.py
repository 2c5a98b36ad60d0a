"""Loading a map-style dataset for virtual nodes: worker processes, prefetch, pinned memory.

`NodeLoader` is what `torch.utils.data.DataLoader` is to a plain loop, for the node loop of
`virtualflow.torch`::

    loader = vf.NodeLoader(job, train_set, num_workers=2, pin_memory=True)
    for step in job.steps(state, dataset_size=len(train_set)):
        for node in step.virtual_nodes():
            x, y = loader.batch(node)          # node.indices' samples, collated
            node.backward(F.cross_entropy(model(x.to(dev)), y.to(dev)))
        ...

The rule that keeps the weights the same on any number of workers: before it loads the j-th
sample of virtual node v in step s, whichever process loads it (the training process or one of
its loader processes) seeds PyTorch's CPU generator, Python's `random` and NumPy's global
generator with `sample_seed()`, a function of (job seed, s, v, j) only. Random augmentation drawn
from them in `__getitem__` gives the same bits whichever worker, loader process or plan loads the
sample, and again when a node is loaded twice. The training process's own generators are left as
they were (the node's seed, for dropout).

Loader processes are started with the 'forkserver' method: forked from a small server process
that imported PyTorch once, never from the training process, which runs the agent's threads,
Gloo's and PyTorch's thread pools and perhaps CUDA (a fork of such a process may deadlock in a
lock another thread held, and CUDA cannot be used in a forked child). Each loader process talks
to the training process through two pipes of its own and exits when they close: the training
process's end (a normal exit, `close()`, or a kill -9 of the worker) or its forkserver's death.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import random
import sys
import traceback
from collections.abc import Callable, Iterable
from multiprocessing.reduction import ForkingPickler
from typing import Any, NoReturn

import torch
import torch.multiprocessing  # noqa: F401  (registers the reductions that share tensors)
import torch.utils.data

from virtualflow import _core
from virtualflow._core import Error

__all__ = ["LoaderError", "NodeLoader", "sample_seed"]

_SEED_MASK = 0x7FFF_FFFF_FFFF_FFFF

# The seed of the sample being loaded in this process (None outside a loader's __getitem__).
_current_seed: int | None = None


class LoaderError(Error):
    """Loading a node's samples failed: the dataset or collate_fn raised (its traceback is in the
    message), or a loader process died."""


def sample_seed() -> int:
    """The seed of the sample being loaded, a function of (job seed, step, virtual node, the
    sample's place in the node) only. Valid inside the dataset's `__getitem__` (and `collate_fn`,
    where it is the last sample's) when a `NodeLoader` loads it; the loader has already seeded
    torch's CPU generator, `random` and NumPy's global generator with it. For a generator of your
    own: `torch.Generator().manual_seed(vf.sample_seed())`."""
    if _current_seed is None:
        raise Error("vf.sample_seed() outside a sample that a NodeLoader is loading")
    return _current_seed


def _sample_seed(job_seed: int, step: int, vnode: int, j: int) -> int:
    # The node's own seed is mix_key(seed, step, vnode) (c = 0); samples take c = j + 1.
    return _core.mix_key(job_seed, step, vnode, j + 1) & _SEED_MASK


def _seed_all(seed: int) -> None:
    global _current_seed
    _current_seed = seed
    torch.default_generator.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed & 0xFFFF_FFFF)  # NumPy's legacy global generator takes 32 bits


def _load_node(
    dataset: Any,
    collate_fn: Callable[[list[Any]], Any],
    job_seed: int,
    step: int,
    vnode: int,
    indices: list[int],
) -> Any:
    global _current_seed
    samples = []
    try:
        for j, i in enumerate(indices):
            _seed_all(_sample_seed(job_seed, step, vnode, j))
            samples.append(dataset[i])
        return collate_fn(samples)
    finally:
        _current_seed = None


def _where(step: int, vnode: int) -> str:
    return f"virtual node {vnode} of step {step + 1}"


def _loader_main(
    rank: int,
    tasks: Any,
    results: Any,
    dataset: Any,
    collate_fn: Callable[[list[Any]], Any],
    job_seed: int,
) -> None:
    """A loader process: loads the nodes the training process sends, until its pipes close."""
    # Dies with the forkserver, which exits when the training process does (even by SIGKILL).
    _core.exit_with_parent(os.getppid())
    torch.set_num_threads(1)
    while True:
        try:
            task = tasks.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        step, vnode, indices = task
        try:
            payload = ForkingPickler.dumps(
                ("ok", step, vnode, _load_node(dataset, collate_fn, job_seed, step, vnode, indices))
            )
        except Exception:  # the dataset's or collate_fn's: it goes to the training process
            payload = ForkingPickler.dumps(
                (
                    "error",
                    step,
                    vnode,
                    f"loader process {rank} (pid {os.getpid()}), loading {_where(step, vnode)}:\n"
                    + traceback.format_exc(),
                )
            )
        try:
            results.send_bytes(payload)
        except (EOFError, OSError):
            return


def _pin(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {k: _pin(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(_pin(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_pin(v) for v in batch)
    return batch


class _Loader:
    """One loader process and the training process's ends of its pipes."""

    def __init__(self, ctx: Any, rank: int, args: tuple[Any, ...]) -> None:
        task_r, self.tasks = ctx.Pipe(duplex=False)
        self.results, result_w = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_loader_main,
            args=(rank, task_r, result_w, *args),
            name=f"vf-loader-{rank}",
            daemon=True,
        )
        self.process.start()
        task_r.close()
        result_w.close()
        self.rank = rank
        self.outstanding: list[tuple[int, int]] = []  # sent, not received, in order


class NodeLoader:
    """Loads each virtual node's samples from a map-style dataset (`__getitem__` and `__len__`)
    and collates them, like a DataLoader, for `loader.batch(node)` in the node loop.

    - `num_workers`: loader processes (0: the training process loads each node when asked).
    - `prefetch_steps`: with loader processes, how many steps past the current one are loaded
      ahead, for the nodes this worker holds in the current plan (its rest of the current step
      is always loaded ahead). A new plan (a resize, a lost worker) drops what it no longer
      needs and loads what it now does. At most `prefetch_factor` nodes per loader process are
      in flight at once.
    - `collate_fn`: makes a batch from the node's list of samples (default: torch's
      `default_collate`). It runs where the samples are loaded.
    - `pin_memory`: the batch's tensors in page-locked memory, for fast copies to a GPU
      (`x.to(device, non_blocking=True)`).

    The dataset and collate_fn are pickled to the loader processes: define them at a module's
    top level. An iterable dataset is refused: every worker must be able to draw any sample by
    its index. Not thread-safe: the training thread's.
    """

    def __init__(
        self,
        job: Any,
        dataset: Any,
        *,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        prefetch_steps: int = 1,
        prefetch_factor: int = 2,
    ) -> None:
        _refuse_iterable(dataset)
        if num_workers < 0 or prefetch_steps < 0 or prefetch_factor < 1:
            raise ValueError(
                "num_workers and prefetch_steps must be >= 0 and prefetch_factor >= 1, got "
                f"{num_workers}, {prefetch_steps} and {prefetch_factor}"
            )
        self._job = job
        self._dataset = dataset
        self._size = len(dataset)
        self._collate = collate_fn or torch.utils.data.default_collate
        self._pin = bool(pin_memory) and torch.cuda.is_available()
        self._prefetch_steps = int(prefetch_steps)
        self._factor = int(prefetch_factor)
        self._num_workers = int(num_workers)
        self._seed = int(job.spec["seed"])
        self._loaders: list[_Loader] = []
        self._started = False
        self._closed = False
        self._sharder: Any = None
        self._total = 0
        self._checked = False
        self._ready: dict[tuple[int, int], Any] = {}  # loaded, not yet taken
        self._pending: list[tuple[int, int]] = []  # wanted, not yet sent
        self.dropped = 0  # nodes loaded or sent ahead that a new plan no longer needed
        # Started now, so that their start overlaps the script's warm-up (building the model,
        # joining the job) rather than its first steps.
        if self._num_workers > 0:
            self._start()

    @property
    def num_workers(self) -> int:
        return self._num_workers

    def __len__(self) -> int:
        return self._size

    # The loop -------------------------------------------------------------------------------
    def batch(self, node: Any) -> Any:
        """The collated samples of `node` (its `indices`, in order)."""
        if self._closed:
            raise Error("NodeLoader.batch() after close()")
        step, vnode = int(node._step.index), int(node.index)
        indices = node.indices.tolist()
        self._check(step, vnode, indices)
        if self._num_workers == 0:
            return self._in_process(step, vnode, indices)
        self._start()
        key = (step, vnode)
        self._plan(key)
        if key not in self._ready and not any(key in ld.outstanding for ld in self._loaders):
            if key in self._pending:
                self._pending.remove(key)
            self._send(key, indices)
        self._fill()
        while key not in self._ready:
            self._receive(key)
            self._fill()
        batch = self._ready.pop(key)
        return _pin(batch) if self._pin else batch

    def close(self) -> None:
        """Ends the loader processes (also done when the training process exits)."""
        if self._closed:
            return
        self._closed = True
        for ld in self._loaders:
            try:
                ld.tasks.send(None)
            except OSError:
                pass
            ld.tasks.close()
        for ld in self._loaders:
            ld.process.join(timeout=5)
            if ld.process.is_alive():
                ld.process.kill()
                ld.process.join(timeout=5)
            ld.results.close()
        self._loaders.clear()
        self._ready.clear()

    def __enter__(self) -> NodeLoader:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # In the training process ---------------------------------------------------------------
    def _in_process(self, step: int, vnode: int, indices: list[int]) -> Any:
        """Loads the node here, with the training process's generators as they were after."""
        np = sys.modules.get("numpy")
        torch_state = torch.get_rng_state()
        py_state = random.getstate()
        np_state = np.random.get_state() if np is not None else None
        try:
            batch = _load_node(self._dataset, self._collate, self._seed, step, vnode, indices)
        finally:
            torch.set_rng_state(torch_state)
            random.setstate(py_state)
            if np is not None:
                np.random.set_state(np_state)
        return _pin(batch) if self._pin else batch

    def _check(self, step: int, vnode: int, indices: list[int]) -> None:
        """The job's nodes must index this dataset: the same size as job.steps() was given."""
        if self._sharder is None:
            spec = self._job.spec
            self._sharder = _core.Sharder(
                self._seed, self._size, int(spec["global_batch_size"]), int(spec["virtual_nodes"])
            )
            self._total = int(self._job.total_steps(self._size))
        if not self._checked:
            if self._sharder.indices(step, vnode) != indices:
                from virtualflow.torch import MisuseError

                raise MisuseError(
                    f"the NodeLoader's dataset has {self._size} samples, but the job's nodes "
                    "index another size: give job.steps() dataset_size=len(dataset) of the same "
                    "dataset"
                )
            self._checked = True

    # With loader processes -----------------------------------------------------------------
    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        ctx = multiprocessing.get_context("forkserver")
        # The server imports PyTorch and this module once; each loader process is a fork of it
        # and imports only the script's module (as __mp_main__) and the dataset's.
        ctx.set_forkserver_preload(["torch", "virtualflow.data"])
        args = (self._dataset, self._collate, self._seed)
        self._loaders = [_Loader(ctx, r, args) for r in range(self._num_workers)]

    def _plan(self, key: tuple[int, int]) -> None:
        """What to load ahead from `key` on, under the current plan: the plan's nodes after
        key's in the current step, then all of its nodes in each of the next prefetch_steps
        steps. Loaded nodes no longer wanted are dropped; nodes sent already arrive and are
        dropped then."""
        step, vnode = key
        plan = [int(v) for v in self._job.virtual_nodes]
        later = plan[plan.index(vnode) + 1 :] if vnode in plan else []
        wanted = [(step, v) for v in later]
        for s in range(step + 1, min(step + 1 + self._prefetch_steps, self._total)):
            wanted += [(s, v) for v in plan]
        keep = set(wanted) | {key}
        for k in [k for k in self._ready if k not in keep]:
            del self._ready[k]
            self.dropped += 1
        busy = {k for ld in self._loaders for k in ld.outstanding}
        self.dropped += sum(1 for k in self._pending if k not in keep)
        self._pending = [k for k in wanted if k not in self._ready and k not in busy]

    def _fill(self) -> None:
        cap = self._factor
        while self._pending:
            ld = min(self._loaders, key=lambda ld: len(ld.outstanding))
            if len(ld.outstanding) >= cap:
                return
            step, vnode = self._pending.pop(0)
            self._send((step, vnode), self._sharder.indices(step, vnode), ld)

    def _send(self, key: tuple[int, int], indices: list[int], ld: _Loader | None = None) -> None:
        ld = ld or min(self._loaders, key=lambda ld: len(ld.outstanding))
        try:
            ld.tasks.send((key[0], key[1], indices))
        except OSError:
            self._died(ld, key)
        ld.outstanding.append(key)

    def _receive(self, key: tuple[int, int]) -> None:
        """Waits for results, or a loader's death, and files them: never blocks for good."""
        by_conn = {ld.results: ld for ld in self._loaders}
        by_sentinel = {ld.process.sentinel: ld for ld in self._loaders}
        ready = multiprocessing.connection.wait([*by_conn, *by_sentinel], timeout=30)
        for r in ready:
            ld = by_conn.get(r)
            if ld is None:
                continue
            try:
                kind, step, vnode, value = ForkingPickler.loads(ld.results.recv_bytes())
            except (EOFError, OSError):
                self._died(ld, key)
            if (step, vnode) in ld.outstanding:
                ld.outstanding.remove((step, vnode))
            if kind == "error":
                raise LoaderError(value)
            self._ready[step, vnode] = value
        for r in ready:
            ld = by_sentinel.get(r)
            # A process that sent its last result and then died is found at the next wait.
            if ld is not None and not ld.results.poll():
                self._died(ld, key)

    def _died(self, ld: _Loader, key: tuple[int, int]) -> NoReturn:
        ld.process.join(timeout=1)
        code = ld.process.exitcode
        how = (
            f"was killed by signal {-code}"
            if code is not None and code < 0
            else f"exited with status {code}"
        )
        raise LoaderError(
            f"loader process {ld.rank} (pid {ld.process.pid}) {how} while the training process "
            f"waited for {_where(*key)}"
        )


def _refuse_iterable(dataset: Any) -> None:
    from virtualflow.torch import MisuseError

    why = (
        "every virtual node's samples are drawn by index from (seed, epoch, step, node), so that "
        "any worker under any plan loads the same ones; a stream has no index"
    )
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise MisuseError(
            f"NodeLoader: {type(dataset).__name__} is an IterableDataset: {why}. Index it: a "
            "map-style Dataset with __len__ and __getitem__(i) (e.g. a list of file paths, or "
            "offsets into the stream's shards)"
        )
    missing = [m for m in ("__getitem__", "__len__") if not hasattr(dataset, m)]
    if missing or isinstance(dataset, Iterable) and not hasattr(dataset, "__getitem__"):
        raise MisuseError(
            f"NodeLoader: {type(dataset).__name__} has no {' or '.join(missing)}: {why}. Index "
            "it: give it __len__ and __getitem__(i)"
        )
