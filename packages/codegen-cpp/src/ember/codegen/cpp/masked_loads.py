"""Masked loads read unconditionally where that costs no gather.

A masked load is `mask ? p[index] : other`: memory is read only where the mask holds.
GCC vectorises that where the index is contiguous along the simd loop (a masked
vector load) or is no affine function of it (a masked gather), but not where it is
strided by a constant other than 1 (a stride-2 pool's taps over a padded window) or
does not move with the loop ("not vectorized: no vectype for stmt: .MASK_LOAD"), and
then the whole loop runs one element at a time. Some masked loads are therefore
written as an unconditional load and a select, `mask ? p[i] : other`, where `i` is the
index clamped into `[low, high]`:

- where the index never leaves `[low, high]` anywhere in the loop nest, with no clamp
  at all (a plain load: a pool's window taps that only padding at the far edge can
  push out, or a mask that always holds);
- where the index does not move along the simd loop (a padded or concatenated
  broadcast): the clamp is computed once per vector and the load is a broadcast.

A clamped index that moves along the loop would be a gather. That vectorises the loop,
but measured on one thread (AMD EPYC, AVX-512, GCC 12) it was slower than the scalar
loop it replaced: 4.3x for a constant pad of a stride-2 slice, 1.2x for a 3x3
stride-2 average pool, 1.6x for ResNet's stem max pool (once `ember::maximum` stopped
branching); it won only where the scalar loop mispredicted branches of its own (a
ReLU inlined into the pool's taps: 3.7x). Such loads keep the masked form.

`low` and `high` are the smallest and the largest index the load reads where its mask
holds (`clamp_bounds`). Where the mask is a conjunction of static bounds on single loop
variables (pooling windows, padding, the pieces of a cat), the points where it holds
form a box of loop values; the index, affine in them, is smallest and largest at two
corners of that box, where the mask holds, so the masked form reads both elements, and
the buffer's storage between them is readable too (one allocation). The clamped index
is therefore always an element the masked form reads, and where the mask holds it is
the index itself: the same values bit for bit (NaN and infinities included: a
masked-off lane's element is never selected), whatever the buffer's layout (an
`as_strided` view may read outside it). Any other mask (a data-dependent one, a bound
on a sum of loop variables), symbolic ranges and indirect loads keep the masked form.
"""

from __future__ import annotations

import sympy
import torch

from ember.ir import Const, IndexExpr, Load, Node, Op
from ember.ir.symbolic import index_var, static_int
from ember.scheduler import FusedKernel
from ember.scheduler.indexing import affine_coefficient

Box = dict[sympy.Symbol, tuple[int, int]]  # loop variable -> smallest and largest value


def loop_box(kernel: FusedKernel) -> Box:
    """Each loop variable of `kernel` with a static range, over all of it."""
    box: Box = {}
    for prefix, ranges in (("i", kernel.ranges), ("r", kernel.reduction_ranges)):
        for d, extent in enumerate(ranges):
            n = static_int(extent)
            if n is not None:
                box[index_var(prefix, d)] = (0, n - 1)
    return box


def moves_with(index: sympy.Expr, lane: sympy.Symbol) -> bool:
    """Whether `index` changes from one iteration of a simd loop over `lane` to the
    next (where it does, a clamped load is a gather)."""
    return affine_coefficient(sympy.sympify(index), lane) != 0


def clamp_bounds(load: Load, loops: Box) -> tuple[int | None, int | None] | None:
    """The smallest and the largest index `load` reads where its mask holds, where its
    mask bounds single loop variables of `loops` only and holds somewhere (the module
    docstring says why the kernel reads both); else None. A bound the index never
    passes in the whole loop nest is None: no clamp on that side."""
    if load.mask is None or load.indirect:
        return None
    box = _mask_box(load.mask, loops)
    if box is None:
        return None
    terms = _affine(sympy.expand(load.index), box)
    if terms is None:
        return None
    low, high = _extremes(terms, box)
    everywhere_low, everywhere_high = _extremes(terms, loops)
    return (low if everywhere_low < low else None), (high if everywhere_high > high else None)


def _extremes(terms: tuple[int, dict[sympy.Symbol, int]], box: Box) -> tuple[int, int]:
    """The smallest and the largest value of an affine expression over `box`."""
    constant, coefficients = terms
    low = high = constant
    for var, c in coefficients.items():
        first, last = box[var]
        low += c * (first if c > 0 else last)
        high += c * (last if c > 0 else first)
    return low, high


def _mask_box(mask: Node, loops: Box) -> Box | None:
    """The box of loop values where `mask` holds, where it is a conjunction of
    comparisons each bounding one loop variable (or none) by constants, and not empty;
    else None."""
    box = dict(loops)
    for condition in _conjuncts(mask):
        bound = _bound(condition, box)
        if bound is None:
            return None
        var, first, last = bound
        if var is None:
            if first > last:  # a constant condition that fails
                return None
            continue
        old_first, old_last = box[var]
        box[var] = (max(old_first, first), min(old_last, last))
    if any(first > last for first, last in box.values()):
        return None
    return box


def _conjuncts(mask: Node) -> list[Node]:
    if isinstance(mask, Op) and mask.name == "logical_and":
        return [c for arg in mask.args for c in _conjuncts(arg)]
    return [mask]


# x (op) 0 as bounds on x: the smallest and the largest integer value it allows
_LIMITS = {"ge": (0, None), "gt": (1, None), "le": (None, 0), "lt": (None, -1)}


def _bound(condition: Node, box: Box) -> tuple[sympy.Symbol | None, int, int] | None:
    """(variable, smallest, largest value) that `condition`, a comparison of two
    integer index values, allows one loop variable of `box`; (None, 0, 0) where it
    holds without one, (None, 1, 0) where it never holds; None for anything else."""
    if not (isinstance(condition, Op) and condition.name in _LIMITS):
        return None
    sides = [_integer_value(a) for a in condition.args]
    if sides[0] is None or sides[1] is None:
        return None
    terms = _affine(sympy.expand(sides[0] - sides[1]), box)
    if terms is None or len(terms[1]) > 1:
        return None
    constant, coefficients = terms
    at_least, at_most = _LIMITS[condition.name]  # on alpha * var + constant
    if not coefficients:
        holds = (at_least is None or constant >= at_least) and (
            at_most is None or constant <= at_most
        )
        return (None, 0, 0) if holds else (None, 1, 0)
    ((var, alpha),) = coefficients.items()
    first, last = box[var]
    if alpha < 0:  # alpha * var + constant >= k  <=>  -alpha * var - constant <= -k
        alpha, constant = -alpha, -constant
        at_least, at_most = (
            None if at_most is None else -at_most,
            None if at_least is None else -at_least,
        )
    if at_least is not None:
        first = -((constant - at_least) // alpha)  # ceil((at_least - constant) / alpha)
    if at_most is not None:
        last = (at_most - constant) // alpha
    return var, first, last


def _integer_value(node: Node) -> sympy.Expr | None:
    if isinstance(node, IndexExpr) and node.dtype == torch.int64:
        return sympy.sympify(node.expr)
    if isinstance(node, Const) and node.dtype in _INTEGERS and isinstance(node.value, int):
        return sympy.Integer(node.value)
    return None


_INTEGERS = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


def _affine(expr: sympy.Expr, box: Box) -> tuple[int, dict[sympy.Symbol, int]] | None:
    """`expr` as an integer constant and the integer coefficients of variables of
    `box`, where it is that (affine, no other symbol, no function); else None."""
    if not expr.free_symbols <= set(box):
        return None
    if not expr.free_symbols:
        return (int(expr), {}) if expr.is_Integer else None
    variables = sorted(expr.free_symbols, key=lambda s: s.name)
    poly = expr.as_poly(*variables)
    if poly is None or poly.total_degree() > 1:
        return None
    coefficients: dict[sympy.Symbol, int] = {}
    constant = 0
    for monomial, coefficient in poly.terms():
        if not sympy.sympify(coefficient).is_Integer:
            return None
        if sum(monomial) == 0:
            constant = int(coefficient)
        else:
            coefficients[variables[monomial.index(1)]] = int(coefficient)
    return constant, coefficients
