"""Evaluating loop nodes with plain torch ops: the body interpreter.

A loop node's iteration space becomes index grids (`torch.arange` per loop variable,
shaped to broadcast against each other); each body node is evaluated once over the
whole grid (memoised, so shared subexpressions cost once), index expressions included.
Loads gather from the flat storage of the buffer they name, masked loads never touch
memory where the mask is off, index checks raise `IndexOutOfBounds` as eager would,
and every `Op` runs as the torch function of the same name in the node's dtype
(integer division by zero raises, as torch on the CPU does). ember.ir.interpreter
drives it for whole programs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sympy
import torch
from torch.utils._sympy.functions import (
    FloatTrueDiv,
    FloorDiv,
    IntTrueDiv,
    ModularIndexing,
    PythonMod,
    ToFloat,
)

from ember.ir.errors import IndexOutOfBounds, index_error_message
from ember.ir.expr import (
    Cast,
    CheckIndex,
    Const,
    IndexExpr,
    Load,
    Node,
    Op,
    Rand,
    Where,
    float_valued,
    walk,
)
from ember.ir.loops import Pointwise, Scan, Scatter, Sort
from ember.ir.nodes import ComputedBuffer
from ember.ir.random import normal, uniform
from ember.ir.symbolic import evaluate, index_var, indirect_var

Value = torch.Tensor | int | float


def _special(name: str) -> Callable[..., torch.Tensor]:
    return getattr(torch.special, name.removeprefix("special_"))  # type: ignore[no-any-return]  # torch.special functions


# How the interpreter runs each op of the ops protocol (ember.ir.ops.OpsHandler).
TORCH_OPS: dict[str, Callable[..., torch.Tensor]] = {
    "neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "floor": torch.floor,
    "ceil": torch.ceil, "trunc": torch.trunc, "round": torch.round, "frac": torch.frac,
    "bitwise_not": torch.bitwise_not, "relu": torch.relu, "square": torch.square,
    "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log,
    "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan,
    "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh,
    "acosh": torch.acosh, "atanh": torch.atanh, "sigmoid": torch.sigmoid, "erf": torch.erf,
    "erfc": torch.erfc, "erfinv": torch.erfinv, "lgamma": torch.lgamma,
    "digamma": torch.digamma, "i0": torch.i0,
    "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite,
    "signbit": torch.signbit, "logical_not": torch.logical_not,
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "remainder": torch.remainder, "fmod": torch.fmod, "pow": torch.pow, "atan2": torch.atan2,
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "copysign": torch.copysign, "hypot": torch.hypot, "nextafter": torch.nextafter,
    "igamma": torch.igamma, "igammac": torch.igammac,
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or,
    "bitwise_xor": torch.bitwise_xor, "bitwise_left_shift": torch.bitwise_left_shift,
    "bitwise_right_shift": torch.bitwise_right_shift,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or,
    "logical_xor": torch.logical_xor,
    "polygamma": lambda n, x: torch.polygamma(int(n), x),
}  # fmt: skip


def _install_special() -> None:
    from ember.ir.ops import OP_NAMES

    for name in OP_NAMES:
        if name.startswith("special_"):
            TORCH_OPS[name] = _special(name)


_install_special()


class BodyEvaluator:
    """Evaluates bodies over one iteration space of `shape` (ranges, then reduction
    ranges), reading buffers from `env` (name -> tensor)."""

    def __init__(
        self,
        env: Mapping[str, Any],
        bindings: Mapping[sympy.Symbol, int],
        ranges: tuple[int, ...],
        reduction_ranges: tuple[int, ...] = (),
    ) -> None:
        self.env = env
        self.bindings = bindings
        shape = (*ranges, *reduction_ranges)
        self.shape = shape
        self.grid: dict[sympy.Symbol, Value] = {}
        names = [index_var("i", d) for d in range(len(ranges))]
        names += [index_var("r", d) for d in range(len(reduction_ranges))]
        for axis, (var, size) in enumerate(zip(names, shape, strict=True)):
            view = [1] * len(shape)
            view[axis] = size
            self.grid[var] = torch.arange(size, dtype=torch.int64).view(view)
        self.memo: dict[int, torch.Tensor] = {}

    def run(self, root: Node) -> torch.Tensor:
        for node in walk(root):
            if id(node) not in self.memo:
                self.memo[id(node)] = self._node(node)
        return self.memo[id(root)]

    def index(self, expr: sympy.Expr, extra: Mapping[sympy.Symbol, Value] | None = None) -> Value:
        """An index expression over the grid (int64 tensor, or an int if constant)."""
        values = dict(self.grid)
        if extra:
            values.update(extra)
        return _eval_index(sympy.sympify(expr), values, self.bindings)

    def _node(self, node: Node) -> torch.Tensor:
        if isinstance(node, Const):
            return torch.tensor(node.value, dtype=node.dtype)
        if isinstance(node, IndexExpr):
            return torch.as_tensor(self.index(node.expr)).to(node.dtype)
        if isinstance(node, Load):
            return self._load(node)
        if isinstance(node, Op):
            args = [self.memo[id(a)] for a in node.args]
            return TORCH_OPS[node.name](*args).to(node.dtype)
        if isinstance(node, Cast):
            return self.memo[id(node.x)].to(node.to)
        if isinstance(node, Where):
            cond, a, b = (self.memo[id(n)] for n in (node.cond, node.a, node.b))
            return torch.where(cond, a, b)
        if isinstance(node, CheckIndex):
            return self._check_index(node)
        if isinstance(node, Rand):
            seed = torch.as_tensor(self.env[node.seed], dtype=torch.int64)
            counter = torch.as_tensor(self.index(node.index + node.offset), dtype=torch.int64)
            draw = uniform if node.distribution == "uniform" else normal
            return draw(seed, counter).to(node.dtype)
        raise TypeError(f"cannot evaluate {type(node).__name__}")

    def _check_index(self, node: CheckIndex) -> torch.Tensor:
        """The index itself, after raising if any point (where the mask holds) is
        outside the dimension, as eager's indexing ops do."""
        index = self.memo[id(node.index)]
        size = int(self.memo[id(node.size)])
        low = -size if node.wraps else 0
        bad = (index < low) | (index >= size)
        if node.mask is not None:
            bad = bad & self.memo[id(node.mask)]
        if bool(bad.any()):
            value = int(torch.broadcast_to(index, bad.shape)[bad][0])
            raise IndexOutOfBounds(
                index_error_message(node.describe(), node.dim, value, size), index=value, size=size
            )
        return index

    def _load(self, node: Load) -> torch.Tensor:
        flat = storage_of(self.env[node.buffer])
        extra = {
            indirect_var(k): self.memo[id(n)].to(torch.int64) for k, n in enumerate(node.indirect)
        }
        offset = torch.as_tensor(self.index(node.index, extra), dtype=torch.int64)
        if node.mask is None:
            return flat[offset]
        mask = self.memo[id(node.mask)]
        if flat.numel() == 0:
            return torch.full(
                torch.broadcast_shapes(offset.shape, mask.shape),  # type: ignore[no-untyped-call]  # untyped in torch
                node.other,
                dtype=node.dtype,
            )
        offset, mask = torch.broadcast_tensors(offset, mask)  # type: ignore[no-untyped-call]  # untyped in torch
        values = flat[torch.where(mask, offset, 0)]
        return torch.where(mask, values, torch.tensor(node.other, dtype=node.dtype))


def storage_of(tensor: torch.Tensor) -> torch.Tensor:
    """The whole storage of `tensor` as a flat tensor (loads use storage offsets)."""
    count = tensor.untyped_storage().nbytes() // tensor.element_size()
    return tensor.as_strided((count,), (1,), 0)


def _eval_index(
    expr: sympy.Expr, values: Mapping[sympy.Symbol, Value], bindings: Mapping[sympy.Symbol, int]
) -> Value:
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        if expr in values:
            return values[expr]
        return int(bindings[expr])
    if isinstance(expr, sympy.Float):
        return float(expr)
    if not any(s in values for s in expr.free_symbols):
        result = evaluate(expr, bindings)
        return result if isinstance(result, float) else int(result)  # a float size stays one
    args = [_eval_index(a, values, bindings) for a in expr.args]
    if float_valued(expr):  # float64 throughout, as Python computes it (not float32)
        args = [a.double() if isinstance(a, torch.Tensor) else a for a in args]
    if isinstance(expr, (IntTrueDiv, FloatTrueDiv)):
        return torch.as_tensor(args[0], dtype=torch.float64) / args[1]
    if isinstance(expr, ToFloat):
        return torch.as_tensor(args[0], dtype=torch.float64)
    if isinstance(expr, sympy.Add):
        total: Any = 0
        for a in args:
            total = total + a
        return total  # type: ignore[no-any-return]  # ints and tensors
    if isinstance(expr, sympy.Mul):
        result_: Any = 1
        for a in args:
            result_ = result_ * a
        return result_  # type: ignore[no-any-return]  # ints and tensors
    if isinstance(expr, sympy.Pow):
        return args[0] ** args[1]
    if isinstance(expr, FloorDiv):
        return args[0] // args[1]
    if isinstance(expr, ModularIndexing):
        return (args[0] // args[1]) % args[2]
    if isinstance(expr, (sympy.Mod, PythonMod)):
        return args[0] % args[1]
    if isinstance(expr, sympy.Max):
        return _fold(torch.maximum, args)
    if isinstance(expr, sympy.Min):
        return _fold(torch.minimum, args)
    raise NotImplementedError(f"index expression {expr} ({type(expr).__name__})")


def _fold(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], args: list[Value]) -> Value:
    result = torch.as_tensor(args[0])
    for a in args[1:]:
        result = fn(result, torch.as_tensor(a))
    return result


def run_loop(
    buffer: ComputedBuffer, env: Mapping[str, Any], bindings: Mapping[sympy.Symbol, int]
) -> torch.Tensor:
    """The tensor a ComputedBuffer holds after its loop runs (for a mutation, the
    mutated tensor itself, updated in place)."""
    loop = buffer.loop
    layout = buffer.layout
    size = tuple(int(evaluate(s, bindings)) for s in layout.size)
    stride = tuple(int(evaluate(s, bindings)) for s in layout.stride)
    offset = int(evaluate(layout.offset, bindings))
    ranges = tuple(int(evaluate(s, bindings)) for s in loop.ranges)
    if isinstance(loop, Scatter):
        evaluator = BodyEvaluator(env, bindings, ranges)
        values = evaluator.run(loop.body).to(layout.dtype).broadcast_to(ranges)
        for node in loop.indirect:
            evaluator.run(node)
        extra = {
            indirect_var(k): evaluator.memo[id(n)].to(torch.int64)
            for k, n in enumerate(loop.indirect)
        }
        where = torch.as_tensor(evaluator.index(loop.index, extra), dtype=torch.int64).broadcast_to(
            ranges
        )
        assert buffer.mutates is not None
        target = env[buffer.mutates]
        flat = storage_of(target)
        where, values = where.reshape(-1), values.reshape(-1)
        if loop.reduce is None:
            flat.index_put_((where,), values)
        elif loop.reduce == "sum":
            flat.index_put_((where,), values, accumulate=True)
        else:
            mode = {"prod": "prod", "max": "amax", "min": "amin"}[loop.reduce]
            flat.scatter_reduce_(0, where, values, mode, include_self=True)
        return target  # type: ignore[no-any-return]  # env holds tensors
    if isinstance(loop, Scan):
        length = int(evaluate(loop.length, bindings))
        body = BodyEvaluator(env, bindings, ranges, (length,)).run(loop.body)
        body = body.to(loop.body.dtype).broadcast_to((*ranges, length))
        values = scan_values(body, loop.kind).movedim(-1, loop.axis)
    elif isinstance(loop, Sort):
        length = int(evaluate(loop.length, bindings))
        count = int(evaluate(loop.count, bindings))
        body = BodyEvaluator(env, bindings, ranges, (length,)).run(loop.body)
        body = body.to(loop.body.dtype).broadcast_to((*ranges, length))
        found = sort_values(body, loop.descending, count, indices=loop.indices)
        values = found.movedim(-1, loop.axis)
    elif isinstance(loop, Pointwise):
        values = (
            BodyEvaluator(env, bindings, ranges)
            .run(loop.body)
            .to(layout.dtype)
            .broadcast_to(ranges)
        )
    else:
        reduced = tuple(int(evaluate(s, bindings)) for s in loop.reduction_ranges)
        body = BodyEvaluator(env, bindings, ranges, reduced).run(loop.body)
        count = 1
        for r in reduced:
            count *= r
        values = _reduce(body.broadcast_to((*ranges, *reduced)).reshape(*ranges, count), loop.kind)
    if buffer.mutates is not None:
        target = env[buffer.mutates]
        target.as_strided(size, stride, offset).copy_(values.reshape(size).clone())
        return target  # type: ignore[no-any-return]  # env holds tensors
    out = torch.empty_strided(size, stride, dtype=layout.dtype)
    out.copy_(values.reshape(size))
    return out


def scan_values(values: torch.Tensor, kind: str) -> torch.Tensor:
    """The scan `kind` (ember.ir.loops.SCAN_KINDS) of `values` along the last dimension,
    carried in `values`' dtype: torch's own cumulative ops, whose tie and NaN rules
    the scan kinds are defined by."""
    if kind == "sum":
        return torch.cumsum(values, -1, dtype=values.dtype)
    if kind == "prod":
        return torch.cumprod(values, -1, dtype=values.dtype)
    if kind == "logsumexp":
        return torch.logcumsumexp(values, -1)
    if kind in ("max", "argmax"):
        top = torch.cummax(values, -1)
        return top.values if kind == "max" else top.indices
    if kind in ("min", "argmin"):
        bottom = torch.cummin(values, -1)
        return bottom.values if kind == "min" else bottom.indices
    raise ValueError(f"unknown scan {kind!r}")


def sort_values(
    values: torch.Tensor, descending: bool, count: int, *, indices: bool
) -> torch.Tensor:
    """The first `count` values of each row (last dimension) of `values` in the order
    of ember.ir.loops.Sort, or with `indices` the positions they came from: torch's own
    stable sort, whose NaN and tie rules the node is defined by."""
    found = torch.sort(values, dim=-1, descending=descending, stable=True)
    chosen = found.indices if indices else found.values
    return chosen[..., :count]


def _reduce(values: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "sum":
        return values.sum(-1, dtype=values.dtype)
    if kind == "prod":
        return values.prod(-1, dtype=values.dtype)
    if kind == "max":
        return values.amax(-1)
    if kind == "min":
        return values.amin(-1)
    if kind == "argmax":
        return values.argmax(-1)
    if kind == "argmin":
        return values.argmin(-1)
    if kind == "any":
        return values.to(torch.bool).any(-1)
    if kind == "all":
        return values.to(torch.bool).all(-1)
    if kind == "welford":
        mean = values.mean(-1)
        m2 = ((values - mean.unsqueeze(-1)) ** 2).sum(-1)
        return torch.stack([mean, m2], -1)
    raise ValueError(f"unknown reduction {kind!r}")
