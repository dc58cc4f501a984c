"""Lowerings of pointwise ATen ops: math, comparisons, casts, where, clamp, activations.

Type promotion is PyTorch's own (`torch._prims_common.elementwise_dtypes`, one rule
kind per op, cached per signature): each operand is cast to the op's computation dtype
(float32 for bfloat16/float16 operands, as eager computes them), the op runs, and the
result is cast to the result dtype. Operands broadcast as in PyTorch: right-aligned,
size-1 dimensions read index 0. A Python or symbolic scalar operand is a constant (or
an `IndexExpr`) of the computation dtype.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes

from ember.ir.expr import Const, Node, Op, Where, size_value
from ember.ir.lowering import GraphLowering, NotLowerable, register_lowering
from ember.ir.ops import BOOL_RESULT
from ember.ir.tensor import Index, LazyTensor, broadcast_loader, cast, const

aten = torch.ops.aten

Operand = Callable[[Index], Node]


@functools.lru_cache(maxsize=4096)
def _promote(signature: tuple[Any, ...], kind: Kind) -> tuple[torch.dtype, torch.dtype]:
    args: list[Any] = []
    for item in signature:
        if isinstance(item, tuple):  # (dtype, is_zero_dim) of a tensor operand
            dtype, zero_dim = item
            args.append(torch.empty(() if zero_dim else (1,), dtype=dtype, device="meta"))
        else:
            args.append(item(1))  # a Python scalar of that type
    return elementwise_dtypes(*args, type_promotion_kind=kind)


def promote(
    lowering: GraphLowering, args: Sequence[Any], kind: Kind
) -> tuple[torch.dtype, torch.dtype]:
    """(computation dtype, result dtype) of a pointwise op on `args` (FX arguments)."""
    signature: list[Any] = []
    for a in args:
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            if isinstance(val, torch.Tensor):
                signature.append((val.dtype, val.ndim == 0))
            elif isinstance(val, (torch.SymInt, int)):
                signature.append(int)
            elif isinstance(val, (torch.SymFloat, float)):
                signature.append(float)
            elif isinstance(val, (torch.SymBool, bool)):
                signature.append(bool)
            else:
                raise NotLowerable(f"operand {a.name} of type {type(val).__name__}")
        elif isinstance(a, (bool, int, float)):
            signature.append(type(a))
        elif a is not None:
            raise NotLowerable(f"operand of type {type(a).__name__}")
    return _promote(tuple(signature), kind)


def operand(
    lowering: GraphLowering, arg: Any, dtype: torch.dtype, size: tuple[sympy.Expr, ...]
) -> Operand:
    """A loader for one operand, broadcast to `size` and cast to `dtype`."""
    if isinstance(arg, torch.fx.Node) and isinstance(arg.meta.get("val"), torch.Tensor):
        load = broadcast_loader(lowering.tensor(arg), size)
        return lambda index: cast(load(index), dtype)
    if isinstance(arg, torch.fx.Node):
        arg = lowering.env[arg]
    if isinstance(arg, (bool, int, float)):
        c = const(arg, dtype)
        return lambda index: c
    if isinstance(arg, sympy.Expr):
        if isinstance(arg, sympy.Integer | sympy.Float) or arg in (sympy.true, sympy.false):
            value: Any = bool(arg) if arg in (sympy.true, sympy.false) else arg
            c = const(int(value) if isinstance(value, sympy.Integer) else float(value), dtype)
            return lambda index: c
        node = cast(size_value(arg), dtype)
        return lambda index: node
    raise NotLowerable(f"operand of type {type(arg).__name__}")


def elementwise(
    lowering: GraphLowering,
    node: torch.fx.Node,
    args: Sequence[Any],
    kind: Kind,
    compute: Callable[..., Node],
) -> LazyTensor:
    """The lazy result of `compute(*operands)` applied pointwise, with promotion."""
    compute_dtype, result_dtype = promote(lowering, args, kind)
    val = lowering.out_val(node)
    size = lowering.out_size(node)
    loads = [operand(lowering, a, compute_dtype, size) for a in args]

    def load(index: Index) -> Node:
        return cast(compute(*(f(index) for f in loads)), val.dtype)

    del result_dtype  # the node's meta value has it, symbolic cases included
    return LazyTensor(val.device, val.dtype, size, load)


def op(name: str, *args: Node) -> Node:
    """An `Op` node (result dtype per the ops protocol).

    `pow(x, 2)` becomes `mul(x, x)`: the same value (the square is exact before
    rounding either way) at a fraction of the cost of a general power on every
    device, and the norms (RMS norm, variance) are full of it. `pow(x, 3)` becomes
    `mul(mul(x, x), x)`, which is what eager computes for that exponent on the CPU
    and on CUDA (ATen's scalar-exponent kernels), so the values are eager's: a
    general power there is a scalar libm call per element that keeps a C++ loop
    from vectorising (GPT-2's tanh GELU, `0.044715 * x**3`, ran at 10 ns an element
    on one CPU core)."""
    if name == "pow" and isinstance(args[1], Const) and args[1].value in (2, 3):
        x = args[0]
        square = Op("mul", (x, x), x.dtype)
        return square if args[1].value == 2 else Op("mul", (square, x), x.dtype)
    dtype = torch.bool if name in BOOL_RESULT else args[-1].dtype
    return Op(name, tuple(args), dtype)


def c(value: float | int | bool, like: Node) -> Node:
    return const(value, like.dtype)


# -- the table -----------------------------------------------------------------------

_UNARY: dict[str, Kind] = {
    **dict.fromkeys(
        ["neg", "sign", "floor", "ceil", "trunc", "round", "frac", "bitwise_not", "relu"],
        Kind.DEFAULT,
    ),
    "abs": Kind.COMPLEX_TO_FLOAT,
    **dict.fromkeys(
        [
            "exp",
            "exp2",
            "expm1",
            "log",
            "log2",
            "log10",
            "log1p",
            "sqrt",
            "rsqrt",
            "reciprocal",
            "sin",
            "cos",
            "tan",
            "asin",
            "acos",
            "atan",
            "sinh",
            "cosh",
            "tanh",
            "asinh",
            "acosh",
            "atanh",
            "sigmoid",
            "erf",
            "erfc",
            "erfinv",
            "lgamma",
            "digamma",
            "i0",
            "special_i0e",
            "special_i1",
            "special_i1e",
            "special_ndtri",
            "special_erfcx",
            "special_airy_ai",
            "special_bessel_j0",
            "special_bessel_j1",
            "special_bessel_y0",
            "special_bessel_y1",
            "special_modified_bessel_i0",
            "special_modified_bessel_i1",
            "special_modified_bessel_k0",
            "special_modified_bessel_k1",
            "special_scaled_modified_bessel_k0",
            "special_scaled_modified_bessel_k1",
            "special_spherical_bessel_j0",
        ],
        Kind.INT_TO_FLOAT,
    ),
    **dict.fromkeys(["isnan", "isinf", "isfinite", "signbit", "logical_not"], Kind.ALWAYS_BOOL),
}

_BINARY: dict[str, tuple[str, Kind]] = {
    **{
        n: (n, Kind.DEFAULT)
        for n in ["mul", "maximum", "minimum", "fmax", "fmin", "remainder", "fmod"]
    },
    **{n: (n, Kind.DEFAULT) for n in ["bitwise_and", "bitwise_or", "bitwise_xor"]},
    "bitwise_left_shift": ("bitwise_left_shift", Kind.DEFAULT),
    "bitwise_right_shift": ("bitwise_right_shift", Kind.DEFAULT),
    **{n: (n, Kind.INT_TO_FLOAT) for n in ["atan2", "hypot", "nextafter", "igamma", "igammac"]},
    "copysign": ("copysign", Kind.INT_TO_FLOAT),
    "special_zeta": ("special_zeta", Kind.INT_TO_FLOAT),
    **{n: (n, Kind.ALWAYS_BOOL) for n in ["eq", "ne", "lt", "le", "gt", "ge"]},
    **{n: (n, Kind.ALWAYS_BOOL) for n in ["logical_and", "logical_or", "logical_xor"]},
    "pow": ("pow", Kind.BOOL_TO_LONG),
    "xlogy": ("xlogy", Kind.INT_TO_FLOAT),
}


def _overloads(name: str) -> list[torch._ops.OpOverload]:
    packet = getattr(aten, name, None)
    if packet is None:
        return []
    wanted = (
        "default",
        "Tensor",
        "Scalar",
        "Tensor_Tensor",
        "Tensor_Scalar",
        "Scalar_Tensor",
        "self",
        "Self",
    )
    return [getattr(packet, o) for o in packet.overloads() if o in wanted]


def _register_unary(name: str, kind: Kind) -> None:
    def lower(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
        if name == "relu":
            return elementwise(lowering, node, node.args[:1], kind, _relu)
        return elementwise(lowering, node, node.args[:1], kind, lambda x: op(name, x))

    register_lowering(*_overloads(name))(lower)


def _relu(x: Node) -> Node:
    return Where(op("lt", x, c(0, x)), c(0, x), x) if x.dtype != torch.bool else x


def _register_binary(aten_name: str, ir_name: str, kind: Kind) -> None:
    def lower(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
        if ir_name == "xlogy":
            return elementwise(lowering, node, node.args[:2], kind, _xlogy)
        return elementwise(lowering, node, node.args[:2], kind, lambda a, b: op(ir_name, a, b))

    register_lowering(*_overloads(aten_name))(lower)


def _xlogy(x: Node, y: Node) -> Node:
    value = Where(op("eq", x, c(0, x)), c(0, x), op("mul", x, op("log", y)))
    return Where(op("isnan", y), y, value)


for _name, _kind in _UNARY.items():
    _register_unary(_name, _kind)
for _name, (_ir, _kind) in _BINARY.items():
    _register_binary(_name, _ir, _kind)
