"""Masked loads in simd loops (ember.codegen.cpp.masked_loads): which ones read
unconditionally (no clamp, or a clamped broadcast) and which keep the masked form,
and the bounds a clamp takes. Values against eager: the runtime's
test_cpp_masked_loads.py."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.cpp import render_kernel
from ember.codegen.cpp.masked_loads import clamp_bounds
from ember.graphpasses import ember_decompositions
from ember.ir import Const, IndexExpr, Load, LoweringOptions, Node, Op, lower_graph
from ember.ir.symbolic import index_var
from ember.scheduler import schedule_program

I0, I1 = index_var("i", 0), index_var("i", 1)
F32 = torch.float32


def _text(fn: Callable[..., Any], *args: torch.Tensor) -> str:
    gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
    kernels = schedule_program(lower_graph(gm, options=LoweringOptions(loops=True))).kernels
    return "\n".join(render_kernel(k)[0] for k in kernels)


def _masked(text: str) -> list[str]:
    """The masked loads of a rendered kernel: `mask ? in_x[...] : other`."""
    return re.findall(r"= t\d+ \? in_\w+\[[^\]]*\] : ", text)


def _unconditional(text: str) -> list[str]:
    return re.findall(r"const float t\d+ = in_\w+\[[^;]*\];", text)


def test_pool_taps_inside_at_every_point_read_unconditionally() -> None:
    """A 3x3 stride-2 pool padded by 1 over 16x16: the taps at offsets 0 and +1 never
    leave the input (2 * 7 + 1 < 16), so they read without a mask; the five taps that
    padding can push out keep it (a clamp there would be a gather)."""
    for fn in (lambda x: F.max_pool2d(x, 3, 2, 1), lambda x: F.avg_pool2d(x, 3, 2, 1)):
        text = _text(fn, torch.randn(2, 3, 16, 16))
        assert len(_masked(text)) == 5
        loads = _unconditional(text)
        assert len(loads) == 4
        assert not any("std::m" in load for load in loads)  # no clamp needed


def test_strided_and_contiguous_masked_loads_keep_the_mask() -> None:
    strided = _text(lambda x: F.pad(x[:, ::2], (1, 2), value=-1.5), torch.randn(6, 40))
    assert len(_masked(strided)) == 1 and "std::max" not in strided
    contiguous = _text(lambda x: F.pad(x, (1, 2)), torch.randn(6, 40))
    assert len(_masked(contiguous)) == 1 and "std::max" not in contiguous


def test_a_mask_that_always_holds_reads_unconditionally() -> None:
    """An unpadded pool's in-range conditions hold at every output point."""
    text = _text(lambda x: F.max_pool2d(x, 2, 2), torch.randn(2, 3, 16, 16))
    assert not _masked(text)
    assert len(_unconditional(text)) == 4


def test_a_broadcast_masked_load_is_clamped() -> None:
    """A padded broadcast column: its index (the row) does not move along the simd
    loop, so the clamped load is a broadcast; it is clamped to the rows the mask
    lets through, 0 and 9, where it would read row -1 and row 10 at the padded rows."""
    text = _text(lambda c: F.pad(c.expand(10, 32), (2, 2, 1, 1), value=-3.0), torch.randn(10, 1))
    assert not _masked(text)
    assert "in_c_1[std::min<int64_t>(std::max<int64_t>(i0 - 1, 0), 9)]" in text
    assert re.search(r"const float t\d+ = t\d+ \? t\d+ : 0\.0f;", text)  # the select


def _in_range(expr: sympy.Expr, low: int, high: int) -> Node:
    value = IndexExpr(expr)
    ge = Op("ge", (value, IndexExpr(sympy.Integer(low))), torch.bool)
    lt = Op("lt", (value, IndexExpr(sympy.Integer(high))), torch.bool)
    return Op("logical_and", (ge, lt), torch.bool)


def test_clamp_bounds_are_the_extremes_over_the_mask() -> None:
    loops = {I0: (0, 5), I1: (0, 4)}
    tap = _in_range(2 * I1 - 1, 0, 9)  # 1 <= i1 <= 4
    load = Load("x", 81 * I0 + 2 * I1 - 10, F32, mask=tap)
    assert clamp_bounds(load, loops) == (-8, None)  # above 405 + 8 - 10 never
    # negative coefficients: 7 - 2 * i1 in [0, 5) holds for i1 in 2..3
    flipped = Load("x", 10 * I0 - I1, F32, mask=_in_range(7 - 2 * I1, 0, 5))
    assert clamp_bounds(flipped, loops) == (-3, 48)
    # a mask that holds everywhere needs no clamp on either side
    everywhere = Load("x", 8 * I0 + I1, F32, mask=_in_range(I1, 0, 5))
    assert clamp_bounds(everywhere, loops) == (None, None)


def test_clamp_bounds_refuse_what_they_cannot_bound() -> None:
    loops = {I0: (0, 5), I1: (0, 4)}
    index = 8 * I0 + 2 * I1 - 1
    never = Load("x", index, F32, mask=_in_range(I1, 6, 9))  # holds nowhere
    data = Op("logical_and", (_in_range(I1, 1, 5), Load("m", I1, torch.bool)), torch.bool)
    sum_bound = Load("x", index, F32, mask=_in_range(I0 + I1, 1, 5))
    even = Op("eq", (IndexExpr(I1 % 2), Const(0, torch.int64)), torch.bool)
    symbolic = Load("x", index + sympy.Symbol("s0", positive=True), F32, mask=_in_range(I1, 1, 5))
    unknown_range = Load("x", index + I0 * index_var("r", 0), F32, mask=_in_range(I1, 1, 5))
    for load in (
        never,
        Load("x", index, F32, mask=data),
        sum_bound,
        Load("x", index, F32, mask=even),
        symbolic,
        unknown_range,
        Load("x", index, F32),  # no mask
    ):
        assert clamp_bounds(load, loops) is None, load
