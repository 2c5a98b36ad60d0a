"""Triton's fold kernel (virtualflow/_fold_kernel.py) against _DeviceFold's PyTorch operations:
the same int64 sums, bucket maxima and overflow flag bit for bit, over several nodes, uneven
buckets and the edge values of the fixed-point format (ties, the 2^50 limit, |v| >= 2^51, NaN,
Inf, subnormals, -0.0). The PyTorch operations are checked against the C++ reducer's fold in
test_fold.py.

Without a GPU the kernel runs on CPU tensors through Triton's interpreter, which must be chosen
before Triton is imported: test_the_kernel_under_tritons_interpreter runs this file again in a
process with TRITON_INTERPRET=1, where the comparisons run on the CPU. In a process with a GPU
(and no TRITON_INTERPRET) they also run on it, compiled."""

from __future__ import annotations

import math
import os
import re
import struct
import subprocess
import sys

import pytest
import torch

import virtualflow.torch as vf

UNSET = -(1 << 31)
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def _kernel_here() -> str:
    """Why the kernel cannot run on this process's kernel device (KERNEL_DEVICE), or ""."""
    try:
        from virtualflow import _fold_kernel
    except ImportError as e:
        return f"Triton does not import ({e})"
    if not INTERPRETING and not torch.cuda.is_available():
        return "no GPU: test_the_kernel_under_tritons_interpreter runs this on the CPU"
    reason = _fold_kernel.unavailable_reason(torch.device(KERNEL_DEVICE))
    if not reason:
        assert _fold_kernel.BLOCK == BLOCK
    return reason


# The CPU under the interpreter, else a GPU.
KERNEL_DEVICE = "cpu" if INTERPRETING else "cuda"
BLOCK = 2048  # _fold_kernel.BLOCK, which the bucket sizes below are chosen around
NO_KERNEL = _kernel_here()
needs_kernel = pytest.mark.skipif(bool(NO_KERNEL), reason=NO_KERNEL)


def f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def exponent_for(max_abs: float) -> int:
    """runtime/reduce/reducer.cc's ExponentFor (as test_fold.py has it)."""
    _, k = math.frexp(max_abs)
    return max(-960, min(960, 44 - k))


def run_fold(
    fold: vf._DeviceFold, device: str, nodes: torch.Tensor, exponents: list[int], kernel: bool
) -> torch.Tensor:
    """One step of `fold` over the rows of `nodes`: its packed results (sums, maxima, flag)."""
    fold.use_kernel = kernel
    fold.begin(exponents)
    assert fold._fused is kernel  # the way asked for is the way it folds
    for i, row in enumerate(nodes):
        fold.add(row.to(device), torch.tensor(0.5 * i, device=device))
    folded, losses = fold.finish()
    assert losses == [0.5 * i for i in range(len(nodes))]
    return folded.clone()


def fold_both(
    device: str, nodes: torch.Tensor, sizes: list[int], exponents: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the kernel's packed results, PyTorch's operations') for the rows `nodes`, each way on a
    fold of its own."""
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    buckets = list(zip(offsets, sizes, strict=True))
    results = []
    # As a worker runs it: init() turns deterministic algorithms on.
    torch.use_deterministic_algorithms(True)
    try:
        for kernel in (True, False):
            fold = vf._DeviceFold(torch.device(device), buckets, sum(sizes), len(nodes))
            results.append(run_fold(fold, device, nodes, exponents, kernel))
    finally:
        torch.use_deterministic_algorithms(False)
    return results[0], results[1]


def assert_same(got: torch.Tensor, want: torch.Tensor, sizes: list[int]) -> None:
    n, b = sum(sizes), len(sizes)
    assert got.dtype == want.dtype == torch.int64 and got.shape == want.shape
    if not torch.equal(got, want):
        wrong = (got != want).nonzero().view(-1).tolist()
        where = [("sum" if i < n else "max" if i < n + b else "flag", i) for i in wrong[:10]]
        raise AssertionError(f"{len(wrong)} of {got.numel()} values differ, first {where}")


def random_nodes(seed: int, k: int, n: int, lo: int, hi: int) -> torch.Tensor:
    """k gradients of n float32 values with magnitudes from 2^lo to 2^hi (lo below -126 gives
    subnormals)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(lo, hi, (k, n), generator=g).float())
    return (torch.randn(k, n, generator=g) * scale).to(torch.float32)


def per_bucket_exponents(nodes: torch.Tensor, sizes: list[int]) -> list[int]:
    """The exponents the reducer would pick from the nodes' largest |x| per bucket."""
    out, off = [], 0
    for size in sizes:
        top = nodes[:, off : off + size].abs().max().item()
        out.append(exponent_for(top) if top > 0 else 0)
        off += size
    return out


# Uneven buckets: one over two tiles and a bit, one smaller than a block, one a block long but
# starting inside a tile, one of one element, one not a multiple of BLOCK.
SIZES = [2 * BLOCK + 37, 100, BLOCK, 1, 3 * BLOCK - 5, 700]


@needs_kernel
def test_random_gradients_of_several_scales_match_pytorchs_fold() -> None:
    device = KERNEL_DEVICE
    n = sum(SIZES)
    for seed, (lo, hi) in enumerate(((-8, 8), (-140, 60), (-30, -10))):
        nodes = random_nodes(seed, 4, n, lo, hi)
        picked = per_bucket_exponents(nodes, SIZES)
        for exponents in (
            picked,  # as the reducer picks them: nothing over the limit
            [e + 8 for e in picked],  # too fine a scale: over the limit, the step flagged
            [UNSET, picked[1], UNSET, picked[3], picked[4], UNSET],  # unset: only measured
            [e - 20 for e in picked],  # coarse: most values round to 0 or to small integers
        ):
            got, want = fold_both(device, nodes, SIZES, exponents)
            assert_same(got, want, SIZES)
        got, _ = fold_both(device, nodes, SIZES, picked)
        assert bool(got[n + len(SIZES)]) is False and bool(got[:n].ne(0).any())


def edge_values() -> list[float]:
    """Values that meet the format's edges at exponents 0, 20 and 60 (see EDGE_EXPONENTS)."""
    ties = [k + 0.5 for k in range(-6, 6)]  # x * 1 exactly k + 0.5, k even and odd
    # k + 0.5 with 24 significant bits, scaled by 2^20 to the tie (2^22 + 1) + 0.5 and others.
    big_ties = [(2.0**22 + k + 0.5) * 2.0**-20 for k in range(4)] + [-(2.0**22 + 1.5) * 2.0**-20]
    near = [0.49999997, 0.50000006, -0.49999997, 1.4999999, 2.5000002]
    limit = [
        2.0**50,  # at 2^0: exactly the limit, kept
        -(2.0**50),
        f32(0x587F_FFFF),  # the float32 below 2^50: kept
        f32(0x5880_0001),  # the float32 above 2^50: over
        2.0**51,  # at 2^0: |v| = 2^51, beyond the rounding trick's range
        -(2.0**51),
        1.5 * 2.0**51,
        2.0**52 + 2.0**30,
        2.0**-10,  # at 2^60: exactly 2^50
        f32(0x3A80_0001),  # the float32 above 2^-10: at 2^60 just over 2^50
        2.0**-9,  # at 2^60: 2^51
        -(2.0**-9) * 1.25,
        3.0e38,  # at 2^60 and more: float64's Inf after scaling
        -3.0e38,
    ]
    special = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0]
    tiny = f32(1)
    subnormal = [tiny, -tiny, 3 * tiny, f32(0x007F_FFFF), -f32(0x0040_0000), f32(0x0080_0000)]
    return ties + big_ties + near + limit + special + subnormal


# Each bucket holds the edge values cyclically, at its own exponent: 0 (ties, the limit), 20 (24-
# bit ties), 60 (the limit reached by scaling), 149 (a subnormal's bit at 1), 960 and -960 (the
# clamps), 1100 (past 1000, where the scale stops at 2^1000), an unset one and 40 (NaN and Inf
# flag a scaled bucket).
EDGE_EXPONENTS = [0, 20, 60, 149, 960, -960, 1100, UNSET, 40]
EDGE_SIZES = [BLOCK + 41, 77, 2 * BLOCK - 1, 300, 61, 45, 33, 129, BLOCK + 3]


@needs_kernel
def test_edge_values_match_pytorchs_fold() -> None:
    device = KERNEL_DEVICE
    edges = torch.tensor(edge_values(), dtype=torch.float32)
    n = sum(EDGE_SIZES)
    cyclic = edges.repeat(n // edges.numel() + 1)[:n]
    g = torch.Generator().manual_seed(11)
    # Each node has the edges at other places (shuffled, reversed), across the tiles' edges.
    nodes = torch.stack([cyclic, cyclic[torch.randperm(n, generator=g)], cyclic.flip(0)])
    got, want = fold_both(device, nodes, EDGE_SIZES, EDGE_EXPONENTS)
    assert_same(got, want, EDGE_SIZES)
    # Without NaN, Inf and what exceeds 2^29 (2^49 at the exponent 20), no bucket is flagged,
    # so the sums are the step's: the ties checked for the values they must have.
    finite = torch.where(edges.abs() <= 2.0**29, edges, torch.zeros(()))
    sizes, exponents = [BLOCK + 41, 77, 300], [0, 20, 0]
    rows = finite.repeat(sum(sizes) // finite.numel() + 1)[: sum(sizes)].unsqueeze(0)
    got, want = fold_both(device, rows, sizes, exponents)
    assert_same(got, want, sizes)
    assert bool(got[sum(sizes) + len(sizes)]) is False
    ties = [int(v) for v in got[:12]]
    assert ties == [-6, -4, -4, -2, -2, 0, 0, 2, 2, 4, 4, 6]  # -5.5 to 5.5: half to even


@needs_kernel
def test_one_fold_flipped_between_steps_gives_the_same_bits() -> None:
    device = KERNEL_DEVICE
    """use_kernel read by begin(): a benchmark flips it between steps, and a redo (begin again)
    starts over; each step's results are the same whichever way folds it."""
    n = sum(SIZES)
    nodes = random_nodes(3, 3, n, -60, 10)
    exponents = per_bucket_exponents(nodes, SIZES)
    offsets = [sum(SIZES[:i]) for i in range(len(SIZES))]
    fold = vf._DeviceFold(torch.device(device), list(zip(offsets, SIZES, strict=True)), n, 3)
    runs = [
        run_fold(fold, device, nodes, exponents, kernel) for kernel in (True, False, True, False)
    ]
    shifted = [e + 1 for e in exponents]  # a redo at a new scale, each way
    runs += [run_fold(fold, device, nodes, shifted, kernel) for kernel in (False, True)]
    for r in runs[1:4]:
        assert_same(r, runs[0], SIZES)
    assert_same(runs[5], runs[4], SIZES)
    assert not torch.equal(runs[4], runs[0])


@needs_kernel
def test_the_kernel_is_chosen_by_vf_torch_fold_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    device = KERNEL_DEVICE
    buckets = [(0, 10), (10, 5)]
    monkeypatch.setenv("VF_TORCH_FOLD_KERNEL", "torch")
    assert not vf._DeviceFold(torch.device(device), buckets, 15, 2).use_kernel
    for choice in ("triton", ""):
        monkeypatch.setenv("VF_TORCH_FOLD_KERNEL", choice)
        # By default on a GPU only; on the CPU the interpreter's kernel is the tests' to ask for.
        assert vf._DeviceFold(torch.device(device), buckets, 15, 2).use_kernel is (device == "cuda")


def test_an_unknown_vf_torch_fold_kernel_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VF_TORCH_FOLD_KERNEL", "bogus")
    with pytest.raises(vf.Error, match=r"VF_TORCH_FOLD_KERNEL='bogus'.*'triton'.*'torch'"):
        vf._DeviceFold(torch.device("cpu"), [(0, 4), (4, 4)], 8, 2)


def test_triton_asked_for_where_it_cannot_fold_says_so_and_folds_with_pytorch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("VF_TORCH_FOLD_KERNEL", "triton")
    fold = vf._DeviceFold(torch.device("cpu"), [(0, 4), (4, 4)], 8, 2)
    assert not fold.use_kernel
    assert "VF_TORCH_FOLD_KERNEL=triton, but" in capsys.readouterr().err
    fold.begin([0, 0])
    fold.add(torch.tensor([0.5, 1.5, 2.5, -0.5, 1, 2, 3, 4]), torch.tensor(1.0))
    folded, _ = fold.finish()
    assert folded[:8].tolist() == [0, 2, 2, 0, 1, 2, 3, 4]


def test_the_kernel_under_tritons_interpreter() -> None:
    """This file's comparisons, again in a process where Triton interprets the kernel on the
    CPU (TRITON_INTERPRET=1 before Triton is imported)."""
    if INTERPRETING:
        pytest.skip("this is the interpreter's process")
    try:
        import triton  # noqa: F401
    except ImportError as e:
        pytest.skip(f"Triton does not import here ({e}); the kernel is never used without it")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-rs"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    # Every comparison ran there: none skipped but this test.
    assert re.search(r"\b[1-9][0-9]* passed, 1 skipped\b", out), out
