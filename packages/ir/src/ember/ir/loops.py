"""Loop nodes: what a computed buffer's loop nest does, with an explicit body.

`Pointwise(ranges, body)` evaluates `body` at every point `(i0, i1, ...)` of `ranges`.
`Reduction(ranges, reduction_ranges, kind, body)` evaluates `body` at every point of
`ranges` x `reduction_ranges` (variables `r0, r1, ...`) and combines along the
reduction ranges. `Scan(ranges, length, axis, kind, body, dtype)` evaluates `body` at
every point of `ranges` x `[length]` (the scanned position is `r0`) and stores, at each
point, the running combination of the body along `r0` up to and including it (cumsum,
cummax...). `Sort(ranges, length, count, axis, descending, indices, body, dtype)`
evaluates `body` along `r0` in `[length]` at every outer point, orders those values
and stores the first `count` of them (or their positions) along the sorted dimension
(sort, argsort, topk). `Scatter(ranges, index, indirect, body, reduce)` stores (or combines)
`body` at storage offset `index` of the buffer it mutates, an index that may depend on
data through `indirect` (scatter, index_put).

Loop nodes have no name and no storage of their own: a `ComputedBuffer`
(ember.ir.nodes) pairs one with the `Layout` it is stored in. They are frozen and
hashable, so the scheduler and the codegens can use them as keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch

from ember.ir.expr import Node

# Reduction kinds. `argmax`/`argmin` give the index of the first extreme element in
# the flattened reduction ranges (NaN counts as the extreme, as in torch). `max`/`min`
# propagate NaN. `welford` computes the mean and the sum of squared deviations in one
# pass (Welford's update) and stores them as a trailing dimension of size 2:
# `[..., 0]` = mean, `[..., 1]` = M2 (variance = M2 / (N - correction)).
REDUCTION_KINDS: frozenset[str] = frozenset(
    {"sum", "prod", "max", "min", "argmax", "argmin", "any", "all", "welford"}
)

# Scan kinds: running sum, product, log(sum(exp)), max and min along one dimension,
# and `argmax`/`argmin`, the position of the running max/min. Their tie rules are
# torch.cummax/cummin's, not those of the reductions of the same name: a new element
# takes over when it is NaN or when the current one is not NaN and the element is >=
# (max) or <= (min) it, so ties go to the LAST occurrence and, once a NaN is seen,
# every later NaN takes over (values: NaN from the first NaN on). `logsumexp` combines
# as torch.logcumsumexp does: log1p(exp(min - max)) + max, except that two equal
# infinities give that infinity; NaN propagates.
SCAN_KINDS: frozenset[str] = frozenset(
    {"sum", "prod", "logsumexp", "max", "min", "argmax", "argmin"}
)

# How a `Scatter` combines the stored value with the one already there
# (None overwrites; with duplicate indices the winner is unspecified, as in torch).
SCATTER_REDUCE: frozenset[str | None] = frozenset({None, "sum", "prod", "max", "min"})


def reduction_dtype(kind: str, body_dtype: torch.dtype) -> torch.dtype:
    """The dtype a reduction stores."""
    if kind in ("argmax", "argmin"):
        return torch.int64
    if kind in ("any", "all"):
        return torch.bool
    return body_dtype


@dataclass(frozen=True)
class Pointwise:
    ranges: tuple[sympy.Expr, ...]
    body: Node

    @property
    def dtype(self) -> torch.dtype:
        return self.body.dtype


@dataclass(frozen=True)
class Reduction:
    """`kind` of the body over `reduction_ranges` (variables `r0, r1, ...`) at every
    point of `ranges` (`i0, i1, ...`). `whole`: the lowering has already cut the work
    into as many outputs as it wants (a segmented scan's segment totals), so the
    scheduler does not split the rows again (ember.scheduler.split)."""

    ranges: tuple[sympy.Expr, ...]
    reduction_ranges: tuple[sympy.Expr, ...]
    kind: str
    body: Node
    whole: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return reduction_dtype(self.kind, self.body.dtype)


@dataclass(frozen=True)
class Scan:
    """A running combination (prefix scan) along one dimension.

    The result has `len(ranges) + 1` dimensions: dimension `axis` is the scanned one,
    of extent `length` (loop variable `r0`), and the others are `ranges` in order
    (variables `i0, i1, ...`). The running value is carried in the body's dtype (the
    accumulation type eager uses: float64 for float32 on the CPU, float32 for the
    half types, int64 for integers) and stored as `dtype`, which is int64 for the
    `argmax`/`argmin` kinds. Work is linear in `length`.
    """

    ranges: tuple[sympy.Expr, ...]
    length: sympy.Expr
    axis: int
    kind: str
    body: Node
    dtype: torch.dtype

    @property
    def result_size(self) -> tuple[sympy.Expr, ...]:
        """The sizes of the result, in its dimension order."""
        return (*self.ranges[: self.axis], self.length, *self.ranges[self.axis :])


@dataclass(frozen=True)
class Sort:
    """The values of a row ordered, or the positions they came from (sort, topk).

    At every outer point (`ranges`, variables `i0, i1, ...`) the body is evaluated at
    `r0 = 0 .. length - 1`; those values are ordered ascending (`descending=False`) or
    descending, and the first `count` of the order are stored along dimension `axis`
    of the result: the values themselves (as `dtype`, the body's), or with
    `indices=True` the `r0` each came from (int64). The order is eager's: NaN is larger
    than every number (last ascending, first descending), -0.0 equals 0.0, and equal
    values keep their input order (the order of a stable sort, which is also one valid
    order for an unstable sort or a topk). So the result is a function of the values
    alone, which lets every codegen and the interpreter agree bit for bit.
    """

    ranges: tuple[sympy.Expr, ...]
    length: sympy.Expr
    count: sympy.Expr  # k of a topk; `length` for a sort
    axis: int
    descending: bool
    indices: bool
    body: Node
    dtype: torch.dtype

    @property
    def result_size(self) -> tuple[sympy.Expr, ...]:
        """The sizes of the result, in its dimension order."""
        return (*self.ranges[: self.axis], self.count, *self.ranges[self.axis :])


@dataclass(frozen=True)
class Scatter:
    ranges: tuple[sympy.Expr, ...]
    index: sympy.Expr
    indirect: tuple[Node, ...]
    body: Node
    reduce: str | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.body.dtype


Loop = Pointwise | Reduction | Scan | Sort | Scatter


def loop_bodies(loop: Loop) -> tuple[Node, ...]:
    """Every body DAG root of a loop node (the scatter's index nodes included)."""
    if isinstance(loop, Scatter):
        return (loop.body, *loop.indirect)
    return (loop.body,)
