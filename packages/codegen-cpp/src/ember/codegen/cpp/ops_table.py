"""The ops table: each op of the ops protocol (ember.ir.ops.OpsHandler) as one line of C++.

`{0}` and `{1}` are the arguments, always named temporaries of the op's argument type,
so the type-generic helpers of the prelude (`ember::maximum`, `ember::floordiv`, ...)
deduce one type. Ops whose torch semantics differ between integers and floats go
through those helpers. The special functions with no standard-library counterpart
(Bessel functions, digamma, zeta, ...) call ember's own (ember.codegen.cpp.special),
which `render_kernels` adds to a translation unit that uses them. An op with no C++
(`UNSUPPORTED_OPS`, none at present) is refused with a `CppRenderError`, and the
runtime falls back to eager for that graph.
"""

from __future__ import annotations

from ember.codegen.cpp.errors import CppRenderError
from ember.codegen.cpp.special import op_format as special_op_format

OP_FORMATS: dict[str, str] = {
    # unary, same dtype in and out
    "neg": "-{0}",
    "abs": "ember::abs({0})",
    "sign": "ember::sign({0})",
    "floor": "ember::floor({0})",
    "ceil": "ember::ceil({0})",
    "trunc": "ember::trunc({0})",
    "round": "ember::round({0})",
    "frac": "ember::frac({0})",
    "bitwise_not": "ember::bitwise_not({0})",
    "relu": "ember::relu({0})",
    "square": "{0} * {0}",
    # unary, floating point
    "exp": "ember::exp({0})",
    "exp2": "std::exp2({0})",
    "expm1": "std::expm1({0})",
    "log": "ember::log({0})",
    "log2": "std::log2({0})",
    "log10": "std::log10({0})",
    "log1p": "std::log1p({0})",
    "sqrt": "std::sqrt({0})",
    "rsqrt": "1 / std::sqrt({0})",
    "reciprocal": "1 / {0}",
    "sin": "std::sin({0})",
    "cos": "std::cos({0})",
    "tan": "std::tan({0})",
    "asin": "std::asin({0})",
    "acos": "std::acos({0})",
    "atan": "std::atan({0})",
    "sinh": "std::sinh({0})",
    "cosh": "std::cosh({0})",
    "tanh": "ember::tanh({0})",
    "asinh": "std::asinh({0})",
    "acosh": "std::acosh({0})",
    "atanh": "std::atanh({0})",
    "sigmoid": "ember::sigmoid({0})",
    "erf": "ember::erf({0})",
    "erfc": "std::erfc({0})",
    "erfinv": "ember::erfinv({0})",
    "lgamma": "std::lgamma({0})",
    # unary, bool result
    "isnan": "std::isnan({0})",
    "isinf": "std::isinf({0})",
    "isfinite": "std::isfinite({0})",
    "signbit": "ember::signbit({0})",
    "logical_not": "!{0}",
    # binary, same dtype in and out
    "add": "{0} + {1}",
    "sub": "{0} - {1}",
    "mul": "{0} * {1}",
    "truediv": "{0} / {1}",
    "floordiv": "ember::floordiv({0}, {1})",
    "truncdiv": "ember::truncdiv({0}, {1})",
    "remainder": "ember::remainder({0}, {1})",
    "fmod": "ember::fmod({0}, {1})",
    "pow": "ember::pow({0}, {1})",
    "atan2": "std::atan2({0}, {1})",
    "maximum": "ember::maximum({0}, {1})",
    "minimum": "ember::minimum({0}, {1})",
    "fmax": "ember::fmax({0}, {1})",
    "fmin": "ember::fmin({0}, {1})",
    "copysign": "std::copysign({0}, {1})",
    "hypot": "std::hypot({0}, {1})",
    "nextafter": "std::nextafter({0}, {1})",
    "bitwise_and": "{0} & {1}",
    "bitwise_or": "{0} | {1}",
    "bitwise_xor": "{0} ^ {1}",
    "bitwise_left_shift": "ember::shift_left({0}, {1})",
    "bitwise_right_shift": "ember::shift_right({0}, {1})",
    # binary, bool result
    "eq": "{0} == {1}",
    "ne": "{0} != {1}",
    "lt": "{0} < {1}",
    "le": "{0} <= {1}",
    "gt": "{0} > {1}",
    "ge": "{0} >= {1}",
    "logical_and": "{0} && {1}",
    "logical_or": "{0} || {1}",
    "logical_xor": "bool({0}) != bool({1})",
}

# Ops with no C++ here, and why (the runtime runs graphs using them eagerly). The
# special functions are all in ember.codegen.cpp.special now.
UNSUPPORTED_OPS: dict[str, str] = {}


def render_op(name: str, args: list[str], kernel: str, member: str | None = None) -> str:
    """The C++ expression of op `name` over argument temporaries `args`."""
    template = OP_FORMATS.get(name) or special_op_format(name)
    if template is None:
        why = UNSUPPORTED_OPS.get(name, "an op the C++ codegen does not know")
        raise CppRenderError(f"op {name!r} ({why})", kernel, member)
    return template.format(*args)
