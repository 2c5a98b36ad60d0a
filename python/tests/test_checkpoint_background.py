"""virtualflow.torch's checkpoints written in the background: the host copy of the state taken at
the step boundary (_Snapshot) is independent of the live tensors, keeps its buffers from one
checkpoint to the next and holds what the live state holds; the writer (_BackgroundWrite) runs
one write at a time and hands its outcome back to the training thread; a file
write_checkpoint is writing stays the old one until the new one is whole."""

from __future__ import annotations

import io
import json
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
        assert a.layout == b.layout
        if a.layout != torch.strided:
            a, b = a.to_dense(), b.to_dense()
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


def test_a_large_host_copy_is_shared_out_between_threads_and_is_exact(monkeypatch):
    """Over _THREADED bytes, the copy is cut into pieces copied on several threads: every byte
    lands where it belongs, in tensors cut into pieces (odd sizes) and in those copied whole (a
    non-contiguous one, small ones)."""
    monkeypatch.setattr(vf._Snapshot, "_THREADED", 1 << 20)
    monkeypatch.setattr(vf._Snapshot, "_PIECE", 1000)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: the copy is not threaded")
    live = {
        "w": torch.randn(3_000_001),
        "bf16": torch.randn(1000, 777).to(torch.bfloat16),
        "transposed": torch.randn(300, 500).t(),
        "small": torch.arange(10),
    }
    copy = vf._Snapshot().take(live)
    assert_same(live, copy)
    for t in copy.values():
        assert t.is_contiguous()


def test_tensors_sharing_memory_stay_one_tensor():
    lin = torch.nn.Linear(3, 3)
    tied = {"a": lin.weight.detach(), "b": lin.weight.detach(), "c": lin.bias.detach()}
    copy = vf._Snapshot().take(tied)
    assert copy["a"] is copy["b"] and copy["a"] is not copy["c"]
    assert torch.equal(copy["a"], lin.weight.detach())


def decoded(pieces: list) -> tuple[dict, dict]:
    """The header and payload of _encode_state's pieces, sealed and read back as _Holder reads a
    checkpoint or a joiner's state."""
    sealed = _core.seal(pieces)
    raw = _core.unseal(sealed, "test")
    line, _, body = raw.partition(b"\n")
    header = json.loads(line)
    return header, vf._decode_state(header, memoryview(body), "test")


def test_a_state_as_a_checkpoint_holds_it():
    """_encode_state writes the header line with the layout, the skeleton and the tensors' bytes:
    what _Holder._load reads gives the state back, metadata and all."""
    state = trained_state("cpu")
    header, back = decoded(vf._encode_state({"step": 3}, vf._Snapshot().take(contents(state))))
    assert header["step"] == 3 and header["layout"]["skeleton_bytes"] > 0
    assert_same(loaded(contents(state)), back)
    assert back["model"]._metadata == state.model.state_dict()._metadata


@pytest.mark.parametrize("device", DEVICES)
def test_every_kind_of_tensor_comes_back_as_it_was(device):
    base = torch.arange(24, dtype=torch.float32, device=device).reshape(4, 6)
    payload = {
        "bf16": torch.linspace(-3, 3, 7, device=device).to(torch.bfloat16),
        "half": torch.tensor([1.5, -2.25], dtype=torch.float16, device=device),
        "bool": torch.tensor([True, False, True], device=device),
        "int": torch.tensor([[1, -2], [3, 4]], dtype=torch.int32, device=device),
        "scalar": torch.tensor(2.5, dtype=torch.float64, device=device),
        "empty": torch.empty(0, 3, device=device),
        "transposed": base.t(),  # not contiguous
        "slice": base[1:3, ::2],
        "tied": (base, base),
        "sparse": torch.tensor([[0.0, 2.0], [3.0, 0.0]]).to_sparse(),
        "plain": [1, "two", 3.0, None, (4, 5)],
    }
    pieces = vf._encode_state({}, payload)
    _, back = decoded(pieces)
    assert_same(payload, back)
    assert back["tied"][0] is back["tied"][1]
    assert back["sparse"].layout == torch.sparse_coo
    for t in back["bf16"], back["transposed"], back["scalar"]:
        assert t.is_contiguous() and t.device.type == "cpu"


def test_a_snapshots_tensors_are_lent_to_the_writer_not_copied():
    state = trained_state("cpu")
    copy = vf._Snapshot().take(contents(state))
    pieces = vf._encode_state({}, copy)
    lent = {p.__array_interface__["data"][0] for p in pieces[2:]}
    assert copy["model"]["0.weight"].data_ptr() in lent
    assert copy["optimizer"]["state"][0]["exp_avg"].data_ptr() in lent


def test_a_layout_that_does_not_fit_its_bytes_is_refused():
    line, skeleton, *tensors = vf._encode_state({}, {"w": torch.ones(4), "v": torch.zeros(2)})
    header = json.loads(line)
    body = skeleton + b"".join(bytes(t) for t in tensors)
    assert_same(
        vf._decode_state(header, memoryview(body), "x"), {"w": torch.ones(4), "v": torch.zeros(2)}
    )
    with pytest.raises(ValueError, match="x: its tensors need more bytes than it holds"):
        vf._decode_state(header, memoryview(body[:-1]), "x")
    with pytest.raises(ValueError, match="x: 1 bytes after its tensors"):
        vf._decode_state(header, memoryview(body + b"\0"), "x")
    header["layout"]["tensors"][0][0] = "no_such_dtype"
    with pytest.raises(ValueError, match="unknown dtype 'no_such_dtype'"):
        vf._decode_state(header, memoryview(body), "x")
    with pytest.raises(ValueError, match="x: no layout"):
        vf._decode_state({}, memoryview(body), "x")


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


def test_pieces_are_written_as_their_sealed_joined_bytes(tmp_path):
    path = str(tmp_path / "job.ckpt")
    w = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB: several of the writer's chunks
    pieces = vf._encode_state({"step": 1}, {"w": w, "n": 7})
    _core.write_checkpoint(path, pieces)
    joined = b"".join(bytes(p) for p in pieces)
    assert _core.read_checkpoint(path) == joined
    assert _core.seal(pieces) == _core.seal(joined)
    with pytest.raises(TypeError):
        _core.write_checkpoint(path, [b"header", 3])
    assert _core.read_checkpoint(path) == joined  # a refused payload leaves the file as it was
