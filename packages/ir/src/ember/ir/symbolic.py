"""Sizes as sympy expressions.

Static sizes are sympy Integers; under `torch.compile(dynamic=True)` sizes are the
symbols of the graph's ShapeEnv (s0, s1, ...) and expressions over them, taken as is
from each SymInt's node. The IR never reads a symbol's example value, so it never
specialises on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sympy
import torch

Expr = sympy.Expr


def as_expr(value: Any) -> sympy.Expr:
    """An int, bool, float or torch Sym* value as a sympy expression."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        expr = value.node.expr
        return expr if isinstance(expr, sympy.Basic) else sympy.sympify(expr)
    if isinstance(value, bool):
        return sympy.true if value else sympy.false
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, float):
        return sympy.Float(value)
    raise TypeError(f"cannot make a size expression of {type(value).__name__} {value!r}")


def is_symbolic(value: Any) -> bool:
    """True for torch Sym* values whose expression still has free symbols."""
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)) and bool(
        as_expr(value).free_symbols
    )


def evaluate(expr: sympy.Expr, bindings: Mapping[sympy.Symbol, int]) -> int | float | bool:
    """Evaluate a size expression with concrete symbol values."""
    value = (
        expr.xreplace({k: sympy.sympify(v) for k, v in bindings.items()})
        if expr.free_symbols
        else expr
    )
    if value.free_symbols:
        missing = ", ".join(sorted(str(s) for s in value.free_symbols))
        raise KeyError(f"size expression {expr} needs values for {missing}")
    if value in (sympy.true, sympy.false):
        return bool(value)
    if value.is_Integer or value.is_integer:
        return int(value)
    return float(value)
