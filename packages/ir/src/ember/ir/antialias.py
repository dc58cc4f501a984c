"""Lowering of antialiased resampling: `_upsample_bilinear2d_aa`,
`_upsample_bicubic2d_aa` and, where torch has it, `_upsample_lanczos2d_aa` (what
`F.interpolate(x, mode="bilinear" | "bicubic" | "lanczos", antialias=True)` calls).

Each output sample along a resampled axis is a weighted sum of a window of input
samples. For output index i of an axis of n_in inputs and n_out outputs, with
eager's `scale` (n_in / n_out; 1 / scale_factor where one is given; with
align_corners (n_in - 1) / (n_out - 1)):

    support = interp_size / 2 * max(scale, 1)    (interp_size 2, 4, 6 by filter)
    center  = scale * (i + 0.5)
    xmin    = max(int(center - support + 0.5), 0)
    xsize   = min(int(center + support + 0.5), n_in) - xmin
    w[j]    = filter((j + xmin - center + 0.5) / max(scale, 1)),  j < xsize
    out[i]  = sum_j in[xmin + j] * w[j] / sum_j w[j]

The filters are PIL's: a triangle (bilinear), Keys' cubic with a = -0.5 (bicubic),
Lanczos-3 (sinc(x) sinc(x / 3)); widened by the scale when downsampling, so that
each output averages the inputs it covers. No window has more than
`taps = 2 * ceil(support) + 1` taps, a constant of the static sizes: an output is a
masked sum over that many taps.

The filter is separable, and so is the work. Eager's CPU kernel resamples the width
into an intermediate [N, C, H_in, W_out], then the height; so does ember, as two
pointwise loops, the first stored in the scalar type, the second reading it. That
keeps the work linear in the taps, H_in * W_out * taps_w + H_out * W_out * taps_h
multiply-adds, where one loop over the outputs would make H_out * W_out * taps_h *
taps_w: more at every size (upsampling by 2 has 3 taps per axis: 9 per output in one
loop, 1.5 + 3 in two; a 4x bilinear downsampling has 9: 81 against 36 + 9). An axis
whose size does not change is not resampled (eager's CPU kernel copies it, even
where a scale factor is given), so such a call is one loop, and equal sizes a copy.
Each loop reads its source through masked indirect loads at xmin + j.

The weights depend on the output index along the axis alone. The program computes
them as eager does, into a table per axis, [n_out, taps] (0 past a window): one
small loop evaluates the filter at each tap, a second divides each weight by its
window's total; the two resampling loops read the table. Computed in the resampling
loops instead, they were recomputed for every row and channel: on a 2-core CPU, a
1024x1024 RGB image resized to 64x64 took 9-10 ms bilinear against 1.3 ms from
tables (eager: 1-5 ms in the same runs), and Lanczos, two sines per tap, 160-170 ms
against 5.5-7.5 (eager 5.4-8) and 10 s to compile instead of 1.5 (2026-11-25). A
square image's two axes share a table.

What is matched: eager's CPU kernel (`_compute_indices_min_size_weights_aa` and the
separable loops of aten/src/ATen/native/cpu/UpSampleKernel.cpp), op by op. The
per-axis constants (scale, support, 1 / scale) are computed here in the kernel's
scalar type as it computes them. Center and weights are in that type (float32 for
float32 input, float64 for float64) except where eager's C++ computes in double:
`scale * (i + 0.5)` (rounded to the scalar type after), `center - support + 0.5`
and `center + support + 0.5` (truncated to indices), and
`(j + xmin - center + 0.5) * invscale` (j + xmin - center in the scalar type). These are made
in float64 here too, which also keeps a codegen from fusing the product into a
multiply-add (C++ with -ffp-contract=fast, Triton do): that dropped the rounding of
the center that eager subtracts, 1e-4 off for centers in the hundreds. Taps and
totals are summed first to last. The interpreter gives eager's bilinear weights bit
for bit. Eager's build fuses multiply-adds itself (its AVX2 and AVX-512 kernels:
the bicubic polynomial, the sums of taps), where the IR rounds each op: results
differ from eager's by a few float32 ulps, within the OpInfo tolerances.

Half types: eager has no CPU kernel for them (it raises), and its CUDA kernel
rounds each weight and each row sum to the half type. Ember computes weights,
intermediate and sums in float32 and rounds once, at the end: eager's float32 result
for the same values, rounded. Eager's CUDA kernel also differs from its CPU kernel in
float32 by an ulp here and there (all its steps are in float), and it resamples an
unchanged axis where a scale factor is given; ember follows the CPU kernel on every
device. Integer input (uint8) goes through eager's fixed-point weights, another
computation, and stays an extern call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx

from ember.ir.expr import Const, IndexExpr, Load, Node, Where
from ember.ir.indexing import address, gather_from
from ember.ir.layout import Layout
from ember.ir.lowering import GraphLowering, NotLowerable, register_lowering
from ember.ir.pointwise import c, op
from ember.ir.tensor import Index, LazyTensor, Loader, buffer_loader, cast, const

aten = torch.ops.aten

Filter = Callable[[Node], Node]


def _triangle(x: Node) -> Node:
    """PIL's bilinear filter: 1 - |x| inside (-1, 1)."""
    ax = op("abs", x)
    return Where(op("lt", ax, c(1.0, ax)), op("sub", c(1.0, ax), ax), c(0.0, ax))


def _keys_cubic(x: Node) -> Node:
    """Keys' cubic convolution with a = -0.5 (PIL's bicubic), in eager's CPU forms:
    ((a + 2) x - (a + 3)) x x + 1 inside (-1, 1), ((a x - 5a) x + 8a) x - 4a inside
    (-2, 2)."""
    a = -0.5
    ax = op("abs", x)

    def k(value: float) -> Node:
        return c(value, ax)

    near = op("sub", op("mul", k(a + 2), ax), k(a + 3))
    near = op("add", op("mul", op("mul", near, ax), ax), k(1.0))
    far = op("sub", op("mul", k(a), ax), k(5 * a))
    far = op("sub", op("mul", op("add", op("mul", far, ax), k(8 * a)), ax), k(4 * a))
    return Where(op("lt", ax, k(1.0)), near, Where(op("lt", ax, k(2.0)), far, k(0.0)))


def _sinc(x: Node) -> Node:
    """sin(pi x) / (pi x), 1 at 0 (with pi in x's type, as c10::pi)."""
    scaled = op("mul", x, c(float(torch.tensor(math.pi, dtype=x.dtype)), x))
    return Where(op("eq", x, c(0.0, x)), c(1.0, x), op("truediv", op("sin", scaled), scaled))


def _lanczos3(x: Node) -> Node:
    """Lanczos-3: sinc(x) sinc(x / 3) inside (-3, 3)."""
    ax = op("abs", x)
    inside = op("mul", _sinc(ax), _sinc(op("truediv", ax, c(3.0, ax))))
    return Where(op("lt", ax, c(3.0, ax)), inside, c(0.0, ax))


@dataclass(frozen=True)
class Axis:
    """One resampled dimension: sizes, eager's constants in the kernel's scalar type,
    and the most taps a window has."""

    n_in: int
    n_out: int
    scale: float
    support: float
    invscale: float
    taps: int

    @staticmethod
    def of(
        n_in: int, n_out: int, align: bool, given: float | None, width: int, dtype: torch.dtype
    ) -> Axis:
        """`width`: the filter's support at scale 1, in samples (eager's interp_size);
        `dtype`: the scalar type the constants are rounded to, as eager stores them."""

        def typed(value: float) -> float:
            return float(torch.tensor(value, dtype=torch.float64).to(dtype))

        if align:
            scale = typed(typed(n_in - 1) / (n_out - 1)) if n_out > 1 else 0.0
        elif given is not None and given > 0:
            scale = typed(1.0 / given)
        else:
            scale = typed(typed(n_in) / n_out)
        wide = scale >= 1.0
        support = typed(width * 0.5 * scale) if wide else width * 0.5
        invscale = typed(1.0 / scale) if wide else 1.0
        return Axis(n_in, n_out, scale, support, invscale, math.ceil(support) * 2 + 1)


def _truncated(edge: Node) -> Node:
    """`static_cast<int64_t>(edge + 0.5)` with the sum in double, as eager makes it."""
    wide = cast(edge, torch.float64)
    return cast(op("add", wide, c(0.5, wide)), torch.int64)


@dataclass(frozen=True)
class Span:
    """The window of one output index: its center (in input samples), its first
    input index and its number of taps, as body nodes."""

    center: Node
    first: Node
    size: Node

    @staticmethod
    def of(axis: Axis, o: sympy.Expr, dtype: torch.dtype) -> Span:
        """The window of output index `o` along `axis`, in scalar type `dtype`."""
        # scale * (i + 0.5) in double, rounded to the scalar type, as eager makes it:
        # a product in the scalar type, which a codegen may fuse into the subtractions
        # from it (C++ with -ffp-contract=fast, Triton), would lose the rounding of
        # the center that eager subtracts (1e-4 off for centers in the hundreds)
        position = cast(IndexExpr(o), torch.float64)
        middle = op("add", position, c(0.5, position))
        center = cast(op("mul", c(axis.scale, middle), middle), dtype)
        zero = const(0, torch.int64)
        first = _truncated(op("sub", center, c(axis.support, center)))
        first = op("maximum", first, zero)
        end = _truncated(op("add", center, c(axis.support, center)))
        end = op("minimum", end, c(axis.n_in, zero))
        size = op("minimum", op("maximum", op("sub", end, first), zero), c(axis.taps, zero))
        return Span(center, first, size)

    def tap(self, j: Node) -> tuple[Node, Node]:
        """(whether tap `j` is in the window, its input index)."""
        at = self.first if isinstance(j, Const) and j.value == 0 else op("add", self.first, j)
        return op("lt", j, self.size), at


def raw_weight(axis: Axis, span: Span, j: Node, kernel: Filter) -> Node:
    """The filter's weight of tap `j` of `span` before normalization, 0 past the
    window: filter((j + xmin - center + 0.5) * invscale), with j + xmin - center in
    the scalar type and the rest in double, as eager computes it."""
    inside, at = span.tap(j)
    distance = cast(op("sub", cast(at, span.center.dtype), span.center), torch.float64)
    shifted = op("add", distance, c(0.5, distance))
    argument = cast(op("mul", shifted, c(axis.invscale, shifted)), span.center.dtype)
    return Where(inside, kernel(argument), c(0.0, span.center))


def weight_table(
    lowering: GraphLowering,
    device: torch.device,
    axis: Axis,
    dtype: torch.dtype,
    kernel: Filter,
) -> tuple[str, Layout]:
    """The normalized weights of every window of `axis`, [n_out, taps] (0 past each
    window), stored: the filter evaluated once per output index and tap, then each
    weight divided by its window's total (summed first to last, as eager)."""
    size = (sympy.Integer(axis.n_out), sympy.Integer(axis.taps))

    def raw(index: Index) -> Node:
        span = Span.of(axis, index[0], dtype)
        return raw_weight(axis, span, IndexExpr(index[1]), kernel)

    raw_name = lowering.realize(LazyTensor(device, dtype, size, raw)).name
    read = buffer_loader(raw_name, lowering.layouts[raw_name])

    def normalized(index: Index) -> Node:
        total = read([index[0], sympy.Integer(0)])
        for j in range(1, axis.taps):
            total = op("add", total, read([index[0], sympy.Integer(j)]))
        weight = read(index)
        nonzero = op("ne", total, c(0.0, total))
        return Where(nonzero, op("truediv", weight, total), weight)

    name = lowering.realize(LazyTensor(device, dtype, size, normalized)).name
    return name, lowering.layouts[name]


def resample(
    source: tuple[str, Layout],
    dim: int,
    axis: Axis,
    dtype: torch.dtype,
    weights: tuple[str, Layout],
) -> Loader:
    """The loader of buffer `source` resampled along `dim` (in scalar type `dtype`):
    each output the taps of its window, read through masked indirect loads, times
    their weights (`weights`: `weight_table`'s), summed first to last."""
    name, layout = source
    weight = buffer_loader(*weights)

    def load(index: Index) -> Node:
        span = Span.of(axis, index[dim], dtype)
        total: Node | None = None
        for j in range(axis.taps):
            inside, at = span.tap(const(j, torch.int64))
            positions: list[sympy.Expr | Node] = list(index)
            positions[dim] = at
            offset, indirect = address(layout, positions)
            tap = Load(name, offset, layout.dtype, mask=inside, indirect=indirect)
            term = op("mul", cast(tap, dtype), weight([index[dim], sympy.Integer(j)]))
            total = term if total is None else op("add", total, term)
        assert total is not None
        return total

    return load


def _channels_last_strides(size: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    _, channels, height, width = size
    return (height * width * channels, sympy.Integer(1), width * channels, channels)


def lower_antialiased(
    lowering: GraphLowering, node: torch.fx.Node, width: int, kernel: Filter
) -> LazyTensor:
    """An antialiased resampling node with filter `kernel` of support `width` (at
    scale 1): the width resampled, then the height, each axis only where its size
    changes."""
    a = lowering.args(node)
    source = a["self"] if "self" in a else a["input"]
    x = lowering.tensor(source)
    if not x.dtype.is_floating_point:
        raise NotLowerable(f"antialiased resampling of {x.dtype} (eager's fixed-point weights)")
    out_size = lowering.out_size(node)
    spatial = [*x.size[-2:], *out_size[-2:]]
    if not all(isinstance(s, sympy.Integer) for s in spatial):
        raise NotLowerable("antialiased resampling of symbolic spatial sizes")
    h_in, w_in, h_out, w_out = (int(s) for s in spatial)
    if 0 in (h_out, w_out):
        return LazyTensor(x.device, x.dtype, out_size, lambda index: const(0.0, x.dtype))
    if 0 in (h_in, w_in):
        raise NotLowerable("antialiased resampling of an empty plane")
    if (h_in, w_in) == (h_out, w_out):
        return LazyTensor(x.device, x.dtype, out_size, x.loader)  # eager copies
    if getattr(node.target, "_overloadname", "") == "vec":
        factors = a["scale_factors"]
        scales: list[Any] = [None, None] if factors is None else list(factors)
    else:
        scales = [a["scales_h"], a["scales_w"]]
    align = bool(a["align_corners"])
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = lowering.out_val(node)
    channels_last = out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    source_buffer = gather_from(lowering, source)
    tables: dict[Axis, tuple[str, Layout]] = {}  # a square image's two axes share one
    result: LazyTensor | None = None
    size = list(x.size)
    for dim, given in ((3, scales[1]), (2, scales[0])):
        n_in, n_out = int(x.size[dim]), int(out_size[dim])
        if n_in == n_out:
            continue
        if result is not None:  # the intermediate, stored in the scalar type
            if channels_last:
                result.stride_hint = _channels_last_strides(result.size)
            name = lowering.realize(result).name
            source_buffer = (name, lowering.layouts[name])
        axis = Axis.of(n_in, n_out, align, given, width, dtype)
        if axis not in tables:
            tables[axis] = weight_table(lowering, x.device, axis, dtype, kernel)
        size[dim] = sympy.Integer(n_out)
        loader = resample(source_buffer, dim, axis, dtype, tables[axis])
        result = LazyTensor(x.device, dtype, tuple(size), loader)
    assert result is not None
    resampled = result
    return LazyTensor(
        x.device, x.dtype, out_size, lambda index: cast(resampled.loader(index), x.dtype)
    )


# op name -> the filter's support at scale 1 (eager's interp_size), the filter
_FILTERS: dict[str, tuple[int, Filter]] = {
    "_upsample_bilinear2d_aa": (2, _triangle),
    "_upsample_bicubic2d_aa": (4, _keys_cubic),
    "_upsample_lanczos2d_aa": (6, _lanczos3),  # newer torch only (2.15 has it)
}


def _register(op_name: str, width: int, kernel: Filter) -> None:
    packet = getattr(aten, op_name)

    def lower(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
        return lower_antialiased(lowering, node, width, kernel)

    lower.__name__ = f"lower{op_name}"
    register_lowering(packet.default, packet.vec)(lower)


for _op_name, (_width, _kernel) in _FILTERS.items():
    if hasattr(aten, _op_name):
        _register(_op_name, _width, _kernel)
