"""virtualflow.torch's checkpoints written in the background: the host copy of the state taken at
the step boundary (_Snapshot) is independent of the live tensors, keeps its buffers from one
checkpoint to the next and holds what the live state holds; the writer (_BackgroundWrite) runs
one write at a time and hands its outcome back to the training thread; a file
write_checkpoint is writing stays the old one until the new one is whole."""

from __future__ import annotations

import io
import os
import threading

import pytest
import torch

import virtualflow.torch as vf
from virtualflow import _core

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def trained_state(device: str) -> vf.State:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 5), torch.nn.BatchNorm1d(5), torch.nn.Linear(5, 2)
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    for _ in range(3):
        model(torch.randn(4, 6, device=device)).square().sum().backward()
        opt.step()
        sched.step()
    return vf.State(model=model, optimizer=opt, scheduler=sched, extra={"n": 3, "t": torch.ones(2)})


def contents(state: vf.State) -> dict:
    return {
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "extra": state.extra,
    }


def saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def loaded(obj) -> dict:
    """obj through torch.save and the loader a resume uses."""
    return torch.load(io.BytesIO(saved(obj)), weights_only=True, map_location="cpu")


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.cpu(), b.cpu())
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


@pytest.mark.parametrize("device", DEVICES)
def test_a_snapshot_holds_the_state_in_host_memory_and_loads_as_the_state(device):
    state = trained_state(device)
    live = contents(state)
    copy = vf._Snapshot().take(live)
    assert_same(loaded(live), loaded(copy))
    # The module versions load_state_dict reads (BatchNorm's) come along.
    assert copy["model"]._metadata == live["model"]._metadata
    for t in copy["model"].values():
        assert t.device.type == "cpu"
        assert t.is_pinned() == (device == "cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_a_snapshot_does_not_change_with_the_live_state_and_reuses_its_buffers(device):
    state = trained_state(device)
    snapshot = vf._Snapshot()
    first = snapshot.take(contents(state))
    before = loaded(first)
    with torch.no_grad():
        for p in state.model.parameters():
            p.add_(1.0)
    state.optimizer.state[next(iter(state.model.parameters()))]["exp_avg"].mul_(3.0)
    state.extra["t"].add_(5.0)
    assert_same(before, loaded(first))
    second = snapshot.take(contents(state))
    # The same buffers, holding the new values.
    assert first["model"]["0.weight"].data_ptr() == second["model"]["0.weight"].data_ptr()
    assert_same(loaded(contents(state)), loaded(second))


def test_tensors_sharing_memory_stay_one_tensor():
    lin = torch.nn.Linear(3, 3)
    tied = {"a": lin.weight.detach(), "b": lin.weight.detach(), "c": lin.bias.detach()}
    copy = vf._Snapshot().take(tied)
    assert copy["a"] is copy["b"] and copy["a"] is not copy["c"]
    assert torch.equal(copy["a"], lin.weight.detach())


def test_a_state_as_a_checkpoint_holds_it():
    """_encode_state writes the header line and torch.save's bytes: what _Holder._load reads."""
    state = trained_state("cpu")
    blob = vf._encode_state({"step": 3}, vf._Snapshot().take(contents(state)))
    line, _, body = blob.partition(b"\n")
    assert line == b'{"step": 3}'
    assert_same(loaded(contents(state)), torch.load(io.BytesIO(body), weights_only=True))


def test_one_write_at_a_time_its_outcome_handed_back():
    writer = vf._BackgroundWrite()
    assert writer.wait() is None
    release = threading.Event()
    writer.start(4, release.wait)
    assert writer.in_flight()
    assert writer.wait(block=False) is None  # still writing
    with pytest.raises(AssertionError):
        writer.start(5, lambda: None)
    release.set()
    assert writer.wait() == (4, "")
    assert not writer.in_flight() and writer.wait() is None


def test_a_failed_write_is_an_error_to_report_and_a_broken_state_is_raised():
    writer = vf._BackgroundWrite()

    def refused() -> None:
        raise _core.Error("checkpoint /ro/x: open: Read-only file system")

    writer.start(6, refused)
    assert writer.wait() == (6, "checkpoint /ro/x: open: Read-only file system")

    def unpicklable() -> None:
        raise TypeError("cannot pickle 'generator' object")

    writer.start(7, unpicklable)
    with pytest.raises(TypeError, match="generator"):
        writer.wait()
    assert not writer.in_flight()


def test_a_real_write_in_the_background_leaves_a_whole_file(tmp_path):
    path = str(tmp_path / "job.ckpt")
    _core.write_checkpoint(path, b"old" * 1000)
    writer = vf._BackgroundWrite()
    big = os.urandom(8 << 20)
    writer.start(2, lambda: _core.write_checkpoint(path, big))
    # Read while it writes: the old checkpoint or the new one, never a part of either.
    done = None
    while done is None:
        assert _core.read_checkpoint(path) in (b"old" * 1000, big)
        done = writer.wait(block=False)
    assert done == (2, "")
    assert _core.read_checkpoint(path) == big


def test_faults_are_read_as_the_agent_reads_them(monkeypatch):
    monkeypatch.setenv(
        _core.ENV_FAULT_INJECT, "worker-1:allreduce@5,worker-0:checkpoint-write@6,worker-2:x"
    )
    assert vf._armed_fault("checkpoint-write", "worker-0") == 6
    assert vf._armed_fault("checkpoint-write", "worker-1") is None
    monkeypatch.setenv(_core.ENV_FAULT_INJECT, "worker-3:checkpoint-write")
    assert vf._armed_fault("checkpoint-write", "worker-3") == -1
    monkeypatch.delenv(_core.ENV_FAULT_INJECT)
    assert vf._armed_fault("checkpoint-write", "worker-3") is None


def test_the_piecewise_buffer_writes_what_a_bytesio_writes():
    payload = {"w": torch.arange(3 << 20, dtype=torch.float32), "n": 7}  # 12 MiB: 12 pieces
    piecewise = vf._PiecewiseBuffer()
    torch.save(payload, piecewise)
    assert piecewise.getvalue() == saved(payload)
