"""One Triton kernel for a virtual node's exact fold on a GPU (virtualflow.torch._DeviceFold).

_DeviceFold's PyTorch operations fold a node's float32 gradient into the step's int64 sums in
about nine passes over float64 temporaries: some 146 bytes of memory traffic per gradient
element, 4.3 ms a node for a 124M-parameter model on an H200, the library's main cost. This
kernel makes one pass: it reads the gradient (4 bytes an element) and reads and writes the sum
(8 + 8): 20 bytes an element, and no temporaries. Its results are those of the PyTorch
operations bit for bit (python/tests/test_fold_kernel.py), so either may fold any step.

Per element x of bucket b, with the bucket's scale s (float64: 2^e, or 0 where the bucket has no
exponent yet): v = float64(x) * s, exact as in the PyTorch code (the same IEEE multiplication,
and a float32 widens to float64 exactly, subnormals included); rounded half to even; added to the
sum when |v| <= 2^50 after rounding (NaN fails that), else nothing is added. Per bucket, the
largest bit pattern of |x| (bits(x) & 0x7FFFFFFF as int32: NaN above +Inf) is reduced into one
int32 per bucket with an atomic maximum, which is deterministic because a maximum does not
depend on the order it is taken in.

The gradient is cut into blocks that never cross a bucket's boundary: each aligned tile of BLOCK
elements, split where a bucket ends inside it. A block therefore has one scale, and a whole tile
(nearly all of them) is read and written without masks, which lets the compiler vectorise it.
One program owns each block's elements, so the sums need no atomics.

Importing this module imports Triton: virtualflow.torch imports it only when it folds with it,
and runs without it (with PyTorch's operations) where Triton does not import. With
TRITON_INTERPRET=1 set before Triton is imported, the kernel runs on CPU tensors through
Triton's interpreter: how the tests check it without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Triton has no type information (nor, on a worker without it, is it here: virtualflow.torch
# imports this module only where it is).
import triton  # type: ignore[import-untyped, import-not-found, unused-ignore]
import triton.language as tl  # type: ignore[import-untyped, import-not-found, unused-ignore]

# Elements per block, and warps per block: 8 elements a thread. On an H200 with 124M elements,
# 0.60 ms a node (4.1 TB/s at 20 bytes an element), against 0.62 ms with 4096 and 8 warps, and
# 4.3 ms with PyTorch's operations.
BLOCK = 2048
NUM_WARPS = 4


@triton.jit
def _fixed_point(x, scale):  # type: ignore[no-untyped-def]
    """x * scale rounded half to even as int64 where |rounded| <= 2^50, else 0."""
    v = x.to(tl.float64) * scale
    # Adding and subtracting 1.5 * 2^52 rounds |v| < 2^51 to an integer, half to even: v + C lies
    # in (2^52, 2^53), where float64's spacing is 1, so the addition rounds in the default mode
    # (to nearest, ties to even; C is even, so the tie goes to the even integer), and the
    # subtraction is exact. Neither Triton nor LLVM reassociates floating-point additions
    # without fast-math flags, and the launch turns contraction into FMAs off. The constants are
    # exact in float32 and float64 alike.
    r = (v + 6755399441055744.0) - 6755399441055744.0
    # |v| >= 2^51 is beyond the trick's range, but the two roundings then move r from v by a
    # few of v's last-place units at most, so |r| is still far above the limit: such an element
    # adds nothing either way. Inf gives NaN, and NaN fails the test.
    keep = tl.abs(r) <= 1125899906842624.0
    return tl.where(keep, r, 0.0).to(tl.int64)


@triton.jit
def _magnitude_bits(x):  # type: ignore[no-untyped-def]
    """|x|'s bit pattern as int32: ordered as the magnitudes, NaN above +Inf."""
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit  # type: ignore[untyped-decorator, misc, unused-ignore]
def _fold(grad, acc, scale, maxima, starts, lengths, buckets, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    """acc[i] += fixed_point(grad[i]) over one block; maxima[bucket] = max(|grad[i]|'s bits)."""
    block = tl.program_id(0)
    start = tl.load(starts + block)  # int64: gradients may exceed 2^31 elements
    length = tl.load(lengths + block)
    bucket = tl.load(buckets + block)
    s = tl.load(scale + bucket)
    lanes = tl.arange(0, BLOCK)
    if length == BLOCK:
        # A whole tile, so start is a multiple of BLOCK: written so the compiler knows it.
        offsets = (start // BLOCK) * BLOCK + lanes
        x = tl.load(grad + offsets)
        tl.store(acc + offsets, tl.load(acc + offsets) + _fixed_point(x, s))
        top = tl.max(_magnitude_bits(x), axis=0)
    else:
        inside = lanes < length
        offsets = start + lanes
        x = tl.load(grad + offsets, mask=inside, other=0.0)  # 0.0's bits: no maximum
        total = tl.load(acc + offsets, mask=inside, other=0) + _fixed_point(x, s)
        tl.store(acc + offsets, total, mask=inside)
        top = tl.max(_magnitude_bits(x), axis=0)
    tl.atomic_max(maxima + bucket, top)


def interpreted() -> bool:
    """Whether the kernel runs through Triton's interpreter (TRITON_INTERPRET=1 at import)."""
    return not isinstance(_fold, triton.runtime.JITFunction)


def unavailable_reason(device: torch.device) -> str:
    """Why the kernel cannot fold on `device`, or "" where it can: on a CUDA device, and on the
    CPU under Triton's interpreter."""
    if device.type == "cuda" and not interpreted():
        return ""
    if device.type == "cpu" and interpreted():
        return ""
    where = "the CPU without TRITON_INTERPRET=1" if device.type == "cpu" else str(device)
    return f"Triton's fold kernel does not run on {where}"


def available(device: torch.device) -> bool:
    """Whether the kernel can fold gradients that are on `device`."""
    return not unavailable_reason(device)


@dataclass(frozen=True)
class Blocks:
    """The kernel's blocks over a flat gradient tiled by buckets, on the gradient's device:
    each block's first element, length (at most BLOCK) and bucket."""

    starts: torch.Tensor  # int64
    lengths: torch.Tensor  # int32
    buckets: torch.Tensor  # int32
    count: int


def blocks(buckets: list[tuple[int, int]], device: torch.device) -> Blocks:
    """The aligned tiles of BLOCK elements, each split where a bucket of `buckets` ((offset,
    size), tiling the gradient in order) ends inside it. Made once per job."""
    starts, ends, owners = [], [], []
    for b, (offset, size) in enumerate(buckets):
        if size <= 0:
            continue
        stop = offset + size
        tiles = torch.arange(offset // BLOCK, (stop - 1) // BLOCK + 1, dtype=torch.int64)
        starts.append(torch.clamp(tiles * BLOCK, min=offset))
        ends.append(torch.clamp((tiles + 1) * BLOCK, max=stop))
        owners.append(torch.full((tiles.numel(),), b, dtype=torch.int32))
    if not starts:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return Blocks(empty, empty.to(torch.int32), empty.to(torch.int32), 0)
    start, end = torch.cat(starts), torch.cat(ends)
    return Blocks(
        start.to(device),
        (end - start).to(torch.int32).to(device),
        torch.cat(owners).to(device),
        start.numel(),
    )


def fold(
    grad: torch.Tensor,
    acc: torch.Tensor,
    scale: torch.Tensor,
    maxima: torch.Tensor,
    table: Blocks,
) -> None:
    """acc += each element of grad (flat float32) times its bucket's scale (float64, one per
    bucket), rounded half to even, where within 2^50; maxima (int32, one per bucket) raised to
    the largest |x| bit pattern of each bucket. One kernel launch, on grad's device."""
    if table.count == 0:
        return
    args = (grad, acc, scale, maxima, table.starts, table.lengths, table.buckets)
    # enable_fp_fusion=False: no multiply and add contracted into an FMA (Triton's default
    # allows it; here it would not change a result, but exactness should not rest on why).
    launch = _fold[(table.count,)]
    if grad.device.type == "cuda":
        with torch.cuda.device(grad.device):  # Triton launches on the current device
            launch(*args, BLOCK=BLOCK, num_warps=NUM_WARPS, enable_fp_fusion=False)
    else:
        launch(*args, BLOCK=BLOCK, num_warps=NUM_WARPS, enable_fp_fusion=False)
