"""Lowerings of pooling and resampling: max_pool2d and max_pool3d (values and
indices), avg_pool2d and avg_pool3d, adaptive avg and max pool 2d and 3d, and bilinear
upsampling. Max pooling's backward is in ember.ir.pool_gradients.

A small fixed window (a max or average pool's of at most `UNROLL_WINDOW` elements,
such as ResNet's 3x3 stem pool) is unrolled into pointwise code: one masked load per
tap, combined in order. As a reduction, a 3x3 window padded 9 lanes to 16, computed
an argmax nobody read, and took 494 us for ResNet-50's stem pool on an H100, where the
unrolled form reads each input element about once from memory. Larger windows, and
adaptive ones, are a `Reduction` whose reduction ranges are the kernel's. Either way
the input coordinate is `out * stride - pad + r * dilation`, read through a masked
load so that padding never touches memory (and reads -inf for max, 0 for sums).
Adaptive windows vary in size; they reduce over the largest window with the excess
masked off. Max pooling's indices are eager's (flat within each plane or volume): the
first maximum, but the last NaN (eager's kernels take each element greater than the
running maximum, or NaN), and for a window of -inf its first position inside the
input; as a reduction, that takes an argmax and a last-NaN offset beside the max.
Bilinear upsampling is pointwise: four indirect loads weighted by the fractional
source coordinate, computed as eager computes it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv

from ember.ir.assemble import all_of, guard, in_range
from ember.ir.expr import IndexExpr, Load, Node, Where, replace_index
from ember.ir.loops import Reduction
from ember.ir.lowering import GraphLowering, NotLowerable, register_lowering
from ember.ir.pointwise import c, op
from ember.ir.reduction import acc_dtype
from ember.ir.symbolic import index_var, indirect_var, loop_vars, simplify_index
from ember.ir.tensor import Index, LazyTensor, Loader, cast, const

aten = torch.ops.aten

# Fixed windows of at most this many elements are unrolled into pointwise code.
UNROLL_WINDOW = 16


def spatial_arg(value: Any, dims: int, default: Sequence[int] | None = None) -> list[int]:
    """A pooling argument as one int per spatial dimension (a single value repeats)."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items and default is not None:
        return list(default)
    return [int(v) for v in items] * (dims if len(items) == 1 else 1)


def flat_position(coords: Sequence[sympy.Expr], sizes: Sequence[sympy.Expr]) -> sympy.Expr:
    """The position of `coords` in a row-major block of `sizes` (eager's pooling
    indices: flat over the spatial dimensions)."""
    flat: sympy.Expr = sympy.Integer(0)
    for coord, size in zip(coords, sizes, strict=True):
        flat = flat * size + coord
    return flat


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
    """Store a reduction over windows of the last len(kernel) dimensions:
    `starts(index)` gives the window's first input position along each, `limits(index)`
    how many of its positions along each count. `kind` is a reduction's, or
    'last_nan': the window offset of the last NaN (row-major), -1 where none."""
    dims = len(kernel)
    i = loop_vars(len(out_size))
    r = [index_var("r", d) for d in range(dims)]
    coords = [s + rd * dl for s, rd, dl in zip(starts(i), r, dilation, strict=True)]
    checks: list[Node] = []
    for coord, size in zip(coords, x.size[-dims:], strict=True):
        checks.append(op("ge", IndexExpr(coord), IndexExpr(sympy.Integer(0))))
        checks.append(op("lt", IndexExpr(coord), IndexExpr(size)))
    for rd, limit in zip(r, limits(i), strict=True):
        checks.append(op("lt", IndexExpr(rd), IndexExpr(limit)))
    mask = all_of(checks)
    inner = cast(x.loader([*i[:-dims], *coords]), dtype)
    body = Where(mask, guard(inner, mask), const(fill, dtype))
    if kind == "last_nan":
        kernel_sizes = [sympy.Integer(k) for k in kernel]
        nan = op("logical_and", mask, op("isnan", guard(inner, mask)))
        body = Where(nan, IndexExpr(flat_position(r, kernel_sizes)), const(-1, torch.int64))
        kind, dtype = "max", torch.int64
    ranges = tuple(out_size)
    layout = lowering.node_layout(
        x.device, torch.int64 if kind.startswith("arg") else dtype, ranges
    )
    window = tuple(sympy.Integer(k) for k in kernel)
    ref = lowering.store(Reduction(ranges, window, kind, body), layout)
    return lowering.tensor(ref)


def _max_offset(
    lowering: GraphLowering,
    x: LazyTensor,
    out_size: tuple[sympy.Expr, ...],
    starts: Any,
    kernel: Sequence[int],
    dilation: Sequence[int],
    limits: Any,
) -> Loader:
    """The loader of the window offset of eager's maximum (windows as `_window`'s):
    eager's kernels take each element greater than the running maximum, or NaN, so
    the last NaN if there is one, else the first maximum (`argmax`)."""
    window = (lowering, x, out_size, starts, kernel, dilation, limits)
    first = _window(*window, "argmax", float("-inf"), x.dtype)
    last_nan = _window(*window, "last_nan", float("-inf"), x.dtype)

    def offset(i: Index) -> Node:
        nan = last_nan.loader(i)
        return Where(op("ge", nan, c(0, nan)), nan, first.loader(i))

    return offset


def _pool_input(
    lowering: GraphLowering, arg: Any, kernel: Sequence[int], stride: Sequence[int]
) -> LazyTensor:
    """The pooled input, stored first where its producer would otherwise be computed
    again for each window it falls in (overlapping windows: a 3x3 stride-2 pool reads
    each input element 2.25 times), by the rule for a value with that many readers
    (`GraphLowering.read_by`). Only where shared values are not recomputed (the CPU):
    on a GPU each tap recomputing a batch norm and ReLU in registers is cheaper than
    storing and reading back their result, while ResNet-18's stem (batch norm, ReLU,
    3x3 max pool) took 2.08 of 10.7 ms on one CPU thread with the producer inlined
    into the nine masked taps."""
    x = lowering.tensor(arg)
    if lowering.options.recompute_shared:
        return x
    steps = math.prod(min(s, k) for s, k in zip(stride, kernel, strict=True))
    reads = math.ceil(math.prod(kernel) / steps)
    like = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    # `read_by` marks the value stored; its loader still computes it, so the taps
    # read the stored buffer through `tensor`
    return lowering.tensor(lowering.read_by(x, reads, like))


Tap = tuple[Node, Node, sympy.Expr]  # (in bounds, masked load, flat input position)


def _taps(
    x: LazyTensor,
    i: Sequence[sympy.Expr],
    starts: Any,
    kernel: Sequence[int],
    dilation: Sequence[int],
) -> list[Tap]:
    """The window's elements for output point `i`, in row-major window order."""
    dims = len(kernel)
    first = starts(i)
    sizes = x.size[-dims:]
    zero = sympy.Integer(0)
    found: list[Tap] = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        coords = [s + o * dl for s, o, dl in zip(first, offsets, dilation, strict=True)]
        mask = all_of([in_range(co, zero, n) for co, n in zip(coords, sizes, strict=True)])
        found.append((mask, guard_window(x, i, coords, mask), flat_position(coords, sizes)))
    return found


def guard_window(
    x: LazyTensor, i: Sequence[sympy.Expr], coords: Sequence[sympy.Expr], mask: Node
) -> Node:
    """`x` at input position `coords` (its last dimensions) of output point `i`, with
    the loads that depend on the window position masked by `mask`. The body is built
    at stand-in coordinates first, so a load is masked exactly when its index moves
    with the position. A load that does not (a batch norm's per-channel weight,
    inlined from the producer) reads the same in-bounds element for every tap: left
    unmasked, the taps share one load."""
    dims = len(coords)
    stand_in = [sympy.Symbol(f"tap_{d}", integer=True) for d in range(dims)]
    moving = set(stand_in)
    body = guard(
        x.loader([*i[:-dims], *stand_in]),
        mask,
        only=lambda load: bool(moving & sympy.sympify(load.index).free_symbols),
    )
    return replace_index(body, dict(zip(stand_in, coords, strict=True)))


def first_in_bounds(start: sympy.Expr, pad: int, dilation: int) -> sympy.Expr:
    """The first position a window starting at `start` reads inside the input along
    one dimension (eager's `while (start < 0) start += dilation`): the smallest
    `start + n * dilation` that is not negative. `start` is at least `-pad`; the
    division is of a nonnegative number (a codegen's `//` may truncate)."""
    if dilation == 1:
        return sympy.Max(start, 0)
    shift = dilation * -(-pad // dilation)  # a multiple of the dilation, at least pad
    remainder = start + shift - dilation * FloorDiv(start + shift, dilation)
    return sympy.Max(start, remainder)


def _unrolled_max(
    x: LazyTensor,
    starts: Any,
    first: Any,
    kernel: Sequence[int],
    dilation: Sequence[int],
) -> tuple[Loader, Loader]:
    """Loaders of the window maximum and of its flat input position, as eager finds
    them: the running index starts at the window's first position inside the input
    (`first(index)`, flat) with the value -inf, and each tap in bounds that is greater
    or NaN is taken (so a NaN wins, and the value is NaN; a window of -inf keeps its
    first position in bounds)."""

    def value(i: Index) -> Node:
        best: Node | None = None
        for mask, load, _ in _taps(x, i, starts, kernel, dilation):
            tap = Where(mask, load, const(float("-inf"), x.dtype))
            best = tap if best is None else op("maximum", best, tap)
        assert best is not None
        return best

    def position(i: Index) -> Node:
        best_v: Node = const(float("-inf"), x.dtype)
        best_i: Node = IndexExpr(first(i))
        for mask, load, flat in _taps(x, i, starts, kernel, dilation):
            better = op("logical_or", op("gt", load, best_v), op("isnan", load))
            take = op("logical_and", mask, better)
            best_v = Where(take, load, best_v)
            best_i = Where(take, IndexExpr(flat), best_i)
        return best_i

    return value, position


def _window_position(
    k: Node,
    starts: Sequence[sympy.Expr],
    kernel: Sequence[int],
    dilation: Sequence[int],
) -> list[Node]:
    """The input coordinates of tap `k` (a flat offset in the row-major window) of a
    window whose first tap is at `starts`."""
    coords: list[Node] = []
    for d, (start, dl) in enumerate(zip(starts, dilation, strict=True)):
        inner = math.prod(kernel[d + 1 :])
        offset = op("remainder", op("floordiv", k, c(inner, k)), c(kernel[d], k))
        step = offset if dl == 1 else op("mul", offset, c(dl, k))
        coords.append(op("add", IndexExpr(start), step))
    return coords


def _flat_node(coords: Sequence[Node], sizes: Sequence[sympy.Expr]) -> Node:
    """`flat_position` of coordinates that are body nodes."""
    flat: Node = c(0, coords[0])
    for coord, size in zip(coords, sizes, strict=True):
        scale = c(int(size), flat) if isinstance(size, sympy.Integer) else IndexExpr(size)
        flat = op("add", op("mul", flat, scale), coord)
    return flat


@register_lowering(aten.max_pool2d_with_indices.default)
def lower_max_pool2d(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, LazyTensor]:
    return _max_pool(lowering, node, 2)


@register_lowering(aten.max_pool3d_with_indices.default)
def lower_max_pool3d(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, LazyTensor]:
    return _max_pool(lowering, node, 3)


def _max_pool(
    lowering: GraphLowering, node: torch.fx.Node, dims: int
) -> tuple[LazyTensor, LazyTensor]:
    """max_pool2d/3d_with_indices: the windows' maxima and their flat positions in each
    input plane (or volume), as eager's kernels find them (`_unrolled_max`)."""
    a = lowering.args(node)
    kernel = spatial_arg(a["kernel_size"], dims)
    stride = spatial_arg(a["stride"], dims, kernel)
    pad, dilation = spatial_arg(a["padding"], dims), spatial_arg(a["dilation"], dims)
    x = _pool_input(lowering, a["self"], kernel, stride)
    out_size = tuple(sympy.Integer(int(s)) for s in node.meta["val"][0].shape)
    sizes = x.size[-dims:]

    def starts(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
        return tuple(o * st - p for o, st, p in zip(i[-dims:], stride, pad, strict=True))

    def first(i: Sequence[sympy.Expr]) -> sympy.Expr:
        coords = [
            first_in_bounds(s, p, dl) for s, p, dl in zip(starts(i), pad, dilation, strict=True)
        ]
        return flat_position(coords, sizes)

    def limits(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
        return tuple(sympy.Integer(k) for k in kernel)

    if math.prod(kernel) <= UNROLL_WINDOW:
        value, position = _unrolled_max(x, starts, first, kernel, dilation)
        return (
            LazyTensor(x.device, x.dtype, out_size, value),
            LazyTensor(x.device, torch.int64, out_size, position),
        )
    args = (lowering, x, out_size, starts, kernel, dilation, limits)
    values = _window(*args, "max", float("-inf"), x.dtype)
    offset = _max_offset(*args)

    def index(i: Index) -> Node:
        # padding reads -inf: a window whose maximum is -inf may find its first tap in
        # the padding, where eager keeps the first position in bounds
        coords = _window_position(offset(i), starts(i), kernel, dilation)
        inside = all_of(
            [
                op("logical_and", op("ge", co, c(0, co)), op("lt", co, IndexExpr(n)))
                for co, n in zip(coords, sizes, strict=True)
            ]
        )
        return Where(inside, _flat_node(coords, sizes), IndexExpr(first(i)))

    return values, LazyTensor(x.device, torch.int64, out_size, index)


@register_lowering(aten.avg_pool2d.default)
def lower_avg_pool2d(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return _avg_pool(lowering, node, 2)


@register_lowering(aten.avg_pool3d.default)
def lower_avg_pool3d(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return _avg_pool(lowering, node, 3)


def _avg_pool(lowering: GraphLowering, node: torch.fx.Node, dims: int) -> LazyTensor:
    """avg_pool2d and avg_pool3d: the window's sum over its count (the padded or the
    in-bounds extent per dimension, or `divisor_override`)."""
    a = lowering.args(node)
    kernel = spatial_arg(a["kernel_size"], dims)
    stride = spatial_arg(a["stride"], dims, kernel)
    x = _pool_input(lowering, a["self"], kernel, stride)
    pad = spatial_arg(a["padding"], dims)
    sizes = _ints(x.size[-dims:])
    out_size = lowering.out_size(node)
    dtype = acc_dtype(x.dtype)

    def starts(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
        return tuple(o * st - p for o, st, p in zip(i[-dims:], stride, pad, strict=True))

    def limits(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
        return tuple(sympy.Integer(k) for k in kernel)

    total: LazyTensor
    if math.prod(kernel) <= UNROLL_WINDOW:

        def window_sum(i: Index) -> Node:
            taps = _taps(x, i, starts, kernel, [1] * dims)
            parts = [Where(mask, cast(load, dtype), const(0.0, dtype)) for mask, load, _ in taps]
            acc: Node = parts[0]
            for part in parts[1:]:
                acc = op("add", acc, part)
            return acc

        total = LazyTensor(x.device, dtype, out_size, window_sum)
    else:
        ones = [1] * dims
        total = _window(lowering, x, out_size, starts, kernel, ones, limits, "sum", 0.0, dtype)
    override = a["divisor_override"]
    include_pad = bool(a["count_include_pad"])

    def divisor(i: Index) -> Node:
        if override:
            return const(float(override), dtype)
        count: sympy.Expr = sympy.Integer(1)
        for start, k, size, p in zip(starts(i), kernel, sizes, pad, strict=True):
            end = sympy.Min(start + k, size + p)
            if include_pad:
                count = count * (end - start)
            else:
                count = count * (sympy.Min(end, size) - sympy.Max(start, 0))
        return cast(IndexExpr(count), dtype)

    return LazyTensor(
        x.device,
        x.dtype,
        out_size,
        lambda i: cast(op("truediv", total.loader(i), divisor(i)), x.dtype),
    )


def _adaptive(
    lowering: GraphLowering, node: torch.fx.Node, kind: str, dims: int
) -> tuple[LazyTensor, LazyTensor, Any]:
    """Adaptive pooling by `kind` ('sum' or 'max') over the last `dims` dimensions:
    (the windows' values, their maxima's flat input positions (for 'max'; the values
    again for 'sum'), `limits(index)`: each window's extent per dimension)."""
    x = lowering.tensor(node.args[0])
    sizes = _ints(x.size[-dims:])
    out_size = (
        tuple(sympy.Integer(int(s)) for s in lowering.out_val(node).shape)
        if kind == "sum"
        else tuple(sympy.Integer(int(s)) for s in node.meta["val"][0].shape)
    )
    outs = [int(o) for o in out_size[-dims:]]
    # output o of n inputs over m outputs covers [floor(o*n/m), ceil((o+1)*n/m));
    # `kernel`: the largest window per dimension
    kernel = [
        max(-(-(o + 1) * n // m) - (o * n // m) for o in range(m)) if m else 1
        for n, m in zip(sizes, outs, strict=True)
    ]

    def starts(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
        return tuple(FloorDiv(o * n, m) for o, n, m in zip(i[-dims:], sizes, outs, strict=True))

    def ends(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
        return tuple(
            FloorDiv((o + 1) * n + m - 1, m) for o, n, m in zip(i[-dims:], sizes, outs, strict=True)
        )

    def limits(i: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
        return tuple(e - s for s, e in zip(starts(i), ends(i), strict=True))

    dtype = acc_dtype(x.dtype) if kind == "sum" else x.dtype
    fill = 0.0 if kind == "sum" else float("-inf")
    ones = [1] * dims
    first = _window(lowering, x, out_size, starts, kernel, ones, limits, kind, fill, dtype)
    if kind == "sum":
        return first, first, limits
    offset = _max_offset(lowering, x, out_size, starts, kernel, ones, limits)

    def index(i: Index) -> Node:
        # the window's flat offset, unravelled over the largest window, then the
        # input position flat over the spatial dimensions
        coords = _window_position(offset(i), starts(i), kernel, ones)
        return _flat_node(coords, [sympy.Integer(n) for n in sizes])

    return first, LazyTensor(x.device, torch.int64, out_size, index), limits


@register_lowering(aten._adaptive_avg_pool2d.default)
def lower_adaptive_avg_pool2d(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return _adaptive_avg_pool(lowering, node, 2)


@register_lowering(aten._adaptive_avg_pool3d.default)
def lower_adaptive_avg_pool3d(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return _adaptive_avg_pool(lowering, node, 3)


def _adaptive_avg_pool(lowering: GraphLowering, node: torch.fx.Node, dims: int) -> LazyTensor:
    total, _, limits = _adaptive(lowering, node, "sum", dims)

    def count(i: Index) -> Node:
        return cast(IndexExpr(sympy.Mul(*limits(i))), total.dtype)

    val = lowering.out_val(node)
    return LazyTensor(
        total.device,
        val.dtype,
        total.size,
        lambda i: cast(op("truediv", total.loader(i), count(i)), val.dtype),
    )


@register_lowering(aten.adaptive_max_pool2d.default)
def lower_adaptive_max_pool2d(
    lowering: GraphLowering, node: torch.fx.Node
) -> tuple[LazyTensor, LazyTensor]:
    values, indices, _ = _adaptive(lowering, node, "max", 2)
    return values, indices


@register_lowering(aten.adaptive_max_pool3d.default)
def lower_adaptive_max_pool3d(
    lowering: GraphLowering, node: torch.fx.Node
) -> tuple[LazyTensor, LazyTensor]:
    values, indices, _ = _adaptive(lowering, node, "max", 3)
    return values, indices


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
