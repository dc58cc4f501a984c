"""Lowerings of pooling and resampling: max_pool2d (values and indices), avg_pool2d,
adaptive avg/max pool 2d, and bilinear upsampling.

A small fixed window (max_pool2d and avg_pool2d of at most `UNROLL_WINDOW` elements,
such as ResNet's 3x3 stem pool) is unrolled into pointwise code: one masked load per
tap, combined in order. As a reduction, a 3x3 window padded 9 lanes to 16, computed
an argmax nobody read, and took 494 us for ResNet-50's stem pool on an H100, where the
unrolled form reads each input element about once from memory. Larger windows, and
adaptive ones, are a `Reduction` whose reduction ranges are the kernel's. Either way
the input coordinate is `out * stride - pad + r * dilation`, read through a masked
load so that padding never touches memory (and reads -inf for max, 0 for sums).
Adaptive windows vary in size; they reduce over the largest window with the excess
masked off.
Bilinear upsampling is pointwise: four indirect loads weighted by the fractional
source coordinate, computed as eager computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv

from ember.ir.assemble import guard
from ember.ir.expr import IndexExpr, Load, Node, Where, map_dag
from ember.ir.loops import Reduction
from ember.ir.lowering import GraphLowering, NotLowerable, register_lowering
from ember.ir.pointwise import c, op
from ember.ir.reduction import acc_dtype
from ember.ir.symbolic import index_var, indirect_var, loop_vars, simplify_index
from ember.ir.tensor import Index, LazyTensor, Loader, cast, const

aten = torch.ops.aten

# Fixed windows of at most this many elements are unrolled into pointwise code.
UNROLL_WINDOW = 16


def _pair(value: Any, default: Sequence[int] | None = None) -> list[int]:
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items and default is not None:
        return list(default)
    return [int(v) for v in items] * (2 if len(items) == 1 else 1)


def _ints(sizes: Sequence[sympy.Expr]) -> list[int]:
    if not all(isinstance(s, sympy.Integer) for s in sizes):
        raise NotLowerable("pooling over symbolic spatial sizes")
    return [int(s) for s in sizes]


def _window(
    lowering: GraphLowering,
    x: LazyTensor,
    out_size: tuple[sympy.Expr, ...],
    starts: Any,
    kernel: Sequence[int],
    dilation: Sequence[int],
    limits: Any,
    kind: str,
    fill: float,
    dtype: torch.dtype,
) -> LazyTensor:
    """Store a reduction over 2-d windows: `starts(index)` gives the window's first
    input row and column, `limits(index)` how many of its rows and columns count."""
    i = loop_vars(len(out_size))
    r = [index_var("r", 0), index_var("r", 1)]
    h0, w0 = starts(i)
    rows, cols = limits(i)
    ih, iw = h0 + r[0] * dilation[0], w0 + r[1] * dilation[1]
    height, width = x.size[-2], x.size[-1]
    checks = [
        op("ge", IndexExpr(ih), IndexExpr(sympy.Integer(0))),
        op("lt", IndexExpr(ih), IndexExpr(height)),
        op("ge", IndexExpr(iw), IndexExpr(sympy.Integer(0))),
        op("lt", IndexExpr(iw), IndexExpr(width)),
        op("lt", IndexExpr(r[0]), IndexExpr(rows)),
        op("lt", IndexExpr(r[1]), IndexExpr(cols)),
    ]
    mask = checks[0]
    for check in checks[1:]:
        mask = op("logical_and", mask, check)
    inner = cast(x.loader([*i[:-2], ih, iw]), dtype)
    body = Where(mask, guard(inner, mask), const(fill, dtype))
    ranges = tuple(out_size)
    layout = lowering.node_layout(
        x.device, torch.int64 if kind.startswith("arg") else dtype, ranges
    )
    ref = lowering.store(
        Reduction(ranges, (sympy.Integer(kernel[0]), sympy.Integer(kernel[1])), kind, body), layout
    )
    return lowering.tensor(ref)


Tap = tuple[Node, Node, sympy.Expr]  # (in bounds, masked load, flat input position)


def _taps(
    x: LazyTensor,
    i: Sequence[sympy.Expr],
    starts: Any,
    kernel: Sequence[int],
    dilation: Sequence[int],
) -> list[Tap]:
    """The window's elements for output point `i`, in row-major window order."""
    h0, w0 = starts(i)
    height, width = x.size[-2], x.size[-1]
    found: list[Tap] = []
    for a in range(kernel[0]):
        for b in range(kernel[1]):
            ih, iw = h0 + a * dilation[0], w0 + b * dilation[1]
            mask = op(
                "logical_and",
                op(
                    "logical_and",
                    op("ge", IndexExpr(ih), IndexExpr(sympy.Integer(0))),
                    op("lt", IndexExpr(ih), IndexExpr(height)),
                ),
                op(
                    "logical_and",
                    op("ge", IndexExpr(iw), IndexExpr(sympy.Integer(0))),
                    op("lt", IndexExpr(iw), IndexExpr(width)),
                ),
            )
            load = _guard_window(x.loader([*i[:-2], ih, iw]), mask, i[-2:])
            found.append((mask, load, ih * width + iw))
    return found


def _guard_window(body: Node, mask: Node, spatial: Sequence[sympy.Expr]) -> Node:
    """`body` with the loads that depend on the window's position masked by `mask`. A
    load whose index has no spatial output coordinate (a batch norm's per-channel
    weight, inlined from the producer) reads the same in-bounds element for every
    tap: left unmasked, the taps share one load."""
    symbols = set().union(*(sympy.sympify(e).free_symbols for e in spatial))

    def add_mask(node: Node) -> Node:
        if not isinstance(node, Load) or not (sympy.sympify(node.index).free_symbols & symbols):
            return node
        combined = mask if node.mask is None else op("logical_and", node.mask, mask)
        return replace(node, mask=combined)

    return map_dag(body, add_mask)


def _unrolled_max(
    x: LazyTensor, starts: Any, kernel: Sequence[int], dilation: Sequence[int]
) -> tuple[Loader, Loader]:
    """Loaders of the window maximum and of its flat input position, as eager finds
    them: the first element in bounds is taken, then each later one that is greater
    or NaN (so a NaN wins, and the value is NaN)."""

    def value(i: Index) -> Node:
        best: Node | None = None
        for mask, load, _ in _taps(x, i, starts, kernel, dilation):
            tap = Where(mask, load, const(float("-inf"), x.dtype))
            best = tap if best is None else op("maximum", best, tap)
        assert best is not None
        return best

    def position(i: Index) -> Node:
        best_v: Node = const(float("-inf"), x.dtype)
        best_i: Node = const(-1, torch.int64)
        for mask, load, flat in _taps(x, i, starts, kernel, dilation):
            better = op(
                "logical_or",
                op("logical_or", op("lt", best_i, const(0, torch.int64)), op("gt", load, best_v)),
                op("isnan", load),
            )
            take = op("logical_and", mask, better)
            best_v = Where(take, load, best_v)
            best_i = Where(take, IndexExpr(flat), best_i)
        return best_i

    return value, position


@register_lowering(aten.max_pool2d_with_indices.default)
def lower_max_pool2d(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, LazyTensor]:
    a = lowering.args(node)
    x = lowering.tensor(a["self"])
    kernel = _pair(a["kernel_size"])
    stride = _pair(a["stride"], kernel)
    pad, dilation = _pair(a["padding"]), _pair(a["dilation"])
    out_size = tuple(sympy.Integer(int(s)) for s in node.meta["val"][0].shape)
    width = x.size[-1]

    def starts(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, sympy.Expr]:
        return i[-2] * stride[0] - pad[0], i[-1] * stride[1] - pad[1]

    def limits(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, sympy.Expr]:
        return sympy.Integer(kernel[0]), sympy.Integer(kernel[1])

    if kernel[0] * kernel[1] <= UNROLL_WINDOW:
        value, position = _unrolled_max(x, starts, kernel, dilation)
        return (
            LazyTensor(x.device, x.dtype, out_size, value),
            LazyTensor(x.device, torch.int64, out_size, position),
        )
    args = (lowering, x, out_size, starts, kernel, dilation, limits)
    values = _window(*args, "max", float("-inf"), x.dtype)
    arg = _window(*args, "argmax", float("-inf"), x.dtype)

    def index(i: Index) -> Node:
        k = arg.loader(i)
        h0, w0 = starts(i)
        row = op(
            "add", IndexExpr(h0), op("mul", op("floordiv", k, c(kernel[1], k)), c(dilation[0], k))
        )
        col = op(
            "add", IndexExpr(w0), op("mul", op("remainder", k, c(kernel[1], k)), c(dilation[1], k))
        )
        return op("add", op("mul", row, IndexExpr(width)), col)

    return values, LazyTensor(x.device, torch.int64, out_size, index)


@register_lowering(aten.avg_pool2d.default)
def lower_avg_pool2d(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    x = lowering.tensor(a["self"])
    kernel = _pair(a["kernel_size"])
    stride = _pair(a["stride"], kernel)
    pad = _pair(a["padding"])
    height, width = _ints(x.size[-2:])
    out_size = lowering.out_size(node)
    dtype = acc_dtype(x.dtype)

    def starts(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, sympy.Expr]:
        return i[-2] * stride[0] - pad[0], i[-1] * stride[1] - pad[1]

    def limits(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, sympy.Expr]:
        return sympy.Integer(kernel[0]), sympy.Integer(kernel[1])

    total: LazyTensor
    if kernel[0] * kernel[1] <= UNROLL_WINDOW:

        def window_sum(i: Index) -> Node:
            taps = _taps(x, i, starts, kernel, [1, 1])
            parts = [Where(mask, cast(load, dtype), const(0.0, dtype)) for mask, load, _ in taps]
            acc = parts[0]
            for part in parts[1:]:
                acc = op("add", acc, part)
            return acc

        total = LazyTensor(x.device, dtype, out_size, window_sum)
    else:
        total = _window(lowering, x, out_size, starts, kernel, [1, 1], limits, "sum", 0.0, dtype)
    override = a["divisor_override"]
    include_pad = bool(a["count_include_pad"])

    def divisor(i: Index) -> Node:
        if override:
            return const(float(override), dtype)
        counts = []
        for start, k, size, p in zip(starts(i), kernel, (height, width), pad, strict=True):
            end = sympy.Min(start + k, size + p)
            if include_pad:
                counts.append(end - start)
            else:
                counts.append(sympy.Min(end, size) - sympy.Max(start, 0))
        return cast(IndexExpr(counts[0] * counts[1]), dtype)

    return LazyTensor(
        x.device,
        x.dtype,
        out_size,
        lambda i: cast(op("truediv", total.loader(i), divisor(i)), x.dtype),
    )


def _adaptive(
    lowering: GraphLowering, node: torch.fx.Node, kind: str
) -> tuple[LazyTensor, LazyTensor]:
    x = lowering.tensor(node.args[0])
    height, width = _ints(x.size[-2:])
    out_size = (
        tuple(sympy.Integer(int(s)) for s in lowering.out_val(node).shape)
        if kind == "sum"
        else tuple(sympy.Integer(int(s)) for s in node.meta["val"][0].shape)
    )
    oh, ow = int(out_size[-2]), int(out_size[-1])
    kernel = [
        max(-(-(o + 1) * n // m) - (o * n // m) for o in range(m)) if m else 1
        for n, m in ((height, oh), (width, ow))
    ]

    def starts(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, sympy.Expr]:
        return FloorDiv(i[-2] * height, oh), FloorDiv(i[-1] * width, ow)

    def ends(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, sympy.Expr]:
        return FloorDiv((i[-2] + 1) * height + oh - 1, oh), FloorDiv(
            (i[-1] + 1) * width + ow - 1, ow
        )

    def limits(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, sympy.Expr]:
        (h0, w0), (h1, w1) = starts(i), ends(i)
        return h1 - h0, w1 - w0

    dtype = acc_dtype(x.dtype) if kind == "sum" else x.dtype
    fill = 0.0 if kind == "sum" else float("-inf")
    first = _window(lowering, x, out_size, starts, kernel, [1, 1], limits, kind, fill, dtype)
    if kind == "sum":
        return first, first
    arg = _window(lowering, x, out_size, starts, kernel, [1, 1], limits, "argmax", fill, dtype)

    def index(i: Index) -> Node:
        k = arg.loader(i)
        h0, w0 = starts(i)
        row = op("add", IndexExpr(h0), op("floordiv", k, c(kernel[1], k)))
        col = op("add", IndexExpr(w0), op("remainder", k, c(kernel[1], k)))
        return op("add", op("mul", row, c(width, row)), col)

    return first, LazyTensor(x.device, torch.int64, out_size, index)


@register_lowering(aten._adaptive_avg_pool2d.default)
def lower_adaptive_avg_pool2d(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    total, _ = _adaptive(lowering, node, "sum")
    x = lowering.tensor(node.args[0])
    height, width = _ints(x.size[-2:])
    oh, ow = (int(s) for s in total.size[-2:])

    def count(i: Index) -> Node:
        rows = FloorDiv((i[-2] + 1) * height + oh - 1, oh) - FloorDiv(i[-2] * height, oh)
        cols = FloorDiv((i[-1] + 1) * width + ow - 1, ow) - FloorDiv(i[-1] * width, ow)
        return cast(IndexExpr(rows * cols), total.dtype)

    val = lowering.out_val(node)
    return LazyTensor(
        x.device,
        val.dtype,
        total.size,
        lambda i: cast(op("truediv", total.loader(i), count(i)), val.dtype),
    )


@register_lowering(aten.adaptive_max_pool2d.default)
def lower_adaptive_max_pool2d(
    lowering: GraphLowering, node: torch.fx.Node
) -> tuple[LazyTensor, LazyTensor]:
    return _adaptive(lowering, node, "max")


@register_lowering(aten.upsample_bilinear2d.default, aten.upsample_bilinear2d.vec)
def lower_upsample_bilinear2d(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    ref = lowering.realize(lowering.env[node.args[0]])  # type: ignore[index]  # an FX node
    name = lowering.current(ref).name
    layout = lowering.layouts[name]
    height, width = _ints(layout.size[-2:])
    out_size = lowering.out_size(node)
    oh, ow = _ints(out_size[-2:])
    align = bool(a["align_corners"])
    if node.target is aten.upsample_bilinear2d.vec:
        factors = a["scale_factors"]
        scales = [None, None] if factors is None else list(factors)
    else:
        scales = [a["scales_h"], a["scales_w"]]
    dtype = acc_dtype(layout.dtype)

    def source(
        o: sympy.Expr, n_in: int, n_out: int, scale: float | None
    ) -> tuple[Node, Node, Node]:
        pos = cast(IndexExpr(o), dtype)
        if align:
            ratio = (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
            real = op("mul", pos, c(ratio, pos))
        else:
            ratio = 1.0 / scale if scale else n_in / n_out
            real = op("sub", op("mul", op("add", pos, c(0.5, pos)), c(ratio, pos)), c(0.5, pos))
            real = op("maximum", real, c(0.0, real))
        low = cast(op("floor", real), torch.int64)
        high = op("minimum", op("add", low, c(1, low)), c(n_in - 1, low))
        return low, high, op("sub", real, cast(low, dtype))

    def load(index: Index) -> Node:
        h0, h1, lh = source(index[-2], height, oh, scales[0])
        w0, w1, lw = source(index[-1], width, ow, scales[1])
        prefix = list(index[:-2])

        def at(row: Node, col: Node) -> Node:
            offset = (
                layout.offset
                + indirect_var(0) * layout.stride[-2]
                + indirect_var(1) * layout.stride[-1]
            )
            for i, stride in zip(prefix, layout.stride[:-2], strict=True):
                offset = offset + i * stride
            return cast(
                Load(name, simplify_index(offset), layout.dtype, indirect=(row, col)), dtype
            )

        one = c(1.0, lh)
        top = op("add", op("mul", at(h0, w0), op("sub", one, lw)), op("mul", at(h0, w1), lw))
        bottom = op("add", op("mul", at(h1, w0), op("sub", one, lw)), op("mul", at(h1, w1), lw))
        return cast(
            op("add", op("mul", top, op("sub", one, lh)), op("mul", bottom, lh)), layout.dtype
        )

    return LazyTensor(layout.device, layout.dtype, out_size, load)
