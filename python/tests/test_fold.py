"""virtualflow.torch's fold on the gradients' own device (_DeviceFold) against the C++ reducer's
fold (_core.fold_reference, the CPU device's FoldBuckets): the same int64 sums, bucket maxima
and overflow flag bit for bit, on the CPU and, where there is one, on a GPU."""

from __future__ import annotations

import math
import struct

import pytest
import torch

import virtualflow.torch as vf
from virtualflow import _core

UNSET = -(1 << 31)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def exponent_for(max_abs: float) -> int:
    """runtime/reduce/reducer.cc's ExponentFor."""
    _, k = math.frexp(max_abs)
    return max(-960, min(960, 44 - k))


def fold_both(device: str, nodes: list[list[float]], sizes: list[int], exponents: list[int]):
    """(torch's (sums, max_bits, bad), C++'s (sums, max_bits, bad)) for the rows `nodes`."""
    grads = torch.tensor(nodes, dtype=torch.float32)
    want = _core.fold_reference(grads.numpy(), sizes, exponents)
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    # As a worker runs it: init() turns deterministic algorithms on, and an operation without
    # one would raise here.
    torch.use_deterministic_algorithms(True)
    try:
        fold = vf._DeviceFold(
            torch.device(device), list(zip(offsets, sizes, strict=True)), sum(sizes), len(nodes)
        )
        fold.begin(exponents)
        for row in grads:
            fold.add(row.to(device), torch.tensor(0.25, device=device))
        folded, losses = fold.finish()
    finally:
        torch.use_deterministic_algorithms(False)
    assert losses == [0.25] * len(nodes)
    n, b = sum(sizes), len(sizes)
    got = (folded[:n].tolist(), folded[n : n + b].tolist(), bool(folded[n + b]))
    return got, (list(want[0]), list(want[1]), want[2])


@pytest.mark.parametrize("device", DEVICES)
def test_ties_round_half_to_even_as_the_cpp_fold_does(device: str) -> None:
    halves = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 0.49999997, 0.50000006, -0.0]
    ties = [(k + 0.5) / 1024 for k in range(-5, 5)]  # exact ties at 2^10
    got, want = fold_both(device, [halves + ties], [10, 10], [0, 10])
    assert got == want and got[2] is False
    assert got[0] == [0, 2, 2, 0, -2, -2, 4, 0, 1, 0, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4]


@pytest.mark.parametrize("device", DEVICES)
def test_values_at_the_limit_pass_and_just_above_flag_the_step(device: str) -> None:
    at_limit = [2.0**50, -(2.0**50), 2.0**49 + 0.5, 1.0]
    got, want = fold_both(device, [at_limit], [4], [0])
    assert got == want and got[2] is False
    assert got[0][0] == 1 << 50
    above = f32(0x5880_0001)  # the next float32 after 2^50
    for row, e in (([above, 0.0], 0), ([1.0, 2.0**-4], 55), ([f32(1), 0.0], 960)):
        got, want = fold_both(device, [[0.0, 0.0], row], [2], [e])
        assert got[1:] == want[1:] and got[2] is True, (row, e)  # the sums of a bad step are void


@pytest.mark.parametrize("device", DEVICES)
def test_subnormals_and_the_clamped_exponents(device: str) -> None:
    tiny = f32(1)  # 2^-149
    subnormal = [tiny, 3 * tiny, -f32(0x0040_0000), f32(0x007F_FFFF), -tiny, 0.0]
    e = exponent_for(max(abs(x) for x in subnormal))
    assert e > 127  # 2^e is no float32
    huge = [3.0e38, -1.0e38, 1.0, 2.0**-126]
    got, want = fold_both(device, [subnormal + huge, subnormal + huge[::-1]], [6, 4], [e, -960])
    assert got == want and got[2] is False
    assert got[0][0] == 2 * round(tiny * 2.0**e) and got[0][0] != 0
    got, want = fold_both(device, [subnormal], [6], [0])  # far below 1 at 2^0: all zeros
    assert got == want and got[0] == [0] * 6


@pytest.mark.parametrize("device", DEVICES)
def test_nan_and_inf_flag_a_scaled_bucket_and_are_measured_in_an_unset_one(device: str) -> None:
    nan, inf = float("nan"), float("inf")
    for row in ([1.0, nan, 2.0, 3.0], [1.0, -inf, 2.0, 3.0], [1.0, 2.0, 3.0, inf]):
        got, want = fold_both(device, [[0.5] * 4, row], [2, 2], [40, 40])
        assert got[1:] == want[1:] and got[2] is True, row
        got, want = fold_both(device, [[0.5] * 4, row], [2, 2], [UNSET, UNSET])
        assert got == want and got[2] is False, row
        assert got[0] == [0] * 4 and max(got[1]) >= 0x7F80_0000


@pytest.mark.parametrize("device", DEVICES)
def test_random_gradients_at_the_scales_the_reducer_picks(device: str) -> None:
    g = torch.Generator().manual_seed(7)
    sizes = [1, 7, 64, 300, 33]
    n = sum(sizes)
    # Magnitudes from subnormal to large, per bucket, as real gradients of different layers.
    nodes = []
    for _ in range(5):
        row = torch.randn(n, generator=g) * torch.exp2(
            torch.randint(-140, 60, (n,), generator=g).float()
        )
        nodes.append(row.tolist())
    grads = torch.tensor(nodes, dtype=torch.float32)
    maxima, off = [], 0
    for size in sizes:
        maxima.append(grads[:, off : off + size].abs().max().item())
        off += size
    picked = [exponent_for(m) for m in maxima]
    for exponents, bad in (
        (picked, False),
        ([e + 8 for e in picked], True),
        ([UNSET, picked[1], UNSET, picked[3], picked[4]], False),
    ):
        got, want = fold_both(device, nodes, sizes, exponents)
        assert got[1:] == want[1:] and got[2] is bad, exponents
        if not bad:
            assert got[0] == want[0], exponents
            assert any(s != 0 for s in got[0])


def test_a_bucket_table_that_does_not_tile_the_gradient_is_refused() -> None:
    with pytest.raises(vf.Error, match="do not tile"):
        vf._DeviceFold(torch.device("cpu"), [(0, 4), (5, 3)], 8, 2)


def test_the_fold_is_chosen_by_device_reduction_and_vf_torch_fold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("VF_TORCH_FOLD", raising=False)
    assert not vf._fold_on_device(cpu, "exact") and vf._fold_on_device(cuda, "exact")
    assert not vf._fold_on_device(cuda, "fast")
    monkeypatch.setenv("VF_TORCH_FOLD", "device")
    assert vf._fold_on_device(cpu, "exact") and not vf._fold_on_device(cpu, "fast")
    monkeypatch.setenv("VF_TORCH_FOLD", "host")
    assert not vf._fold_on_device(cuda, "exact")
    monkeypatch.setenv("VF_TORCH_FOLD", "gpu")
    with pytest.raises(vf.Error, match="'device' or 'host'"):
        vf._fold_on_device(cpu, "exact")
