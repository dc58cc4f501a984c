"""Sizes as sympy expressions.

Static sizes are sympy Integers; under `torch.compile(dynamic=True)` sizes are the
symbols of the graph's ShapeEnv (s0, s1, ...) and expressions over them, taken as is
from each SymInt's node. The IR never reads a symbol's example value, so it never
specialises on it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sympy
import torch

Expr = sympy.Expr


# What a size symbol counts as wherever a heuristic needs a number for it: the one
# guess of the whole stack (the scheduler's loop order and fusion scores, the Triton
# codegen's block sizes and tuning menu, the lowering's stride order), so that every
# layer plans for the same program. Large, because the sizes that are left symbolic
# are the ones that vary (batch, sequence length) and a kernel tuned for a small guess
# (a 64-wide block) would run a large size slowly, while one tuned for a large guess
# runs a small size masked. A power of two, as most real sizes are. It stands for no
# actual size: the IR never reads a symbol's example value (see above), and nothing
# that decides correctness may rest on it, only speed.
SIZE_HINT = 4096


def size_hint(expr: sympy.Expr) -> int:
    """`expr` as a number: every size symbol counted as `SIZE_HINT` (for heuristics
    only: ordering, scoring, picking configs)."""
    if expr.is_number:
        return int(expr)
    return int(expr.xreplace(dict.fromkeys(expr.free_symbols, sympy.Integer(SIZE_HINT))))


def as_expr(value: Any) -> sympy.Expr:
    """An int, bool, float or torch Sym* value as a sympy expression."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = value.node.expr
        return _exact_divisions(sympy.sympify(expr) if not isinstance(expr, sympy.Basic) else expr)
    if isinstance(value, bool):
        return sympy.true if value else sympy.false
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, float):
        return sympy.Float(value)
    raise TypeError(f"cannot make a size expression of {type(value).__name__} {value!r}")


def _exact_divisions(expr: sympy.Basic) -> sympy.Expr:
    """`expr` with floor divisions that divide exactly replaced by their quotient,
    `Max(1, e)` by `e` where `e >= 1` for all sizes, and torch's Max and Min by sympy's.

    ShapeEnv leaves `s**3 // s**2` (the -1 of a view when every dimension is one ducked
    symbol) as is, and contiguous strides of a strided slice as `Max(1, (s + 1)//2)`;
    the IR then sees a size that is `s` but does not compare equal to it (views and
    output strides that should match did not), and a `Max` no codegen prints."""
    from torch.utils._sympy.functions import FloorDiv
    from torch.utils._sympy.functions import Max as TorchMax
    from torch.utils._sympy.functions import Min as TorchMin
    from torch.utils._sympy.value_ranges import bound_sympy

    def quotient(division: sympy.Expr) -> sympy.Expr:
        a, b = division.args
        exact = sympy.cancel(a / b)
        numerator, denominator = sympy.fraction(exact)
        if denominator == 1 and exact.is_polynomial() and numerator.is_integer:
            return sympy.expand(exact)
        return division

    def at_least_one(maximum: sympy.Expr) -> sympy.Expr:
        rest = [a for a in maximum.args if a != 1]
        if len(rest) == 1 and len(maximum.args) == 2:
            try:
                if bound_sympy(rest[0]).lower >= 1:
                    return rest[0]
            except Exception:  # an expression value ranges cannot bound: keep the Max
                return maximum
        return maximum

    if expr.has(FloorDiv):
        expr = expr.replace(lambda e: isinstance(e, FloorDiv), quotient)
    if expr.has(TorchMax) or expr.has(sympy.Max):
        expr = expr.replace(lambda e: isinstance(e, (TorchMax, sympy.Max)), at_least_one)
    if expr.has(TorchMax) or expr.has(TorchMin):
        # What stays is a real maximum (`Max(1, s1 - s0)`, the stride of a slice that
        # may be empty; `max(n, 1)` in user code): the codegens print sympy's Max and
        # Min, not torch's classes of the same name.
        expr = expr.replace(lambda e: isinstance(e, TorchMax), lambda e: sympy.Max(*e.args))
        expr = expr.replace(lambda e: isinstance(e, TorchMin), lambda e: sympy.Min(*e.args))
    return expr


def is_symbolic(value: Any) -> bool:
    """True for torch Sym* values whose expression still has free symbols."""
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) and bool(
        as_expr(value).free_symbols
    )


def known_true(condition: bool | torch.SymBool) -> bool:
    """True when `condition` holds for every size the graph's ShapeEnv admits (its
    symbols' ranges and the guards tracing recorded), checked without adding a guard:
    a compiled graph must stay right for all the inputs its guards let through."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    return bool(statically_known_true(condition))


def evaluate(expr: sympy.Expr, bindings: Mapping[sympy.Symbol, int]) -> int | float | bool:
    """Evaluate a size expression with concrete symbol values."""
    if isinstance(expr, (int, float, bool)):
        return expr
    value = sympy.sympify(expr.xreplace(dict(bindings))) if expr.free_symbols else expr
    if value.free_symbols:
        missing = ", ".join(sorted(str(s) for s in value.free_symbols))
        raise KeyError(f"size expression {expr} needs values for {missing}")
    if value in (sympy.true, sympy.false):
        return bool(value)
    if value.is_Integer or value.is_integer:
        return int(value)
    return float(value)


# -- index math -------------------------------------------------------------------------
#
# Loop variables are integer symbols with fixed names: `i0, i1, ...` for the ranges of a
# loop node, `r0, r1, ...` for the reduction ranges, `ind0, ind1, ...` for the values of
# an indirect load or store (see ember.ir.expr.Load). Size symbols come from the graph's
# ShapeEnv (`s0, s1, ...`, `u0` for unbacked ones). Floor division and modulo use torch's
# own sympy functions (`FloorDiv`, `ModularIndexing`), the ones ShapeEnv expressions
# already contain, so one evaluator and one printer cover both.


@functools.cache
def index_var(prefix: str, position: int) -> sympy.Symbol:
    """The loop variable `{prefix}{position}` (nonnegative integer)."""
    return sympy.Symbol(f"{prefix}{position}", integer=True, nonnegative=True)


def loop_vars(count: int, prefix: str = "i") -> tuple[sympy.Symbol, ...]:
    return tuple(index_var(prefix, d) for d in range(count))


def indirect_var(position: int) -> sympy.Symbol:
    """The symbol standing for the value of an indirect index (may be any integer)."""
    return _indirect_var(position)


@functools.cache
def _indirect_var(position: int) -> sympy.Symbol:
    return sympy.Symbol(f"ind{position}", integer=True)


def is_loop_var(symbol: sympy.Basic) -> bool:
    return (
        isinstance(symbol, sympy.Symbol)
        and symbol.name[:1] in ("i", "r")
        and (symbol.name[1:].isdigit())
    )


def is_indirect_var(symbol: sympy.Basic) -> bool:
    return isinstance(symbol, sympy.Symbol) and symbol.name.startswith("ind")


def product(values: Iterable[sympy.Expr]) -> sympy.Expr:
    result: sympy.Expr = sympy.Integer(1)
    for v in values:
        result = result * v
    return result


def split_groups(parts: Sequence[sympy.Expr], wholes: Sequence[sympy.Expr]) -> list[int] | None:
    """How many of `parts`, taken in order, make up each of `wholes` (their product is
    its size), when every whole is one part or several in a row: the loop sizes of a
    result stored in a layout whose dimensions merge some of them, in the same
    row-major order. None when they do not line up."""
    groups: list[int] = []
    at = 0
    for whole in wholes:
        taken: sympy.Expr = sympy.Integer(1)
        start = at
        while at < len(parts) and (at == start or sympy.expand(taken - whole) != 0):
            taken = taken * parts[at]
            at += 1
        if at == start or sympy.expand(taken - whole) != 0:
            return None
        groups.append(at - start)
    return groups if at == len(parts) else None


def static_int(expr: sympy.Expr) -> int | None:
    """The value of a size expression when it has no symbols, else None."""
    return int(expr) if isinstance(expr, sympy.Integer) else None


@functools.lru_cache(maxsize=65536)
def simplify_index(expr: sympy.Expr) -> sympy.Expr:
    """A cheap, cached canonical form for index expressions.

    `sympy.simplify` costs milliseconds per call; lowering a model makes thousands of
    index expressions, most of them affine. Expanding products of sums is all the
    rewriting that affine indexing needs; FloorDiv/ModularIndexing simplify themselves
    on construction.
    """
    if expr.is_Atom:
        return expr
    return _merge_floor_mod(sympy.expand(expr))


def _merge_floor_mod(expr: sympy.Expr) -> sympy.Expr:
    """c*n*(x // (d*n)) + c*((x // d) % n)  ->  c*(x // d).

    The identity undoes what reshape index maps do when a view merges dimensions
    that a later view splits again (or a contiguous buffer is read through a merged
    view), so such loads stay affine."""
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    if not isinstance(expr, sympy.Add):
        return expr
    terms = list(expr.args)
    changed = True
    while changed:
        changed = False
        for term in terms:
            factors = term.args if isinstance(term, sympy.Mul) else (term,)
            mods = [f for f in factors if isinstance(f, ModularIndexing)]
            if len(mods) != 1:
                continue
            x, d, n = mods[0].args
            coeff = term / mods[0]
            partner = coeff * n * FloorDiv(x, d * n)
            if partner in terms:
                terms.remove(term)
                terms.remove(partner)
                terms.append(coeff * FloorDiv(x, d))
                changed = True
                break
    return sympy.Add(*terms)
