"""Text for the pieces of a kernel that are not ops: index expressions, dtypes, literals.

Index expressions are sympy over loop variables (`i0..`, `r0..`), indirect values
(`ind0..`) and size symbols (kernel arguments). They print as Triton integer
arithmetic. Triton's `//` and `%` truncate towards zero (C semantics) while sympy's
`FloorDiv`/`ModularIndexing` floor; the two agree on the nonnegative operands that
index math has (loop variables, sizes, storage offsets), which is the assumption
Inductor makes too. Negative offsets only reach memory under a mask.

Size expressions with a float value (a SymFloat's: torch's `IntTrueDiv` and
`FloatTrueDiv`, `ToFloat`, float constants; batch norm's `n / (n - 1)` with a
symbolic `n`) print as float64 arithmetic: each true division divides its operands
converted to float64, as Python does, and float constants are typed float64.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping

import sympy
import torch
from torch.utils._sympy.functions import (
    FloatTrueDiv,
    FloorDiv,
    IntTrueDiv,
    ModularIndexing,
    PythonMod,
    ToFloat,
)

from ember.ir import float_valued

# torch dtype -> the Triton dtype a value is *stored* in
_STORAGE_TYPES: dict[torch.dtype, str] = {
    torch.float32: "tl.float32",
    torch.float64: "tl.float64",
    torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16",
    torch.int8: "tl.int8",
    torch.int16: "tl.int16",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
    torch.uint8: "tl.uint8",
    torch.uint16: "tl.uint16",
    torch.uint32: "tl.uint32",
    torch.uint64: "tl.uint64",
    torch.bool: "tl.int1",
}

LOW_PRECISION: frozenset[torch.dtype] = frozenset({torch.float16, torch.bfloat16})


class UnsupportedKernelError(NotImplementedError):
    """The kernel uses something this codegen cannot render; the runtime falls back."""


def storage_type(dtype: torch.dtype) -> str:
    try:
        return _STORAGE_TYPES[dtype]
    except KeyError:
        raise UnsupportedKernelError(f"dtype {dtype} has no Triton equivalent") from None


def register_type(dtype: torch.dtype) -> str:
    """The Triton dtype a value is computed in: float16/bfloat16 compute in float32."""
    return "tl.float32" if dtype in LOW_PRECISION else storage_type(dtype)


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


def float_literal(value: float) -> str:
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(float(value))


def literal(value: bool | int | float, dtype: torch.dtype) -> str:
    """A Python literal for `value` as `dtype` holds it (low precision rounded)."""
    if dtype == torch.bool:
        return "1" if value else "0"
    if dtype.is_floating_point:
        if dtype in LOW_PRECISION:
            value = round_to(float(value), dtype)
        return float_literal(float(value))
    return str(int(value))


def round_to(value: float, dtype: torch.dtype) -> float:
    """`value` as torch stores it in float16 or bfloat16 (through float32, rounding to
    nearest even; beyond the range, infinity), without making a tensor: kernels are
    rendered while AOTAutograd traces, where a tensor is a fake one that costs 250 µs
    to make (resnet50 rendered about 2000 literals this way, 0.5 s of its compile)."""
    if math.isnan(value) or math.isinf(value):
        return value
    try:
        single = struct.pack("<f", value)
    except OverflowError:  # beyond float32: infinite in either format
        return math.copysign(math.inf, value)
    if dtype == torch.float16:
        try:
            return float(struct.unpack("<e", struct.pack("<e", struct.unpack("<f", single)[0]))[0])
        except OverflowError:
            return math.copysign(math.inf, value)
    if dtype != torch.bfloat16:
        raise ValueError(f"round_to: {dtype} is not float16 or bfloat16")
    bits = struct.unpack("<I", single)[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # nearest, ties to even
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def constant(value: bool | int | float, dtype: torch.dtype) -> str:
    """A typed scalar: `tl.full([], value, type)` (a bare literal would be weakly typed)."""
    return f"tl.full([], {literal(value, dtype)}, {register_type(dtype)})"


def sanitize(name: str) -> str:
    """A buffer or symbol name as a Python identifier."""
    cleaned = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return cleaned if cleaned[:1].isalpha() else f"v_{cleaned}"


class IndexPrinter:
    """Prints index expressions; `names` maps symbols (loop variables, indirect
    values, sizes) to the Triton names that hold them."""

    def __init__(self, names: Mapping[sympy.Symbol, str] | None = None) -> None:
        self.names: dict[sympy.Symbol, str] = dict(names or {})

    def __call__(self, expr: sympy.Expr) -> str:
        return self._print(sympy.sympify(expr))

    def _print(self, expr: sympy.Basic) -> str:
        if isinstance(expr, sympy.Integer):
            return str(int(expr))
        if isinstance(expr, sympy.Symbol):
            return self.names.get(expr, sanitize(expr.name))
        if isinstance(expr, sympy.Add):
            terms = [self._print(a) for a in _ordered(expr.args)]
            text = terms[0]
            for term in terms[1:]:
                text += f" - {term[1:]}" if term.startswith("-") else f" + {term}"
            return f"({text})"
        if isinstance(expr, sympy.Mul):
            factors = list(_ordered(expr.args))
            if factors[0] == -1:
                rest = sympy.Mul(*factors[1:])
                return f"-{self._print(rest)}"
            return "(" + " * ".join(self._print(a) for a in factors) + ")"
        if isinstance(expr, sympy.Pow):
            base, exponent = expr.args
            if isinstance(exponent, sympy.Integer) and int(exponent) > 0:
                return "(" + " * ".join([self._print(base)] * int(exponent)) + ")"
        if isinstance(expr, sympy.Float):
            return constant(float(expr), torch.float64)
        if isinstance(expr, (IntTrueDiv, FloatTrueDiv)):
            return f"({self._float(expr.args[0])} / {self._float(expr.args[1])})"
        if isinstance(expr, ToFloat):
            return self._float(expr.args[0])
        if isinstance(expr, FloorDiv):
            return f"({self._print(expr.args[0])} // {self._print(expr.args[1])})"
        if isinstance(expr, ModularIndexing):
            x, div, mod = (self._print(a) for a in expr.args)
            inner = x if expr.args[1] == 1 else f"({x} // {div})"
            return f"({inner} % {mod})"
        if isinstance(expr, (sympy.Mod, PythonMod)):
            return f"({self._print(expr.args[0])} % {self._print(expr.args[1])})"
        if isinstance(expr, (sympy.Max, sympy.Min)):
            fn = "tl.maximum" if isinstance(expr, sympy.Max) else "tl.minimum"
            parts = [self._print(a) for a in expr.args]
            text = parts[0]
            for part in parts[1:]:
                text = f"{fn}({text}, {part})"
            return text
        raise UnsupportedKernelError(
            f"index expression {expr} ({type(expr).__name__}) has no Triton form"
        )

    def _float(self, expr: sympy.Basic) -> str:
        """`expr` as a float64 operand: an integer converted (Triton's `/` of integers
        would divide in float32, and a bare literal is weakly typed)."""
        if isinstance(expr, sympy.Number):
            return constant(float(expr), torch.float64)
        if float_valued(expr):
            return self._print(expr)
        return f"({self._print(expr)}).to(tl.float64)"


def _ordered(args: tuple[sympy.Basic, ...]) -> list[sympy.Basic]:
    """Terms in a stable order: constants first for products, last for sums' readers."""
    return sorted(args, key=lambda a: (not a.is_number, sympy.default_sort_key(a)))


def coefficient(expr: sympy.Expr, var: sympy.Symbol) -> sympy.Expr | None:
    """The coefficient of `var` when `expr` is affine in it, else None."""
    expanded = sympy.expand(expr)
    if not expanded.has(var):
        return sympy.Integer(0)
    coeff = expanded.coeff(var)
    rest = sympy.expand(expanded - coeff * var)
    if rest.has(var) or coeff.has(var):
        return None
    return sympy.sympify(coeff)


def upper_bound(expr: sympy.Basic, maxima: Mapping[sympy.Symbol, int]) -> int | None:
    """A bound on |expr| given each loop variable's largest value; None when unknown
    (a size symbol, an indirect value, an unfamiliar function)."""
    if isinstance(expr, sympy.Integer):
        return abs(int(expr))
    if isinstance(expr, sympy.Symbol):
        return maxima.get(expr)
    if isinstance(expr, ModularIndexing):
        return upper_bound(expr.args[2], maxima)
    parts = [upper_bound(a, maxima) for a in expr.args]
    if any(p is None for p in parts):
        return None
    values = [p for p in parts if p is not None]
    if isinstance(expr, sympy.Add):
        return sum(values)
    if isinstance(expr, sympy.Mul):
        return math.prod(values)
    if isinstance(expr, sympy.Pow):
        return int(values[0] ** values[1])
    if isinstance(expr, FloorDiv):
        return values[0]
    if isinstance(expr, (sympy.Mod, PythonMod)):
        return values[1]
    if isinstance(expr, (sympy.Max, sympy.Min)):
        return max(values)
    return None
