"""Index analysis: where a computed buffer stores the value of each loop point, and
the affine facts the fusion and loop-merging decisions need."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import sympy
from torch.utils._sympy.functions import ModularIndexing

from ember.ir import ComputedBuffer, IndexExpr, Load, Node, Rand, walk
from ember.ir.loops import Scan, Scatter, Sort
from ember.ir.symbolic import index_var, is_loop_var, product, split_groups

ONE = sympy.Integer(1)


def store_index(buffer: ComputedBuffer) -> sympy.Expr:
    """Storage index of the value at loop point (i0, i1, ...) of `buffer`'s loop.

    A loop's points map to the layout's elements in row-major order (the IR's contract;
    for welford the layout has a trailing dimension of 2 for mean and M2 and the index
    is that of the mean; for a scan the scanned dimension of the layout is `r0`'s, the
    others the outer variables'; for a sort it is `r0`'s too, over the kept count).
    Size-1 dimensions are skipped, so the common case
    gives the plain affine `offset + sum(i_k * stride_k)`.
    """
    layout = buffer.layout
    loop = buffer.loop
    if isinstance(loop, Scatter):
        return sympy.expand(loop.index)
    sizes = list(layout.size)
    strides = list(layout.stride)
    if getattr(loop, "kind", None) == "welford":
        sizes, strides = sizes[:-1], strides[:-1]
    every = [(index_var("i", k), r) for k, r in enumerate(loop.ranges)]
    if isinstance(loop, Scan):
        every.insert(loop.axis, (index_var("r", 0), loop.length))
    if isinstance(loop, Sort):
        every.insert(loop.axis, (index_var("r", 0), loop.count))
    dims = [(var, r) for var, r in every if r != ONE]
    kept = [(s, st) for s, st in zip(sizes, strides, strict=True) if s != ONE]
    split = _split_strides([r for _, r in dims], kept)
    if split is not None:
        terms = [var * st for (var, _), st in zip(dims, split, strict=True)]
        return sympy.expand(layout.offset + sympy.Add(*terms))
    linear = sympy.Add(
        *(var * product(r for _, r in dims[k + 1 :]) for k, (var, _) in enumerate(dims))
    )
    index = layout.offset
    for d, (size, stride) in enumerate(kept):
        inner = product(s for s, _ in kept[d + 1 :])
        index = index + ModularIndexing(linear, inner, size) * stride
    return sympy.expand(index)


def _split_strides(
    ranges: list[sympy.Expr], kept: list[tuple[sympy.Expr, sympy.Expr]]
) -> list[sympy.Expr] | None:
    """The stride of each loop dimension when every layout dimension is one or more
    loop dimensions in a row (the same sizes, or a layout dimension split in the loop:
    a long scan run as segment and position), else None."""
    groups = split_groups(ranges, [size for size, _ in kept])
    if groups is None:
        return None
    strides: list[sympy.Expr] = []
    at = 0
    for (_, stride), taken in zip(kept, groups, strict=True):
        group = ranges[at : at + taken]
        strides.extend(stride * product(group[k + 1 :]) for k in range(taken))
        at += taken
    return strides


def body_exprs(roots: Iterable[Node]) -> list[sympy.Expr]:
    """Every index expression inside the bodies (loads, index values, random counters)."""
    found: list[sympy.Expr] = []
    for root in roots:
        for node in walk(root):
            if isinstance(node, Load):
                found.append(node.index)
            elif isinstance(node, IndexExpr):
                found.append(node.expr)
            elif isinstance(node, Rand):
                found.append(node.index)
    return found


@functools.lru_cache(maxsize=65536)
def affine_coefficient(expr: sympy.Expr, var: sympy.Symbol) -> sympy.Expr | None:
    """The coefficient of `var` when `expr` is affine in the loop variables, else None."""
    coefficient = sympy.expand(sympy.diff(expr, var))
    if any(is_loop_var(s) for s in coefficient.free_symbols):
        return None
    if expr.has(ModularIndexing) or any(
        f.has(var) for f in expr.atoms(sympy.Function) if not isinstance(f, sympy.Symbol)
    ):
        return None
    return coefficient
