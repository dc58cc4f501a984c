"""Special functions as @triton.jit helpers, for the ops libdevice lacks or gets wrong
for eager's purposes: the exponentially scaled modified Bessel functions i0e and i1e
(exp(-|x|) * i0(x) overflows in float32 above 88), K0 and K1 and their scaled forms,
digamma, trigamma and polygamma, the Hurwitz zeta function and the Airy function Ai
(the orthogonal polynomials are in ember.codegen.triton.polynomials).

They follow eager's approximations (Cephes' Chebyshev series, whose coefficients are in
ember.ir.special_tables; the series are unrolled into straight-line Clenshaw
recurrences generated here) in the precision of their argument, with eager's special
cases (K at 0 is infinite and NaN below; digamma is infinite at +-0 with the opposite
sign and NaN at the negative integers). Branches are evaluated on the whole block and
selected with `tl.where`, so every lane runs the same code. The two series whose
length depends on the argument (zeta's direct sum, Ai's Maclaurin series) loop while
any lane of the block still needs a term, lanes that are done keeping their values.

They run where eager's CUDA kernels run, so they follow those where eager's devices
differ: the Hurwitz zeta function (and so polygamma from order 2) is summed in the
precision of its argument, float32 for float32 and bfloat16 values, as eager's CUDA
kernels sum it (eager on the CPU, and the C++ rendering, sum float32 in float64). In
float32 that sum is 0 where every term underflows and its Euler-Maclaurin factor then
overflows to NaN, and it loses digits where the terms cancel (a negative q); eager's
GPU values have the same error. Where precision matters they call libdevice's
correctly rounded or accurate functions (`div_rn`, `sqrt_rn`, `exp`), as eager's
compiled C++ does, not Triton's approximate `tl.exp`; kernels using them compile with
libdevice's subnormals kept (`FULL_RANGE_HELPERS`), as eager's do.
"""

from __future__ import annotations

from ember.codegen.triton.polynomials import POLYNOMIAL_CALLS, POLYNOMIAL_HELPERS, POLYNOMIAL_OPS
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


def _zeta_tail() -> str:
    """The Euler-Maclaurin correction of the Hurwitz zeta sum, unrolled over its twelve
    terms: lanes in `tail` add terms until one falls below double's epsilon relative to
    the sum (then keep it). A NaN ratio (0 / 0 where the sum underflowed) does not stop
    a lane, as it does not stop eager's loop: in float32 the factor then overflows and
    the sum turns NaN there, as eager's does on the GPU."""
    lines = ["@triton.jit", "def ember_zeta_tail(x, s, b, w, tail):"]
    lines += ["    factor = tl.zeros_like(x) + 1.0", "    k = tl.zeros_like(x)"]
    for divisor in special_tables.ZETA_EULER_MACLAURIN:
        lines += [
            "    factor = factor * (x + k)",
            "    b = ember_div(b, w)",
            f"    t = ember_div(factor * b, {divisor!r})",
            "    s = tl.where(tail, s + t, s)",
            "    tail = tail & ((tl.abs(ember_div(t, s)) < 1.11022302462515654042e-16) == 0)",
            "    k = k + 1.0",
            "    factor = factor * (x + k)",
            "    b = ember_div(b, w)",
            "    k = k + 1.0",
        ]
    lines.append("    return s")
    return "\n" + "\n".join(lines) + "\n"


_TABLES = ["I0_SMALL", "I0_LARGE", "I1_SMALL", "I1_LARGE", "K0_SMALL", "K0_LARGE", "K1_SMALL"]
_TABLES += ["K1_LARGE"]
_AIRY_TABLES = ["AIRY_DECAY_P", "AIRY_DECAY_Q", "AIRY_OSC_F_P", "AIRY_OSC_F_Q", "AIRY_OSC_G_P"]
_AIRY_TABLES += ["AIRY_OSC_G_Q"]

SPECIAL_HELPERS: dict[str, str] = {
    **{f"ember_cheb_{t.lower()}": _clenshaw(t) for t in _TABLES},
    "ember_poly_digamma_asymptotic": _horner("DIGAMMA_ASYMPTOTIC"),
    **{f"ember_poly_{t.lower()}": _horner(t) for t in _AIRY_TABLES},
    "ember_zeta_tail": _zeta_tail(),
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
    # eager's GPU steps in eager's order: below 0 the reflection, -pi / tan(pi r) (r:
    # v's fraction, which tan takes more accurately than pi v) in float64, then
    # digamma(1 - v); digamma(x) = digamma(x + 1) - 1/x up to 10 (at most 10 steps from
    # x > 0), then log(x) - 1/(2x) - the asymptotic series, plus the steps' sum
    whole = libdevice.trunc(v)
    negative = v < 0
    fraction = (v - whole).to(tl.float64)
    cotangent = 3.141592653589793 / libdevice.tan(3.141592653589793 * fraction)
    total = tl.where(negative, (cotangent * -1.0).to(v.dtype), 0.0)
    x = tl.where(negative, 1.0 - v, v)
    for _ in tl.static_range(10):
        below = x < 10.0
        total = total - tl.where(below, ember_div(1.0, x), 0.0)
        x = tl.where(below, x + 1.0, x)
    z = ember_div(1.0, x * x)
    tail = tl.where(x < 1e17, z * ember_poly_digamma_asymptotic(z), 0.0)
    large = libdevice.log(x) - ember_div(0.5, x) - tail + total
    out = tl.where(x == 10.0, total + 2.25175258906672110764, large)
    out = tl.where(negative & (v == whole), float("nan"), out)
    # -inf at +0.0, +inf at -0.0 (negating the infinity: Triton 3.6 negates a float as
    # 0 - x, which loses the sign of a zero)
    infinite = libdevice.copysign(tl.zeros_like(v) + float("inf"), v) * -1.0
    return tl.where(v == 0, infinite, out)
""",
    "ember_div": """
@triton.jit
def ember_div(a, b):
    # a / b correctly rounded, as eager's compiled division is: Triton's float32 `/`
    # is div.full's approximation (2 ulp) on NVIDIA GPUs, its float64 `/` is exact
    q = a / b
    if q.dtype == tl.float32:
        q = tl.div_rn(a, b)
    return q
""",
    "ember_sqrt": """
@triton.jit
def ember_sqrt(x):
    # the correctly rounded square root: libdevice's float32 sqrt compiles to
    # sqrt.approx under Triton's options
    if x.dtype == tl.float32:
        out = tl.sqrt_rn(x)
    else:
        out = libdevice.sqrt(x)
    return out
""",
    "ember_any": """
@triton.jit
def ember_any(mask):
    # whether any lane of the block is set (the condition of a loop run per block); the
    # mask gets a dimension first: a 0-d value (a kernel over one element) is no block
    # to Triton 3.6's reductions
    lanes = mask.to(tl.int32) + tl.zeros([1], tl.int32)
    return tl.max(lanes, axis=None) > 0
""",
    "ember_hurwitz_zeta": """
@triton.jit
def ember_hurwitz_zeta(x, q):
    # zeta(x, q) = sum_k (k + q)^-x in x's precision: the direct sum until a term falls
    # below double's epsilon relative to the sum, or past 9 terms and q + k > 9, then
    # the Euler-Maclaurin tail; +inf at x = 1 and at the integers q <= 0, NaN for x < 1
    # and for q < 0 with x not an integer
    x, q = tl.broadcast(x, q)
    eps = 1.11022302462515654042e-16
    pole = (q <= 0.0) & (q == tl.floor(q))
    edge = (x == 1.0) | (x < 1.0) | pole | ((q <= 0.0) & (x != tl.floor(x)))
    qs = tl.where(edge, 1.0, q)
    s = libdevice.pow(qs, x * -1.0)
    a = qs
    b = tl.zeros_like(qs)
    summing = edge == 0
    tail = summing
    i = 0
    go = ember_any(summing)
    while go:
        i += 1
        a = tl.where(summing, a + 1.0, a)
        term = libdevice.pow(a, x * -1.0)
        b = tl.where(summing, term, b)
        s = tl.where(summing, s + term, s)
        converged = summing & (eps * s * -1.0 < term) & (term < eps * s)
        tail = tail & (converged == 0)
        summing = summing & (converged == 0) & ((i < 9) | (a <= 9.0))
        go = ember_any(summing)
    w = a
    s = tl.where(tail, s + ember_div(b * w, x - 1.0), s)
    s = tl.where(tail, s - 0.5 * b, s)
    s = ember_zeta_tail(x, s, b, w, tail)
    out = tl.where((q <= 0.0) & (x != tl.floor(x)), float("nan"), s)
    out = tl.where(pole, float("inf"), out)
    out = tl.where(x < 1.0, float("nan"), out)
    return tl.where(x == 1.0, float("inf"), out)
""",
    "ember_trigamma": """
@triton.jit
def ember_trigamma(v):
    # below 1/2 the reflection trigamma(1 - x) + trigamma(x) = pi^2 / sin^2(pi x); then
    # six steps of trigamma(x) = trigamma(x + 1) + 1/x^2 and the asymptotic series
    low = v < 0.5
    pi = tl.zeros_like(v) + 3.141592653589793
    s = libdevice.sin(pi * v)
    total = tl.where(low, 0.0 - ember_div(pi * pi, s * s), tl.zeros_like(v))
    x = tl.where(low, 1.0 - v, v)
    for _ in tl.static_range(6):
        total = total + ember_div(1.0, x * x)
        x = x + 1.0
    z = ember_div(1.0, x * x)
    tail = z * (0.16666666666666666 - z * (0.03333333333333333 - z * 0.023809523809523808))
    total = total + ember_div(1.0 + ember_div(1.0, 2.0 * x) + tail, x)
    return tl.where(low, total * -1.0, total)
""",
    "ember_polygamma": """
@triton.jit
def ember_polygamma(n, x):
    # the n-th derivative of digamma (n the same for the whole kernel): digamma, trigamma,
    # then (-1)^(n+1) n! zeta(n + 1, x), all in x's precision (float32 for bfloat16,
    # rounded once when stored, as eager's GPU kernel computes it)
    if n == 0:
        out = ember_digamma(x)
    elif n == 1:
        out = ember_trigamma(x)
    else:
        order = (n + tl.zeros_like(x).to(tl.int64))
        factorial = libdevice.exp(libdevice.lgamma(order.to(x.dtype) + 1.0))
        sign = tl.where((order & 1) == 1, 1.0, -1.0)
        out = sign * factorial * ember_hurwitz_zeta((order + 1).to(x.dtype), x)
    return out
""",
    "ember_airy_series": """
@triton.jit
def ember_airy_series(x):
    # Ai by its Maclaurin series: the two solutions f and g, terms in x^3, until the
    # last term of f is below double's epsilon relative to f, in float32 too (eager's
    # stopping point: stopping at float32's epsilon loses the digits that the
    # cancellation of f and g near |x| = 2 needs)
    f = tl.zeros_like(x) + 1.0
    g = x
    m = tl.zeros_like(x) + 1.0
    n = x
    k = tl.zeros_like(x) + 1.0
    z = x * x * x
    active = x == x
    go = ember_any(active)
    while go:
        m = tl.where(active, m * z, m)
        k = tl.where(active, k + 1.0, k)
        m = tl.where(active, ember_div(m, k), m)
        n = tl.where(active, n * z, n)
        k = tl.where(active, k + 1.0, k)
        n = tl.where(active, ember_div(n, k), n)
        m = tl.where(active, ember_div(m, k), m)
        f = tl.where(active, f + m, f)
        k = tl.where(active, k + 1.0, k)
        n = tl.where(active, ember_div(n, k), n)
        g = tl.where(active, g + n, g)
        active = active & (tl.abs(ember_div(m, f)) > 1.11022302462515654042e-16)
        go = ember_any(active)
    return 0.355028053887817239260 * f - 0.258819403792806798405 * g
""",
    "ember_airy_ai": """
@triton.jit
def ember_airy_ai(x):
    # oscillating below -2.09 (f and g rational in 1/zeta^2, zeta = 2/3 |x|^1.5),
    # decaying from 2.09 (exp(-zeta) times a rational function of 1/zeta), the
    # Maclaurin series between; 0 above 103.892, NaN at the infinities. The operations
    # and their order are eager's, exp libdevice's accurate one (tl.exp's approximate
    # exp2 is 1e-5 off at zeta = 88)
    oscillating = x < -2.09
    decaying = x >= 2.09
    series = (oscillating == 0) & (decaying == 0)
    xo = tl.where(oscillating, x, -3.0)
    zeta = ember_div(-2.0 * xo * ember_sqrt(0.0 - xo), 3.0)
    z = ember_div(1.0, zeta)
    zz = z * z
    f = ember_div(zz * ember_poly_airy_osc_f_p(zz), ember_poly_airy_osc_f_q(zz))
    g = ember_div(z * ember_poly_airy_osc_g_p(zz), ember_poly_airy_osc_g_q(zz))
    t = zeta + 0.7853981633974483
    wave = libdevice.sin(t) * (1.0 + f) - libdevice.cos(t) * g
    wave = ember_div(0.564189583547756286948, ember_sqrt(ember_sqrt(0.0 - xo))) * wave
    xd = tl.where(decaying, x, 3.0)
    zeta_d = ember_div(2.0 * xd * ember_sqrt(xd), 3.0)
    u = ember_div(1.0, zeta_d)
    r = ember_div(ember_poly_airy_decay_p(u), ember_poly_airy_decay_q(u))
    decay = ember_div(
        0.564189583547756286948 * r,
        2.0 * ember_sqrt(ember_sqrt(xd)) * libdevice.exp(zeta_d),
    )
    near = ember_airy_series(tl.where(series, x, 0.0))
    out = tl.where(oscillating, wave, tl.where(decaying, decay, near))
    out = tl.where(x > 103.892, 0.0, out)
    return tl.where(tl.abs(x) == float("inf"), float("nan"), out)
""",
    **POLYNOMIAL_HELPERS,
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
    "ember_digamma": ("ember_poly_digamma_asymptotic", "ember_div"),
    "ember_zeta_tail": ("ember_div",),
    "ember_hurwitz_zeta": ("ember_any", "ember_div", "ember_zeta_tail"),
    "ember_trigamma": ("ember_div",),
    "ember_polygamma": ("ember_digamma", "ember_trigamma", "ember_hurwitz_zeta"),
    "ember_airy_series": ("ember_any", "ember_div"),
    "ember_airy_ai": (
        *(f"ember_poly_{t.lower()}" for t in _AIRY_TABLES),
        "ember_airy_series",
        "ember_div",
        "ember_sqrt",
    ),
    **POLYNOMIAL_CALLS,
}

# Helpers whose kernels compile with libdevice's subnormals kept (kernel.py's
# FULL_RANGE_OPTIONS): their float32 results depend on subnormal values as eager's do
# (a zeta term of 1e-42 keeps the sum finite where 0 would make it NaN).
FULL_RANGE_HELPERS: frozenset[str] = frozenset(
    {"ember_hurwitz_zeta", "ember_polygamma", "ember_airy_ai"}
)

# op of the ops protocol -> its floating-point template
SPECIAL_OPS: dict[str, str] = {
    "special_i0e": "ember_i0e({0})",
    "special_i1e": "ember_i1e({0})",
    "special_modified_bessel_k0": "ember_k0({0})",
    "special_modified_bessel_k1": "ember_k1({0})",
    "special_scaled_modified_bessel_k0": "ember_k0e({0})",
    "special_scaled_modified_bessel_k1": "ember_k1e({0})",
    "digamma": "ember_digamma({0})",
    "polygamma": "ember_polygamma({0}, {1})",
    "special_zeta": "ember_hurwitz_zeta({0}, {1})",
    "special_airy_ai": "ember_airy_ai({0})",
    **POLYNOMIAL_OPS,
}
