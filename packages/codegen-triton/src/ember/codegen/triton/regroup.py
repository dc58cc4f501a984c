"""Split a loop variable that the kernel's indices only divide and take remainders of.

A kernel over [16, 512, 768] that reads a [16, 12, 512, 64] buffer (attention's
output going back to [batch, sequence, heads * head_dim]) indexes its input with
`i2 // 64` and `i2 % 64`, where `i2 = xindex % 768`. Triton proves contiguity and
alignment through `%` and `//` by powers of two, and through a non-power-of-two
`xindex % 768` as far as the next power of two (256), but not through a division or
remainder of that result again: the load then compiles to one 4-byte load per
element (`ld.global.b32`) instead of 16-byte ones (`ld.global.v4.b32`), and the
index math takes four times the instructions (sm_90 PTX of BERT's kernel at its GPU
size, compiled on the CPU).

Splitting `i2` (range 768) into `i2 = 64 * a + b` (ranges 12 and 64) gives the same
iteration space in the same order, with indices `32768 * a + b`: pure in the new
variables, which the kernel's axis setup computes as `(xindex // 64) % 12` and
`xindex % 64`. A variable is split only when every division and remainder of it in
the kernel maps onto the two halves exactly; nothing else changes (same points,
same flat index, same grid), so numbers cannot change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ember.ir.expr import map_indices
from ember.ir.symbolic import index_var
from ember.scheduler import FusedKernel
from ember.scheduler.indexing import body_exprs

# a kernel never has this many nested splits worth making; a bound on the loop below
_MAX_SPLITS = 8


def split_divided_variables(kernel: FusedKernel) -> FusedKernel:
    """`kernel` with each outer loop variable of static range that the indices only
    use through divisions and remainders at one boundary split into two variables
    there (outer then inner, renumbered `i0, i1, ...`); `kernel` itself when none is.
    Reduction variables are left alone."""
    for _ in range(_MAX_SPLITS):
        split = _split_one(kernel)
        if split is None:
            return kernel
        kernel = split
    return kernel


def _index_exprs(kernel: FusedKernel) -> list[sympy.Expr]:
    exprs = [m.index for m in kernel.members]
    for m in kernel.members:
        exprs += body_exprs([m.body, *m.indirect])
    return exprs


def _divisions(expr: sympy.Expr, var: sympy.Symbol) -> list[sympy.Expr]:
    return [
        node
        for node in sympy.preorder_traversal(expr)
        if isinstance(node, (FloorDiv, ModularIndexing)) and node.has(var)
    ]


def _candidates(divisions: list[sympy.Expr], size: int) -> list[int]:
    found: set[int] = set()
    for node in divisions:
        if not all(isinstance(a, sympy.Integer) for a in node.args[1:]):
            continue  # a symbolic divisor: _rule refuses it
        if isinstance(node, FloorDiv):
            found.add(int(node.args[1]))
        else:
            div, mod = int(node.args[1]), int(node.args[2])
            found.update((div, div * mod))
    return sorted((c for c in found if 1 < c < size and size % c == 0), reverse=True)


def _rule(
    node: sympy.Expr,
    var: sympy.Symbol,
    cut: int,
    halves: tuple[tuple[sympy.Symbol, int], tuple[sympy.Symbol, int]],
) -> sympy.Expr | None:
    """`node` (a division or remainder of `var`) in terms of var = cut * hi + lo
    (`halves`: hi and lo with their ranges; 0 <= lo < cut), exactly and without a
    division spanning both; None if not."""
    (hi, hi_size), (lo, _) = halves
    args = node.args
    if args[0] != var or not all(isinstance(a, sympy.Integer) for a in args[1:]):
        return None
    if isinstance(node, FloorDiv):
        d = int(args[1])
        if d % cut == 0:  # (cut*hi + lo) // (k*cut) = hi // k
            return _floordiv(hi, hi_size, d // cut)
        if cut % d == 0:  # (cut*hi + lo) // d = (cut/d)*hi + lo // d
            return (cut // d) * hi + _floordiv(lo, cut, d)
        return None
    d, m = int(args[1]), int(args[2])
    if d % cut == 0:  # ((cut*hi + lo) // (k*cut)) % m = (hi // k) % m
        return _digit(hi, hi_size, d // cut, m)
    if cut % (d * m) == 0:  # d*m divides cut*hi: only lo's digits remain
        return _digit(lo, cut, d, m)
    return None


def _floordiv(x: sympy.Symbol, size: int, d: int) -> sympy.Expr:
    """x // d for 0 <= x < size, without the division where it is trivial."""
    if d == 1:
        return x
    return sympy.Integer(0) if size <= d else FloorDiv(x, d)


def _digit(x: sympy.Symbol, size: int, d: int, m: int) -> sympy.Expr:
    """(x // d) % m for 0 <= x < size, without the remainder where x // d < m."""
    quotient = _floordiv(x, size, d)
    return quotient if -(-size // d) <= m else ModularIndexing(x, d, m)


def _split_one(kernel: FusedKernel) -> FusedKernel | None:
    exprs = _index_exprs(kernel)
    for position, extent in enumerate(kernel.ranges):
        if not isinstance(extent, sympy.Integer):
            continue
        var = index_var("i", position)
        divisions = [node for e in exprs for node in _divisions(e, var)]
        if not divisions:
            continue
        for cut in _candidates(divisions, int(extent)):
            rewrite = _rewriter(kernel, position, cut, divisions)
            if rewrite is not None:
                return _apply(kernel, position, cut, rewrite)
    return None


def _rewriter(
    kernel: FusedKernel, position: int, cut: int, divisions: list[sympy.Expr]
) -> Callable[[sympy.Expr], sympy.Expr] | None:
    """The index rewrite splitting variable `position` at `cut`, or None when some
    division of it does not map onto the halves."""
    var = index_var("i", position)
    count = len(kernel.ranges)
    # the later variables move up one place; the new pair takes `position`, `position+1`
    shift = {index_var("i", d): index_var("_s", d + 1) for d in range(position + 1, count)}
    hi, lo = index_var("_s", position), index_var("_s", position + 1)
    halves = ((hi, int(kernel.ranges[position]) // cut), (lo, cut))
    mapping: dict[sympy.Expr, sympy.Expr] = {}
    for node in divisions:
        replaced = _rule(node, var, cut, halves)
        if replaced is None:
            return None
        mapping[node] = replaced
    final = {index_var("_s", d): index_var("i", d) for d in range(position, count + 1)}

    def rewrite(expr: sympy.Expr) -> sympy.Expr:
        if not expr.has(var) and not any(expr.has(s) for s in shift):
            return expr
        out = expr.xreplace(mapping).xreplace(shift).xreplace({var: cut * hi + lo})
        return sympy.expand(out.xreplace(final))

    return rewrite


def _apply(
    kernel: FusedKernel, position: int, cut: int, rewrite: Callable[[sympy.Expr], sympy.Expr]
) -> FusedKernel:
    extent = int(kernel.ranges[position])
    ranges = (
        *kernel.ranges[:position],
        sympy.Integer(extent // cut),
        sympy.Integer(cut),
        *kernel.ranges[position + 1 :],
    )
    members = tuple(
        replace(
            m,
            index=rewrite(m.index),
            body=map_indices(m.body, rewrite),
            indirect=tuple(map_indices(i, rewrite) for i in m.indirect),
        )
        for m in kernel.members
    )
    return replace(kernel, ranges=ranges, members=members)
