"""Ember's C++ special functions (ember.codegen.cpp.special) against torch, compiled
strict with fallbacks off, over wide ranges: NaN, infinities, signed zeros, negatives,
every branch boundary of the approximations, and magnitudes from 1e-30 to 1e30.

What must hold, per dtype:
- NaN and infinities (with their sign) exactly where eager has them;
- float64: within 1e-12 relative of eager (the same approximations in the same
  precision; the incomplete gamma functions, which ember sums in its own way, within
  2e-9 of eager and 1e-10 of mpmath, since eager's own float64 values are off by up to
  7e-10 where it uses the uniform asymptotic expansion);
- float32: within 2e-6 relative (plus 1e-30) of the float64 result, or no further from
  it than twice eager's own distance (eager's float32 approximations carry more error
  near the zeros of the Bessel functions, and its igammac much more for small a);
- bfloat16 (computed in float32, as eager does): within one bfloat16 step of eager's
  result, or no further from the float32 result than eager's.
One graph per group of functions, so that each dtype compiles one translation unit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ember.runtime  # noqa: F401  # registers backend="ember"
from ember.runtime import config

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "i0": torch.i0,
    "i0e": torch.special.i0e,
    "i1": torch.special.i1,
    "i1e": torch.special.i1e,
    "modified_bessel_i0": torch.special.modified_bessel_i0,
    "modified_bessel_i1": torch.special.modified_bessel_i1,
    "modified_bessel_k0": torch.special.modified_bessel_k0,
    "modified_bessel_k1": torch.special.modified_bessel_k1,
    "scaled_modified_bessel_k0": torch.special.scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": torch.special.scaled_modified_bessel_k1,
    "bessel_j0": torch.special.bessel_j0,
    "bessel_j1": torch.special.bessel_j1,
    "bessel_y0": torch.special.bessel_y0,
    "bessel_y1": torch.special.bessel_y1,
    "spherical_bessel_j0": torch.special.spherical_bessel_j0,
    "airy_ai": torch.special.airy_ai,
    "erfcx": torch.special.erfcx,
    "log_ndtr": torch.special.log_ndtr,
    "digamma": torch.digamma,
    "trigamma": lambda x: torch.polygamma(1, x),
    # from order 2 through the Hurwitz zeta, whose direct sum runs from q to 9: as in
    # eager, about |x| steps for a negative non-integer x, so those stay above -1e3
    "polygamma_2": lambda x: torch.polygamma(2, torch.where(x < -1e3, -x, x)),
    "polygamma_3": lambda x: torch.polygamma(3, torch.where(x < -1e3, -x, x)),
}
POLYNOMIALS = [
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
    "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
    "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
    "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p",
]  # fmt: skip
EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30, 1e-6, 1e-5, 0.5, -0.5]
EDGES += [1.0, -1.0, 2.0, 2.09, -2.09, 5.0, 8.0, -8.0, 10.0, 26.0, 50.0, 85.0, 88.0, 89.5]
EDGES += [-9.5, -26.5, -27.0, 103.8, 104.0, 700.0, 1e10, 1e30, -1e30, -3.0, -2.5]


def _unary_inputs() -> torch.Tensor:
    magnitudes = torch.logspace(-30, 30, 241, dtype=torch.float64)
    return torch.cat(
        [torch.tensor(EDGES, dtype=torch.float64), torch.linspace(-30, 30, 3001).double(),
         magnitudes, -magnitudes]
    )  # fmt: skip


def _compiled(fn: Callable[..., Any], *args: torch.Tensor) -> Any:
    torch._dynamo.reset()
    with config.scope(fallback=False, strict=True):
        return torch.compile(fn, backend="ember")(*args)


def _same_specials(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    g, w = got.double(), want.double()
    nan_differs = g.isnan() != w.isnan()
    assert not nan_differs.any(), f"{name}: NaN differs at {nan_differs.nonzero()[:5].tolist()}"
    inf_differs = (g.isinf() != w.isinf()) | (g.isinf() & (g.sign() != w.sign()))
    assert not inf_differs.any(), (
        f"{name}: infinity differs at {inf_differs.nonzero()[:5].tolist()}"
    )


def _check(
    name: str, got: torch.Tensor, eager: torch.Tensor, precise: torch.Tensor, dtype: torch.dtype
) -> None:
    """`got` against eager at `dtype` and a more precise `precise` result (float64 for
    float32 and float64, float32 for bfloat16)."""
    assert got.dtype == eager.dtype == dtype
    _same_specials(name, got, eager)
    g, e, p = got.double(), eager.double(), precise.double()
    finite = g.isfinite() & e.isfinite() & p.isfinite()
    g, e, p = g[finite], e[finite], p[finite]
    if dtype == torch.float64:
        rtol = 2e-9 if name.startswith("igamma") else 1e-12
        bad = (g - e).abs() > rtol * e.abs() + 1e-300
    elif dtype == torch.float32:
        ours, theirs = (g - p).abs(), (e - p).abs()
        bad = (ours > 2e-6 * p.abs() + 1e-30) & (ours > 2 * theirs)
    else:
        ours, theirs = (g - p).abs(), (e - p).abs()
        bad = ((g - e).abs() > 2.0**-7 * e.abs()) & (ours > theirs)
    assert not bad.any(), (
        f"{name} {dtype}: {int(bad.sum())} values out of bounds, e.g. ours "
        f"{g[bad][:3].tolist()} eager {e[bad][:3].tolist()} precise {p[bad][:3].tolist()}"
    )


def _run(
    fns: dict[str, Callable[..., torch.Tensor]], args: tuple[torch.Tensor, ...], dtype: torch.dtype
) -> None:
    def all_of(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(fn(*xs) for fn in fns.values())

    inputs = tuple(a.to(dtype) for a in args)
    if dtype == torch.bfloat16:  # eager computes only some of them in bfloat16
        fns = {name: fn for name, fn in fns.items() if _eager_supports(fn, inputs)}
        assert fns
    got = _compiled(all_of, *inputs)
    eager = all_of(*inputs)
    precise_dtype = torch.float32 if dtype == torch.bfloat16 else torch.float64
    precise = all_of(*(a.to(precise_dtype) for a in inputs))
    for name, g, e, p in zip(fns, got, eager, precise, strict=True):
        _check(name, g, e, p, dtype)


def _eager_supports(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> bool:
    try:
        fn(*(x[:1] for x in inputs))
    except NotImplementedError:
        return False
    return True


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_unary_special_functions_match_eager(dtype: torch.dtype) -> None:
    _run(UNARY, (_unary_inputs(),), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # no bfloat16 ndtri in eager
def test_ndtri_matches_eager(dtype: torch.dtype) -> None:
    edges = torch.tensor([0.0, -0.0, 1.0, -0.1, 1.1, 1e-30, 1e-300, 0.5, math.nan, math.inf])
    probabilities = torch.cat([edges.double(), torch.sigmoid(_unary_inputs())])
    _run({"ndtri": torch.special.ndtri}, (probabilities,), dtype)


def _pairs(first: list[float], second: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.tensor(first, dtype=torch.float64)
    b = torch.tensor(second, dtype=torch.float64)
    return a[:, None].expand(-1, len(b)).reshape(-1), b[None, :].expand(len(a), -1).reshape(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_incomplete_gamma_and_zeta_match_eager(dtype: torch.dtype) -> None:
    values = [0.0, -0.0, 1e-30, 1e-5, 0.3, 0.5, 0.9, 1.0, 1.1, 1.5, 2.0, 3.0, 7.0, 9.9, 10.0]
    values += [12.5, 25.0, 30.0, 100.0, 150.0, 250.0, 1000.0, 1e5, -0.5, -1.0, -2.5, -3.0]
    values += [math.inf, -math.inf, math.nan]
    a, x = _pairs(values, values)
    fns = {"igamma": torch.igamma, "igammac": torch.igammac, "zeta": torch.special.zeta}
    _run(fns, (a, x), dtype)


def test_incomplete_gamma_float64_against_mpmath() -> None:
    mpmath = pytest.importorskip("mpmath")
    points = [(30.0, 30.0), (150.0, 100.0), (1e-5, 1.0), (0.5, 700.0), (2.5, 0.3), (250.0, 260.0)]
    a = torch.tensor([p[0] for p in points], dtype=torch.float64)
    x = torch.tensor([p[1] for p in points], dtype=torch.float64)
    lower, upper = _compiled(lambda a, x: (torch.igamma(a, x), torch.igammac(a, x)), a, x)
    with mpmath.workdps(40):
        for i, (pa, px) in enumerate(points):
            p = float(mpmath.gammainc(pa, 0, px, regularized=True))
            q = float(mpmath.gammainc(pa, px, mpmath.inf, regularized=True))
            assert abs(float(lower[i]) - p) <= 1e-10 * abs(p) + 1e-300, (pa, px)
            assert abs(float(upper[i]) - q) <= 1e-10 * abs(q) + 1e-300, (pa, px)


# eager has no bfloat16 orthogonal polynomials
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_orthogonal_polynomials_match_eager(dtype: torch.dtype) -> None:
    xs = [*torch.linspace(-2, 2, 81).tolist(), 0.0, 1.0, -1.0, 0.5, math.nan, math.inf, -math.inf]
    degrees = [-1.0, 0.0, 1.0, 2.0, 3.0, 5.0, 7.0, 9.0, 10.0, 20.0, 2.7, 130.0, 600.0]
    degrees += [math.nan, math.inf, -math.inf, 1e20]
    x, n = _pairs(xs, degrees)
    fns = {p: getattr(torch.special, p) for p in POLYNOMIALS}
    _run(fns, (x, n), dtype)
