#!/usr/bin/env python3
"""examples/torch/cnn.py's training loop as a VirtualFlow worker that records its step times.

The same loop as cnn.py's main() (the model, augmentation and data are cnn.py's own), without
the test-set evaluation at the end, plus: each step's start (when job.steps() hands it out) and
end (after the optimizer step) go to $VF_BENCH_TIMES with this worker's rank and world size, and
the $VF_BENCH_KILL_STEP hook SIGKILLs the highest rank once, after its first node of that step;
with VF_BENCH_NODE_TIMES=1 each node's start is recorded too (the resize runs use it to split
the recovery into detection and recomputation); with VF_BENCH_PROFILE=1 each step's time in
the library's calls, node.backward(), the forward passes and the optimizer (bench.py profile).
Started by `vf run` (the command of the job's worker container).
"""

from __future__ import annotations

import time

T_START = time.time()

import os  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

if os.environ.get("VF_BENCH_LIBRARY"):
    # bench.py ab: a patched copy of the virtualflow package ahead of the built one (vf run puts
    # build/python first on PYTHONPATH).
    sys.path.insert(0, os.environ["VF_BENCH_LIBRARY"])

import common  # noqa: E402
import virtualflow.torch as vf  # noqa: E402


class Timed:
    """Stands in for one of the library's C++ objects (job._worker, job._sharder) and adds the
    time spent in each of its methods to `times` (VF_BENCH_PROFILE=1)."""

    def __init__(self, inner: Any, times: dict[str, float], prefix: str) -> None:
        self._inner, self._times, self._prefix = inner, times, prefix

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr
        key = self._prefix + name

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self._times[key] = self._times.get(key, 0.0) + time.perf_counter() - t0

        return timed


def main() -> None:
    if os.environ.get("VF_BENCH_SETSID", "") == "1":
        # A session of its own, as torchrun gives each DDP rank (start_new_session=True): with
        # the kernel's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled) CPU time
        # is shared between sessions first, so on a loaded machine the two sides would
        # otherwise get different shares of it.
        os.setsid()
    job = vf.init()
    profile = os.environ.get("VF_BENCH_PROFILE", "") == "1"
    times: dict[str, float] = {}
    if profile:
        # Where a step's time goes: the library's calls into C++ (the per-node fold `add`, the
        # reduction `finish`, ...), node.backward() (autograd plus the library's checks), the
        # user's forward and optimizer step; the rest is Python in the library's step loop.
        # A proxy in the worker's place, the same calls timed.
        job._worker = Timed(job._worker, times, "worker.")  # type: ignore[assignment]
        backward = job._backward

        def timed_backward(node: Any, loss: torch.Tensor) -> None:
            t0 = time.perf_counter()
            backward(node, loss)
            times["node.backward"] = times.get("node.backward", 0.0) + time.perf_counter() - t0

        job._backward = timed_backward  # type: ignore[method-assign]
    cnn = common.cnn_module(with_virtualflow=True)
    rec = common.Recorder(
        system="virtualflow",
        worker=os.environ.get("VF_WORKER", ""),
        threads=torch.get_num_threads(),
    )
    rec.write(event="start", t=T_START)
    dev = cnn.device()
    x_train, y_train = (t.to(dev) for t in cnn.load("train"))
    torch.manual_seed(0)
    model = cnn.Net().to(dev)
    total = job.total_steps(len(x_train))
    opt, sched = common.make_optimizer(model, total)
    state = vf.State(model=model, optimizer=opt, scheduler=sched)
    if profile:
        job._prepare_original = job._prepare  # type: ignore[attr-defined]

        def prepare(state: vf.State, dataset_size: int) -> None:
            job._prepare_original(state, dataset_size)  # type: ignore[attr-defined]
            job._sharder = Timed(job._sharder, times, "sharder.")  # type: ignore[assignment]

        job._prepare = prepare  # type: ignore[method-assign]
    node_times = os.environ.get("VF_BENCH_NODE_TIMES", "") == "1"  # also each node's start

    for step in job.steps(state, dataset_size=len(x_train)):
        t0 = time.time()
        model.train()
        first = True
        for node in step.virtual_nodes():
            if node_times:
                rec.write(
                    event="node",
                    step=step.index,
                    vnode=node.index,
                    t=time.time(),
                    rank=job.rank,
                    world=job.world_size,
                )
            t1 = time.perf_counter()
            # as_tensor: a library before its indices were a tensor (bench.py ab) gave a list.
            idx = torch.as_tensor(node.indices).to(dev)
            loss = F.cross_entropy(model(cnn.augment(x_train[idx])), y_train[idx])
            times["forward"] = times.get("forward", 0.0) + time.perf_counter() - t1
            node.backward(loss)
            if first and common.kill_requested(step.index, job.rank, job.world_size):
                common.die(rec, step.index)
            first = False
        t1 = time.perf_counter()
        opt.step()
        sched.step()
        opt.zero_grad()
        times["optimizer"] = times.get("optimizer", 0.0) + time.perf_counter() - t1
        if profile:
            rec.write(
                event="profile", step=step.index, rank=job.rank, world=job.world_size, **times
            )
            times.clear()
        rec.step(step.index, t0, time.time(), rank=job.rank, world=job.world_size, loss=step.loss)
    job.finish()


if __name__ == "__main__":
    if os.environ.get("VF_BENCH_CPROFILE"):
        # cProfile of the whole worker (bench.py profile --cprofile): where the library's own
        # Python time goes, per function.
        import cProfile  # noqa: PLC0415

        out = f"{os.environ['VF_BENCH_CPROFILE']}.{os.environ.get('VF_WORKER', 'worker')}"
        cProfile.run("main()", out)
    else:
        main()
