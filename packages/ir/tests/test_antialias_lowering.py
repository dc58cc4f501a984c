"""Antialiased resampling lowered (ember.ir.antialias) and run by the interpreter:
eager's CPU values for bilinear, bicubic and Lanczos filters, downsampling and
upsampling by integer and non-integer factors, sizes or scale factors given,
align_corners both ways, channels-last inputs, float32 and float64; half types as
eager's float32 values rounded once. The bilinear weights are eager's bit for bit;
the rest within the OpInfo tolerances (eager's build fuses multiply-adds, which the
interpreter rounds twice)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ir_helpers import computed, lower, trace

from ember.ir import (
    ExternKernel,
    Load,
    LoweringOptions,
    Pointwise,
    loads,
    lower_graph,
    run_program,
    verify,
)

aten = torch.ops.aten
G = torch.Generator().manual_seed(0)
MODES = ["bilinear", "bicubic"] + (["lanczos"] if hasattr(aten, "_upsample_lanczos2d_aa") else [])

# (input size, F.interpolate's arguments): down- and upsampling, by sizes and by scale
# factors (integer and not), one axis changed alone, a 1x1 output
RESIZES: list[tuple[tuple[int, int], dict[str, Any]]] = [
    ((10, 20), {"size": (3, 3)}),
    ((10, 20), {"size": (5, 5)}),
    ((9, 7), {"size": (4, 13)}),
    ((10, 20), {"scale_factor": (1.7, 0.9)}),
    ((9, 7), {"scale_factor": 0.37}),
    ((9, 7), {"scale_factor": 2.5}),
    ((16, 16), {"scale_factor": 0.25}),
    ((10, 20), {"scale_factor": (0.8, 1.0)}),
    ((45, 56), {"size": (27, 27)}),
    ((9, 7), {"size": (1, 1)}),
]


def _resize(mode: str, align: bool, **kwargs: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: F.interpolate(x, mode=mode, antialias=True, align_corners=align, **kwargs)


def _images(plane: tuple[int, int], dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    x = (torch.randn(2, 3, *plane, generator=G) * 3).to(dtype)
    return x.to(memory_format=torch.channels_last) if channels_last else x


def _cases(mode: str) -> list[tuple[tuple[int, int], dict[str, Any], bool]]:
    aligns = [False] if mode == "lanczos" else [False, True]  # lanczos refuses align_corners
    return [(plane, kwargs, align) for plane, kwargs in RESIZES for align in aligns]


@pytest.mark.parametrize(
    ("dtype", "channels_last"),
    [(torch.float32, False), (torch.float32, True), (torch.float64, False)],
)
@pytest.mark.parametrize("mode", MODES)
def test_matches_eager(mode: str, dtype: torch.dtype, channels_last: bool) -> None:
    for plane, kwargs, align in _cases(mode):
        fn = _resize(mode, align, **kwargs)
        x = _images(plane, dtype, channels_last)
        expected = fn(x)
        (got,) = run_program(lower(fn, x), [x], seed=0)
        # float64: eager's fused multiply-adds against the interpreter's rounded ops
        tolerance = {"atol": 1e-12, "rtol": 1e-12} if dtype == torch.float64 else {}
        torch.testing.assert_close(got, expected, **tolerance, msg=lambda m, k=kwargs: f"{k}: {m}")
        if expected.shape[-2:] != (1, 1):
            assert got.stride() == expected.stride(), kwargs  # channels-last stays so


@pytest.mark.parametrize(
    "kwargs", [{"size": (1, 7)}, {"scale_factor": (1.0, 0.37)}, {"size": (1, 31)}]
)
@pytest.mark.parametrize("align", [False, True])
def test_bilinear_weights_are_eagers_bit_for_bit(kwargs: dict[str, Any], align: bool) -> None:
    """Resampling one-hot rows reads each window's weights off the output: the
    triangle's weights are computed as eager computes them, to the last bit."""
    width = 20
    rows = torch.eye(width).reshape(width, 1, 1, width)
    fn = _resize("bilinear", align, **kwargs)
    (got,) = run_program(lower(fn, rows), [rows], seed=0)
    torch.testing.assert_close(got, fn(rows), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_half_types_round_once(mode: str, dtype: torch.dtype) -> None:
    """Eager has no CPU kernel for half types: the result is eager's float32 result
    for the same values, rounded once (within one rounding of it)."""
    for plane, kwargs, align in _cases(mode)[::3]:
        fn = _resize(mode, align, **kwargs)
        x = _images(plane, dtype, channels_last=False)
        (got,) = run_program(lower(fn, x, mode="fake"), [x], seed=0)
        assert got.dtype == dtype
        torch.testing.assert_close(
            got, fn(x.float()).to(dtype), msg=lambda m, k=kwargs: f"{k}: {m}"
        )


def _gathers(loop: Any) -> list[Load]:
    return [n for n in loads(loop.body) if isinstance(n, Load) and n.indirect]


def test_two_separable_loops_read_per_axis_weight_tables() -> None:
    """Width then height: per axis a table of weights [n_out, taps] (the filter at
    each tap, then normalized: two small loops), and a loop of masked indirect loads
    of `taps` taps; the width's result is stored in float32 and read by the height's
    loop."""
    x = torch.randn(1, 3, 40, 30, generator=G)
    buffers = computed(lower(_resize("bilinear", False, size=(10, 7)), x))
    tables_w, norms_w, rows, tables_h, norms_h, out = (b.loop for b in buffers)
    assert all(isinstance(b.loop, Pointwise) for b in buffers)
    # bilinear taps: 2 * ceil(scale) + 1, scales 30/7 and 40/10
    assert tables_w.ranges == (7, 2 * math.ceil(30 / 7) + 1) and tables_h.ranges == (10, 9)
    assert norms_w.ranges == tables_w.ranges and norms_h.ranges == tables_h.ranges
    assert rows.ranges == (1, 3, 40, 7) and out.ranges == (1, 3, 10, 7)
    for loop, taps in ((rows, 11), (out, 9)):
        gathers = _gathers(loop)
        assert len(gathers) == taps and all(n.mask is not None for n in gathers)
    assert {n.buffer for n in _gathers(out)} == {buffers[2].name}  # the stored rows
    assert buffers[2].layout.dtype == torch.float32
    # the passes read their weights from the normalized tables
    assert {buffers[1].name} <= {n.buffer for n in loads(rows.body)}
    assert {buffers[4].name} <= {n.buffer for n in loads(out.body)}


def test_a_square_image_shares_one_table() -> None:
    x = torch.randn(1, 3, 24, 24, generator=G)
    buffers = computed(lower(_resize("bicubic", False, size=(10, 10)), x))
    assert len(buffers) == 4  # raw and normalized weights, then the two passes
    assert buffers[1].name in {n.buffer for n in loads(buffers[3].loop.body)}


@pytest.mark.parametrize("kwargs", [{"size": (12, 5)}, {"scale_factor": (1.05, 0.5)}])
def test_an_unchanged_axis_is_not_resampled(kwargs: dict[str, Any]) -> None:
    """As eager's CPU kernel: the height (12 rows; 12 * 1.05 rounds down to 12) is
    copied even where a scale factor would give other weights: one pass."""
    x = torch.randn(2, 3, 12, 10, generator=G)
    fn = _resize("bilinear", False, **kwargs)
    program = lower(fn, x)
    assert len(computed(program)) == 3  # the width's two tables and its pass
    (got,) = run_program(program, [x], seed=0)
    torch.testing.assert_close(got, fn(x))


def test_same_size_is_a_copy() -> None:
    x = torch.randn(2, 3, 6, 5, generator=G)
    fn = _resize("bicubic", False, scale_factor=1.1)
    program = lower(fn, x)
    assert not any(_gathers(loop) for loop in (b.loop for b in computed(program)))
    (got,) = run_program(program, [x], seed=0)
    torch.testing.assert_close(got, fn(x), atol=0, rtol=0)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_vec_overload(mode: str) -> None:
    """The `.vec` form (sizes or scale factors as lists), which tracing decomposes
    into the default one, lowers with its scale factors."""
    x = torch.randn(1, 2, 11, 9, generator=G)
    fn = _resize(mode, False, scale_factor=(0.6, 1.7))
    gm = trace(fn, x)
    packet = getattr(aten, f"_upsample_{mode}2d_aa")
    (node,) = [n for n in gm.graph.nodes if n.target is packet.default]
    source, _, align, scale_h, scale_w = node.args
    node.target, node.args = packet.vec, (source, None, align, [scale_h, scale_w])
    gm.recompile()
    program = lower_graph(gm, options=LoweringOptions(loops=True, allow_fallback=False))
    verify(program)
    (got,) = run_program(program, [x], seed=0)
    torch.testing.assert_close(got, fn(x))


def test_integer_images_stay_extern_calls() -> None:
    """uint8 goes through eager's fixed-point weights: an ATen call."""
    x = torch.randint(0, 256, (1, 3, 12, 10), dtype=torch.uint8, generator=G)
    fn = _resize("bilinear", False, size=(5, 4))
    program = lower(fn, x, allow_fallback=True)
    (extern,) = program.extern_kernels()
    assert isinstance(extern, ExternKernel) and extern.op is aten._upsample_bilinear2d_aa.default
    (got,) = run_program(program, [x], seed=0)
    torch.testing.assert_close(got, fn(x), atol=0, rtol=0)
