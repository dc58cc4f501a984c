"""Lowerings of data-dependent indexing: index, gather, index_select, embedding
(indirect loads); the indirect stores (scatters) are in ember.ir.scatters.

An indirect load reads a stored buffer at an index that uses the symbols `ind0, ...`,
each the value of an index tensor at this point (`Load.indirect`). Each index is first
checked against its dimension (`CheckIndex`, unless `LoweringOptions.index_checks`
is off), with the range eager accepts: `[-size, size)` with negative indices counted
from the end for index and index_put, `[0, size)` for the others (eager raises on a
negative embedding, gather, index_select or scatter index). The source of an
indirect load is realized first, so the load's index is plain layout math.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import sympy
import torch
import torch.fx

from ember.ir.expr import CheckIndex, Load, Node, Where
from ember.ir.layout import Layout
from ember.ir.lowering import GraphLowering, NotLowerable, int_arg, register_lowering
from ember.ir.pointwise import c, op
from ember.ir.symbolic import indirect_var, simplify_index
from ember.ir.tensor import Index, LazyTensor, broadcast_loader, cast
from ember.ir.views import norm_dim

aten = torch.ops.aten

Position: TypeAlias = "sympy.Expr | Node"


def wrap_index(value: Node, size: sympy.Expr) -> Node:
    """An int64 index with negative values counted from the end of a dim of `size`."""
    from ember.ir.assemble import index_value

    value = cast(value, torch.int64)
    return Where(op("lt", value, c(0, value)), op("add", value, index_value(size)), value)


def checked_index(
    lowering: GraphLowering,
    node: torch.fx.Node,
    value: Node,
    size: sympy.Expr,
    dim: int,
    *,
    wraps: bool,
) -> Node:
    """The int64 position in a dimension of `size` that index `value` names: checked
    against the range eager accepts (see the module docstring), then, where negative
    indices count from the end, wrapped. Without checks every index is wrapped, as
    before checks existed, which is harmless for good indices."""
    from ember.ir.assemble import index_value

    target = node.target
    if not lowering.options.index_checks:
        return wrap_index(value, size)
    packet = target.overloadpacket.__name__ if isinstance(target, torch._ops.OpOverload) else "?"
    op_name = f"aten.{packet}"
    checked = CheckIndex(
        cast(value, torch.int64),
        index_value(size),
        wraps,
        op_name,
        node.name,
        dim,
    )
    return wrap_index(checked, size) if wraps else checked


def address(layout: Layout, positions: Sequence[Position]) -> tuple[sympy.Expr, tuple[Node, ...]]:
    """Storage offset of an element whose coordinates are index expressions or
    (indirect) body nodes; returns the offset and the indirect nodes it uses."""
    offset: sympy.Expr = layout.offset
    indirect: list[Node] = []
    for position, stride in zip(positions, layout.stride, strict=True):
        if isinstance(position, Node):
            position_expr: sympy.Expr = indirect_var(len(indirect))
            indirect.append(position)
        else:
            position_expr = position
        offset = offset + position_expr * stride
    return simplify_index(sympy.sympify(offset)), tuple(indirect)


def gather_from(lowering: GraphLowering, arg: torch.fx.Node) -> tuple[str, Layout]:
    ref = lowering.realize(lowering.env[arg])
    name = lowering.current(ref).name
    return name, lowering.layouts[name]


def indirect_load(name: str, layout: Layout, positions: Sequence[Position]) -> Node:
    index, indirect = address(layout, positions)
    return Load(name, index, layout.dtype, indirect=indirect)


def index_tensor(lowering: GraphLowering, arg: Any) -> LazyTensor:
    value = lowering.tensor(arg)
    if value.dtype in (torch.bool, torch.uint8):
        raise NotLowerable("boolean mask index (data-dependent shape)")
    return value


class AdvancedIndex:
    """How `x[indices]` (advanced indexing, `None` for a full slice) maps a result
    index to x's coordinates, shared by index and index_put."""

    def __init__(
        self,
        lowering: GraphLowering,
        node: torch.fx.Node,
        x_size: tuple[sympy.Expr, ...],
        indices: Sequence[Any],
    ):
        self.lowering = lowering
        self.node = node
        self.x_size = x_size
        self.tensors = {
            d: index_tensor(lowering, i) for d, i in enumerate(indices) if i is not None
        }
        if not self.tensors:
            raise NotLowerable("index without index tensors")
        dims = sorted(self.tensors)
        width = max(t.ndim for t in self.tensors.values())
        shape: list[sympy.Expr] = [sympy.Integer(1)] * width
        for t in self.tensors.values():
            for k, s in enumerate(t.size):
                pos = width - t.ndim + k
                if s != 1:
                    shape[pos] = s
        self.broadcast = tuple(shape)
        self.rest = [d for d in range(len(x_size)) if d not in self.tensors]
        self.adjacent = dims == list(range(dims[0], dims[-1] + 1))
        self.first = dims[0] if self.adjacent else 0
        before = [d for d in self.rest if d < self.first] if self.adjacent else []
        after = [d for d in self.rest if d not in before]
        self.size = (*(x_size[d] for d in before), *self.broadcast, *(x_size[d] for d in after))
        self.before, self.after = before, after

    def positions(self, index: Index) -> list[Position]:
        nb = len(self.broadcast)
        start = len(self.before)
        b_index = index[start : start + nb]
        result: list[Position] = [sympy.Integer(0)] * len(self.x_size)
        for k, d in enumerate(self.before):
            result[d] = index[k]
        for k, d in enumerate(self.after):
            result[d] = index[start + nb + k]
        for d, t in self.tensors.items():
            value = broadcast_loader(t, self.broadcast)(b_index)
            result[d] = checked_index(
                self.lowering, self.node, value, self.x_size[d], d, wraps=True
            )
        return result


@register_lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
def lower_index(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    name, layout = gather_from(lowering, node.args[0])  # type: ignore[arg-type]  # a node
    plan = AdvancedIndex(lowering, node, layout.size, node.args[1])  # type: ignore[arg-type]  # a list
    size = lowering.out_size(node)
    if len(size) != len(plan.size):
        raise NotLowerable("unexpected result rank")
    return LazyTensor(
        layout.device,
        layout.dtype,
        size,
        lambda index: indirect_load(name, layout, plan.positions(index)),
    )


@register_lowering(aten.gather.default)
def lower_gather(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    name, layout = gather_from(lowering, node.args[0])  # type: ignore[arg-type]  # a node
    dim = norm_dim(int_arg(node.args[1]), max(layout.ndim, 1))
    index_value = index_tensor(lowering, node.args[2])
    if layout.ndim == 0:
        return LazyTensor(
            layout.device, layout.dtype, (), lambda index: Load(name, layout.offset, layout.dtype)
        )

    def load(index: Index) -> Node:
        positions: list[Position] = list(index)
        value = index_value.loader(index)
        positions[dim] = checked_index(lowering, node, value, layout.size[dim], dim, wraps=False)
        return indirect_load(name, layout, positions)

    return LazyTensor(layout.device, layout.dtype, index_value.size, load)


@register_lowering(aten.index_select.default)
def lower_index_select(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    name, layout = gather_from(lowering, node.args[0])  # type: ignore[arg-type]  # a node
    dim = norm_dim(int_arg(node.args[1]), max(layout.ndim, 1))
    index_value = index_tensor(lowering, node.args[2])
    size = lowering.out_size(node)
    if layout.ndim == 0:
        return LazyTensor(
            layout.device, layout.dtype, size, lambda index: Load(name, layout.offset, layout.dtype)
        )

    def load(index: Index) -> Node:
        positions: list[Position] = list(index)
        at = [index[dim]] if index_value.ndim == 1 else []
        value = index_value.loader(at)
        positions[dim] = checked_index(lowering, node, value, layout.size[dim], dim, wraps=False)
        return indirect_load(name, layout, positions)

    return LazyTensor(layout.device, layout.dtype, size, load)


@register_lowering(aten.embedding.default)
def lower_embedding(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    name, layout = gather_from(lowering, node.args[0])  # type: ignore[arg-type]  # a node
    ids = index_tensor(lowering, node.args[1])
    size = lowering.out_size(node)

    def load(index: Index) -> Node:
        row = checked_index(lowering, node, ids.loader(index[:-1]), layout.size[0], 0, wraps=False)
        return indirect_load(name, layout, [row, index[-1]])

    return LazyTensor(layout.device, layout.dtype, size, load)
