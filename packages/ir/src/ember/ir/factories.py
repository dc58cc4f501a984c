"""Lowerings of tensor factories: full/zeros/ones/empty (and their _like/new_
variants), scalar_tensor, arange and iota. Their bodies need no loads: a constant or
an index expression, so they fuse into whatever reads them.

`empty*` values are unspecified in PyTorch; ember fills them with zeros so that runs
are reproducible.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx

from ember.ir.expr import IndexExpr, Node, size_value
from ember.ir.lowering import GraphLowering, NotLowerable, register_lowering
from ember.ir.pointwise import op
from ember.ir.tensor import Index, LazyTensor, cast, const

aten = torch.ops.aten
prims = torch.ops.prims


def filled(lowering: GraphLowering, node: torch.fx.Node, fill: Any) -> LazyTensor:
    val = lowering.out_val(node)
    if isinstance(fill, torch.fx.Node):
        fill = lowering.env[fill]
    if isinstance(fill, sympy.Expr):
        if fill.free_symbols:
            value: Node = cast(size_value(fill), val.dtype)
        else:
            value = const(int(fill) if fill.is_integer else float(fill), val.dtype)
    elif isinstance(fill, (bool, int, float)):
        value = const(fill, val.dtype)
    else:
        raise NotLowerable(f"fill value of type {type(fill).__name__}")
    return LazyTensor(val.device, val.dtype, lowering.out_size(node), lambda index: value)


@register_lowering(aten.full.default, aten.new_full.default, aten.full_like.default)
def lower_full(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return filled(lowering, node, lowering.args(node)["fill_value"])


@register_lowering(aten.fill.Scalar, aten.fill.Tensor)
def lower_fill(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    value = node.args[1]
    if isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), torch.Tensor):
        source = lowering.tensor(value)
        val = lowering.out_val(node)
        return LazyTensor(
            val.device,
            val.dtype,
            lowering.out_size(node),
            lambda i: cast(source.loader([]), val.dtype),
        )
    return filled(lowering, node, value)


@register_lowering(aten.scalar_tensor.default)
def lower_scalar_tensor(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return filled(lowering, node, node.args[0])


@register_lowering(
    aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty.memory_format,
    aten.empty_like.default, aten.new_empty.default, aten.empty_strided.default,
    aten.new_empty_strided.default, aten.empty_permuted.default, aten.zero.default,
)  # fmt: skip
def lower_zeros(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return filled(lowering, node, 0)


@register_lowering(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def lower_ones(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return filled(lowering, node, 1)


@register_lowering(
    aten.arange.start_step, aten.arange.start, aten.arange.default, prims.iota.default
)
def lower_arange(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    """arange: start + i * step, computed in float64 for floating results as eager."""
    a = lowering.args(node)
    if node.target is prims.iota.default:
        start, step = a["start"], a["step"]
    else:
        start = a.get("start") if a.get("start") is not None else 0
        step = a.get("step") if a.get("step") is not None else 1
    start_value = _scalar(lowering, start)
    step_value = _scalar(lowering, step)
    val = lowering.out_val(node)
    integral = all(
        isinstance(v, (int, sympy.Expr)) and not isinstance(v, float)
        for v in (start_value, step_value)
    )

    size = lowering.out_size(node)
    # Integer bounds with every value exact in float32: the element is an integer index
    # cast once to the result type, with no float64 ops per element (softmax_chain's
    # `arange(n) * 1e-3` ran int -> float64, * 1.0, + 0.0 in its inner loop).
    exact = _small_integer_range(start_value, step_value, size[0])

    def load(index: Index) -> Node:
        if (integral and not val.dtype.is_floating_point) or exact:
            return cast(IndexExpr(sympy.sympify(start_value + index[0] * step_value)), val.dtype)
        i = cast(IndexExpr(index[0]), torch.float64)
        begin = _node(start_value)
        stride = _node(step_value)
        return cast(op("add", begin, op("mul", i, stride)), val.dtype)

    return LazyTensor(val.device, val.dtype, size, load)


def _small_integer_range(start: Any, step: Any, length: sympy.Expr) -> bool:
    """start + i * step for i < length are integers below 2**24 in magnitude."""
    if not (isinstance(start, int) and isinstance(step, int)):
        return False
    if isinstance(start, bool) or isinstance(step, bool) or not isinstance(length, sympy.Integer):
        return False
    last = start + max(int(length) - 1, 0) * step
    return max(abs(start), abs(last)) < 2**24


def _scalar(lowering: GraphLowering, value: Any) -> Any:
    if isinstance(value, torch.fx.Node):
        value = lowering.env[value]
        if not isinstance(value, sympy.Expr):
            raise NotLowerable("tensor arange bounds")
    if isinstance(value, sympy.Integer):
        return int(value)
    if isinstance(value, sympy.Float):
        return float(value)
    if isinstance(value, (int, float, sympy.Expr)):
        return value
    raise NotLowerable(f"arange bound of type {type(value).__name__}")


def _node(value: Any) -> Node:
    if isinstance(value, sympy.Expr):
        return cast(size_value(value), torch.float64)
    return const(value, torch.float64)
