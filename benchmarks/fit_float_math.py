"""Fits the polynomials of the C++ prelude's float math (ember.codegen.cpp.prelude).

    uv run python benchmarks/fit_float_math.py [--points 6000]

Prints, for each polynomial the prelude evaluates, its coefficients (lowest power
first, as float32 literals) and its largest weighted error on the fitting grid, before
and after rounding the coefficients to float32. The prelude's `exp`, `erf` and `tanh`
polynomials are these, digit for digit; `log` keeps the Cephes polynomial its comment
names.

Method. Each fit minimises the largest weighted error over a dense grid (the weight
makes it a relative error where the function needs one): Lawson's iteration, a least
squares fit repeated with each point's weight multiplied by its last error, so the
weights gather where the error peaks and the fit tends to the equal-ripple minimax
one. Reference values come from mpmath at 40 digits. Rounding to float32 then goes
one coefficient at a time, the highest power first, each followed by a refit of the
coefficients not yet rounded, so that those absorb the earlier roundings.

What the prelude evaluates (r, s, u as there):
- exp:  e^r = 1 + r + r^2 P(r) on |r| <= ln2/2 (with a margin for the rounding of k),
        P of degree 4; relative error.
- erf, |x| < 0.96875: erf(x) = x + x P(x^2), P of degree 5; relative error.
- erf, 0.96875 <= |x| <= 4: erfc(|x|) = Q(|x| - 2.484375), Q of degree 15, the middle
        of the interval as origin (an origin at either end costs over 20 ulps: the
        coefficients grow and cancel); absolute error, which is what 1 - Q is off by.
- tanh, |x| < 0.625: tanh(x) = x + x^3 P(x^2), P of degree 4; relative error.
- GELU, |x| < 1.375: GELU(x) = x/2 + x^2 W(x^2) with W(x^2) = (Phi(x) - 1/2) / x, W of
        degree 5; the error relative to GELU(-|x|) = -|x| Phi(-|x|), the side where
        x/2 and x^2 W nearly cancel. (GELU's large branch is erf's Q halved: exact.)
The final error bounds in ulps are measured over every float32 by
`python -m ember.runtime.ulps --stride 1` (see its docstring).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import mpmath
import numpy as np

mpmath.mp.dps = 40


@dataclass(frozen=True)
class Fit:
    """One polynomial: the target values on a grid, the basis and the error weight."""

    name: str
    grid: np.ndarray  # the points the error is measured at
    variable: np.ndarray  # the polynomial's variable at those points
    target: np.ndarray  # the polynomial's wanted values there
    weight: np.ndarray  # error = weight * (polynomial - target)
    degree: int


def lawson(basis: np.ndarray, target: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Coefficients with (nearly) the smallest max |weight * (basis @ c - target)|."""
    a = basis * weight[:, None]
    b = target * weight
    w = np.full(len(b), 1.0 / len(b))
    c = np.zeros(basis.shape[1])
    for _ in range(80):
        root = np.sqrt(w)
        c = np.linalg.lstsq(a * root[:, None], b * root, rcond=None)[0]
        error = np.abs(a @ c - b)
        w = w * error
        w = w / w.sum()
    return c


def rounded(fit: Fit) -> tuple[np.ndarray, float, float]:
    """float32 coefficients of `fit`, and its max weighted error before and after rounding."""
    basis = np.vander(fit.variable, fit.degree + 1, increasing=True)

    def worst(c: np.ndarray) -> float:
        return float(np.max(np.abs((basis @ c - fit.target) * fit.weight)))

    exact = worst(lawson(basis, fit.target, fit.weight))
    fixed: dict[int, float] = {}
    for power in range(fit.degree, -1, -1):
        free = [k for k in range(fit.degree + 1) if k not in fixed]
        rest = fit.target - sum(
            (basis[:, k] * v for k, v in fixed.items()), np.zeros_like(fit.target)
        )
        c = lawson(basis[:, free], rest, fit.weight)
        fixed[power] = float(np.float32(c[free.index(power)]))
    coefficients = np.array([fixed[k] for k in range(fit.degree + 1)])
    return coefficients, exact, worst(coefficients)


def values(function: Callable[[mpmath.mpf], mpmath.mpf], points: np.ndarray) -> np.ndarray:
    return np.array([float(function(mpmath.mpf(float(p)))) for p in points])


def fits(points: int) -> list[Fit]:
    half_ln2 = float(mpmath.log(2)) / 2 * 1.001
    r = np.linspace(-half_ln2, half_ln2, points)
    r = r[np.abs(r) > 1e-4]
    exp_r = values(mpmath.exp, r)

    x = np.linspace(1e-4, 0.96875, points)
    erf_x = values(mpmath.erf, x)

    a = np.linspace(0.96875, 4.0, points)
    erfc_a = values(mpmath.erfc, a)

    t = np.linspace(1e-3, 0.625, points)
    tanh_t = values(mpmath.tanh, t)

    g = np.linspace(1e-4, 1.375, points)
    gelu_w = values(lambda v: (mpmath.ncdf(v) - mpmath.mpf(0.5)) / v, g)
    phi_minus = values(lambda v: mpmath.ncdf(-v), g)
    return [
        Fit("exp P(r)", r, r, (exp_r - 1 - r) / (r * r), r * r / exp_r, 4),
        Fit("erf small P(x^2)", x, x * x, erf_x / x - 1, x / erf_x, 5),
        Fit("erf large Q(|x| - 2.484375)", a, a - 2.484375, erfc_a, np.ones_like(a), 15),
        Fit("tanh small P(x^2)", t, t * t, (tanh_t - t) / t**3, t**3 / tanh_t, 4),
        Fit("gelu small W(x^2)", g, g * g, gelu_w, g / phi_minus, 5),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--points", type=int, default=6000, help="grid points per fit")
    options = parser.parse_args()
    for fit in fits(options.points):
        coefficients, exact, after = rounded(fit)
        print(f"{fit.name}: degree {fit.degree}, max error {exact:.3g} (float32: {after:.3g})")
        print("  " + ", ".join(f"{c:.9e}f" for c in coefficients))


if __name__ == "__main__":
    main()
