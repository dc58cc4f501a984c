"""Special functions as @triton.jit helpers, for the ops libdevice lacks or gets wrong
for eager's purposes: the exponentially scaled modified Bessel functions i0e and i1e
(exp(-|x|) * i0(x) overflows in float32 above 88), K0 and K1 and their scaled forms,
and digamma.

They follow eager's approximations (Cephes' Chebyshev series, whose coefficients are in
ember.ir.special_tables; the series are unrolled into straight-line Clenshaw
recurrences generated here) in the precision of their argument, with eager's special
cases (K at 0 is infinite and NaN below; digamma is infinite at +-0 with the opposite
sign and NaN at the negative integers). Branches are evaluated on the whole block and
selected with `tl.where`, so every lane runs the same code.
"""

from __future__ import annotations

from ember.ir import special_tables


def _clenshaw(table: str) -> str:
    """A helper summing the Chebyshev series `table` at t: (b0 - b2) / 2."""
    coefficients: tuple[float, ...] = getattr(special_tables, table)
    lines = ["@triton.jit", f"def ember_cheb_{table.lower()}(t):"]
    lines += [f"    b0 = tl.zeros_like(t) + {coefficients[0]!r}", "    b1 = tl.zeros_like(t)"]
    lines.append("    b2 = tl.zeros_like(t)")
    for c in coefficients[1:]:
        lines += ["    b2 = b1", "    b1 = b0", f"    b0 = t * b1 - b2 + {c!r}"]
    lines.append("    return 0.5 * (b0 - b2)")
    return "\n" + "\n".join(lines) + "\n"


def _horner(table: str) -> str:
    """A helper evaluating the polynomial `table` (highest power first) at x."""
    coefficients: tuple[float, ...] = getattr(special_tables, table)
    lines = ["@triton.jit", f"def ember_poly_{table.lower()}(x):"]
    lines.append(f"    r = tl.zeros_like(x) + {coefficients[0]!r}")
    lines += [f"    r = r * x + {c!r}" for c in coefficients[1:]]
    lines.append("    return r")
    return "\n" + "\n".join(lines) + "\n"


_TABLES = ["I0_SMALL", "I0_LARGE", "I1_SMALL", "I1_LARGE", "K0_SMALL", "K0_LARGE", "K1_SMALL"]
_TABLES += ["K1_LARGE"]

SPECIAL_HELPERS: dict[str, str] = {
    **{f"ember_cheb_{t.lower()}": _clenshaw(t) for t in _TABLES},
    "ember_poly_digamma_asymptotic": _horner("DIGAMMA_ASYMPTOTIC"),
    "ember_i0e": """
@triton.jit
def ember_i0e(v):
    x = tl.abs(v)
    small = ember_cheb_i0_small(x / 2.0 - 2.0)
    large = ember_cheb_i0_large(32.0 / x - 2.0) / libdevice.sqrt(x)
    return tl.where(x <= 8.0, small, large)
""",
    "ember_i1e": """
@triton.jit
def ember_i1e(v):
    x = tl.abs(v)
    small = ember_cheb_i1_small(x / 2.0 - 2.0) * x
    large = ember_cheb_i1_large(32.0 / x - 2.0) / libdevice.sqrt(x)
    out = tl.where(x <= 8.0, small, large)
    return tl.where(v < 0, -out, out)
""",
    "ember_k_edges": """
@triton.jit
def ember_k_edges(x, value):
    # K0, K1 and their scaled forms: infinite at 0, NaN for negative x
    value = tl.where(x == 0, float("inf"), value)
    return tl.where(x < 0, float("nan"), value)
""",
    "ember_k0_small": """
@triton.jit
def ember_k0_small(x):
    i0 = tl.exp(tl.abs(x)) * ember_i0e(x)
    return ember_cheb_k0_small(x * x - 2.0) - tl.log(0.5 * x) * i0
""",
    "ember_k1_small": """
@triton.jit
def ember_k1_small(x):
    i1 = tl.exp(tl.abs(x)) * ember_i1e(x)
    return tl.log(0.5 * x) * i1 + ember_cheb_k1_small(x * x - 2.0) / x
""",
    "ember_k0": """
@triton.jit
def ember_k0(x):
    large = tl.exp(-x) * ember_cheb_k0_large(8.0 / x - 2.0) / libdevice.sqrt(x)
    return ember_k_edges(x, tl.where(x <= 2.0, ember_k0_small(x), large))
""",
    "ember_k1": """
@triton.jit
def ember_k1(x):
    large = tl.exp(-x) * ember_cheb_k1_large(8.0 / x - 2.0) / libdevice.sqrt(x)
    return ember_k_edges(x, tl.where(x <= 2.0, ember_k1_small(x), large))
""",
    "ember_k0e": """
@triton.jit
def ember_k0e(x):
    large = ember_cheb_k0_large(8.0 / x - 2.0) / libdevice.sqrt(x)
    return ember_k_edges(x, tl.where(x <= 2.0, ember_k0_small(x) * tl.exp(x), large))
""",
    "ember_k1e": """
@triton.jit
def ember_k1e(x):
    large = ember_cheb_k1_large(8.0 / x - 2.0) / libdevice.sqrt(x)
    return ember_k_edges(x, tl.where(x <= 2.0, ember_k1_small(x) * tl.exp(x), large))
""",
    "ember_digamma": """
@triton.jit
def ember_digamma(v):
    # digamma(v) = digamma(1 - v) - pi / tan(pi r) below 0 (r: v's fraction, which
    # tan takes more accurately than pi v); then digamma(x) = digamma(x + 1) - 1/x up to
    # 10 (at most 10 steps from x > 0), then the asymptotic series
    whole = libdevice.trunc(v)
    negative = v < 0
    cotangent = 3.141592653589793 / libdevice.tan(3.141592653589793 * (v - whole))
    reflection = tl.where(negative, cotangent, 0.0)
    x = tl.where(negative, 1.0 - v, v)
    total = tl.zeros_like(x)
    for _ in tl.static_range(10):
        below = x < 10.0
        total = total - tl.where(below, 1.0 / x, 0.0)
        x = tl.where(below, x + 1.0, x)
    z = 1.0 / (x * x)
    tail = tl.where(x < 1e17, z * ember_poly_digamma_asymptotic(z), 0.0)
    out = tl.where(x == 10.0, total + 2.25175258906672110764, total + tl.log(x) - 0.5 / x - tail)
    out = out - reflection
    out = tl.where(negative & (v == whole), float("nan"), out)
    # -inf at +0.0, +inf at -0.0 (negating the infinity: Triton 3.6 negates a float as
    # 0 - x, which loses the sign of a zero)
    infinite = libdevice.copysign(tl.zeros_like(v) + float("inf"), v) * -1.0
    return tl.where(v == 0, infinite, out)
""",
}

SPECIAL_CALLS: dict[str, tuple[str, ...]] = {
    "ember_i0e": ("ember_cheb_i0_small", "ember_cheb_i0_large"),
    "ember_i1e": ("ember_cheb_i1_small", "ember_cheb_i1_large"),
    "ember_k0_small": ("ember_i0e", "ember_cheb_k0_small"),
    "ember_k1_small": ("ember_i1e", "ember_cheb_k1_small"),
    "ember_k0": ("ember_k0_small", "ember_cheb_k0_large", "ember_k_edges"),
    "ember_k1": ("ember_k1_small", "ember_cheb_k1_large", "ember_k_edges"),
    "ember_k0e": ("ember_k0_small", "ember_cheb_k0_large", "ember_k_edges"),
    "ember_k1e": ("ember_k1_small", "ember_cheb_k1_large", "ember_k_edges"),
    "ember_digamma": ("ember_poly_digamma_asymptotic",),
}

# op of the ops protocol -> its floating-point template
SPECIAL_OPS: dict[str, str] = {
    "special_i0e": "ember_i0e({0})",
    "special_i1e": "ember_i1e({0})",
    "special_modified_bessel_k0": "ember_k0({0})",
    "special_modified_bessel_k1": "ember_k1({0})",
    "special_scaled_modified_bessel_k0": "ember_k0e({0})",
    "special_scaled_modified_bessel_k1": "ember_k1e({0})",
    "digamma": "ember_digamma({0})",
}
