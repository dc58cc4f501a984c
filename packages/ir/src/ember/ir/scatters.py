"""Lowerings of indirect stores: scatter, scatter_add, scatter_reduce (every mode,
mean included), index_put, index_reduce, put, masked_scatter and as_strided_scatter.

Each copies its destination into a fresh buffer, then one or more `Scatter` loop nodes
write (or combine) into that copy; the result is the copy's newest version. Indices are
checked as ember.ir.indexing checks loads: `[0, size)` for scatter and index_reduce
(eager raises on a negative one), `[-size, size)` counted from the end for index_put
and put. A mean is three passes over the same positions, as eager computes it: a sum
scatter, a count scatter (starting from 1 where `include_self`, else 0), and a
pointwise division by the count where it is positive (floor division for integers).
masked_scatter takes its source elements in order: a running count of the mask (a
`Scan` over the flattened mask) names, for each selected element, the source element
it receives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch
import torch.fx

from ember.ir.assemble import guard
from ember.ir.expr import Load, Node, Where
from ember.ir.indexing import Position, address, checked_index, gather_from, index_tensor
from ember.ir.layout import Layout
from ember.ir.loops import Pointwise, Scatter
from ember.ir.lowering import GraphLowering, NotLowerable, int_arg, list_arg, register_lowering
from ember.ir.nodes import BufferRef
from ember.ir.pointwise import c, op
from ember.ir.scan import scan
from ember.ir.symbolic import as_expr, indirect_var, loop_vars, simplify_index
from ember.ir.tensor import Index, LazyTensor, broadcast_loader, cast, const
from ember.ir.views import norm_dim, numel, reshape_map, view_of

aten = torch.ops.aten

Positions = Callable[[Index], list[Position]]


def fresh_copy(
    lowering: GraphLowering, arg: torch.fx.Node, layout: Layout | None = None
) -> tuple[str, Layout]:
    """A new buffer holding x's values (scatters write into it): contiguous unless
    `layout` says otherwise."""
    source = lowering.tensor(arg)
    if layout is None:
        layout = Layout.contiguous(source.device, source.dtype, source.size)
    ref = lowering.store(Pointwise(source.size, source.loader(loop_vars(source.ndim))), layout)
    return ref.name, layout


_SCATTER_REDUCE = {
    "add": "sum",
    "sum": "sum",
    "multiply": "prod",
    "prod": "prod",
    "amax": "max",
    "amin": "min",
    "mean": "mean",
}


def _identity(reduce: str, dtype: torch.dtype) -> float | int:
    """The value a reduction starts from where `include_self` is off."""
    if reduce in ("max", "min") and not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return info.min if reduce == "max" else info.max
    return {"sum": 0, "mean": 0, "prod": 1, "max": float("-inf"), "min": float("inf")}[reduce]


def reduce_into(
    lowering: GraphLowering,
    destination: torch.fx.Node,
    ranges: tuple[sympy.Expr, ...],
    positions: Positions,
    source: Callable[[Index], Node],
    reduce: str | None,
    *,
    include_self: bool = True,
) -> BufferRef:
    """Scatter `source(i)` for every `i` of `ranges` into a copy of `destination` at
    `positions(i)`, combined by `reduce` (None: overwrite; sum, prod, max, min, mean)."""
    name, layout = fresh_copy(lowering, destination)
    i = loop_vars(len(ranges))
    # a 0-d destination is addressed as one element of a 1-d one (its index checked)
    seen_as = Layout(layout.device, layout.dtype, (sympy.Integer(1),), (sympy.Integer(1),))
    offset, indirect = address(layout if layout.ndim else seen_as, positions(i))

    def scatter(into: str, body: Node, how: str | None) -> str:
        loop = Scatter(ranges, offset, indirect, body, how)
        return lowering.store(loop, layout, mutates=into).name

    if not include_self and reduce is not None:
        name = scatter(name, const(_identity(reduce, layout.dtype), layout.dtype), None)
    values = cast(source(i), layout.dtype)
    if reduce != "mean":
        return BufferRef(scatter(name, values, reduce))
    sums = scatter(name, values, "sum")
    counts_layout = Layout.contiguous(layout.device, layout.dtype, layout.size)
    start = Pointwise(layout.size, const(1 if include_self else 0, layout.dtype))
    counts = lowering.store(start, counts_layout).name
    counted = lowering.store(
        Scatter(ranges, offset, indirect, const(1, layout.dtype), "sum"),
        counts_layout,
        mutates=counts,
    ).name
    j = loop_vars(layout.ndim)
    total: Node = Load(sums, _flat(layout, j), layout.dtype)
    count: Node = Load(counted, _flat(counts_layout, j), layout.dtype)
    compute = layout.dtype
    if compute in (torch.float16, torch.bfloat16):
        compute = torch.float32
    total, count = cast(total, compute), cast(count, compute)
    divide = "truediv" if compute.is_floating_point else "floordiv"
    safe = Where(op("gt", count, c(0, count)), count, c(1, count))
    mean = cast(op(divide, total, safe), layout.dtype)
    return lowering.store(
        Pointwise(layout.size, mean), Layout.contiguous(layout.device, layout.dtype, layout.size)
    )


def _flat(layout: Layout, index: Index) -> sympy.Expr:
    offset: sympy.Expr = layout.offset
    for i, stride in zip(index, layout.stride, strict=True):
        offset = offset + i * stride
    return simplify_index(sympy.sympify(offset))


@register_lowering(
    aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter.value_reduce,
    aten.scatter_add.default, aten.scatter_reduce.two,
)  # fmt: skip
def lower_scatter(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    a = lowering.args(node)
    reduce: str | None = None
    if node.target is aten.scatter_add.default:
        reduce = "sum"
    elif a.get("reduce") is not None:
        if a["reduce"] not in _SCATTER_REDUCE:
            raise NotLowerable(f"scatter reduce={a['reduce']!r}")
        reduce = _SCATTER_REDUCE[a["reduce"]]
        if reduce == "mean" and node.target is not aten.scatter_reduce.two:
            raise NotLowerable("scatter reduce='mean'")  # only scatter_reduce has it
    index = index_tensor(lowering, a["index"])
    destination = lowering.tensor(a["self"])
    dim = norm_dim(int(a["dim"]), max(destination.ndim, 1))
    src = a.get("src")
    if isinstance(src, torch.fx.Node):
        source = lowering.tensor(src).loader
    else:
        value = const(a["value"], destination.dtype)
        source = lambda i: value  # noqa: E731

    def positions(i: Index) -> list[Position]:
        at = index.loader(i)
        if destination.ndim == 0:
            return [checked_index(lowering, node, at, sympy.Integer(1), 0, wraps=False)]
        found: list[Position] = list(i)
        found[dim] = checked_index(lowering, node, at, destination.size[dim], dim, wraps=False)
        return found

    return reduce_into(
        lowering, a["self"], index.size, positions, source, reduce,
        include_self=a.get("include_self") is not False,
    )  # fmt: skip


_INDEX_REDUCE = {"prod": "prod", "mean": "mean", "amax": "max", "amin": "min"}


@register_lowering(aten.index_reduce.default)
def lower_index_reduce(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    """`self.index_reduce(dim, index, source, reduce)`: source's slice `k` along `dim`
    combines into self's slice `index[k]`."""
    a = lowering.args(node)
    destination = lowering.tensor(a["self"])
    source = lowering.tensor(a["source"])
    index = index_tensor(lowering, a["index"])
    if source.ndim != destination.ndim or index.ndim > 1:
        raise NotLowerable("index_reduce with a source of another rank")  # eager raises
    dim = norm_dim(int_arg(a["dim"]), max(destination.ndim, 1))
    if destination.ndim == 0:  # one element, at index[0], which must be 0
        only = source.loader
        size = (sympy.Integer(1),)

        def position(i: Index) -> list[Position]:
            at = index.loader(i[: index.ndim])
            return [checked_index(lowering, node, at, sympy.Integer(1), 0, wraps=False)]

        return reduce_into(
            lowering, a["self"], size, position, lambda i: only([]), _INDEX_REDUCE[a["reduce"]],
            include_self=bool(a["include_self"]),
        )  # fmt: skip

    def positions(i: Index) -> list[Position]:
        found: list[Position] = list(i)
        at = index.loader([i[dim]])
        found[dim] = checked_index(lowering, node, at, destination.size[dim], dim, wraps=False)
        return found

    return reduce_into(
        lowering, a["self"], source.size, positions, source.loader, _INDEX_REDUCE[a["reduce"]],
        include_self=bool(a["include_self"]),
    )  # fmt: skip


@register_lowering(aten.index_put.default, aten._unsafe_index_put.default)
def lower_index_put(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    from ember.ir.indexing import AdvancedIndex

    a = lowering.args(node)
    destination = lowering.tensor(a["self"])
    plan = AdvancedIndex(lowering, node, destination.size, a["indices"])
    values = broadcast_loader(lowering.tensor(a["values"]), plan.size)
    reduce = "sum" if a["accumulate"] else None
    return reduce_into(lowering, a["self"], plan.size, plan.positions, values, reduce)


@register_lowering(aten.put.default)
def lower_put(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    """`self.put(index, source, accumulate)`: self seen flat, `source` in index order
    (the two have as many elements, in any shapes)."""
    a = lowering.args(node)
    destination = lowering.tensor(a["self"])
    index = index_tensor(lowering, a["index"])
    source = lowering.tensor(a["source"])
    total = numel(destination.size)
    flat_size = (numel(index.size),)
    flat_index = view_of(index, flat_size, reshape_map(index.size, flat_size))
    flat_source = view_of(source, flat_size, reshape_map(source.size, flat_size))
    name, layout = fresh_copy(lowering, a["self"])
    i = loop_vars(1)
    at = checked_index(lowering, node, flat_index.loader(i), total, 0, wraps=True)
    offset = simplify_index(layout.offset + indirect_var(0))  # contiguous: flat is storage
    body = cast(flat_source.loader(i), layout.dtype)
    loop = Scatter(flat_size, offset, (at,), body, "sum" if a["accumulate"] else None)
    return lowering.store(loop, layout, mutates=name)


@register_lowering(aten.masked_scatter.default)
def lower_masked_scatter(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    """`self.masked_scatter(mask, source)`: the k-th selected element (row-major, over
    self and mask broadcast together) takes source's k-th element (source read flat).
    Eager raises when source has fewer elements than the mask selects: so does the
    index check on k."""
    a = lowering.args(node)
    size = lowering.out_size(node)
    destination = broadcast_loader(lowering.tensor(a["self"]), size)
    mask = broadcast_loader(lowering.tensor(a["mask"]), size)
    source = lowering.tensor(a["source"])
    dtype = lowering.out_val(node).dtype
    flat_size = (numel(size),)
    to_flat = reshape_map(flat_size, size)
    flat_mask = view_of(
        LazyTensor(lowering.out_val(node).device, torch.bool, size, mask),
        flat_size,
        reshape_map(size, flat_size),
    )
    counts = scan(lowering, _as_int64(flat_mask), 0, "sum", torch.int64, torch.int64)
    source_name, source_layout = gather_from(lowering, a["source"])
    if tuple(source_layout.stride) != tuple(
        Layout.contiguous(source.device, source.dtype, source.size).stride
    ):
        layout = Layout.contiguous(source.device, source.dtype, source.size)
        body = source.loader(loop_vars(source.ndim))
        source_name = lowering.store(Pointwise(source.size, body), layout).name
        source_layout = layout

    def load(index: Index) -> Node:
        selected = mask(index)
        k = op("sub", counts.loader(to_flat(index)), c(1, counts.loader(to_flat(index))))
        at = checked_index(lowering, node, k, numel(source_layout.size), 0, wraps=False)
        taken = Load(
            source_name,
            simplify_index(source_layout.offset + indirect_var(0)),
            source_layout.dtype,
            indirect=(at,),
        )
        picked = guard(cast(taken, dtype), selected)
        return Where(selected, picked, cast(destination(index), dtype))

    return LazyTensor(lowering.out_val(node).device, dtype, size, load)


def _as_int64(value: LazyTensor) -> LazyTensor:
    load = value.loader
    return LazyTensor(value.device, torch.int64, value.size, lambda i: cast(load(i), torch.int64))


@register_lowering(aten.as_strided_scatter.default)
def lower_as_strided_scatter(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    """`self.as_strided_scatter(src, size, stride, offset)`: a copy of self (laid out as
    eager lays out its clone) whose storage positions `offset + sum(i * stride)` take
    `src`. The positions are storage positions of that copy, so its layout is the
    node's own."""
    a = lowering.args(node)
    val = lowering.out_val(node)
    layout = Layout.of(val)
    if not _dense(layout):
        raise NotLowerable("as_strided_scatter into a result with gaps or overlaps")
    name, layout = fresh_copy(
        lowering, a["self"], Layout(layout.device, layout.dtype, layout.size, layout.stride)
    )
    sizes = tuple(as_expr(s) for s in list_arg(a["size"]))
    strides = [as_expr(s) for s in list_arg(a["stride"])]
    start = as_expr(a["storage_offset"] or 0)
    i = loop_vars(len(sizes))
    offset: sympy.Expr = start
    for var, stride in zip(i, strides, strict=True):
        offset = offset + var * stride
    source = broadcast_loader(lowering.tensor(a["src"]), sizes)
    body = cast(source(i), layout.dtype)
    loop = Scatter(sizes, simplify_index(sympy.sympify(offset)), (), body, None)
    return lowering.store(loop, layout, mutates=name)


def _dense(layout: Layout) -> bool:
    """Strides that are a permutation of contiguous ones (no gaps, no overlaps)."""
    try:
        dims = sorted(
            (d for d in range(layout.ndim) if int(layout.size[d]) != 1),
            key=lambda d: int(layout.stride[d]),
        )
        expected = 1
        for d in dims:
            if int(layout.stride[d]) != expected:
                return False
            expected *= int(layout.size[d])
    except TypeError:
        return False
    return True
