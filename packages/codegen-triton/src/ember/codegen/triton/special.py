"""Special functions as @triton.jit helpers, for the ops libdevice lacks or gets wrong
for eager's purposes: the exponentially scaled modified Bessel functions i0e and i1e
(exp(-|x|) * i0(x) overflows in float32 above 88), K0 and K1 and their scaled forms,
digamma, trigamma and polygamma, the Hurwitz zeta function, the Airy function Ai and
the regularized incomplete gamma functions (the orthogonal polynomials are in
ember.codegen.triton.polynomials).

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

The incomplete gamma functions P(a, x) (igamma) and Q(a, x) = 1 - P (igammac) are
the exception: they take the C++ rendering's algorithm (ember.codegen.cpp.special),
in float64 whatever the dtype, rounded once: the power series of P, the continued
fraction of Q (modified Lentz) and the series of Q for small x, each lane in the
region eager picks for it, then eager's values where a or x is zero, negative,
infinite or NaN. Each series is a loop per block over the lanes in its region (at
most 20000, 19999 and 1999 steps, as in C++). Computed in float64, float32 results
are more precise than eager's float32 ones. Where a and x are both huge (a log(x)
around 1e31) the logarithm of their prefactor has no correct digit left, and the
result is 0 or NaN where eager's asymptotic expansion gives about 1/2, as in C++.
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
    "ember_igamma_prefactor": """
@triton.jit
def ember_igamma_prefactor(a, x):
    # x^a exp(-x) / Gamma(a), by its logarithm; 0 where that is below double's least
    # normal exponent
    logarithm = a * libdevice.log(x) - x - libdevice.lgamma(a)
    return tl.where(logarithm < -709.782712893384, 0.0, libdevice.exp(logarithm))
""",
    "ember_igamma_series": """
@triton.jit
def ember_igamma_series(a, x, active):
    # P(a, x) by its power series, prefactor / a * sum_k x^k / ((a + 1) ... (a + k)),
    # for the lanes in `active`: up to 20000 terms, until a term is within double's
    # epsilon of the sum (0 where the prefactor underflows)
    prefactor = ember_igamma_prefactor(a, x)
    active = active & (prefactor != 0.0)
    r = a
    term = tl.zeros_like(a) + 1.0
    total = tl.zeros_like(a) + 1.0
    k = tl.full([], 0, tl.int32)
    go = ember_any(active)
    while go:
        k = k + 1
        r = tl.where(active, r + 1.0, r)
        term = tl.where(active, term * (x / r), term)
        total = tl.where(active, total + term, total)
        active = active & (term > 1.11022302462515654042e-16 * total) & (k < 20000)
        go = ember_any(active)
    return tl.where(prefactor == 0.0, 0.0, total * prefactor / a)
""",
    "ember_igammac_fraction": """
@triton.jit
def ember_igammac_fraction(a, x, active):
    # Q(a, x) by its continued fraction (modified Lentz, 1e-300 standing in for 0), for
    # the lanes in `active`: up to 19999 steps, until a step's factor is within
    # double's epsilon of 1 (0 where the prefactor underflows)
    prefactor = ember_igamma_prefactor(a, x)
    active = active & (prefactor != 0.0)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / (tl.zeros_like(a) + tiny)
    d = 1.0 / b
    h = d
    i = tl.full([], 0, tl.int32)
    go = ember_any(active)
    while go:
        i = i + 1
        an = (i * -1).to(tl.float64) * (i.to(tl.float64) - a)
        b = tl.where(active, b + 2.0, b)
        d_next = an * d + b
        d_next = tl.where(tl.abs(d_next) < tiny, tiny, d_next)
        c_next = b + an / c
        c_next = tl.where(tl.abs(c_next) < tiny, tiny, c_next)
        d_next = 1.0 / d_next
        step = d_next * c_next
        d = tl.where(active, d_next, d)
        c = tl.where(active, c_next, c)
        h = tl.where(active, h * step, h)
        active = active & (tl.abs(step - 1.0) > 1.11022302462515654042e-16) & (i < 19999)
        go = ember_any(active)
    return tl.where(prefactor == 0.0, 0.0, prefactor * h)
""",
    "ember_igammac_small_x": """
@triton.jit
def ember_igammac_small_x(a, x, active):
    # Q(a, x) for small x, for the lanes in `active`: 1 - x^a / Gamma(a + 1) (by expm1)
    # minus x^a / Gamma(a) * sum_n (-x)^n / (n! (a + n)), up to 1999 terms, until a
    # term is within double's epsilon of the sum
    factor = tl.zeros_like(a) + 1.0
    total = tl.zeros_like(a)
    n = tl.full([], 0, tl.int32)
    go = ember_any(active)
    while go:
        n = n + 1
        factor = tl.where(active, factor * ((x * -1.0) / n.to(tl.float64)), factor)
        term = factor / (a + n.to(tl.float64))
        total = tl.where(active, total + term, total)
        active = active & (tl.abs(term) > 1.11022302462515654042e-16 * tl.abs(total))
        active = active & (n < 1999)
        go = ember_any(active)
    log_x = libdevice.log(x)
    head = libdevice.expm1(a * log_x - libdevice.lgamma(1.0 + a)) * -1.0
    return head - libdevice.exp(a * log_x - libdevice.lgamma(a)) * total
""",
    "ember_igamma_core": """
@triton.jit
def ember_igamma_core(a_in, x_in, UPPER: tl.constexpr):
    # P(a, x) (igamma), or Q(a, x) = 1 - P (igammac) where UPPER, in float64 as the
    # C++ rendering computes them, each lane by the series, the continued fraction or
    # the small-x series where that one picks it, then eager's edge values (a or x
    # negative, zero or infinite, tested in eager's order, before NaN)
    a_in, x_in = tl.broadcast(a_in, x_in)
    a = a_in.to(tl.float64)
    x = x_in.to(tl.float64)
    inf = float("inf")
    nan = float("nan")
    inside = (x > 0.0) & (a > 0.0) & (x < inf) & (a < inf)
    a_ = tl.where(inside, a, 1.0)
    x_ = tl.where(inside, x, 1.0)
    if UPPER:
        log_x = libdevice.log(x_)
        by_series = ((x_ > 1.1) & (x_ < a_)) | ((x_ <= 0.5) & ((-0.4 / log_x) < a_))
        by_series = inside & (by_series | ((x_ > 0.5) & (x_ <= 1.1) & (x_ * 1.1 < a_)))
        by_fraction = inside & (x_ > 1.1) & (by_series == 0)
    else:
        complement = (x_ > 1.0) & (x_ > a_)
        by_series = inside & (complement == 0)
        by_fraction = inside & complement & (x_ > 1.1)
    by_small = inside & (by_series == 0) & (by_fraction == 0)
    series = ember_igamma_series(a_, x_, by_series)
    fraction = ember_igammac_fraction(a_, x_, by_fraction)
    small = ember_igammac_small_x(a_, x_, by_small)
    upper = tl.where(by_fraction, fraction, small)
    if UPPER:
        out = tl.where(by_series, 1.0 - series, upper)
        at_x_inf = 0.0
        at_a_inf = 1.0
        at_x_zero = 1.0
        at_a_zero = 0.0
    else:
        out = tl.where(by_series, series, 1.0 - upper)
        at_x_inf = 1.0
        at_a_inf = 0.0
        at_x_zero = 0.0
        at_a_zero = 1.0
    out = tl.where((a != a) | (x != x), nan, out)
    out = tl.where(x == inf, at_x_inf, out)
    out = tl.where(a == inf, tl.where(x == inf, nan, at_a_inf), out)
    out = tl.where(x == 0.0, at_x_zero, out)
    out = tl.where(a == 0.0, tl.where(x > 0.0, at_a_zero, nan), out)
    out = tl.where((x < 0.0) | (a < 0.0), nan, out)
    return out.to(a_in.dtype)
""",
    "ember_igamma": """
@triton.jit
def ember_igamma(a, x):
    return ember_igamma_core(a, x, False)
""",
    "ember_igammac": """
@triton.jit
def ember_igammac(a, x):
    return ember_igamma_core(a, x, True)
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
    "ember_igamma_series": ("ember_any", "ember_igamma_prefactor"),
    "ember_igammac_fraction": ("ember_any", "ember_igamma_prefactor"),
    "ember_igammac_small_x": ("ember_any",),
    "ember_igamma_core": (
        "ember_igamma_series",
        "ember_igammac_fraction",
        "ember_igammac_small_x",
    ),
    "ember_igamma": ("ember_igamma_core",),
    "ember_igammac": ("ember_igamma_core",),
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
    "igamma": "ember_igamma({0}, {1})",
    "igammac": "ember_igammac({0}, {1})",
    **POLYNOMIAL_OPS,
}
