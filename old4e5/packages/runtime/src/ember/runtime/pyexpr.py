"""Print sympy size expressions as Python source for the generated wrapper.

Symbols become `sym_<name>` variables (bound at the wrapper's entry from the inputs),
and torch's integer sympy functions (FloorDiv, ModularIndexing, ...) become the
Python operators with the same meaning on integers.
"""

from __future__ import annotations

from typing import Any

import sympy
from sympy.printing.str import StrPrinter


def symbol_name(symbol: sympy.Symbol) -> str:
    return f"sym_{symbol.name}"


class PythonExprPrinter(StrPrinter):  # type: ignore[misc]  # sympy is untyped
    """sympy -> Python integer/float arithmetic."""

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return symbol_name(expr)

    def _print_BooleanTrue(self, expr: Any) -> str:
        return "True"

    def _print_BooleanFalse(self, expr: Any) -> str:
        return "False"

    def _binary(self, expr: Any, op: str) -> str:
        a, b = (self._print(arg) for arg in expr.args)
        return f"(({a}) {op} ({b}))"

    def _print_FloorDiv(self, expr: Any) -> str:
        return self._binary(expr, "//")

    _print_CleanDiv = _print_FloorDiv

    def _print_Mod(self, expr: Any) -> str:
        return self._binary(expr, "%")

    _print_PythonMod = _print_Mod

    def _print_IntTrueDiv(self, expr: Any) -> str:
        return self._binary(expr, "/")

    _print_FloatTrueDiv = _print_IntTrueDiv

    def _print_CeilDiv(self, expr: Any) -> str:
        a, b = (self._print(arg) for arg in expr.args)
        return f"(-((-({a})) // ({b})))"

    def _print_ModularIndexing(self, expr: Any) -> str:
        x, div, mod = (self._print(arg) for arg in expr.args)
        return f"((({x}) // ({div})) % ({mod}))"

    def _print_Max(self, expr: Any) -> str:
        return "max(" + ", ".join(self._print(a) for a in expr.args) + ")"

    def _print_Min(self, expr: Any) -> str:
        return "min(" + ", ".join(self._print(a) for a in expr.args) + ")"

    def _print_ToFloat(self, expr: Any) -> str:
        return f"float({self._print(expr.args[0])})"

    def _print_TruncToInt(self, expr: Any) -> str:
        return f"int({self._print(expr.args[0])})"

    def _print_floor(self, expr: Any) -> str:
        return f"(({self._print(expr.args[0])}) // 1)"

    def _print_Relational(self, expr: Any) -> str:
        return f"(({self._print(expr.lhs)}) {expr.rel_op} ({self._print(expr.rhs)}))"

    def _print_And(self, expr: Any) -> str:
        return "(" + " and ".join(self._print(a) for a in expr.args) + ")"

    def _print_Or(self, expr: Any) -> str:
        return "(" + " or ".join(self._print(a) for a in expr.args) + ")"

    def _print_Not(self, expr: Any) -> str:
        return f"(not {self._print(expr.args[0])})"

    def _print_Rational(self, expr: Any) -> str:
        return f"({expr.p} / {expr.q})"

    def _print_Pow(self, expr: Any, rational: bool = False) -> str:
        base, exp = expr.args
        return f"(({self._print(base)}) ** ({self._print(exp)}))"

    def emptyPrinter(self, expr: Any) -> str:  # sympy's hook name
        raise NotImplementedError(
            f"ember cannot print the size expression {expr} ({type(expr).__name__}) as Python"
        )


_PRINTER = PythonExprPrinter()


def pyexpr(expr: sympy.Basic) -> str:
    """Python source for a sympy size expression."""
    if isinstance(expr, sympy.Integer):
        return str(int(expr))
    return str(_PRINTER.doprint(expr))
