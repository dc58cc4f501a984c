"""Random numbers: a counter-based generator, and the lowerings that use it
(rand, randn, their _like variants, bernoulli, native_dropout).

The contract, which every codegen reproduces bit for bit:

- A program that draws random numbers has an int64 scalar input named by
  `Program.rng_seed` (the caller draws it, from torch's default generator in the
  interpreter, so `torch.manual_seed` makes runs repeatable). Each random op reserves
  a range of the program's stream at lowering time: `Rand.offset` is where its range
  starts and `Rand.index` is the element's linear (row-major) index, so the counter of
  an element is `offset + index`.
- `bits(seed, counter)`: with `mix(x)` the 32-bit integer hash
  `x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16`
  (all mod 2**32), and lo/hi the low and high 32 bits:
  `h = mix(lo(counter) ^ lo(seed)); bits = mix(h ^ hi(counter) ^ mix(hi(seed) ^ 0x9e3779b9))`.
- uniform = `(bits >> 8) * 2**-24` as float32, in [0, 1).
- normal = `sqrt(-2 log(1 - u1)) * cos(2 pi u2)` in float32, with u1, u2 the uniforms of
  counters `2 * counter` and `2 * counter + 1` (Box-Muller).

The values are not torch's (torch's Philox streams depend on its generator state), but
they are uniform or normal, and the same for the same seed on every backend.
"""

from __future__ import annotations

import math
from typing import Any

import sympy
import torch
import torch.fx

from ember.ir.expr import Node, Rand, Where
from ember.ir.layout import contiguous_strides
from ember.ir.lowering import GraphLowering, NotLowerable, register_lowering
from ember.ir.pointwise import c, op
from ember.ir.symbolic import product, simplify_index
from ember.ir.tensor import Index, LazyTensor, broadcast_loader, cast, const

aten = torch.ops.aten

_MASK = 0xFFFFFFFF


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    # x * constant mod 2**32 without overflowing int64: split the constant in halves
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def random_bits(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """32 random bits (in an int64 tensor) per counter."""
    h = _mix((counter & _MASK) ^ (seed & _MASK))
    key = _mix(((seed >> 32) & _MASK) ^ 0x9E3779B9)
    return _mix(h ^ ((counter >> 32) & _MASK) ^ key)


def uniform(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    return (random_bits(seed, counter) >> 8).to(torch.float32) * (2.0**-24)


def normal(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    u1 = uniform(seed, counter * 2)
    u2 = uniform(seed, counter * 2 + 1)
    return torch.sqrt(-2.0 * torch.log1p(-u1)) * torch.cos((2.0 * math.pi) * u2)


def draw(
    lowering: GraphLowering, size: tuple[sympy.Expr, ...], distribution: str, device: torch.device
) -> LazyTensor:
    """A fresh float32 tensor of random numbers from the program's stream."""
    seed = lowering.seed_buffer()
    offset = lowering.rng_offset(product(size))
    strides = contiguous_strides(size)

    def load(index: Index) -> Node:
        linear = sum((i * s for i, s in zip(index, strides, strict=True)), sympy.Integer(0))
        return Rand(seed, offset, simplify_index(sympy.sympify(linear)), distribution)

    return LazyTensor(device, torch.float32, size, load)


def _random(distribution: str) -> Any:
    def lower(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
        a = lowering.args(node)
        if a.get("generator") is not None:
            raise NotLowerable("an explicit generator")
        val = lowering.out_val(node)
        if not val.dtype.is_floating_point:
            raise NotLowerable("random integers")
        drawn = draw(lowering, lowering.out_size(node), distribution, val.device)
        load = drawn.loader
        return LazyTensor(
            val.device, val.dtype, drawn.size, lambda index: cast(load(index), val.dtype)
        )

    return lower


register_lowering(aten.rand.default, aten.rand_like.default)(_random("uniform"))
register_lowering(aten.randn.default, aten.randn_like.default)(_random("normal"))


@register_lowering(aten.bernoulli.default, aten.bernoulli.p)
def lower_bernoulli(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    if a.get("generator") is not None:
        raise NotLowerable("an explicit generator")
    source = lowering.tensor(a["self"])
    val = lowering.out_val(node)
    drawn = draw(lowering, source.size, "uniform", val.device).loader
    prob = a.get("p")

    def load(index: Index) -> Node:
        p = (
            cast(source.loader(index), torch.float32)
            if prob is None
            else c(float(prob), drawn(index))
        )
        return cast(op("lt", drawn(index), p), val.dtype)

    return LazyTensor(val.device, val.dtype, source.size, load)


@register_lowering(aten.native_dropout.default)
def lower_dropout(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, LazyTensor]:
    """Keep each element with probability 1 - p and scale kept ones by 1 / (1 - p)."""
    source = lowering.tensor(node.args[0])
    p = float(node.args[1])  # type: ignore[arg-type]  # a float
    train = node.args[2]
    if train is False:
        raise NotLowerable("dropout in eval mode is the identity (decomposed upstream)")
    drawn = draw(lowering, source.size, "uniform", source.device).loader
    keep_prob = 1.0 - p

    def keep(index: Index) -> Node:
        u = drawn(index)
        return op("lt", u, c(keep_prob, u))

    def out(index: Index) -> Node:
        x = source.loader(index)
        compute = torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype
        xf = cast(x, compute)
        scale = c(0.0 if keep_prob == 0 else 1.0 / keep_prob, xf)
        return cast(Where(keep(index), op("mul", xf, scale), c(0, xf)), x.dtype)

    mask = LazyTensor(source.device, torch.bool, source.size, keep)
    return LazyTensor(source.device, source.dtype, source.size, out), mask


def _transformed(
    lowering: GraphLowering, node: torch.fx.Node, distribution: str, transform: Any
) -> LazyTensor:
    """Random numbers from `distribution`, mapped through `transform(x, args)`."""
    a = lowering.args(node)
    if a.get("generator") is not None:
        raise NotLowerable("an explicit generator")
    val = lowering.out_val(node)
    size = lowering.out_size(node)
    drawn = draw(lowering, size, distribution, val.device).loader
    compute = torch.float64 if val.dtype == torch.float64 else torch.float32
    return LazyTensor(
        val.device,
        val.dtype,
        size,
        lambda index: cast(transform(cast(drawn(index), compute), a), val.dtype),
    )


def _arg(a: dict[str, Any], name: str, like: Node, default: float = 0.0) -> Node:
    value = a.get(name)
    return c(float(default if value is None else value), like)


def _uniform(x: Node, a: dict[str, Any]) -> Node:
    low, high = _arg(a, "from", x), _arg(a, "to", x, 1.0)
    return op("add", op("mul", x, op("sub", high, low)), low)


def _normal(x: Node, a: dict[str, Any]) -> Node:
    return op("add", op("mul", x, _arg(a, "std", x, 1.0)), _arg(a, "mean", x))


def _exponential(u: Node, a: dict[str, Any]) -> Node:
    return op("truediv", op("neg", op("log1p", op("neg", u))), _arg(a, "lambd", u, 1.0))


def _cauchy(u: Node, a: dict[str, Any]) -> Node:
    angle = op("mul", op("sub", u, c(0.5, u)), c(math.pi, u))
    return op("add", _arg(a, "median", u), op("mul", _arg(a, "sigma", u, 1.0), op("tan", angle)))


def _log_normal(x: Node, a: dict[str, Any]) -> Node:
    return op("exp", op("add", _arg(a, "mean", x, 1.0), op("mul", x, _arg(a, "std", x, 2.0))))


def _geometric(u: Node, a: dict[str, Any]) -> Node:
    p = _arg(a, "p", u, 0.5)
    return op("ceil", op("truediv", op("log1p", op("neg", u)), op("log1p", op("neg", p))))


def _register_transform(
    ops: tuple[torch._ops.OpOverload, ...], distribution: str, transform: Any
) -> None:
    def lower(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
        return _transformed(lowering, node, distribution, transform)

    register_lowering(*ops)(lower)


for _ops, _dist, _fn in (
    ((aten.uniform.default,), "uniform", _uniform),
    ((aten.normal_functional.default, aten.normal.float_float), "normal", _normal),
    ((aten.exponential.default,), "uniform", _exponential),
    ((aten.cauchy.default,), "uniform", _cauchy),
    ((aten.log_normal.default,), "normal", _log_normal),
    ((aten.geometric.default,), "uniform", _geometric),
):
    _register_transform(_ops, _dist, _fn)


@register_lowering(
    aten.randint.default, aten.randint.low, aten.randint_like.default, aten.randint_like.low_dtype
)
def lower_randint(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    low, high = a.get("low") or 0, a["high"]
    if not isinstance(low, int) or not isinstance(high, int):
        raise NotLowerable("symbolic or tensor randint bounds")

    def pick(u: Node, _: dict[str, Any]) -> Node:
        scaled = op(
            "floor", op("mul", cast(u, torch.float64), const(float(high - low), torch.float64))
        )
        return op("add", scaled, const(float(low), torch.float64))

    return _transformed(lowering, node, "uniform", pick)


def _constant_loader(value: float) -> Any:
    node = const(value, torch.float32)
    return lambda index: node


@register_lowering(aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor)
def lower_normal_tensors(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    val = lowering.out_val(node)
    size = lowering.out_size(node)
    drawn = draw(lowering, size, "normal", val.device).loader
    parts = {}
    for name in ("mean", "std"):
        arg = a[name]
        if isinstance(arg, torch.fx.Node):
            parts[name] = broadcast_loader(lowering.tensor(arg), size)
        else:
            parts[name] = _constant_loader(float(arg))

    def load(index: Index) -> Node:
        n = drawn(index)
        mean = cast(parts["mean"](index), torch.float32)
        std = cast(parts["std"](index), torch.float32)
        return cast(op("add", op("mul", n, std), mean), val.dtype)

    return LazyTensor(val.device, val.dtype, size, load)
