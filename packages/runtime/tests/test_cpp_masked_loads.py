"""Compiled C++ kernels with masked loads (pooling windows, padding, cat) against the
IR interpreter and eager, bit for bit: NaN, infinities and signed zeros at corners and
edges, windows all -inf or all NaN, padded broadcasts (clamped loads), unpadded pools
(loads whose mask always holds). And no access outside the input: each kernel runs once
more on an input whose storage lies between two pages that may not be read.
ember.codegen.cpp.masked_loads says which masked loads read unconditionally."""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from cpp_harness import Case, case_fixtures, check_case, leaves, run_compiled

NAN, INF = float("nan"), float("inf")
G = torch.Generator().manual_seed(0)


def _edges(*shape: int) -> torch.Tensor:
    """Values with NaN, infinities and signed zeros where pooling windows and padding
    meet them: corners, edges, a window all -inf and one all NaN."""
    x = torch.randn(*shape, generator=G)
    x[0, 0, 0, 0] = NAN
    x[0, 1, 0, 5] = NAN
    x[0, 2, -1, -1] = INF
    x[1, 0, -1, 0] = -INF
    x[1, 1, :3, :3] = -INF
    x[1, 2, 4:7, 4:7] = NAN
    x[0, 0, 5, :] = -0.0
    x[0, 0, 6, ::2] = 0.0
    return x


X = _edges(2, 3, 17, 16)
COLUMN = torch.randn(10, 1, generator=G)
COLUMN[0, 0], COLUMN[9, 0] = NAN, -INF
SIGNED = torch.tensor([[0.0, -0.0, NAN, 1.0, -INF, NAN, -0.0, 2.0]])
SIGNED = torch.cat([SIGNED, SIGNED.flip(1), torch.randn(6, 8, generator=G)])


CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], bool]] = {
    "max_pool": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (X,), False),
    "max_pool_f64": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (X.double(),), False),
    "max_pool_bf16": (lambda x: F.max_pool2d(x, 3, 2, 1), (X.bfloat16(),), False),
    "max_pool_shapes": (
        lambda x: (
            F.max_pool2d(x, 3, 1, 1),
            F.max_pool2d(x, 3, 2, 1, ceil_mode=True),
            F.max_pool2d(x, 2, 2, return_indices=True),  # masks that always hold
            F.max_pool2d(x, 3, 2),
        ),
        (X,),
        False,
    ),
    "avg_pool": (
        lambda x: (
            F.avg_pool2d(x, 3, 2, 1),
            F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
            F.avg_pool2d(x, 3, 2, 1, divisor_override=4),
            F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
            F.avg_pool2d(x, 2, 2),
        ),
        (X,),
        False,
    ),
    "pads": (
        lambda x: (
            F.pad(x[..., ::2], (1, 2), value=-1.5),
            F.pad(x.transpose(-1, -2), (1, 1, 2, 0)),
            F.pad(x, (-1, 2, 1, -2), value=NAN),
        ),
        (X,),
        False,
    ),
    "broadcasts": (
        lambda c, y: (
            F.pad(c.expand(10, 32), (2, 2, 1, 1), value=-3.0),
            torch.cat([c.expand(10, 5), y, c.expand(10, 3)], 1),
        ),
        (COLUMN, torch.randn(10, 7, generator=G)),
        False,
    ),
    "maximum_minimum": (
        lambda a, b: (
            torch.maximum(a, b),
            torch.minimum(a, b),
            torch.maximum(b, a),
            a.amax(1),
            a.amin(0),
        ),
        (SIGNED, SIGNED.roll(3, 1)),
        False,
    ),
}
PAGE = mmap.PAGESIZE
# inputs of whole pages of float32, for test_masked_loads_read_nothing_outside_the_input:
# a padded pool (masked and unconditional taps), an unpadded one (every tap
# unconditional), a padded broadcast (clamped loads)
GUARDED = {
    "guarded_pool": (
        lambda x: (F.max_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 3, 2, 1), F.max_pool2d(x, 2, 2)),
        (torch.randn(1, PAGE // 1024, 16, 16, generator=G),),
        False,
    ),
    "guarded_broadcast": (
        lambda c: F.pad(c.expand(PAGE // 4, 16), (2, 2, 1, 1), value=-3.0),
        (torch.randn(PAGE // 4, 1, generator=G),),
        False,
    ),
}
CASES |= GUARDED


_exact_ir_evaluation, traced, compiled = case_fixtures(CASES, "cpp-masked-cache")


def _same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal bit for bit (signed zeros included), NaN where eager has NaN: eager's
    vectorised maximum makes its own NaN (all bits set), not the input's."""
    if not want.dtype.is_floating_point:
        return torch.equal(got, want)
    nan = want.isnan()
    if not torch.equal(got.isnan(), nan):
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[want.element_size()]
    bits = [t.masked_fill(nan, 0).contiguous().view(ints) for t in (got, want)]
    return torch.equal(*bits)


@pytest.mark.parametrize("name", sorted(CASES))
def test_masked_loads_match_eager_bit_for_bit(
    name: str, traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    case = traced[name]
    check_case(case, compiled)
    got = leaves(run_compiled(case, compiled, case.args))
    want = leaves(case.fn(*case.args))
    for g, e in zip(got, want, strict=True):
        assert _same_bits(g, e), name


@contextmanager
def _between_guard_pages(like: torch.Tensor) -> Iterator[torch.Tensor]:
    """A copy of `like` whose storage fills whole pages between two that may not be
    read or written: a kernel reading one element before or after it faults."""
    size = like.numel() * like.element_size()
    assert size % PAGE == 0, "shape the input to whole pages"
    region = mmap.mmap(-1, size + 2 * PAGE)
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    inside = torch.frombuffer(region, dtype=like.dtype, count=like.numel(), offset=PAGE)
    inside.copy_(like.reshape(-1))
    for guard in (start, start + PAGE + size):
        assert libc.mprotect(guard, PAGE, 0) == 0  # PROT_NONE
    try:
        yield inside.view(like.shape)
    finally:
        for guard in (start, start + PAGE + size):
            libc.mprotect(guard, PAGE, mmap.PROT_READ | mmap.PROT_WRITE)


@pytest.mark.skipif(sys.platform != "linux", reason="mprotect through libc")
@pytest.mark.parametrize("name", sorted(GUARDED))
def test_masked_loads_read_nothing_outside_the_input(
    name: str, traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    case = traced[name]
    (x,) = case.args
    program = case.schedule.program
    env: dict[str, torch.Tensor] = {}
    with _between_guard_pages(x) as inside:
        env[program.inputs[0].name] = inside
        for kernel in case.kernels:
            for m in kernel.members:
                env[m.name] = torch.empty(tuple(int(s) for s in m.layout.size))
            compiled[kernel.name](*(env[b] for b in kernel.buffer_arguments()))  # or fault
        got = [env[out.name] for out in program.outputs]
    for g, e in zip(got, leaves(case.fn(x)), strict=True):
        assert _same_bits(g, e), name
