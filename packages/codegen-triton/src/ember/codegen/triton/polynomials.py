"""The orthogonal polynomials of torch.special (Chebyshev T, U, V, W and their shifted
forms, Hermite H and He, Laguerre L, Legendre P) as @triton.jit helpers.

They follow eager's algorithms, as the C++ rendering does (ember.codegen.cpp.special):
the special cases at x = +-1 (and at x = 0 and 1 for the shifted forms), the
trigonometric forms for |x| < 1 past a degree threshold, and otherwise the three-term
recurrence up to the degree, stopped once it turns NaN, with eager's operations in
eager's order (divisions correctly rounded, `ember_div`). The degree is a tensor, so
each lane needs its own number of steps: the recurrences loop while any lane of the
block still needs one, and a lane that is done keeps its value. A block therefore
costs the steps of its largest degree, as eager's thread for that element does.

The float degree becomes an integer as CUDA converts it (eager casts with
static_cast<int64_t>, which compiles to a saturating conversion): NaN and degrees at or
below -2^63 become INT64_MIN, a negative degree (so every polynomial is 0 there), and
degrees at or above 2^63 (+inf too) become INT64_MAX. On x86, where the C++ rendering
runs, every out-of-range degree becomes INT64_MIN instead, so the two eager devices
differ only for the huge positive degrees.
"""

from __future__ import annotations

POLYNOMIAL_HELPERS: dict[str, str] = {
    "ember_poly_degree": """
@triton.jit
def ember_poly_degree(n):
    # the float degree n as an int64, the CUDA way: saturating at the ends, NaN to
    # INT64_MIN (a negative degree); the float is clamped before the conversion, which
    # is undefined for values out of range
    top = 9.223372036854775808e18
    d = tl.where((n != n) | (tl.abs(n) >= top), 0.0, n).to(tl.int64)
    d = tl.where(n >= top, 9223372036854775807, d)
    return tl.where((n <= -top) | (n != n), -9223372036854775807 - 1, d)
""",
    "ember_odd_sign": """
@triton.jit
def ember_odd_sign(n, value):
    # value for even n, -value for odd n
    return tl.where((n & 1) == 0, value, value * -1.0)
""",
    "ember_chebyshev_recurrence": """
@triton.jit
def ember_chebyshev_recurrence(two_x, first, n, wanted):
    # p_k = two_x p_(k-1) - p_(k-2) from p_0 = 1 and p_1 = first, up to k = n, in the
    # lanes `wanted`; a lane stops once its value turns NaN
    p = tl.zeros_like(first) + 1.0
    q = first
    r = first
    k = tl.full([], 2, tl.int64)
    active = wanted & (n >= 2) & (q == q)
    go = ember_any(active)
    while go:
        step = two_x * q - p
        r = tl.where(active, step, r)
        p = tl.where(active, q, p)
        q = tl.where(active, step, q)
        k += 1
        active = active & (k <= n) & (q == q)
        go = ember_any(active)
    return tl.where(n == 0, 1.0, tl.where(n == 1, first, r))
""",
    "ember_chebyshev_t_at": """
@triton.jit
def ember_chebyshev_t_at(y, n, wanted, LIMIT: tl.constexpr):
    # T_n(y) where no special case applies: cos(n acos y) for |y| < 1 past LIMIT
    trig = (n > LIMIT) & (tl.abs(y) < 1.0)
    angle = libdevice.cos(n.to(y.dtype) * libdevice.acos(tl.where(trig, y, 0.0)))
    steps = ember_chebyshev_recurrence(y + y, y, n, wanted & (trig == 0))
    return tl.where(trig, angle, steps)
""",
    "ember_chebyshev_u_at": """
@triton.jit
def ember_chebyshev_u_at(y, n, wanted, LIMIT: tl.constexpr):
    # U_n(y): sin((n + 1) theta) / sin(theta) for |y| < 1 past LIMIT (theta = acos y)
    trig = (n > LIMIT) & (tl.abs(y) < 1.0)
    theta = libdevice.acos(tl.where(trig, y, 0.0))
    m = (n + 1).to(y.dtype)
    s = libdevice.sin(theta)
    edge = ember_div(m * libdevice.cos(m * theta), y)
    angle = tl.where(s != 0.0, ember_div(libdevice.sin(m * theta), s), edge)
    steps = ember_chebyshev_recurrence(y + y, y + y, n, wanted & (trig == 0))
    return tl.where(trig, angle, steps)
""",
    "ember_chebyshev_v_at": """
@triton.jit
def ember_chebyshev_v_at(y, n, wanted, LIMIT: tl.constexpr):
    # V_n(y): cos((n + 1/2) theta) / cos(theta / 2) for |y| < 1 past LIMIT
    trig = (n > LIMIT) & (tl.abs(y) < 1.0)
    theta = libdevice.acos(tl.where(trig, y, 0.0))
    half = ember_div(theta, 2.0)
    angle = ember_div(libdevice.cos((n.to(y.dtype) + 0.5) * theta), libdevice.cos(half))
    odd = ember_odd_sign(n, (n + n + 1).to(y.dtype))
    angle = tl.where(libdevice.sin(half) != 1.0, angle, odd)
    steps = ember_chebyshev_recurrence(y + y, y + y - 1.0, n, wanted & (trig == 0))
    return tl.where(trig, angle, steps)
""",
    "ember_chebyshev_w_at": """
@triton.jit
def ember_chebyshev_w_at(y, n, wanted, at_one, LIMIT: tl.constexpr):
    # W_n(y): sin((n + 1/2) theta) / sin(theta / 2) for |y| < 1 past LIMIT, `at_one`
    # where cos(theta / 2) rounds to 1
    trig = (n > LIMIT) & (tl.abs(y) < 1.0)
    theta = libdevice.acos(tl.where(trig, y, 0.0))
    half = ember_div(theta, 2.0)
    angle = ember_div(libdevice.sin((n.to(y.dtype) + 0.5) * theta), libdevice.sin(half))
    angle = tl.where(libdevice.cos(half) != 1.0, angle, at_one)
    steps = ember_chebyshev_recurrence(y + y, y + y + 1.0, n, wanted & (trig == 0))
    return tl.where(trig, angle, steps)
""",
    "ember_chebyshev_t": """
@triton.jit
def ember_chebyshev_t(x, degree):
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    unit = tl.abs(x) == 1.0
    out = ember_chebyshev_t_at(x, n, unit == 0, 6)
    out = tl.where(unit, tl.where((x > 0.0) | ((n & 1) == 0), 1.0, -1.0), out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_chebyshev_u": """
@triton.jit
def ember_chebyshev_u(x, degree):
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    unit = tl.abs(x) == 1.0
    out = ember_chebyshev_u_at(x, n, unit == 0, 8)
    m = (n + 1).to(x.dtype)
    out = tl.where(unit, tl.where((x > 0.0) | ((n & 1) == 0), m, m * -1.0), out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_chebyshev_v": """
@triton.jit
def ember_chebyshev_v(x, degree):
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    unit = tl.abs(x) == 1.0
    out = ember_chebyshev_v_at(x, n, unit == 0, 8)
    odd = ember_odd_sign(n, (n + n + 1).to(x.dtype))
    out = tl.where(unit, tl.where(x > 0.0, 1.0, odd), out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_chebyshev_w": """
@triton.jit
def ember_chebyshev_w(x, degree):
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    unit = tl.abs(x) == 1.0
    ends = tl.where(x > 0.0, (n + n + 1).to(x.dtype), ember_odd_sign(n, tl.zeros_like(x) + 1.0))
    out = ember_chebyshev_w_at(x, n, unit == 0, ends, 8)
    out = tl.where(unit, ends, out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_shifted_chebyshev_t": """
@triton.jit
def ember_shifted_chebyshev_t(x, degree):
    # the plain polynomial at 2x - 1, with eager's cases at x = 1 and x = 0
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    ends = (x == 1.0) | (x == 0.0)
    out = ember_chebyshev_t_at(x + x - 1.0, n, ends == 0, 6)
    out = tl.where(x == 0.0, ember_odd_sign(n, tl.zeros_like(x) + 1.0), out)
    out = tl.where(x == 1.0, 1.0, out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_shifted_chebyshev_u": """
@triton.jit
def ember_shifted_chebyshev_u(x, degree):
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    ends = (x == 1.0) | (x == 0.0)
    out = ember_chebyshev_u_at(x + x - 1.0, n, ends == 0, 6)
    m = (n + 1).to(x.dtype)
    out = tl.where(x == 0.0, ember_odd_sign(n, m), out)
    out = tl.where(x == 1.0, m, out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_shifted_chebyshev_v": """
@triton.jit
def ember_shifted_chebyshev_v(x, degree):
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    ends = (x == 1.0) | (x == 0.0)
    out = ember_chebyshev_v_at(x + x - 1.0, n, ends == 0, 6)
    out = tl.where(x == 0.0, ember_odd_sign(n, (n + n + 1).to(x.dtype)), out)
    out = tl.where(x == 1.0, 1.0, out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_shifted_chebyshev_w": """
@triton.jit
def ember_shifted_chebyshev_w(x, degree):
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    ends = (x == 1.0) | (x == 0.0)
    odd = ember_odd_sign(n, tl.zeros_like(x) + 1.0)
    out = ember_chebyshev_w_at(x + x - 1.0, n, ends == 0, odd, 4)
    out = tl.where(x == 0.0, odd, out)
    out = tl.where(x == 1.0, (n + n + 1).to(x.dtype), out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_hermite_h": """
@triton.jit
def ember_hermite_h(x, degree):
    # H_k = 2x H_(k-1) - 2(k-1) H_(k-2); NaN past degree 128 (float) or 512 (double)
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    if x.dtype == tl.float64:
        limit = 512
    else:
        limit = 128
    p = tl.zeros_like(x) + 1.0
    q = x + x
    r = tl.zeros_like(x)
    k = tl.full([], 2, tl.int64)
    active = (n >= 2) & (n <= limit)
    go = ember_any(active)
    while go:
        step = (x + x) * q - k.to(x.dtype) * p
        r = tl.where(active, step, r)
        p = tl.where(active, q, p)
        q = tl.where(active, step, q)
        k += 2
        active = active & (k < n + n)
        go = ember_any(active)
    out = tl.where(n > limit, float("nan"), r)
    out = tl.where(n == 1, x + x, out)
    out = tl.where(n == 0, 1.0, out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_hermite_he": """
@triton.jit
def ember_hermite_he(x, degree):
    # He_k = x He_(k-1) - (k-1) He_(k-2); NaN past degree 128 (float) or 512 (double)
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    if x.dtype == tl.float64:
        limit = 512
    else:
        limit = 128
    p = tl.zeros_like(x) + 1.0
    q = x
    r = tl.zeros_like(x)
    k = tl.full([], 1, tl.int64)
    active = (n >= 2) & (n <= limit)
    go = ember_any(active)
    while go:
        step = x * q - k.to(x.dtype) * p
        r = tl.where(active, step, r)
        p = tl.where(active, q, p)
        q = tl.where(active, step, q)
        k += 1
        active = active & (k < n)
        go = ember_any(active)
    out = tl.where(n > limit, float("nan"), r)
    out = tl.where(n == 1, x, out)
    out = tl.where(n == 0, 1.0, out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_laguerre_l": """
@triton.jit
def ember_laguerre_l(x, degree):
    # (k + 1) L_(k+1) = (2k + 1 - x) L_k - k L_(k-1), stopped once it turns NaN
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    p = tl.zeros_like(x) + 1.0
    q = 1.0 - x
    r = q
    k = tl.full([], 1, tl.int64)
    active = (n >= 2) & (x != 0.0) & (q == q)
    go = ember_any(active)
    while go:
        step = ((k + k).to(x.dtype) + (1.0 - x)) * q - k.to(x.dtype) * p
        step = ember_div(step, (k + 1).to(x.dtype))
        r = tl.where(active, step, r)
        p = tl.where(active, q, p)
        q = tl.where(active, step, q)
        k += 1
        active = active & (k < n) & (q == q)
        go = ember_any(active)
    out = tl.where(n == 1, 1.0 - x, r)
    out = tl.where((n == 0) | (x == 0.0), 1.0, out)
    return tl.where(n < 0, 0.0, out)
""",
    "ember_legendre_p": """
@triton.jit
def ember_legendre_p(x, degree):
    # (k + 1) P_(k+1) = (2k + 1) x P_k - k P_(k-1), stopped once it turns NaN
    x, degree = tl.broadcast(x, degree)
    n = ember_poly_degree(degree)
    unit = tl.abs(x) == 1.0
    p = tl.zeros_like(x) + 1.0
    q = x
    r = q
    k = tl.full([], 1, tl.int64)
    active = (n >= 2) & (unit == 0) & (q == q)
    go = ember_any(active)
    while go:
        step = (k + k + 1).to(x.dtype) * x * q - k.to(x.dtype) * p
        step = ember_div(step, (k + 1).to(x.dtype))
        r = tl.where(active, step, r)
        p = tl.where(active, q, p)
        q = tl.where(active, step, q)
        k += 1
        active = active & (k < n) & (q == q)
        go = ember_any(active)
    out = tl.where(n == 1, x, r)
    out = tl.where(n == 0, 1.0, out)
    out = tl.where(unit, tl.where((x > 0.0) | ((n & 1) == 0), 1.0, -1.0), out)
    return tl.where(n < 0, 0.0, out)
""",
}

# ember_any and ember_div are in ember.codegen.triton.special's helpers
_CHEBYSHEV = ("ember_chebyshev_recurrence", "ember_div")
POLYNOMIAL_CALLS: dict[str, tuple[str, ...]] = {
    "ember_chebyshev_recurrence": ("ember_any",),
    "ember_chebyshev_t_at": _CHEBYSHEV,
    "ember_chebyshev_u_at": _CHEBYSHEV,
    "ember_chebyshev_v_at": (*_CHEBYSHEV, "ember_odd_sign"),
    "ember_chebyshev_w_at": _CHEBYSHEV,
    **{
        f"ember_{shifted}chebyshev_{kind}": (
            "ember_poly_degree",
            "ember_odd_sign",
            f"ember_chebyshev_{kind}_at",
        )
        for shifted in ("", "shifted_")
        for kind in "tuvw"
    },
    **{f"ember_{name}": ("ember_poly_degree", "ember_any") for name in ("hermite_h", "hermite_he")},
    **{
        f"ember_{name}": ("ember_poly_degree", "ember_any", "ember_div")
        for name in ("laguerre_l", "legendre_p")
    },
}

# op of the ops protocol -> its floating-point template
POLYNOMIAL_OPS: dict[str, str] = {
    **{
        f"special_{shifted}chebyshev_polynomial_{kind}": (
            f"ember_{shifted}chebyshev_{kind}({{0}}, {{1}})"
        )
        for shifted in ("", "shifted_")
        for kind in "tuvw"
    },
    "special_hermite_polynomial_h": "ember_hermite_h({0}, {1})",
    "special_hermite_polynomial_he": "ember_hermite_he({0}, {1})",
    "special_laguerre_polynomial_l": "ember_laguerre_l({0}, {1})",
    "special_legendre_polynomial_p": "ember_legendre_p({0}, {1})",
}
