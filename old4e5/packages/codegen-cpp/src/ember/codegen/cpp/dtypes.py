"""How torch dtypes live in C++: the storage type behind a pointer, the type values are
computed in, and literals.

Half types (bfloat16, float16) are stored as `uint16_t` bits and computed in `float`;
loads convert up, stores round to nearest even (the prelude's converters). `bool` is
stored as `uint8_t` and computed as `bool`. Everything else maps to its natural type.
"""

from __future__ import annotations

import math

import torch

from ember.codegen.cpp.errors import CppRenderError

_STORAGE: dict[torch.dtype, str] = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "uint16_t",
    torch.bfloat16: "uint16_t",
    torch.bool: "uint8_t",
    torch.int8: "int8_t",
    torch.uint8: "uint8_t",
    torch.int16: "int16_t",
    torch.int32: "int32_t",
    torch.int64: "int64_t",
    torch.uint16: "uint16_t",
    torch.uint32: "uint32_t",
    torch.uint64: "uint64_t",
}

HALF_TYPES: dict[torch.dtype, str] = {torch.bfloat16: "bf16", torch.float16: "half"}


def _check(dtype: torch.dtype, kernel: str) -> None:
    if dtype not in _STORAGE:
        raise CppRenderError(f"dtype {dtype}", kernel)


def storage_type(dtype: torch.dtype, kernel: str = "?") -> str:
    """The C++ element type of a buffer of `dtype`."""
    _check(dtype, kernel)
    return _STORAGE[dtype]


def compute_type(dtype: torch.dtype, kernel: str = "?") -> str:
    """The C++ type a value of `dtype` is computed in."""
    _check(dtype, kernel)
    if dtype in HALF_TYPES:
        return "float"
    if dtype == torch.bool:
        return "bool"
    return _STORAGE[dtype]


def load_value(dtype: torch.dtype, element: str) -> str:
    """C++ for the computed value of a stored element."""
    if dtype in HALF_TYPES:
        return f"ember::{HALF_TYPES[dtype]}_to_float({element})"
    if dtype == torch.bool:
        return f"({element} != 0)"
    return element


def store_value(dtype: torch.dtype, value: str) -> str:
    """C++ for the stored bits of a computed value."""
    if dtype in HALF_TYPES:
        return f"ember::float_to_{HALF_TYPES[dtype]}({value})"
    if dtype == torch.bool:
        return f"static_cast<uint8_t>({value})"
    return value


def round_to(dtype: torch.dtype, value: str) -> str:
    """A float computed for a half-typed node, rounded to that type's precision (as
    torch rounds the result of every half op)."""
    if dtype in HALF_TYPES:
        return f"ember::round_{HALF_TYPES[dtype]}({value})"
    return value


def literal(value: bool | int | float, dtype: torch.dtype, kernel: str = "?") -> str:
    """A C++ literal of `value` in the compute type of `dtype`."""
    ctype = compute_type(dtype, kernel)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        number = float(value)
        if math.isnan(number):
            return f"std::numeric_limits<{ctype}>::quiet_NaN()"
        if math.isinf(number):
            sign = "-" if number < 0 else ""
            return f"{sign}std::numeric_limits<{ctype}>::infinity()"
        text = repr(number)
        if "e" not in text and "." not in text:
            text += ".0"
        return f"{text}f" if ctype == "float" else text
    return int_literal(int(value), ctype)


def int_literal(value: int, ctype: str = "int64_t") -> str:
    if value == -(2**63):
        return f"static_cast<{ctype}>(-9223372036854775807LL - 1)"
    if ctype == "int64_t" and not -(2**31) <= value < 2**31:
        return f"{value}LL"
    if ctype in ("uint64_t", "uint32_t") and value >= 2**31:
        return f"{value}ULL"
    return str(value) if ctype in ("int64_t", "int32_t") else f"static_cast<{ctype}>({value})"
