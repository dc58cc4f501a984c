"""Lowerings of pointwise ops with extra arguments: add/sub (alpha), div (rounding
modes), where, clamp, casts and copies, rounding, the activation functions, and the
special functions that take an order. The plain table-driven ones are in
ember.ir.pointwise; these share its promotion and broadcasting helpers.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind

from ember.ir.expr import Const, Node, Where
from ember.ir.lowering import GraphLowering, NotLowerable, register_lowering
from ember.ir.pointwise import c, elementwise, op, operand, promote
from ember.ir.tensor import Index, LazyTensor, broadcast_loader, cast

aten = torch.ops.aten
prims = torch.ops.prims


@register_lowering(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar)
def lower_add_sub(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    name = "add" if node.target in (aten.add.Tensor, aten.add.Scalar) else "sub"
    alpha = a["alpha"]
    if alpha is None or alpha == 1:
        return elementwise(
            lowering, node, [a["self"], a["other"]], Kind.DEFAULT, lambda x, y: op(name, x, y)
        )
    if isinstance(alpha, torch.fx.Node):
        raise NotLowerable("symbolic alpha")
    return elementwise(
        lowering,
        node,
        [a["self"], a["other"], alpha],
        Kind.DEFAULT,
        lambda x, y, k: op(name, x, op("mul", y, k)),
    )


@register_lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def lower_rsub(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    alpha = a["alpha"]
    if alpha not in (None, 1):
        raise NotLowerable("rsub with alpha")
    return elementwise(
        lowering, node, [a["self"], a["other"]], Kind.DEFAULT, lambda x, y: op("sub", y, x)
    )


@register_lowering(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor)
def lower_div(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return elementwise(
        lowering, node, node.args[:2], Kind.INT_TO_FLOAT, lambda x, y: op("truediv", x, y)
    )


@register_lowering(aten.div.Tensor_mode, aten.div.Scalar_mode, aten.floor_divide.default)
def lower_div_mode(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    if node.target is aten.floor_divide.default:
        mode: str | None = "floor"
    else:
        mode = lowering.args(node)["rounding_mode"]
    if mode is None:
        return lower_div(lowering, node)
    name = "floordiv" if mode == "floor" else "truncdiv"
    return elementwise(lowering, node, node.args[:2], Kind.DEFAULT, lambda x, y: op(name, x, y))


@register_lowering(
    aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar
)
def lower_where(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    cond, x, y = node.args[:3]
    compute, _ = promote(lowering, [x, y], Kind.NO_OPMATH)
    val = lowering.out_val(node)
    size = lowering.out_size(node)
    fc = operand(lowering, cond, torch.bool, size)
    fx_, fy = operand(lowering, x, compute, size), operand(lowering, y, compute, size)

    def load(index: Index) -> Node:
        return cast(Where(fc(index), fx_(index), fy(index)), val.dtype)

    return LazyTensor(val.device, val.dtype, size, load)


@register_lowering(
    aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_min.Tensor,
    aten.clamp_max.default, aten.clamp_max.Tensor,
)  # fmt: skip
def lower_clamp(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    name = str(node.target._schema.name).split("::")[-1]  # type: ignore[union-attr]  # an OpOverload
    lo = a.get("min") if name != "clamp_max" else None
    hi = a.get("max") if name != "clamp_min" else None
    args = [a["self"], lo, hi]
    present = [x for x in args if x is not None]

    def clamp(x: Node, *bounds: Node) -> Node:
        rest = list(bounds)
        if lo is not None:
            x = op("maximum", x, rest.pop(0))
        if hi is not None:
            x = op("minimum", x, rest.pop(0))
        return x

    return elementwise(lowering, node, present, Kind.DEFAULT, clamp)


@register_lowering(
    aten._to_copy.default, aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
    aten.detach.default, aten._conj.default, aten.resolve_conj.default,
    aten.resolve_neg.default, aten.positive.default, aten.contiguous.default,
    prims.convert_element_type.default,
)  # fmt: skip
def lower_copy(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    """Copies and casts: the same elements, as the node's dtype (C-style conversion)."""
    val = lowering.out_val(node)
    source = lowering.tensor(node.args[0])
    load = broadcast_loader(source, lowering.out_size(node))
    return LazyTensor(
        val.device, val.dtype, source.size, lambda index: cast(load(index), val.dtype)
    )


@register_lowering(aten.copy.default)
def lower_functional_copy(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    val = lowering.out_val(node)
    load = broadcast_loader(lowering.tensor(node.args[1]), lowering.out_size(node))
    return LazyTensor(
        val.device, val.dtype, lowering.out_size(node), lambda i: cast(load(i), val.dtype)
    )


@register_lowering(aten.copy_.default)
def lower_copy_(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    """AOTAutograd's epilogue for a mutated input: write the new value into it."""
    return lowering.mutate(node.args[0], lowering.tensor(node.args[1]))


@register_lowering(aten.round.decimals)
def lower_round_decimals(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    decimals = int(lowering.args(node)["decimals"])
    scale = 10.0 ** abs(decimals)

    def round_to(x: Node) -> Node:
        if decimals >= 0:
            return op("truediv", op("round", op("mul", x, c(scale, x))), c(scale, x))
        return op("mul", op("round", op("truediv", x, c(scale, x))), c(scale, x))

    return elementwise(lowering, node, node.args[:1], Kind.DEFAULT, round_to)


@register_lowering(aten.polygamma.default)
def lower_polygamma(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    n, x = node.args[:2]
    if not isinstance(n, int):
        raise NotLowerable("symbolic polygamma order")
    order = Const(n, torch.int64)
    return elementwise(lowering, node, [x], Kind.INT_TO_FLOAT, lambda v: op("polygamma", order, v))


def _register_polynomials() -> None:
    names = [
        "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
        "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
        "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
        "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
        "laguerre_polynomial_l", "legendre_polynomial_p",
    ]  # fmt: skip
    for name in names:
        packet = getattr(aten, f"special_{name}")

        def lower(
            lowering: GraphLowering, node: torch.fx.Node, ir: str = f"special_{name}"
        ) -> LazyTensor:
            return elementwise(
                lowering, node, node.args[:2], Kind.INT_TO_FLOAT, lambda x, n: op(ir, x, n)
            )

        register_lowering(*(getattr(packet, o) for o in packet.overloads() if "out" not in o))(
            lower
        )


_register_polynomials()


@register_lowering(aten.ldexp.Tensor)
def lower_ldexp(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return elementwise(
        lowering, node, node.args[:2], Kind.INT_TO_FLOAT, lambda x, e: op("mul", x, op("exp2", e))
    )


@register_lowering(aten.angle.default)
def lower_angle(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    """The argument of a real number: pi below zero, 0 otherwise, NaN kept."""

    def angle(x: Node) -> Node:
        turned = Where(op("lt", x, c(0, x)), c(math.pi, x), c(0, x))
        return Where(op("isnan", x), x, turned)

    return elementwise(lowering, node, node.args[:1], Kind.INT_TO_FLOAT, angle)


# -- activations ----------------------------------------------------------------------


@register_lowering(aten.gelu.default)
def lower_gelu(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    approximate = lowering.args(node)["approximate"]

    def gelu(x: Node) -> Node:
        half_x = op("mul", x, c(0.5, x))
        if approximate == "tanh":
            cube = op("mul", op("mul", x, x), x)
            inner = op(
                "mul", c(math.sqrt(2 / math.pi), x), op("add", x, op("mul", c(0.044715, x), cube))
            )
            return op("mul", half_x, op("add", c(1, x), op("tanh", inner)))
        return op("mul", half_x, op("add", c(1, x), op("erf", op("mul", x, c(math.sqrt(0.5), x)))))

    return elementwise(lowering, node, node.args[:1], Kind.DEFAULT, gelu)


@register_lowering(aten.leaky_relu.default)
def lower_leaky_relu(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    slope = float(lowering.args(node)["negative_slope"])
    return elementwise(
        lowering, node, node.args[:1], Kind.DEFAULT,
        lambda x: Where(op("gt", x, c(0, x)), x, op("mul", x, c(slope, x))),
    )  # fmt: skip


@register_lowering(aten.elu.default)
def lower_elu(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    alpha, scale, in_scale = float(a["alpha"]), float(a["scale"]), float(a["input_scale"])

    def elu(x: Node) -> Node:
        neg = op("mul", c(alpha, x), op("expm1", op("mul", x, c(in_scale, x))))
        return op("mul", Where(op("gt", x, c(0, x)), x, neg), c(scale, x))

    return elementwise(lowering, node, node.args[:1], Kind.DEFAULT, elu)


@register_lowering(aten.hardtanh.default)
def lower_hardtanh(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    lo, hi = a["min_val"], a["max_val"]
    return elementwise(
        lowering, node, [a["self"], lo, hi], Kind.DEFAULT,
        lambda x, low, high: op("minimum", op("maximum", x, low), high),
    )  # fmt: skip


@register_lowering(aten.silu.default)
def lower_silu(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    return elementwise(
        lowering, node, node.args[:1], Kind.INT_TO_FLOAT, lambda x: op("mul", x, op("sigmoid", x))
    )


@register_lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lower_lerp(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    def lerp(start: Node, end: Node, weight: Node) -> Node:
        diff = op("sub", end, start)
        low = op("add", start, op("mul", weight, diff))
        high = op("sub", end, op("mul", diff, op("sub", c(1, weight), weight)))
        return Where(op("lt", op("abs", weight), c(0.5, weight)), low, high)

    return elementwise(lowering, node, node.args[:3], Kind.DEFAULT, lerp)


def _frexp(x: Node) -> tuple[Node, Node]:
    """Mantissa (0.5 <= |m| < 1) and exponent of a float node, both in its dtype,
    from log2 and exact scalings by powers of two. The exponent from log2 can be one
    off next to a power of two (log2 rounds), so one step each way fixes it. The
    scaling is two halves, so that neither power overflows for a subnormal `x`. Zero,
    infinities and NaN give `(x, 0)`, as eager does."""
    ax = op("abs", x)
    special = op("logical_or", op("eq", x, c(0, x)), op("logical_not", op("isfinite", x)))
    safe = Where(special, c(1.0, x), ax)  # log2 of 0 or inf is no exponent
    e = op("add", op("floor", op("log2", safe)), c(1, x))
    half = op("floor", op("mul", e, c(0.5, x)))
    m = op("mul", op("mul", x, op("exp2", op("neg", half))), op("exp2", op("sub", half, e)))
    big = op("ge", op("abs", m), c(1, m))
    m = Where(big, op("mul", m, c(0.5, m)), m)
    e = Where(big, op("add", e, c(1, e)), e)
    small = op("lt", op("abs", m), c(0.5, m))
    m = Where(small, op("mul", m, c(2, m)), m)
    e = Where(small, op("sub", e, c(1, e)), e)
    return Where(special, x, m), Where(special, c(0, e), e)


@register_lowering(aten.frexp.Tensor)
def lower_frexp(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, LazyTensor]:
    x = lowering.tensor(node.args[0])
    if not x.dtype.is_floating_point:
        raise NotLowerable("frexp of an integer tensor")  # eager raises
    compute = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    load = x.loader

    def part(k: int, dtype: torch.dtype) -> LazyTensor:
        return LazyTensor(
            x.device, dtype, x.size, lambda i: cast(_frexp(cast(load(i), compute))[k], dtype)
        )

    return part(0, x.dtype), part(1, torch.int32)
