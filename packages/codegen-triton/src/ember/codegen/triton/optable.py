"""Every op of the ops protocol (ember.ir.ops) as one line of Triton, in one table.

An entry is a pair of templates: the first for floating-point arguments, the second
for integer and bool arguments (None: that dtype class is unsupported). `{0}`, `{1}`
are the arguments (already-computed values, so no precedence issues), `{T}` the
Triton dtype the result is computed in and `{I}` the signed integer type of the same
width (for bit tests). Math goes through `tl` where Triton has an accurate builtin and
through `libdevice` (triton.language.extra.libdevice, present in Triton 3.6 and 3.9)
for the rest. `ember_*` names are small @triton.jit helpers from ember.codegen.triton.
helpers, emitted into a kernel's source only when it uses them; the special functions
libdevice lacks (i0e, i1e, K0, K1, digamma, polygamma, zeta, Airy Ai, the incomplete
gamma functions, the orthogonal polynomials) are helpers too
(ember.codegen.triton.special and .polynomials).

Ops listed in `UNSUPPORTED` (none at present) raise `UnsupportedKernelError` naming
the op and kernel, so the runtime runs that graph another way.
"""

from __future__ import annotations

import torch

from ember.codegen.triton.special import SPECIAL_OPS

Template = tuple[str | None, str | None]

_FLOAT_ONLY = None

TRITON_OPS: dict[str, Template] = {
    # unary, same dtype in and out
    # a product, not `-x`: Triton 3.6 renders a float's unary minus as 0 - x, which
    # gives +0.0 for x = 0.0 where eager gives -0.0 (and 1 / that, -inf)
    "neg": ("({0} * -1.0)", "-{0}"),
    "abs": ("tl.abs({0})", "tl.abs({0})"),
    "sign": ("tl.where({0} != {0}, {0}, ({0} > 0).to({T}) - ({0} < 0).to({T}))",
             "({0} > 0).to({T}) - ({0} < 0).to({T})"),
    "floor": ("tl.floor({0})", "{0}"),
    "ceil": ("tl.ceil({0})", "{0}"),
    "trunc": ("libdevice.trunc({0})", "{0}"),
    "round": ("libdevice.rint({0})", "{0}"),
    "frac": ("{0} - libdevice.trunc({0})", None),
    "bitwise_not": (None, "~{0}"),
    "relu": ("tl.where({0} < 0, 0, {0}).to({T})", "tl.where({0} < 0, 0, {0}).to({T})"),
    "square": ("{0} * {0}", "{0} * {0}"),
    # unary, floating point
    "exp": ("tl.exp({0})", _FLOAT_ONLY),
    "exp2": ("tl.exp2({0})", None),
    "expm1": ("libdevice.expm1({0})", None),
    "log": ("tl.log({0})", None),
    "log2": ("tl.log2({0})", None),
    "log10": ("libdevice.log10({0})", None),
    "log1p": ("libdevice.log1p({0})", None),
    "sqrt": ("libdevice.sqrt({0})", None),
    "rsqrt": ("libdevice.rsqrt({0})", None),
    "reciprocal": ("1.0 / {0}", None),
    "sin": ("libdevice.sin({0})", None),
    "cos": ("libdevice.cos({0})", None),
    "tan": ("libdevice.tan({0})", None),
    "asin": ("libdevice.asin({0})", None),
    "acos": ("libdevice.acos({0})", None),
    "atan": ("libdevice.atan({0})", None),
    "sinh": ("libdevice.sinh({0})", None),
    "cosh": ("libdevice.cosh({0})", None),
    "tanh": ("libdevice.tanh({0})", None),
    "asinh": ("libdevice.asinh({0})", None),
    "acosh": ("libdevice.acosh({0})", None),
    "atanh": ("libdevice.atanh({0})", None),
    "sigmoid": ("1.0 / (1.0 + tl.exp(-{0}))", None),
    "erf": ("libdevice.erf({0})", None),
    "erfc": ("libdevice.erfc({0})", None),
    "erfinv": ("libdevice.erfinv({0})", None),
    "lgamma": ("libdevice.lgamma({0})", None),
    "i0": ("libdevice.cyl_bessel_i0({0})", None),
    "special_i1": ("libdevice.cyl_bessel_i1({0})", None),
    "special_ndtri": ("libdevice.normcdfinv({0})", None),
    "special_erfcx": ("libdevice.erfcx({0})", None),
    "special_bessel_j0": ("libdevice.j0({0})", None),
    "special_bessel_j1": ("libdevice.j1({0})", None),
    "special_bessel_y0": ("libdevice.y0({0})", None),
    "special_bessel_y1": ("libdevice.y1({0})", None),
    "special_modified_bessel_i0": ("libdevice.cyl_bessel_i0({0})", None),
    "special_modified_bessel_i1": ("libdevice.cyl_bessel_i1({0})", None),
    "special_spherical_bessel_j0": ("tl.where({0} == 0, 1.0, libdevice.sin({0}) / {0})", None),
    # unary, bool result
    "isnan": ("{0} != {0}", "{0} != {0}"),
    "isinf": ("tl.abs({0}) == float('inf')", "{0} != {0}"),
    "isfinite": ("tl.abs({0}) < float('inf')", "{0} == {0}"),
    "signbit": ("{0}.to({I}, bitcast=True) < 0", "{0} < 0"),
    "logical_not": ("{0} == 0", "{0} == 0"),
    # binary, same dtype in and out
    "add": ("{0} + {1}", "{0} + {1}"),
    "sub": ("{0} - {1}", "{0} - {1}"),
    "mul": ("{0} * {1}", "{0} * {1}"),
    "truediv": ("{0} / {1}", None),
    "floordiv": ("tl.floor({0} / {1})", "ember_floordiv({0}, {1})"),
    "truncdiv": ("libdevice.trunc({0} / {1})", "ember_truncdiv({0}, {1})"),
    "remainder": ("ember_remainder_float({0}, {1})", "ember_remainder({0}, {1})"),
    "fmod": ("libdevice.fmod({0}, {1})", "ember_fmod({0}, {1})"),
    "pow": ("libdevice.pow({0}, {1})", None),
    "atan2": ("libdevice.atan2({0}, {1})", None),
    "maximum": ("tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", "tl.maximum({0}, {1})"),
    "minimum": ("tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)", "tl.minimum({0}, {1})"),
    # NaN only where both are (C's fmax); Triton 3.6's libdevice.fmax did not compile
    "fmax": (
        "tl.where({0} != {0}, {1}, tl.where({1} != {1}, {0}, tl.maximum({0}, {1})))",
        "tl.maximum({0}, {1})",
    ),
    "fmin": (
        "tl.where({0} != {0}, {1}, tl.where({1} != {1}, {0}, tl.minimum({0}, {1})))",
        "tl.minimum({0}, {1})",
    ),
    "copysign": ("libdevice.copysign({0}, {1})", None),
    "hypot": ("libdevice.hypot({0}, {1})", None),
    "nextafter": ("libdevice.nextafter({0}, {1})", None),
    "bitwise_and": (None, "{0} & {1}"),
    "bitwise_or": (None, "{0} | {1}"),
    "bitwise_xor": (None, "{0} ^ {1}"),
    "bitwise_left_shift": (None, "{0} << {1}"),
    "bitwise_right_shift": (None, "{0} >> {1}"),
    # binary, bool result
    "eq": ("{0} == {1}", "{0} == {1}"),
    "ne": ("{0} != {1}", "{0} != {1}"),
    "lt": ("{0} < {1}", "{0} < {1}"),
    "le": ("{0} <= {1}", "{0} <= {1}"),
    "gt": ("{0} > {1}", "{0} > {1}"),
    "ge": ("{0} >= {1}", "{0} >= {1}"),
    "logical_and": ("({0} != 0) & ({1} != 0)", "({0} != 0) & ({1} != 0)"),
    "logical_or": ("({0} != 0) | ({1} != 0)", "({0} != 0) | ({1} != 0)"),
    "logical_xor": ("({0} != 0) ^ ({1} != 0)", "({0} != 0) ^ ({1} != 0)"),
}  # fmt: skip

# Ops with no accurate Triton/libdevice form yet: the graph runs another way. Empty
# now: the incomplete gamma functions, the last ones, are helpers (special.py).
UNSUPPORTED: dict[str, str] = {}

# Ops the codegen renders whose kernels do not match eager on the GPU yet: the
# runtime's CUDA record lists them as unsupported, so lowering declines them and the
# graph runs them another way. Empty now: zeta, Airy Ai and the orthogonal polynomials
# left it once they followed eager's CUDA kernels (NaN degrees as INT64_MIN, zeta
# summed in float32 for float32, eager's stopping point and correctly rounded
# division, square root and exp, subnormals kept), checked against eager on an H200
# (2026-11-24) by test_triton_special_functions.py; polygamma followed once that
# test's bfloat16 bound (float32's rounding where the sum cancels, near its zeros at
# negative x) passed on an H100 (2026-11-24). A special function added later enters
# here until its GPU test passes. The incomplete gamma functions left it once their
# float32 and float64 cases passed on an H100 (2026-11-25): their bfloat16 case had
# failed because eager's CUDA kernels take no bfloat16, and a graph eager refuses now
# raises eager's error compiled too (ember.runtime.dtype_gaps).
UNVERIFIED: dict[str, str] = {}

TRITON_OPS.update({name: (template, None) for name, template in SPECIAL_OPS.items()})

_INT_TYPES = {8: "tl.int8", 16: "tl.int16", 32: "tl.int32", 64: "tl.int64"}


def op_template(name: str, dtype: torch.dtype) -> str:
    """The template for op `name` over arguments of `dtype`; KeyError/ValueError with
    the reason when it has none."""
    if name in UNSUPPORTED:
        raise ValueError(UNSUPPORTED[name])
    floating, integral = TRITON_OPS[name]
    template = floating if dtype.is_floating_point else integral
    if template is None:
        kind = "floating-point" if dtype.is_floating_point else "integer or bool"
        raise ValueError(f"not defined for {kind} arguments ({dtype})")
    return template


def bits_type(register: str) -> str:
    """The signed integer Triton type with the width of float type `register`."""
    width = {"tl.float64": 64, "tl.float32": 32, "tl.float16": 16, "tl.bfloat16": 16}[register]
    return _INT_TYPES[width]
