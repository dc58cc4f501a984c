"""Size expressions printed as Python evaluate to what sympy says they are."""

from __future__ import annotations

import sympy
from torch.utils._sympy.functions import CeilDiv, FloorDiv, ModularIndexing

from ember.runtime.pyexpr import pyexpr

s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)


def evaluate(expr: sympy.Expr, **values: int) -> object:
    env = {f"sym_{k}": v for k, v in values.items()}
    return eval(pyexpr(expr), {}, env)


def test_arithmetic_and_integer_functions() -> None:
    cases = [
        (s0 * s1 + 3, 7 * 5 + 3),
        (FloorDiv(s0, 2), 3),
        (CeilDiv(s0, 2), 4),
        (ModularIndexing(s1, 2, 3), (5 // 2) % 3),
        (sympy.Max(s0, s1), 7),
        (s0**2, 49),
    ]
    for expr, expected in cases:
        assert evaluate(expr, s0=7, s1=5) == expected, (expr, pyexpr(expr))


def test_integers_print_plainly() -> None:
    assert pyexpr(sympy.Integer(12)) == "12"
    assert pyexpr(sympy.true) == "True"
