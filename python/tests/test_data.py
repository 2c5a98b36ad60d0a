"""virtualflow.data.NodeLoader without a job: per-sample seeds that do not depend on which process
loads a sample, prefetch that follows the plan, the refusal of iterable datasets, and errors and
deaths of loader processes that surface in the training process."""

from __future__ import annotations

import os
import random
import signal
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.utils.data

from virtualflow import _core
from virtualflow.data import LoaderError, NodeLoader, sample_seed
from virtualflow.torch import MisuseError

SEED, N, BATCH, V = 7, 64, 16, 4


class FakeJob:
    """What NodeLoader reads of a Job: the spec, the plan's nodes and the job's length."""

    def __init__(self, nodes: list[int], steps: int = 6) -> None:
        self.spec = {"seed": SEED, "global_batch_size": BATCH, "virtual_nodes": V}
        self.virtual_nodes = nodes
        self._steps = steps

    def total_steps(self, _n: int) -> int:
        return self._steps


def node(step: int, v: int) -> SimpleNamespace:
    indices = torch.tensor(_core.Sharder(SEED, N, BATCH, V).indices(step, v), dtype=torch.int64)
    return SimpleNamespace(_step=SimpleNamespace(index=step), index=v, indices=indices)


class Augmented(torch.utils.data.Dataset):
    """Each sample: its index and draws from torch, random and NumPy, and its seed."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "i": torch.tensor(i),
            "torch": torch.rand(3),
            "random": torch.tensor(random.random(), dtype=torch.float64),
            "numpy": torch.tensor(np.random.rand(), dtype=torch.float64),
            "seed": torch.tensor(sample_seed()),
        }


class Failing(Augmented):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i == int(node(1, 2).indices[3]):
            raise ValueError(f"sample {i} is broken")
        return super().__getitem__(i)


class Dying(Augmented):
    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if i == int(node(0, 1).indices[0]):
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        yield from range(N)


def all_batches(loader: NodeLoader, job: FakeJob, steps: int) -> dict[tuple[int, int], dict]:
    out = {}
    for s in range(steps):
        for v in job.virtual_nodes:
            out[s, v] = loader.batch(node(s, v))
    return out


def test_the_same_samples_and_random_draws_in_process_and_in_one_or_two_loader_processes():
    results = {}
    for workers in (0, 1, 2):
        job = FakeJob(list(range(V)))
        with NodeLoader(job, Augmented(), num_workers=workers) as loader:
            results[workers] = all_batches(loader, job, 3)
    for key, batch in results[0].items():
        assert batch["i"].tolist() == node(*key).indices.tolist()
        expected = [
            _core.mix_key(SEED, key[0], key[1], j + 1) & 0x7FFF_FFFF_FFFF_FFFF
            for j in range(BATCH // V)
        ]
        assert batch["seed"].tolist() == expected
        for workers in (1, 2):
            for name, t in batch.items():
                assert torch.equal(t, results[workers][key][name]), (workers, key, name)
    # Different samples draw different numbers.
    draws = torch.cat([b["torch"] for b in results[0].values()]).flatten()
    assert len(set(draws.tolist())) == len(draws)


def test_loading_in_process_leaves_the_training_generators_as_they_were():
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    expected = (torch.rand(2), random.random(), np.random.rand())
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    NodeLoader(FakeJob([0]), Augmented()).batch(node(0, 0))
    assert torch.equal(torch.rand(2), expected[0])
    assert random.random() == expected[1] and np.random.rand() == expected[2]


def test_a_new_plan_drops_what_it_no_longer_needs_and_loads_what_it_does():
    job = FakeJob([0, 1])
    # Three steps ahead of 2 nodes is 6 nodes wanted, more than the 2 loader processes take at
    # once (2 each): whatever has arrived by then, at least 2 are loaded or waiting to be sent
    # when the plan changes, and are dropped. (No sleep: on a busy machine none may arrive.)
    with NodeLoader(job, Augmented(), num_workers=2, prefetch_steps=3) as loader:
        first = loader.batch(node(0, 0))
        loader.batch(node(0, 1))
        job.virtual_nodes = [2, 3]  # a resize: this worker now holds other nodes
        b = loader.batch(node(1, 2))
        assert loader.dropped > 0
        assert b["i"].tolist() == node(1, 2).indices.tolist()
        # A node run twice (exact mode's recompute) is loaded again, to the same bits.
        again = loader.batch(node(0, 0))
        assert all(torch.equal(first[k], again[k]) for k in first)


def test_a_dataset_error_in_a_loader_process_surfaces_with_its_traceback():
    job = FakeJob(list(range(V)))
    with NodeLoader(job, Failing(), num_workers=2) as loader:
        with pytest.raises(LoaderError) as e:
            all_batches(loader, job, 3)
    text = str(e.value)
    assert "ValueError: sample" in text and "is broken" in text
    assert "Traceback" in text and "__getitem__" in text
    assert "virtual node 2 of step 2" in text


def test_a_loader_process_that_dies_is_reported_not_waited_for():
    job = FakeJob(list(range(V)))
    started = time.monotonic()
    with NodeLoader(job, Dying(), num_workers=1) as loader:
        with pytest.raises(LoaderError, match="killed by signal 9"):
            all_batches(loader, job, 1)
    assert time.monotonic() - started < 60


def test_loader_processes_end_with_close():
    loader = NodeLoader(FakeJob([0]), Augmented(), num_workers=2)
    loader.batch(node(0, 0))
    processes = [ld.process for ld in loader._loaders]
    loader.close()
    assert not any(p.is_alive() for p in processes)


def test_an_iterable_dataset_is_refused_saying_why_and_what_to_do():
    with pytest.raises(MisuseError, match="IterableDataset.*by index.*Index it"):
        NodeLoader(FakeJob([0]), Stream())
    with pytest.raises(MisuseError, match="no __getitem__ or __len__.*Index it"):
        NodeLoader(FakeJob([0]), iter(range(N)))


def test_a_dataset_of_another_size_than_the_jobs_is_refused():
    class Short(Augmented):
        def __len__(self) -> int:
            return N - 1

    with pytest.raises(MisuseError, match="dataset_size=len"):
        NodeLoader(FakeJob([0]), Short()).batch(node(0, 0))
