"""Lowering of `pdist`: the p-norm distances between the rows of an [n, m] matrix,
for every pair i < j in row-major order (k = 0 is (0, 1), then (0, 2), ...).

Output k's pair comes from k itself: row i starts at s(i) = i * (2n - i - 1) / 2, so
i is the largest row with s(i) <= k. The float64 root of s(i) = k gives it to within
one (rounding near a row's start), and two integer comparisons with s(i) and s(i + 1)
make it exact; then j = k - s(i) + i + 1. Each output is a reduction over the m
columns of |x[i] - x[j]| reduced as eager's kernel does for its p: the sum of squares
and a square root (2), the sum (1), the maximum (inf), the count of nonzero
differences (0), otherwise the sum of |d|^p to the power 1/p.
"""

from __future__ import annotations

import math

import sympy
import torch
import torch.fx

from ember.ir.expr import IndexExpr, Node, Where
from ember.ir.indexing import gather_from, indirect_load
from ember.ir.lowering import GraphLowering, NotLowerable, register_lowering
from ember.ir.pointwise import c, op
from ember.ir.reduction import acc_dtype, reduce
from ember.ir.tensor import Index, LazyTensor, cast

aten = torch.ops.aten


def _row_start(i: Node, n: int) -> Node:
    """s(i) = i * (2n - i - 1) / 2, the first output of row i (int64)."""
    twice = op("mul", i, op("sub", c(2 * n - 1, i), i))
    return op("floordiv", twice, c(2, twice))


def _pair(k: Node, n: int) -> tuple[Node, Node]:
    """The rows (i, j) of output k (int64 nodes)."""
    real = cast(k, torch.float64)
    b = c(2.0 * n - 1.0, real)
    disc = op("sub", op("mul", b, b), op("mul", c(8.0, real), real))
    root = op("sqrt", op("maximum", disc, c(0.0, disc)))
    guess = cast(op("floor", op("mul", op("sub", b, root), c(0.5, root))), torch.int64)
    guess = op("minimum", op("maximum", guess, c(0, guess)), c(max(n - 2, 0), guess))
    # the root is within one of the row: step up or down where it missed
    up = op("add", guess, c(1, guess))
    i = Where(op("le", _row_start(up, n), k), up, guess)
    i = Where(op("gt", _row_start(i, n), k), op("sub", i, c(1, i)), i)
    j = op("add", op("add", op("sub", k, _row_start(i, n)), i), c(1, i))
    return i, j


@register_lowering(aten._pdist_forward.default)
def lower_pdist(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    source = lowering.tensor(a["self"])
    if source.ndim != 2 or not all(isinstance(s, sympy.Integer) for s in source.size):
        raise NotLowerable("pdist of a matrix with symbolic sizes")
    n, m = (int(s) for s in source.size)
    p = float(a["p"])
    name, layout = gather_from(lowering, a["self"])
    dtype = acc_dtype(layout.dtype)
    pairs = sympy.Integer(n * (n - 1) // 2)

    def term(index: Index) -> Node:
        k, r = IndexExpr(index[0]), index[1]
        i, j = _pair(k, n)
        left = cast(indirect_load(name, layout, [i, r]), dtype)
        right = cast(indirect_load(name, layout, [j, r]), dtype)
        d = op("abs", op("sub", left, right))
        if p == 0:
            return cast(op("ne", d, c(0.0, d)), dtype)
        if p == 1 or math.isinf(p):
            return d
        if p == 2:
            return op("mul", d, d)
        return op("pow", d, c(p, d))

    terms = LazyTensor(source.device, dtype, (pairs, sympy.Integer(m)), term)
    total = reduce(lowering, terms, [1], "max" if math.isinf(p) else "sum", dtype)

    def finish(index: Index) -> Node:
        value = total.loader(index)
        if p == 2:
            value = op("sqrt", value)
        elif p not in (0, 1) and not math.isinf(p):
            value = op("pow", value, c(1.0 / p, value))
        return cast(value, layout.dtype)

    return LazyTensor(source.device, layout.dtype, (pairs,), finish)
