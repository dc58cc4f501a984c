"""Loop bodies: an explicit, immutable, hash-consed expression DAG.

A loop node (`Pointwise`, `Reduction`, `Scatter` in ember.ir.loops) computes one value
per point of its iteration space; its body says how, as a DAG of the node types below.
The body is data, not a Python closure, so that it can be printed, hashed into cache
keys, compared in tests, analysed for the memory it reads (every `Load` carries its
index expression) and rendered by any codegen.

Nodes are hash-consed: constructing a node equal to one that exists returns the
existing object, so structural equality is identity (`a == b` is `a is b`) and hashing
is O(1) however deep the DAG. `fingerprint()` gives a hash that is stable across
processes, for cache keys.

Index expressions are sympy over the loop variables (`i0..`, `r0..`), size symbols and,
for indirect accesses, the symbols `ind0..` that stand for `Load.indirect[k]`'s value.
The names of `Op`s are the methods of `ember.ir.ops.OpsHandler`.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

import sympy
import torch
from torch.utils._sympy.functions import (
    FloatPow,
    FloatTrueDiv,
    IntTrueDiv,
    ToFloat,
    TruncToFloat,
)

Scalar = bool | int | float


class _HashConsed(type):
    """Metaclass that interns instances: equal field values give the same object."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        fresh = super().__call__(*args, **kwargs)
        key = (cls, *(_key_part(v) for v in fresh._key()))
        table: weakref.WeakValueDictionary[Any, Any] = cls._interned  # type: ignore[attr-defined]  # set on Node
        try:
            return table[key]
        except KeyError:
            table[key] = fresh
            return fresh


def _key_part(value: Any) -> Any:
    # 0.0 == -0.0 and True == 1 == 1.0 in Python: keep them apart by type and sign.
    if isinstance(value, float):
        return (float, repr(value))
    return (type(value), value)


@dataclass(frozen=True, eq=False)
class Node(metaclass=_HashConsed):
    """Base class of body nodes. Every node has the dtype of the value it computes."""

    _interned: ClassVar[weakref.WeakValueDictionary[Any, Any]] = weakref.WeakValueDictionary()

    def _key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._key())

    @property
    def dtype(self) -> torch.dtype:
        raise NotImplementedError

    def children(self) -> tuple[Node, ...]:
        return ()

    def with_children(self, children: tuple[Node, ...]) -> Node:
        """The same node over new children (in `children()` order)."""
        return self

    def fingerprint(self) -> str:
        """A process-independent hash of the DAG (for cache keys)."""
        from ember.ir.printer import format_body

        return hashlib.sha256(format_body(self).encode()).hexdigest()[:24]


@dataclass(frozen=True, eq=False)
class Const(Node):
    """A scalar constant of a given dtype (`inf` and `nan` allowed)."""

    value: Scalar
    const_dtype: torch.dtype

    @property
    def dtype(self) -> torch.dtype:
        return self.const_dtype


@dataclass(frozen=True, eq=False)
class IndexExpr(Node):
    """The value of an index expression (loop variables, sizes) as an integer, or as a
    float64 where the expression's value is a float (`size_value`)."""

    expr: sympy.Expr
    index_dtype: torch.dtype = torch.int64

    @property
    def dtype(self) -> torch.dtype:
        return self.index_dtype


# torch's sympy functions whose value is a float (a SymFloat's expression)
_FLOAT_FUNCTIONS = (FloatPow, FloatTrueDiv, IntTrueDiv, ToFloat, TruncToFloat)


def float_valued(expr: sympy.Basic) -> bool:
    """Whether the size expression `expr` has a float value: not an integer, and holding
    a true division, a conversion to float or a float constant (batch norm's unbiased
    variance correction `n / (n - 1)` with a symbolic `n`)."""
    if expr.is_integer or expr.is_Boolean:
        return False
    return bool(expr.atoms(sympy.Float)) or expr.has(*_FLOAT_FUNCTIONS)


def size_value(expr: sympy.Expr) -> IndexExpr:
    """The value of the size expression `expr` in a kernel: an int64, or a float64 where
    the value is a float (an int64 would truncate it: `n / (n - 1)` became 1)."""
    return IndexExpr(expr, torch.float64 if float_valued(expr) else torch.int64)


@dataclass(frozen=True, eq=False)
class Load(Node):
    """Element `index` of buffer `buffer`, counted in storage elements.

    `index` is the full storage offset (layout offset and strides applied). With a
    `mask`, lanes where the mask is false do not access memory and read `other`
    (padding, cat, bounds of gathers). With `indirect`, `index` may use the symbols
    `ind0, ind1, ...`, each the (int64) value of `indirect[k]` at this point
    (gather, index, embedding): that is an indirect load.
    """

    buffer: str
    index: sympy.Expr
    load_dtype: torch.dtype
    mask: Node | None = None
    other: Scalar = 0
    indirect: tuple[Node, ...] = ()

    @property
    def dtype(self) -> torch.dtype:
        return self.load_dtype

    def children(self) -> tuple[Node, ...]:
        return (*self.indirect, *((self.mask,) if self.mask is not None else ()))

    def with_children(self, children: tuple[Node, ...]) -> Node:
        count = len(self.indirect)
        mask = children[count] if self.mask is not None else None
        return replace(self, indirect=tuple(children[:count]), mask=mask)


@dataclass(frozen=True, eq=False)
class CheckIndex(Node):
    """The int64 value of `index`, which must lie in `[0, size)` (or `[-size, size)`
    with `wraps`, for ops that count negative indices from the end) wherever `mask`
    holds (everywhere without one); anywhere else the program is in error.

    Lowering wraps every data-dependent index in one of these (unless index checks are
    off), so that an index out of its dimension raises instead of reading or writing
    outside the buffer. The value passes through unchanged: each evaluator decides how
    to fail (the interpreter raises, the C++ kernels record the error and read or
    write nothing, Triton asserts on the device). `size` is an `IndexExpr` child, so
    its size symbols reach kernels as every index's do. `op`, `node` and `dim` name
    what is indexed, for the error message.
    """

    index: Node
    size: Node
    wraps: bool
    op: str
    node: str
    dim: int
    mask: Node | None = None

    @property
    def dtype(self) -> torch.dtype:
        return torch.int64

    @property
    def low(self) -> Node:
        """The smallest valid index: 0, or -size where negative indices wrap."""
        if not self.wraps:
            return Const(0, torch.int64)
        if isinstance(self.size, IndexExpr):
            return IndexExpr(-self.size.expr)
        return Op("neg", (self.size,), torch.int64)

    def children(self) -> tuple[Node, ...]:
        return (self.index, self.size, *((self.mask,) if self.mask is not None else ()))

    def with_children(self, children: tuple[Node, ...]) -> Node:
        mask = children[2] if self.mask is not None else None
        return replace(self, index=children[0], size=children[1], mask=mask)

    def describe(self) -> str:
        """The op and graph node indexed, for error messages."""
        return f"{self.op} (graph node {self.node!r})"


@dataclass(frozen=True, eq=False)
class Op(Node):
    """An op of the ops protocol (`ember.ir.ops.OpsHandler`) applied to `args`."""

    name: str
    args: tuple[Node, ...]
    op_dtype: torch.dtype

    @property
    def dtype(self) -> torch.dtype:
        return self.op_dtype

    def children(self) -> tuple[Node, ...]:
        return self.args

    def with_children(self, children: tuple[Node, ...]) -> Node:
        return replace(self, args=children)


@dataclass(frozen=True, eq=False)
class Cast(Node):
    """`x` converted to `to` (C semantics towards integers: truncation; bool: != 0)."""

    x: Node
    to: torch.dtype

    @property
    def dtype(self) -> torch.dtype:
        return self.to

    def children(self) -> tuple[Node, ...]:
        return (self.x,)

    def with_children(self, children: tuple[Node, ...]) -> Node:
        return Cast(children[0], self.to)


@dataclass(frozen=True, eq=False)
class Where(Node):
    """`a` where `cond` (a bool node) holds, else `b`; `a` and `b` share one dtype."""

    cond: Node
    a: Node
    b: Node

    @property
    def dtype(self) -> torch.dtype:
        return self.a.dtype

    def children(self) -> tuple[Node, ...]:
        return (self.cond, self.a, self.b)

    def with_children(self, children: tuple[Node, ...]) -> Node:
        return Where(*children)


@dataclass(frozen=True, eq=False)
class Rand(Node):
    """A counter-based random number: see ember.ir.random for the exact contract.

    The value depends only on the program's seed (the int64 scalar in buffer `seed`),
    the integer `offset + index` (offset: this op's place in the program's random
    stream; index: the point's linear index) and `distribution` ('uniform' in [0, 1)
    or 'normal'), so every codegen can reproduce it bit for bit.
    """

    seed: str
    offset: sympy.Expr
    index: sympy.Expr
    distribution: str
    rand_dtype: torch.dtype = torch.float32

    @property
    def dtype(self) -> torch.dtype:
        return self.rand_dtype


# Integer ops that divide by their second argument: a zero divisor is an error in eager
# (ZeroDivisionError on the CPU) and a trap on x86.
INTEGER_DIVISIONS = frozenset({"floordiv", "truncdiv", "remainder", "fmod"})


def may_divide_by_zero(node: Node) -> bool:
    """Whether `node` is an integer division whose divisor may be 0 (any divisor but a
    nonzero constant; floating-point division by zero is inf or NaN, as in torch)."""
    if not isinstance(node, Op) or node.name not in INTEGER_DIVISIONS:
        return False
    divisor = node.args[1]
    if divisor.dtype.is_floating_point or divisor.dtype == torch.bool:
        return False
    return not (isinstance(divisor, Const) and divisor.value != 0)


def walk(root: Node) -> Iterator[Node]:
    """Every node of the DAG under `root` once, children before parents."""
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            yield node
            continue
        stack.append((node, True))
        for child in reversed(node.children()):
            if id(child) not in seen:
                stack.append((child, False))


def loads(root: Node) -> list[Load]:
    """The loads of a body, in evaluation order (what the scheduler's dependencies use)."""
    return [n for n in walk(root) if isinstance(n, Load)]


def rands(root: Node) -> list[Rand]:
    return [n for n in walk(root) if isinstance(n, Rand)]


def map_dag(root: Node, rewrite: Callable[[Node], Node]) -> Node:
    """Rebuild the DAG bottom-up, passing each node (children already rebuilt) through
    `rewrite`. Shared subgraphs are rebuilt once."""
    memo: dict[int, Node] = {}
    for node in walk(root):
        kids = node.children()
        new_kids = tuple(memo[id(k)] for k in kids)
        rebuilt = node if new_kids == kids else node.with_children(new_kids)
        memo[id(node)] = rewrite(rebuilt)
    return memo[id(root)]


def replace_index(root: Node, mapping: dict[sympy.Symbol, sympy.Expr]) -> Node:
    """The body with loop variables substituted in every index expression."""
    return map_indices(root, lambda expr: sympy.sympify(expr).xreplace(mapping))


def map_indices(root: Node, rewrite: Callable[[sympy.Expr], sympy.Expr]) -> Node:
    """The body with `rewrite` applied to every index expression (loads, index
    values, random counters)."""

    def substitute(node: Node) -> Node:
        if isinstance(node, Load):
            return replace(node, index=rewrite(node.index))
        if isinstance(node, IndexExpr):
            return replace(node, expr=rewrite(node.expr))
        if isinstance(node, Rand):
            return replace(node, index=rewrite(node.index))
        return node

    return map_dag(root, substitute)
