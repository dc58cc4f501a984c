"""Special functions in C++: the ops of the ops protocol with no standard-library
counterpart (Bessel functions, digamma, zeta, incomplete gamma, orthogonal polynomials,
...), written for ember and emitted into a translation unit only when a kernel of it
calls them, so that the prelude every graph compiles stays small.

Each function is a template over the computation type (`float` or `double`; bfloat16
and float16 values reach it as float, as eager computes them) and follows the
approximation eager PyTorch uses on the CPU (the Cephes Math Library's Chebyshev
series and rational functions, whose coefficients are in `ember.ir.special_tables`),
evaluated in the same precision eager evaluates it in, with the same special cases.
That is what keeps NaN, infinity and overflow where eager has them; the accuracy
rule compares them exactly. The exceptions compute in double and round once, where
eager does too (`special_zeta`, and so `polygamma` of order >= 2) or where double is
the simpler route to an accurate float result (`igamma`, `igammac`: series and
continued fraction; `special_erfcx`: exp(x^2) erfc(x) with x^2 split exactly, an
asymptotic series from x = 10).

The runtime's tests (test_cpp_special_functions.py) compile them and hold them to
stated bounds against eager over wide ranges with NaN, infinities, zeros and
negatives: NaN and infinities where eager has them, float64 within 1e-12 of eager,
float32 within 2e-6 of float64 (or no further than twice eager's own error).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ember.ir import special_tables
from ember.ir.ops import arity


@dataclass(frozen=True)
class Section:
    """C++ text defining one function, the tables it reads and the sections it calls."""

    code: str
    tables: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()


def _table(name: str) -> str:
    values: tuple[float, ...] = getattr(special_tables, name)
    numbers = ", ".join(repr(v) for v in values)
    return f"constexpr double {name}[] = {{{numbers}}};\n"


_COMMON = r"""
namespace sf {
template <class T> constexpr T inf() { return std::numeric_limits<T>::infinity(); }
template <class T> constexpr T nan() { return std::numeric_limits<T>::quiet_NaN(); }
// Horner's rule over coefficients given highest power first.
template <class T, std::size_t N> inline T horner(T x, const double (&c)[N]) {
  T r = T(c[0]);
  for (std::size_t i = 1; i < N; ++i) r = r * x + T(c[i]);
  return r;
}
// A Chebyshev series by Clenshaw's recurrence: (b0 - b2) / 2.
template <class T, std::size_t N> inline T clenshaw(T t, const double (&c)[N]) {
  T b0 = T(c[0]), b1 = T(0), b2 = T(0);
  for (std::size_t i = 1; i < N; ++i) {
    b2 = b1;
    b1 = b0;
    b0 = t * b1 - b2 + T(c[i]);
  }
  return T(0.5) * (b0 - b2);
}
}  // namespace sf
"""

SECTIONS: dict[str, Section] = {}


def _add(name: str, code: str, tables: tuple[str, ...] = (), needs: tuple[str, ...] = ()) -> None:
    SECTIONS[name] = Section(code, tables, needs)


# -- modified Bessel functions -------------------------------------------------------
_add(
    "special_i0",
    r"""
template <class T> inline T special_i0(T x) {
  x = std::fabs(x);
  if (x <= T(8)) return std::exp(x) * sf::clenshaw(x / T(2) - T(2), sf::I0_SMALL);
  return std::exp(x) * sf::clenshaw(T(32) / x - T(2), sf::I0_LARGE) / std::sqrt(x);
}
""",
    ("I0_SMALL", "I0_LARGE"),
)
_add(
    "special_i0e",
    r"""
template <class T> inline T special_i0e(T x) {
  x = std::fabs(x);
  if (x <= T(8)) return sf::clenshaw(x / T(2) - T(2), sf::I0_SMALL);
  return sf::clenshaw(T(32) / x - T(2), sf::I0_LARGE) / std::sqrt(x);
}
""",
    ("I0_SMALL", "I0_LARGE"),
)
_add(
    "special_i1",
    r"""
template <class T> inline T special_i1(T v) {
  const T x = std::fabs(v);
  T out;
  if (x <= T(8)) out = std::exp(x) * x * sf::clenshaw(x / T(2) - T(2), sf::I1_SMALL);
  else out = std::exp(x) * sf::clenshaw(T(32) / x - T(2), sf::I1_LARGE) / std::sqrt(x);
  return v < T(0) ? -out : out;
}
""",
    ("I1_SMALL", "I1_LARGE"),
)
_add(
    "special_i1e",
    r"""
template <class T> inline T special_i1e(T v) {
  const T x = std::fabs(v);
  T out;
  if (x <= T(8)) out = sf::clenshaw(x / T(2) - T(2), sf::I1_SMALL) * x;
  else out = sf::clenshaw(T(32) / x - T(2), sf::I1_LARGE) / std::sqrt(x);
  return v < T(0) ? -out : out;
}
""",
    ("I1_SMALL", "I1_LARGE"),
)
# K0 and K1: below 2 a series in x^2 plus log(x/2) I(x); above, exp(-x) / sqrt(x) times a
# series in 8/x. The scaled forms multiply by exp(x) (small x) or leave exp(-x) out.
_add(
    "k0_small",
    r"""
template <class T> inline T k0_small(T x) {
  return sf::clenshaw(x * x - T(2), sf::K0_SMALL) - std::log(T(0.5) * x) * special_i0(x);
}
""",
    ("K0_SMALL",),
    ("special_i0",),
)
_add(
    "k1_small",
    r"""
template <class T> inline T k1_small(T x) {
  return std::log(T(0.5) * x) * special_i1(x) + sf::clenshaw(x * x - T(2), sf::K1_SMALL) / x;
}
""",
    ("K1_SMALL",),
    ("special_i1",),
)
_add(
    "special_modified_bessel_k0",
    r"""
template <class T> inline T special_modified_bessel_k0(T x) {
  if (x == T(0)) return sf::inf<T>();
  if (x < T(0)) return sf::nan<T>();
  if (x <= T(2)) return k0_small(x);
  return std::exp(-x) * sf::clenshaw(T(8) / x - T(2), sf::K0_LARGE) / std::sqrt(x);
}
""",
    ("K0_LARGE",),
    ("k0_small",),
)
_add(
    "special_modified_bessel_k1",
    r"""
template <class T> inline T special_modified_bessel_k1(T x) {
  if (x == T(0)) return sf::inf<T>();
  if (x < T(0)) return sf::nan<T>();
  if (x <= T(2)) return k1_small(x);
  return std::exp(-x) * sf::clenshaw(T(8) / x - T(2), sf::K1_LARGE) / std::sqrt(x);
}
""",
    ("K1_LARGE",),
    ("k1_small",),
)
_add(
    "special_scaled_modified_bessel_k0",
    r"""
template <class T> inline T special_scaled_modified_bessel_k0(T x) {
  if (x == T(0)) return sf::inf<T>();
  if (x < T(0)) return sf::nan<T>();
  if (x <= T(2)) return k0_small(x) * std::exp(x);
  return sf::clenshaw(T(8) / x - T(2), sf::K0_LARGE) / std::sqrt(x);
}
""",
    ("K0_LARGE",),
    ("k0_small",),
)
_add(
    "special_scaled_modified_bessel_k1",
    r"""
template <class T> inline T special_scaled_modified_bessel_k1(T x) {
  if (x == T(0)) return sf::inf<T>();
  if (x < T(0)) return sf::nan<T>();
  if (x <= T(2)) return k1_small(x) * std::exp(x);
  return sf::clenshaw(T(8) / x - T(2), sf::K1_LARGE) / std::sqrt(x);
}
""",
    ("K1_LARGE",),
    ("k1_small",),
)

# -- Bessel functions of the first and second kind ---------------------------------------
_add("special_bessel_j0", r"""
template <class T> inline T special_bessel_j0(T x) {
  if (x < T(0)) x = -x;
  if (x <= T(5)) {
    if (x < T(1e-5)) return T(1) - x * x / T(4);
    const T z = x * x;
    return (z - T(5.78318596294678452118)) * (z - T(30.4712623436620863991)) *
           sf::horner(z, sf::J0_SMALL_P) / sf::horner(z, sf::J0_SMALL_Q);
  }
  const T w = T(25) / (x * x), shifted = x - T(0.785398163397448309616);
  const T p = sf::horner(w, sf::J0_AMPLITUDE_P) / sf::horner(w, sf::J0_AMPLITUDE_Q);
  const T q = sf::horner(w, sf::J0_PHASE_P) / sf::horner(w, sf::J0_PHASE_Q);
  return (p * std::cos(shifted) - T(5) / x * q * std::sin(shifted)) *
         T(0.797884560802865355880) / std::sqrt(x);
}
""", ("J0_SMALL_P", "J0_SMALL_Q", "J0_AMPLITUDE_P", "J0_AMPLITUDE_Q", "J0_PHASE_P",
      "J0_PHASE_Q"))  # fmt: skip
_add(
    "special_bessel_y0",
    r"""
template <class T> inline T special_bessel_y0(T x) {
  if (x <= T(5)) {
    if (x == T(0)) return -sf::inf<T>();
    if (x < T(0)) return sf::nan<T>();
    const T z = x * x;
    return sf::horner(z, sf::Y0_SMALL_P) / sf::horner(z, sf::Y0_SMALL_Q) +
           T(0.636619772367581343076) * std::log(x) * special_bessel_j0(x);
  }
  const T w = T(25) / (x * x), shifted = x - T(0.785398163397448309616);
  const T p = sf::horner(w, sf::J0_AMPLITUDE_P) / sf::horner(w, sf::J0_AMPLITUDE_Q);
  const T q = sf::horner(w, sf::J0_PHASE_P) / sf::horner(w, sf::J0_PHASE_Q);
  return (p * std::sin(shifted) + T(5) / x * q * std::cos(shifted)) *
         T(0.797884560802865355880) / std::sqrt(x);
}
""",
    ("Y0_SMALL_P", "Y0_SMALL_Q"),
    ("special_bessel_j0",),
)
_add("special_bessel_j1", r"""
template <class T> inline T special_bessel_j1(T x) {
  if (x < T(0)) return -special_bessel_j1(-x);
  if (x <= T(5)) {
    const T z = x * x;
    return sf::horner(z, sf::J1_SMALL_P) / sf::horner(z, sf::J1_SMALL_Q) * x *
           (z - T(14.6819706421238932572)) * (z - T(49.2184563216946036703));
  }
  const T w = T(5) / x * (T(5) / x), shifted = x - T(2.35619449019234492885);
  const T p = sf::horner(w, sf::J1_AMPLITUDE_P) / sf::horner(w, sf::J1_AMPLITUDE_Q);
  const T q = sf::horner(w, sf::J1_PHASE_P) / sf::horner(w, sf::J1_PHASE_Q);
  return (p * std::cos(shifted) - T(5) / x * q * std::sin(shifted)) *
         T(0.797884560802865355880) / std::sqrt(x);
}
""", ("J1_SMALL_P", "J1_SMALL_Q", "J1_AMPLITUDE_P", "J1_AMPLITUDE_Q", "J1_PHASE_P",
      "J1_PHASE_Q"))  # fmt: skip
_add(
    "special_bessel_y1",
    r"""
template <class T> inline T special_bessel_y1(T x) {
  if (x <= T(5)) {
    if (x == T(0)) return -sf::inf<T>();
    if (x <= T(0)) return sf::nan<T>();
    const T z = x * x;
    return x * (sf::horner(z, sf::Y1_SMALL_P) / sf::horner(z, sf::Y1_SMALL_Q)) +
           T(0.636619772367581343076) * (special_bessel_j1(x) * std::log(x) - T(1) / x);
  }
  const T w = T(5) / x * (T(5) / x), shifted = x - T(2.35619449019234492885);
  const T p = sf::horner(w, sf::J1_AMPLITUDE_P) / sf::horner(w, sf::J1_AMPLITUDE_Q);
  const T q = sf::horner(w, sf::J1_PHASE_P) / sf::horner(w, sf::J1_PHASE_Q);
  return (p * std::sin(shifted) + T(5) / x * q * std::cos(shifted)) *
         T(0.797884560802865355880) / std::sqrt(x);
}
""",
    ("Y1_SMALL_P", "Y1_SMALL_Q"),
    ("special_bessel_j1",),
)
_add(
    "special_spherical_bessel_j0",
    r"""
template <class T> inline T special_spherical_bessel_j0(T x) {
  if (std::isinf(x)) return T(0);
  if (std::fabs(x) < T(0.5)) {  // sin(x)/x by its Maclaurin series, to x^12
    const T z = x * x;
    return T(1) + z * (T(-1) / T(6) + z * (T(1) / T(120) + z * (T(-1) / T(5040) +
           z * (T(1) / T(362880) + z * (T(-1) / T(39916800) + z * (T(1) / T(6227020800)))))));
  }
  return std::sin(x) / x;
}
""",
)
_add("special_airy_ai", r"""
template <class T> inline T special_airy_ai(T x) {
  if (std::isinf(x)) return sf::nan<T>();
  if (x > T(103.892)) return T(0);
  if (x < T(-2.09)) {  // oscillating: f and g in 1/zeta^2
    const T zeta = T(-2) * x * std::sqrt(-x) / T(3);
    const T z = T(1) / zeta, zz = z * z;
    const T f = sf::horner(zz, sf::AIRY_OSC_F_P) / sf::horner(zz, sf::AIRY_OSC_F_Q);
    const T g = sf::horner(zz, sf::AIRY_OSC_G_P) / sf::horner(zz, sf::AIRY_OSC_G_Q);
    const T t = zeta + T(0.25) * T(3.14159265358979323846);
    return T(0.564189583547756286948) / std::sqrt(std::sqrt(-x)) *
           (std::sin(t) * (T(1) + zz * f) - std::cos(t) * (z * g));
  }
  if (x >= T(2.09)) {  // decaying: exp(-zeta) times a rational function of 1/zeta
    const T zeta = T(2) * x * std::sqrt(x) / T(3);
    const T u = T(1) / zeta;
    const T r = sf::horner(u, sf::AIRY_DECAY_P) / sf::horner(u, sf::AIRY_DECAY_Q);
    return T(0.564189583547756286948) * r / (T(2) * std::sqrt(std::sqrt(x)) * std::exp(zeta));
  }
  // Maclaurin series of the two solutions f and g (terms in x^3)
  T f = T(1), g = x, k = T(1), m = T(1), n = x, t = T(1);
  const T z = x * x * x;
  while (t > std::numeric_limits<T>::epsilon()) {
    m *= z; k += T(1); m /= k;
    n *= z; k += T(1); n /= k;
    m /= k; f += m;
    k += T(1); n /= k; g += n;
    t = std::fabs(m / f);
  }
  return T(0.355028053887817239260) * f - T(0.258819403792806798405) * g;
}
""", ("AIRY_DECAY_P", "AIRY_DECAY_Q", "AIRY_OSC_F_P", "AIRY_OSC_F_Q", "AIRY_OSC_G_P",
      "AIRY_OSC_G_Q"))  # fmt: skip

# -- the normal distribution -----------------------------------------------------------
_add("special_ndtri", r"""
template <class T> inline T special_ndtri(T y0) {
  if (y0 == T(0)) return -sf::inf<T>();
  if (y0 == T(1)) return sf::inf<T>();
  if (y0 < T(0) || y0 > T(1)) return sf::nan<T>();
  const T e2 = T(0.13533528323661269189);  // exp(-2)
  bool lower = true;
  T y = y0;
  if (y > T(1) - e2) {
    y = T(1) - y;
    lower = false;
  }
  if (y > e2) {
    y = y - T(0.5);
    const T w = y * y;
    const T r = sf::horner(w, sf::NDTRI_CENTRAL_P) / sf::horner(w, sf::NDTRI_CENTRAL_Q);
    const T x = y + y * (w * r);
    return x * T(2.50662827463100050242);
  }
  const T z = std::sqrt(T(-2) * std::log(y));
  const T x0 = z - std::log(z) / z, u = T(1) / z;
  const T x1 = z < T(8) ? u * sf::horner(u, sf::NDTRI_TAIL_P) / sf::horner(u, sf::NDTRI_TAIL_Q)
                        : u * sf::horner(u, sf::NDTRI_FAR_P) / sf::horner(u, sf::NDTRI_FAR_Q);
  return lower ? -(x0 - x1) : x0 - x1;
}
""", ("NDTRI_CENTRAL_P", "NDTRI_CENTRAL_Q", "NDTRI_TAIL_P", "NDTRI_TAIL_Q", "NDTRI_FAR_P",
      "NDTRI_FAR_Q"))  # fmt: skip
_add(
    "special_erfcx",
    r"""
// exp(x^2) for |x| < 16 to a few ulps: x = hi + lo with hi on a 2^-12 grid, so hi^2 is
// exact and x^2 = hi^2 + lo (x + hi).
inline double exp_square(double x) {
  const double hi = std::floor(x * 4096.0) / 4096.0, lo = x - hi;
  return std::exp(hi * hi) * std::exp(lo * (x + hi));
}
// erfcx(x) = exp(x^2) erfc(x) for x >= 0: directly below 10, above by the asymptotic
// series 1/(x sqrt(pi)) sum (-1)^k (2k-1)!! / (2x^2)^k (14 terms: below 2e-18 at x = 10).
inline double erfcx_positive(double x) {
  if (x < 10.0) return exp_square(x) * std::erfc(x);
  const double w = 0.5 / (x * x);
  double term = 1.0, sum = 1.0;
  for (int k = 1; k <= 14; ++k) {
    term *= -(2 * k - 1) * w;
    sum += term;
  }
  return 0.564189583547756286948 / x * sum;
}
template <class T> inline T special_erfcx(T v) {
  const double x = double(v);
  if (x != x) return v;
  if (x >= 0.0) return T(erfcx_positive(x));
  if (x < -26.7) return sf::inf<T>();
  return T(2.0 * exp_square(x) - erfcx_positive(-x));
}
""",
)

# -- gamma and zeta -------------------------------------------------------------------
_add(
    "special_digamma",
    r"""
template <class T> inline T special_digamma(T x) {
  if (x == T(0)) return std::copysign(sf::inf<T>(), -x);
  T reflection = T(0);  // digamma(x) = digamma(1 - x) - pi / tan(pi x) for x < 0
  if (x < T(0)) {
    if (x == std::trunc(x)) return sf::nan<T>();
    double whole;
    const double r = std::modf(double(x), &whole);  // tan(pi r) is more accurate than tan(pi x)
    reflection = T(3.14159265358979323846 / std::tan(3.14159265358979323846 * r));
    x = T(1) - x;
  }
  T sum = T(0);
  while (x < T(10)) {  // digamma(x) = digamma(x + 1) - 1/x
    sum -= T(1) / x;
    x += T(1);
  }
  if (x == T(10)) return sum + T(2.25175258906672110764) - reflection;
  T tail = T(0);
  if (x < T(1e17)) {
    const T z = T(1) / (x * x);
    tail = z * sf::horner(z, sf::DIGAMMA_ASYMPTOTIC);
  }
  return sum + std::log(x) - T(0.5) / x - tail - reflection;
}
""",
    ("DIGAMMA_ASYMPTOTIC",),
)
_add(
    "special_zeta",
    r"""
// Hurwitz zeta(x, q) = sum_k (k + q)^-x, in double: the direct sum until its terms fall
// below double's epsilon or past 9 terms and q + k > 9, then the Euler-Maclaurin tail.
inline double hurwitz_zeta(double x, double q) {
  if (x == 1.0) return std::numeric_limits<double>::infinity();
  if (x < 1.0) return std::numeric_limits<double>::quiet_NaN();
  if (q <= 0.0) {
    if (q == std::floor(q)) return std::numeric_limits<double>::infinity();
    if (x != std::floor(x)) return std::numeric_limits<double>::quiet_NaN();
  }
  const double eps = 1.11022302462515654042e-16;
  double s = std::pow(q, -x), a = q, b = 0.0;
  int i = 0;
  while (i < 9 || a <= 9.0) {
    i += 1;
    a += 1.0;
    b = std::pow(a, -x);
    s += b;
    if (-eps * s < b && b < eps * s) return s;
  }
  const double w = a;
  s += b * w / (x - 1.0);
  s -= 0.5 * b;
  double factor = 1.0, k = 0.0;
  for (i = 0; i < 12; ++i) {
    factor *= x + k;
    b /= w;
    const double t = factor * b / sf::ZETA_EULER_MACLAURIN[i];
    s = s + t;
    if (std::fabs(t / s) < eps) return s;
    k += 1.0;
    factor *= x + k;
    b /= w;
    k += 1.0;
  }
  return s;
}
template <class T> inline T special_zeta(T x, T q) { return T(hurwitz_zeta(double(x), double(q))); }
""",
    ("ZETA_EULER_MACLAURIN",),
)
_add(
    "special_polygamma",
    r"""
template <class T> inline T trigamma(T x) {
  T sign = T(1), sum = T(0);
  if (x < T(0.5)) {  // reflection: trigamma(1 - x) + trigamma(x) = pi^2 / sin^2(pi x)
    sign = T(-1);
    const T s = std::sin(T(3.14159265358979323846) * x);
    sum -= T(3.14159265358979323846) * T(3.14159265358979323846) / (s * s);
    x = T(1) - x;
  }
  for (int i = 0; i < 6; ++i) {
    sum += T(1) / (x * x);
    x += T(1);
  }
  const T z = T(1) / (x * x);
  const T tail = z * (T(1) / T(6) - z * (T(1) / T(30) - z * (T(1) / T(42))));
  sum += (T(1) + T(1) / (T(2) * x) + tail) / x;
  return sign * sum;
}
// The n-th derivative of digamma: (-1)^(n+1) n! zeta(n + 1, x) from n = 2.
template <class T> inline T special_polygamma(int64_t n, T x) {
  if (n == 0) return special_digamma(x);
  if (n == 1) return trigamma(x);
  const T sign = (n % 2) ? T(1) : T(-1);
  return sign * std::exp(std::lgamma(T(n) + T(1))) * T(hurwitz_zeta(double(n + 1), double(x)));
}
""",
    needs=("special_digamma", "special_zeta"),
)
_add(
    "special_igamma",
    r"""
// The regularized incomplete gamma functions P(a, x) (igamma) and Q(a, x) = 1 - P
// (igammac), in double: the power series of P where x is below about a, the continued
// fraction of Q above, and the series of Q - (1 - x^a / Gamma(a + 1)) for small x,
// picking the same regions as eager, with eager's values on the edges (a or x zero,
// negative or infinite, tested in eager's order, before NaN).
inline double igamma_prefactor(double a, double x) {  // x^a exp(-x) / Gamma(a)
  const double log_value = a * std::log(x) - x - std::lgamma(a);
  return log_value < -709.782712893384 ? 0.0 : std::exp(log_value);
}
inline double igamma_series(double a, double x) {
  const double prefactor = igamma_prefactor(a, x);
  if (prefactor == 0.0) return 0.0;
  double r = a, term = 1.0, sum = 1.0;
  for (int i = 0; i < 20000; ++i) {
    r += 1.0;
    term *= x / r;
    sum += term;
    if (term <= 1.11022302462515654042e-16 * sum) break;
  }
  return sum * prefactor / a;
}
inline double igammac_fraction(double a, double x) {  // modified Lentz
  const double prefactor = igamma_prefactor(a, x);
  if (prefactor == 0.0) return 0.0;
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 20000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1.0) <= 1.11022302462515654042e-16) break;
  }
  return prefactor * h;
}
inline double igammac_small_x(double a, double x) {
  double factor = 1.0, sum = 0.0;
  for (int n = 1; n < 2000; ++n) {
    factor *= -x / n;
    const double term = factor / (a + n);
    sum += term;
    if (std::fabs(term) <= 1.11022302462515654042e-16 * std::fabs(sum)) break;
  }
  const double log_x = std::log(x);
  return -std::expm1(a * log_x - std::lgamma(1.0 + a)) - std::exp(a * log_x - std::lgamma(a)) * sum;
}
inline double igammac_double(double a, double x) {
  if (x < 0.0 || a < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (a == 0.0) return x > 0.0 ? 0.0 : std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return 1.0;
  if (std::isinf(a)) return std::isinf(x) ? std::numeric_limits<double>::quiet_NaN() : 1.0;
  if (std::isinf(x)) return 0.0;
  if (a != a || x != x) return std::numeric_limits<double>::quiet_NaN();
  if (x > 1.1) return x < a ? 1.0 - igamma_series(a, x) : igammac_fraction(a, x);
  if (x <= 0.5) return -0.4 / std::log(x) < a ? 1.0 - igamma_series(a, x) : igammac_small_x(a, x);
  return x * 1.1 < a ? 1.0 - igamma_series(a, x) : igammac_small_x(a, x);
}
inline double igamma_double(double a, double x) {
  if (x < 0.0 || a < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (a == 0.0) return x > 0.0 ? 1.0 : std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return 0.0;
  if (std::isinf(a)) return std::isinf(x) ? std::numeric_limits<double>::quiet_NaN() : 0.0;
  if (std::isinf(x)) return 1.0;
  if (a != a || x != x) return std::numeric_limits<double>::quiet_NaN();
  if (x > 1.0 && x > a) return 1.0 - igammac_double(a, x);
  return igamma_series(a, x);
}
template <class T> inline T special_igamma(T a, T x) {
  return T(igamma_double(double(a), double(x)));
}
template <class T> inline T special_igammac(T a, T x) {
  return T(igammac_double(double(a), double(x)));
}
""",
)

# -- orthogonal polynomials ----------------------------------------------------------
_add(
    "special_polynomials",
    r"""
// The degree: eager converts the float with a C cast, which on x86 turns NaN, the
// infinities and values out of int64's range into INT64_MIN (a negative degree: 0).
template <class T> inline int64_t poly_degree(T n) {
  return (n == n && n > T(-9.2e18) && n < T(9.2e18)) ? int64_t(n)
                                                     : std::numeric_limits<int64_t>::min();
}
// The three-term recurrence p_k = two_x p_{k-1} - p_{k-2} from p_0 = 1, p_1 = first,
// stopped once it turns NaN (infinity - infinity).
template <class T> inline T chebyshev_recurrence(T two_x, T first, int64_t n) {
  if (n == 0) return T(1);
  if (n == 1) return first;
  T p = T(1), q = first, r = first;
  for (int64_t k = 2; k <= n && !std::isnan(q); ++k) {
    r = two_x * q - p;
    p = q;
    q = r;
  }
  return r;
}
template <class T> inline T odd_sign(int64_t n, T value) { return n % 2 == 0 ? value : -value; }
template <class T> inline T special_chebyshev_polynomial_t(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return (x > T(0) || n % 2 == 0) ? T(1) : T(-1);
  if (n > 6 && std::fabs(x) < T(1)) return std::cos(T(n) * std::acos(x));
  return chebyshev_recurrence(x + x, x, n);
}
template <class T> inline T special_chebyshev_polynomial_u(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return (x > T(0) || n % 2 == 0) ? T(n + 1) : T(-(n + 1));
  if (n > 8 && std::fabs(x) < T(1)) {
    const T theta = std::acos(x);
    if (std::sin(theta) != T(0)) return std::sin(T(n + 1) * theta) / std::sin(theta);
    return T(n + 1) * std::cos(T(n + 1) * theta) / x;
  }
  return chebyshev_recurrence(x + x, x + x, n);
}
template <class T> inline T special_chebyshev_polynomial_v(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return x > T(0) ? T(1) : odd_sign(n, T(n + n + 1));
  if (n > 8 && std::fabs(x) < T(1)) {
    const T theta = std::acos(x);
    if (std::sin(theta / T(2)) != T(1))
      return std::cos((T(n) + T(0.5)) * theta) / std::cos(theta / T(2));
    return odd_sign(n, T(n + n + 1));
  }
  return chebyshev_recurrence(x + x, x + x - T(1), n);
}
template <class T> inline T special_chebyshev_polynomial_w(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return x > T(0) ? T(n + n + 1) : odd_sign(n, T(1));
  if (n > 8 && std::fabs(x) < T(1)) {
    const T theta = std::acos(x);
    if (std::cos(theta / T(2)) != T(1))
      return std::sin((T(n) + T(0.5)) * theta) / std::sin(theta / T(2));
    return x > T(0) ? T(n + n + 1) : odd_sign(n, T(1));
  }
  return chebyshev_recurrence(x + x, x + x + T(1), n);
}
// The shifted polynomials are the plain ones at y = 2x - 1, with eager's special cases
// at x = 1 and x = 0 and its own thresholds for the trigonometric forms.
template <class T> inline T special_shifted_chebyshev_polynomial_t(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (x == T(1)) return T(1);
  if (x == T(0)) return odd_sign(n, T(1));
  const T y = x + x - T(1);
  if (n > 6 && std::fabs(y) < T(1)) return std::cos(T(n) * std::acos(y));
  return chebyshev_recurrence(y + y, y, n);
}
template <class T> inline T special_shifted_chebyshev_polynomial_u(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (x == T(1)) return T(n + 1);
  if (x == T(0)) return odd_sign(n, T(n + 1));
  const T y = x + x - T(1);
  if (n > 6 && std::fabs(y) < T(1)) {
    const T theta = std::acos(y);
    if (std::sin(theta) != T(0)) return std::sin(T(n + 1) * theta) / std::sin(theta);
    return T(n + 1) * std::cos(T(n + 1) * theta) / y;
  }
  return chebyshev_recurrence(y + y, y + y, n);
}
template <class T> inline T special_shifted_chebyshev_polynomial_v(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (x == T(1)) return T(1);
  if (x == T(0)) return odd_sign(n, T(n + n + 1));
  const T y = x + x - T(1);
  if (n > 6 && std::fabs(y) < T(1)) {
    const T theta = std::acos(y);
    if (std::sin(theta / T(2)) != T(1))
      return std::cos((T(n) + T(0.5)) * theta) / std::cos(theta / T(2));
    return odd_sign(n, T(n + n + 1));
  }
  return chebyshev_recurrence(y + y, y + y - T(1), n);
}
template <class T> inline T special_shifted_chebyshev_polynomial_w(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (x == T(1)) return T(n + n + 1);
  if (x == T(0)) return odd_sign(n, T(1));
  const T y = x + x - T(1);
  if (n > 4 && std::fabs(y) < T(1)) {
    const T theta = std::acos(y);
    if (std::cos(theta / T(2)) != T(1))
      return std::sin((T(n) + T(0.5)) * theta) / std::sin(theta / T(2));
    return odd_sign(n, T(1));
  }
  return chebyshev_recurrence(y + y, y + y + T(1), n);
}
// Hermite: eager gives NaN past degree 128 (float) or 512 (double).
template <class T> inline int64_t hermite_limit() { return std::is_same_v<T, float> ? 128 : 512; }
template <class T> inline T special_hermite_polynomial_h(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (n == 0) return T(1);
  if (n == 1) return x + x;
  if (n > hermite_limit<T>()) return sf::nan<T>();
  T p = T(1), q = x + x, r = T(0);
  for (int64_t k = 2; k < n + n; k += 2) {
    r = (x + x) * q - T(k) * p;
    p = q;
    q = r;
  }
  return r;
}
template <class T> inline T special_hermite_polynomial_he(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (n == 0) return T(1);
  if (n == 1) return x;
  if (n > hermite_limit<T>()) return sf::nan<T>();
  T p = T(1), q = x, r = T(0);
  for (int64_t k = 1; k < n; ++k) {
    r = x * q - T(k) * p;
    p = q;
    q = r;
  }
  return r;
}
template <class T> inline T special_laguerre_polynomial_l(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(0)) return T(1);
  if (n == 0) return T(1);
  if (n == 1) return T(1) - x;
  T p = T(1), q = T(1) - x, r = q;
  for (int64_t k = 1; k < n && !std::isnan(q); ++k) {
    r = ((T(k + k) + (T(1) - x)) * q - T(k) * p) / T(k + 1);
    p = q;
    q = r;
  }
  return r;
}
template <class T> inline T special_legendre_polynomial_p(T x, T degree) {
  const int64_t n = poly_degree(degree);
  if (n < 0) return T(0);
  if (std::fabs(x) == T(1)) return (x > T(0) || n % 2 == 0) ? T(1) : T(-1);
  if (n == 0) return T(1);
  if (n == 1) return x;
  T p = T(1), q = x, r = q;
  for (int64_t k = 1; k < n && !std::isnan(q); ++k) {
    r = (T(k + k + 1) * x * q - T(k) * p) / T(k + 1);
    p = q;
    q = r;
  }
  return r;
}
""",
)

_POLYNOMIALS = (
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
    "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
    "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p",
)  # fmt: skip
_SAME_NAME = (
    "special_i0e", "special_i1", "special_i1e", "special_modified_bessel_k0",
    "special_modified_bessel_k1", "special_scaled_modified_bessel_k0",
    "special_scaled_modified_bessel_k1", "special_bessel_j0", "special_bessel_j1",
    "special_bessel_y0", "special_bessel_y1", "special_spherical_bessel_j0", "special_airy_ai",
    "special_ndtri", "special_erfcx", "special_zeta",
)  # fmt: skip
# The op of the ops protocol -> (C++ function in namespace ember, section defining it).
OP_FUNCTIONS: dict[str, tuple[str, str]] = {
    "i0": ("special_i0", "special_i0"),
    "special_modified_bessel_i0": ("special_i0", "special_i0"),
    "special_modified_bessel_i1": ("special_i1", "special_i1"),
    "digamma": ("special_digamma", "special_digamma"),
    "polygamma": ("special_polygamma", "special_polygamma"),
    "igamma": ("special_igamma", "special_igamma"),
    "igammac": ("special_igammac", "special_igamma"),
    **{name: (name, name) for name in _SAME_NAME},
    **{f"special_{p}": (f"special_{p}", "special_polynomials") for p in _POLYNOMIALS},
}


def op_format(name: str) -> str | None:
    """The ops-table template of special op `name` (None if it is not one)."""
    if name not in OP_FUNCTIONS:
        return None
    arguments = ", ".join(f"{{{i}}}" for i in range(arity(name)))
    return f"ember::{OP_FUNCTIONS[name][0]}({arguments})"


_CALL = re.compile(r"\bember::(\w+)\(")
_FUNCTION_SECTION = {function: section for function, section in OP_FUNCTIONS.values()}


def _closure(names: Iterable[str]) -> set[str]:
    wanted: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name not in wanted:
            wanted.add(name)
            stack.extend(SECTIONS[name].needs)
    return wanted


def special_source(kernel_text: str) -> str:
    """The C++ of the special functions `kernel_text` calls (empty if none): their
    tables, then the functions, each after those it calls, inside `namespace ember`."""
    called = {_FUNCTION_SECTION[f] for f in _CALL.findall(kernel_text) if f in _FUNCTION_SECTION}
    if not called:
        return ""
    wanted = _closure(called)
    tables = sorted({t for name in wanted for t in SECTIONS[name].tables})
    parts = ["namespace ember {", "namespace sf {", *(_table(t) for t in tables), "}", _COMMON]
    parts += [SECTIONS[name].code for name in SECTIONS if name in wanted]
    parts.append("}  // namespace ember\n")
    return "\n".join(parts)
