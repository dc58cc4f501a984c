"""Lowerings that assemble a tensor from pieces with masked reads: cat,
constant_pad_nd, and the view scatters functionalization emits (slice_scatter,
select_scatter, diagonal_scatter).

Each output element reads exactly one source, chosen by comparisons on the index;
reads of the sources are guarded by the same mask (`Load.mask` via the `guard`
helper), so no lane ever addresses memory outside a source, and the scheduler can
still see every load's index.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv

from ember.ir.expr import CheckIndex, IndexExpr, Load, Node, Where, map_dag
from ember.ir.lowering import GraphLowering, NotLowerable, int_arg, list_arg, register_lowering
from ember.ir.pointwise import op
from ember.ir.tensor import Index, LazyTensor, broadcast_loader, cast, const
from ember.ir.views import dim_extent, norm_dim, select_index, size_expr, size_value, slice_start

aten = torch.ops.aten


def index_value(expr: sympy.Expr) -> Node:
    return IndexExpr(sympy.sympify(expr))


def all_of(checks: Sequence[Node]) -> Node:
    """Bool node: every one of `checks` (at least one) holds."""
    result = checks[0]
    for check in checks[1:]:
        result = op("logical_and", result, check)
    return result


def in_range(expr: sympy.Expr, low: sympy.Expr, high: sympy.Expr) -> Node:
    """Bool node: low <= expr < high (constant bounds fold away)."""
    value = index_value(expr)
    checks: list[Node] = []
    if not (isinstance(low, sympy.Integer) and int(low) <= 0 and expr.is_nonnegative):
        checks.append(op("ge", value, index_value(low)))
    checks.append(op("lt", value, index_value(high)))
    return all_of(checks)


def guard(body: Node, mask: Node, only: Callable[[Load], bool] | None = None) -> Node:
    """`body` with every load (or each one `only` picks) masked by `mask` (it reads 0
    where the mask is off), so that lanes outside a piece never address its memory;
    and every index check too: an index computed from a masked read (say `ids - 1`
    from the 0 it reads) is no index of the result there and must not raise."""

    def add_mask(node: Node) -> Node:
        if isinstance(node, CheckIndex):
            both = mask if node.mask is None else op("logical_and", node.mask, mask)
            return replace(node, mask=both)
        if not isinstance(node, Load) or (only is not None and not only(node)):
            return node
        combined = mask if node.mask is None else op("logical_and", node.mask, mask)
        return replace(node, mask=combined)

    return map_dag(body, add_mask)


@register_lowering(aten.cat.default)
def lower_cat(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    val = lowering.out_val(node)
    size = lowering.out_size(node)
    dim = norm_dim(int_arg(node.args[1]) if len(node.args) > 1 else 0, len(size))
    pieces: list[tuple[sympy.Expr, sympy.Expr, LazyTensor]] = []
    start: sympy.Expr = sympy.Integer(0)
    for arg in node.args[0]:  # type: ignore[union-attr]  # a list of nodes
        piece = lowering.tensor(arg)
        if piece.ndim == 1 and piece.size[0] == 0 and len(size) != 1:
            continue  # legacy empty tensors take no part in cat
        pieces.append((start, start + piece.size[dim], piece))
        start = start + piece.size[dim]

    def load(index: Index) -> Node:
        result: Node | None = None
        for begin, end, piece in reversed(pieces):
            shifted = list(index)
            shifted[dim] = index[dim] - begin
            mask = in_range(index[dim], begin, end)
            value = cast(guard(piece.loader(shifted), mask), val.dtype)
            result = value if result is None else Where(mask, value, result)
        if result is None:
            raise NotLowerable("cat of nothing")
        return result

    return LazyTensor(val.device, val.dtype, size, load)


@register_lowering(aten.constant_pad_nd.default)
def lower_constant_pad(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    pad = [size_expr(lowering, p) for p in list_arg(node.args[1])]  # may be symbolic
    fill = node.args[2] if len(node.args) > 2 else 0
    size = lowering.out_size(node)
    fill_node = const(fill, source.dtype)  # type: ignore[arg-type]  # a number

    def load(index: Index) -> Node:
        shifted = list(index)
        mask: Node | None = None
        for k in range(len(pad) // 2):
            d = source.ndim - 1 - k
            shifted[d] = index[d] - pad[2 * k]
            check = in_range(shifted[d], sympy.Integer(0), source.size[d])
            mask = check if mask is None else op("logical_and", mask, check)
        inner = source.loader(shifted)
        if mask is None:
            return inner
        return Where(mask, guard(inner, mask), fill_node)

    return LazyTensor(source.device, source.dtype, size, load)


def _scatter_view(
    lowering: GraphLowering,
    node: torch.fx.Node,
    inside: Node,
    src_index: list[sympy.Expr],
    index: Index,
) -> Node:
    base = lowering.tensor(node.args[0])
    src = lowering.tensor(node.args[1])
    return Where(inside, cast(guard(src.loader(src_index), inside), base.dtype), base.loader(index))


@register_lowering(aten.slice_scatter.default)
def lower_slice_scatter(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    """Each position of the slice takes the next element of `src`. The slice's end is
    not needed: `src` has exactly the slice's length, so a position is inside when its
    offset from the start is below len(src) * step (and a multiple of the step)."""
    base = lowering.tensor(node.args[0])
    a = lowering.args(node)
    dim = norm_dim(int(a["dim"]), base.ndim)
    step = size_expr(lowering, a["step"])
    start_expr = slice_start(size_value(a["start"]), dim_extent(node.args[0], dim))
    src_size = lowering.tensor(node.args[1]).size[dim]

    def load(index: Index) -> Node:
        offset = index[dim] - start_expr
        inside = in_range(offset, sympy.Integer(0), src_size * step)
        if step != 1:
            rem = op("remainder", index_value(offset), index_value(step))
            inside = op("logical_and", inside, op("eq", rem, index_value(sympy.Integer(0))))
        src_index = list(index)
        src_index[dim] = FloorDiv(offset, step) if step != 1 else offset
        return _scatter_view(lowering, node, inside, src_index, index)

    return LazyTensor(base.device, base.dtype, base.size, load)


@register_lowering(aten.select_scatter.default)
def lower_select_scatter(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    base = lowering.tensor(node.args[0])
    dim = norm_dim(int_arg(node.args[2]), base.ndim)
    position = size_value(node.args[3])
    if position is None:
        raise NotLowerable("select_scatter without an index")
    where = select_index(position, dim_extent(node.args[0], dim))

    def load(index: Index) -> Node:
        inside = op("eq", index_value(index[dim]), index_value(where))
        src_index = [*index[:dim], *index[dim + 1 :]]
        return _scatter_view(lowering, node, inside, src_index, index)

    return LazyTensor(base.device, base.dtype, base.size, load)


@register_lowering(aten.diagonal_scatter.default)
def lower_diagonal_scatter(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    base = lowering.tensor(node.args[0])
    a = lowering.args(node)
    offset = int(a["offset"])
    d1, d2 = norm_dim(int(a["dim1"]), base.ndim), norm_dim(int(a["dim2"]), base.ndim)
    rest = [d for d in range(base.ndim) if d not in (d1, d2)]
    diag_len = lowering.tensor(node.args[1]).size[-1]

    def load(index: Index) -> Node:
        k = index[d1] - max(-offset, 0)
        inside = op(
            "logical_and",
            op("eq", index_value(index[d2] - max(offset, 0)), index_value(k)),
            in_range(k, sympy.Integer(0), diag_len),
        )
        src_index = [*(index[d] for d in rest), k]
        return _scatter_view(lowering, node, inside, src_index, index)

    return LazyTensor(base.device, base.dtype, base.size, load)


def broadcast(
    lowering: GraphLowering, arg: torch.fx.Node, size: tuple[sympy.Expr, ...]
) -> LazyTensor:
    value = lowering.tensor(arg)
    return LazyTensor(value.device, value.dtype, size, broadcast_loader(value, size))
