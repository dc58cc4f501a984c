"""Index expressions (sympy over loop variables and size symbols) as C++ int64 arithmetic.

Loop variables (`i0`, `r0`, ...) and size symbols (`s0`, ...) are `int64_t` variables of
the same name in the generated code; `ind<k>` symbols are renamed per load to the
temporary holding that load's k-th indirect value. Floor division and modulo follow
Python; when sympy knows the dividend is nonnegative (loop variables and sizes are),
plain C `/` and `%` are exact and vectorise, so they are used.

Size expressions with a floating value (a value of a graph's dtype float, not an
index) also print here: torch's true divisions (`IntTrueDiv`, `FloatTrueDiv`, as in
batch norm's unbiased variance `n / (n - 1)` with a symbolic `n`), `ToFloat` and
float constants. Each true division divides its operands as `double`s, as Python
does (Python divides two ints exactly rounded even past 2**53, which sizes never
reach); sums and products mixing them with integers promote to `double` in C++ as
they do in Python, so the value is Python's, which the emitter then casts to the
node's dtype as eager rounds the Python scalar.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy
from torch.utils._sympy.functions import (
    FloatTrueDiv,
    FloorDiv,
    IntTrueDiv,
    ModularIndexing,
    PythonMod,
    ToFloat,
)

from ember.codegen.cpp.dtypes import int_literal
from ember.ir import float_valued


class IndexPrintError(ValueError):
    """An index expression uses a function this printer does not know."""


def print_index(expr: sympy.Expr, names: Mapping[sympy.Symbol, str] | None = None) -> str:
    """C++ for `expr` (an int64 value, or a double where it divides truly or holds a
    float); `names` renames symbols."""
    text = _IndexPrinter(names or {}).show(sympy.sympify(expr))
    if isinstance(expr, sympy.Add):
        text = text[1:-1]  # the outermost parentheses of a sum are never needed
    return text


def _nonnegative(expr: sympy.Expr) -> bool:
    return bool(expr.is_nonnegative)


class _IndexPrinter:
    def __init__(self, names: Mapping[sympy.Symbol, str]) -> None:
        self.names = names
        self.functions: dict[type, Callable[[sympy.Expr], str]] = {
            FloorDiv: self._floordiv,
            ModularIndexing: self._modular,
            PythonMod: self._mod,
            sympy.Mod: self._mod,
            sympy.Max: self._max,
            sympy.Min: self._min,
            IntTrueDiv: self._true_division,
            FloatTrueDiv: self._true_division,
            ToFloat: self._to_float,
        }

    def show(self, expr: sympy.Expr) -> str:
        if isinstance(expr, sympy.Integer):
            return int_literal(int(expr))
        if isinstance(expr, sympy.Symbol):
            return self.names.get(expr, expr.name)
        if isinstance(expr, sympy.Float):
            return _double_literal(expr)
        if isinstance(expr, sympy.Add):
            return self._add(expr)
        if isinstance(expr, sympy.Mul):
            return self._mul(expr)
        if isinstance(expr, sympy.Pow):
            return self._pow(expr)
        for kind, show in self.functions.items():
            if isinstance(expr, kind):
                return show(expr)
        raise IndexPrintError(f"index expression {expr} ({type(expr).__name__})")

    def _atom(self, expr: sympy.Expr) -> str:
        """`expr` safe to use as an operand of * / %."""
        text = self.show(expr)
        # A power prints as a product: `x / s**2` must not become `x / s*s`.
        if isinstance(expr, (sympy.Add, sympy.Mul, sympy.Pow)) or text.startswith("-"):
            return f"({text})"
        return text

    def _add(self, expr: sympy.Expr) -> str:
        text = ""
        for term in expr.as_ordered_terms():
            coefficient, rest = term.as_coeff_Mul()
            if coefficient < 0:
                positive = self.show(-term)
                text += f" - {positive}" if text else f"-{self._atom(-term)}"
            else:
                text += f" + {self.show(term)}" if text else self.show(term)
            del rest
        return f"({text})" if len(expr.args) > 1 else text

    def _mul(self, expr: sympy.Expr) -> str:
        coefficient, rest = expr.as_coeff_Mul()
        factors = [
            self.show(f) if isinstance(f, sympy.Pow) else self._atom(f)
            for f in sympy.Mul.make_args(rest)
        ]
        if coefficient == -1:
            return "-" + "*".join(factors)
        if coefficient != 1:
            factors.insert(0, self._atom(coefficient))
        return "*".join(factors)

    def _pow(self, expr: sympy.Expr) -> str:
        base, exponent = expr.args
        if not (isinstance(exponent, sympy.Integer) and int(exponent) > 0):
            raise IndexPrintError(f"index expression {expr} (non-integer power)")
        return "*".join([self._atom(base)] * int(exponent))

    def _floordiv(self, expr: sympy.Expr) -> str:
        a, b = expr.args
        if _nonnegative(a) and b.is_positive:
            return f"({self._atom(a)} / {self._atom(b)})"
        return f"ember::floordiv_i({self.show(a)}, {self.show(b)})"

    def _modular(self, expr: sympy.Expr) -> str:
        x, divisor, modulus = expr.args
        if _nonnegative(x) and divisor.is_positive and modulus.is_positive:
            quotient = (
                self._atom(x) if divisor == 1 else f"({self._atom(x)} / {self._atom(divisor)})"
            )
            return f"({quotient} % {self._atom(modulus)})"
        quotient = f"ember::floordiv_i({self.show(x)}, {self.show(divisor)})"
        return f"ember::mod_i({quotient}, {self.show(modulus)})"

    def _mod(self, expr: sympy.Expr) -> str:
        a, b = expr.args
        if _nonnegative(a) and b.is_positive:
            return f"({self._atom(a)} % {self._atom(b)})"
        return f"ember::mod_i({self.show(a)}, {self.show(b)})"

    def _true_division(self, expr: sympy.Expr) -> str:
        a, b = expr.args
        return f"({self._double(a)} / {self._double(b)})"

    def _to_float(self, expr: sympy.Expr) -> str:
        return self._double(expr.args[0])

    def _double(self, expr: sympy.Expr) -> str:
        """`expr` as a double operand (an integer converted, as Python's float())."""
        if isinstance(expr, sympy.Integer):
            return _double_literal(sympy.Float(int(expr)))
        if isinstance(expr, sympy.Float):
            return _double_literal(expr)
        if float_valued(expr):
            return self._atom(expr)
        return f"static_cast<double>({self.show(expr)})"

    def _max(self, expr: sympy.Expr) -> str:
        return self._fold("std::max", expr.args)

    def _min(self, expr: sympy.Expr) -> str:
        return self._fold("std::min", expr.args)

    def _fold(self, function: str, args: tuple[sympy.Expr, ...]) -> str:
        text = self.show(args[0])
        for a in args[1:]:
            text = f"{function}<int64_t>({text}, {self.show(a)})"
        return text


def _double_literal(value: sympy.Float) -> str:
    """A C++ double literal of exactly `value` (Python's shortest round-trip text; a
    sympy Float is finite: infinities and NaN are other classes)."""
    text = repr(float(value))
    return text if any(c in text for c in ".e") else f"{text}.0"
