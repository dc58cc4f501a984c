"""Lowerings of sorting ops: sort (stable or not, any dim, either direction), topk, and
the median of all elements; argsort and msort reach here as sort through the
decompositions.

Each becomes two `Sort` loop nodes (ember.ir.loops) over the same input, the values and
the indices, which the scheduler runs as one kernel (codegens sort once and store
both); an unused one is dropped with the rest of the dead code. The input is not stored
first: its producer's body is inlined into the sort body, as for reductions.

The order is eager's (NaN largest, ties in input order), for every flag: a stable sort
is that order by definition; an unstable sort may order ties any way (eager's CPU sort
does not keep them in input order past a few dozen elements) and the stable order is
one of those; topk takes the first k of the same order, so where values are distinct
its indices are eager's, and among equal values it picks the earliest positions
(eager's CPU and CUDA kernels may pick others). `sorted=False` still returns them
sorted, which is a valid answer.

Where the target codegen cannot sort the row (a GPU block holds at most
`LoweringOptions.sort_limits` elements), the op stays an ATen call on purpose, with
the reason logged: not a fallback.
"""

from __future__ import annotations

import sympy
import torch
import torch.fx

from ember.ir.expr import Where
from ember.ir.layout import Layout
from ember.ir.loops import Sort
from ember.ir.lowering import (
    GraphLowering,
    NotLowerable,
    int_arg,
    non_overlapping,
    register_lowering,
)
from ember.ir.pointwise import op
from ember.ir.symbolic import as_expr, index_var, static_int
from ember.ir.tensor import LazyTensor, const
from ember.ir.views import norm_dim, numel, reshape_map, view_of

aten = torch.ops.aten


def sort_rows(
    lowering: GraphLowering,
    source: LazyTensor,
    dim: int,
    count: sympy.Expr,
    descending: bool,
    results: tuple[object, object] = (None, None),
) -> tuple[LazyTensor, LazyTensor]:
    """The first `count` values of `source` along `dim` in eager's order, and the
    positions they came from, each stored with the strides of the matching example
    in `results` (eager's sort keeps its input's dimension order: storing so spares a
    graph output a copy), or contiguously."""
    ranges = tuple(s for d, s in enumerate(source.size) if d != dim)
    index = [
        index_var("r", 0) if d == dim else index_var("i", d - (d > dim)) for d in range(source.ndim)
    ]
    body = source.loader(index)
    size = list(source.size)
    size[dim] = count
    stored = []
    for indices, dtype in ((False, source.dtype), (True, torch.int64)):
        loop = Sort(ranges, source.size[dim], count, dim, descending, indices, body, dtype)
        layout = _layout(results[indices], source.device, dtype, tuple(size))
        stored.append(lowering.tensor(lowering.store(loop, layout)))
    return stored[0], stored[1]


def _layout(
    example: object, device: torch.device, dtype: torch.dtype, size: tuple[sympy.Expr, ...]
) -> Layout:
    if isinstance(example, torch.Tensor):
        strides = Layout.of(example).stride
        layout = Layout(device, dtype, size, strides)
        if len(strides) == len(size) and non_overlapping(layout):
            return layout
    return Layout.contiguous(device, dtype, size)


def _too_long(lowering: GraphLowering, source: LazyTensor, dim: int) -> str | None:
    """Why the target codegen cannot sort along `dim` of `source`, if it cannot."""
    for device_type, limit in lowering.options.sort_limits:
        if device_type != source.device.type:
            continue
        if limit <= 0:
            return f"ember's {device_type} sort kernels are off (the runtime keeps them ATen calls)"
        length = static_int(source.size[dim])
        if length is None:
            size = source.size[dim]
            return f"the sorted length {size} is symbolic ({device_type} sorts known lengths)"
        if length > limit:
            return f"rows of {length} elements are longer than the {limit} {device_type} sorts"
    return None


def _lower(
    lowering: GraphLowering, node: torch.fx.Node, dim_arg: object, descending: bool
) -> object:
    source = lowering.tensor(node.args[0])
    if source.dtype.is_complex:
        raise NotLowerable("a sort of complex values")
    values, indices = node.meta["val"]
    if source.ndim == 0:
        norm_dim(int_arg(dim_arg), 1)
        if values.numel() != 1:
            raise NotLowerable("a topk of no element of a 0-d tensor")
        zero = const(0, torch.int64)
        return source, LazyTensor(source.device, torch.int64, (), lambda index: zero)
    dim = norm_dim(int_arg(dim_arg), source.ndim)
    reason = _too_long(lowering, source, dim)
    if reason is not None:
        return lowering.intentional_extern(node, reason)
    count = as_expr(values.shape[dim])
    return sort_rows(lowering, source, dim, count, descending, (values, indices))


@register_lowering(aten.sort.default)
def lower_sort(lowering: GraphLowering, node: torch.fx.Node) -> object:
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
    descending = node.args[2] if len(node.args) > 2 else node.kwargs.get("descending", False)
    return _lower(lowering, node, dim, bool(descending))


@register_lowering(aten.sort.stable)
def lower_stable_sort(lowering: GraphLowering, node: torch.fx.Node) -> object:
    # every sort here keeps ties in input order: `stable` changes nothing
    dim = node.kwargs.get("dim", -1)
    return _lower(lowering, node, -1 if dim is None else dim, bool(node.kwargs.get("descending")))


@register_lowering(aten.topk.default)
def lower_topk(lowering: GraphLowering, node: torch.fx.Node) -> object:
    args = [*node.args, None, None, None, None][:5]
    dim = args[2] if args[2] is not None else node.kwargs.get("dim", -1)
    largest = args[3] if args[3] is not None else node.kwargs.get("largest", True)
    return _lower(lowering, node, dim, bool(largest))


@register_lowering(aten.median.default)
def lower_median(lowering: GraphLowering, node: torch.fx.Node) -> object:
    """The lower middle of all elements in sorted order, or NaN where there is one:
    NaNs sort last, so the last sorted value is NaN exactly when any is. One sort of
    the flattened input; the positions it also makes are dead code. An empty input
    stays the ATen call (eager returns NaN)."""
    source = lowering.tensor(node.args[0])
    if source.dtype.is_complex:
        raise NotLowerable("a median of complex values")
    count = numel(source.size)
    flat = view_of(source, (count,), reshape_map(source.size, (count,)))
    reason = _too_long(lowering, flat, 0)
    if reason is not None:
        return lowering.intentional_extern(node, reason)
    length = static_int(count)
    if not length:
        return lowering.intentional_extern(node, "the median of no element")
    values, _ = sort_rows(lowering, flat, 0, count, False)
    middle = values.loader([sympy.Integer((length - 1) // 2)])
    if source.dtype.is_floating_point:
        last = values.loader([sympy.Integer(length - 1)])
        middle = Where(op("isnan", last), last, middle)
    return LazyTensor(source.device, source.dtype, (), lambda index: middle)
