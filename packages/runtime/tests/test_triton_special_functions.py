"""Ember's Triton special functions (ember.codegen.triton.special and .polynomials)
against torch: Airy Ai, trigamma and polygamma, the Hurwitz zeta function and the
orthogonal polynomials, over the ranges test_cpp_special_functions.py uses for the C++
versions (NaN, infinities, signed zeros, negatives, every branch boundary, magnitudes
from 1e-30 to 1e30, degrees from -1 to 600), held to the same bounds:

- NaN and infinities (with their sign) exactly where eager has them;
- float64: within 1e-12 relative of eager;
- float32: within 2e-6 relative (plus 1e-30) of the float64 result, or no further from
  it than twice eager's own distance;
- bfloat16 (computed in float32): within one bfloat16 step of eager's result, or no
  further from the float32 result than eager's.

Those bounds hold on a GPU (the `cuda` tests), where the kernels call the libdevice
functions eager's CUDA kernels call. On the CPU the kernels run in Triton's
interpreter (in subprocesses, see triton_harness) against eager on the CPU, and the
interpreter evaluates libdevice with NumPy's routines, without fused multiply-adds: a
few ulps apart from glibc, which the ill-conditioned regions amplify (Ai's phase at
x = -29, the trigonometric forms at degree 600, the recurrences just outside [-1, 1],
zeta's cancelling sum at negative x), float32 subnormals become bfloat16 wrongly, and
the sine of a float32 beyond 2^24 (Ai's phase below x = -1e6) is reduced differently.
There the values are held to a looser bound, 2.5e-4 relative plus 1e-5 (float32) or
1e-9 plus 1e-13 (float64) of the precise result or of eager's (or no further from the
precise result than twice eager's distance), which still catches a wrong branch,
sign, coefficient or step count; NaN and infinities must match exactly as on a GPU.

Degrees that are NaN, infinite or beyond int64 convert as CUDA converts them (NaN to 0,
saturated), which x86 eager does not (INT64_MIN): the CPU cases leave those out of the
comparison and check the conversion directly.
"""

from __future__ import annotations

import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from triton_harness import interpret, lower_for_triton, report, run_with_triton

from ember.scheduler import ExternCall

Fns = dict[str, Callable[..., torch.Tensor]]

UNARY: Fns = {
    "airy_ai": torch.special.airy_ai,
    "trigamma": lambda x: torch.polygamma(1, x),
    # from order 2 through the Hurwitz zeta, whose direct sum runs from q to 9: about
    # |x| steps for a negative non-integer x, so those stay above -1e3
    "polygamma_2": lambda x: torch.polygamma(2, torch.where(x < -1e3, -x, x)),
    "polygamma_3": lambda x: torch.special.polygamma(3, torch.where(x < -1e3, -x, x)),
    "polygamma_4": lambda x: torch.polygamma(4, torch.where(x < -1e3, -x, x)),
}
POLYNOMIALS: Fns = {
    name: getattr(torch.special, name)
    for name in (
        "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
        "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
        "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
        "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
        "laguerre_polynomial_l", "legendre_polynomial_p",
    )
}  # fmt: skip
EDGES = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, -1e-30, 1e-6, 1e-5, 0.5, -0.5]
EDGES += [1.0, -1.0, 2.0, 2.09, -2.09, 5.0, 8.0, -8.0, 10.0, 26.0, 50.0, 85.0, 88.0, 89.5]
EDGES += [-9.5, -26.5, -27.0, 103.8, 104.0, 700.0, 1e10, 1e30, -1e30, -3.0, -2.5]
ZETA_VALUES = [0.0, -0.0, 1e-30, 1e-5, 0.3, 0.5, 0.9, 1.0, 1.1, 1.5, 2.0, 3.0, 7.0, 9.9, 10.0]
ZETA_VALUES += [12.5, 25.0, 30.0, 100.0, 150.0, 250.0, 1000.0, 1e5, -0.5, -1.0, -2.5, -3.0]
ZETA_VALUES += [math.inf, -math.inf, math.nan]
XS = [*torch.linspace(-2, 2, 81).tolist(), 0.0, 1.0, -1.0, 0.5, 0.25, math.nan, math.inf]
XS += [-math.inf, 1.0001, -1.0001, 3.0, -7.5]
DEGREES = [-1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 20.0, 2.7, 130.0]
DEGREES += [600.0, -math.inf]
# where CUDA's conversion and x86's differ; on a GPU eager loops up to int64's maximum
# for the degrees that saturate wherever the recurrence stays finite, so only NaN
UNCONVERTIBLE = [math.nan]


def _unary_inputs() -> torch.Tensor:
    magnitudes = torch.logspace(-30, 30, 241, dtype=torch.float64)
    return torch.cat(
        [torch.tensor(EDGES, dtype=torch.float64), torch.linspace(-30, 30, 3001).double(),
         magnitudes, -magnitudes]
    )  # fmt: skip


def _pairs(first: list[float], second: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.tensor(first, dtype=torch.float64)
    b = torch.tensor(second, dtype=torch.float64)
    return a[:, None].expand(-1, len(b)).reshape(-1), b[None, :].expand(len(a), -1).reshape(-1)


def _groups(device: str) -> dict[str, tuple[Fns, tuple[torch.Tensor, ...]]]:
    degrees = DEGREES + (UNCONVERTIBLE if device == "cuda" else [])
    return {
        "unary": (UNARY, (_unary_inputs(),)),
        "zeta": ({"zeta": torch.special.zeta}, _pairs(ZETA_VALUES, ZETA_VALUES)),
        "polynomials": (POLYNOMIALS, _pairs(XS, degrees)),
    }


DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}
CASES = [f"{g}_{d}" for g in ("unary", "zeta", "polynomials") for d in DTYPES]
CASES.remove("polynomials_bfloat16")  # eager has no bfloat16 orthogonal polynomials
CASES.remove("zeta_bfloat16")  # nor bfloat16 zeta
CASES.append("nan_degree")


def _eager_supports(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> bool:
    try:
        fn(*(x[:1] for x in inputs))
    except (NotImplementedError, RuntimeError):
        return False
    return True


def _triton(fns: Fns, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """The functions of `fns` run together as ember's Triton kernels on the inputs'
    device (no part of them left to ATen)."""

    def all_of(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(fn(*xs) for fn in fns.values())

    program, schedule = lower_for_triton(all_of, [x.cpu() for x in inputs], False)
    assert not any(isinstance(s, ExternCall) for s in schedule.steps)
    with tempfile.TemporaryDirectory() as cache:
        outputs, _ = run_with_triton(program, schedule, list(inputs), seed=0, cache_dir=Path(cache))
    return list(outputs)


_LOOSE = {torch.float64: (1e-9, 1e-13), torch.float32: (2.5e-4, 1e-5)}
# inputs left out in the interpreter: where float32 cannot resolve Ai's phase
_INTERPRETER_SKIPS: dict[str, Callable[..., torch.Tensor]] = {"airy_ai": lambda x: x < -1e6}


def _bounds_failures(
    name: str,
    got: torch.Tensor,
    eager: torch.Tensor,
    precise: torch.Tensor,
    dtype: torch.dtype,
    inputs: tuple[torch.Tensor, ...],
    strict: bool,
) -> str | None:
    """Why `got` is out of bounds against eager and the more precise result (None if
    it is not); the interpreter's looser bounds unless `strict`."""
    if got.dtype != dtype:
        return f"{name}: dtype {got.dtype}"
    g, e, p = got.double().cpu(), eager.double().cpu(), precise.double().cpu()
    nan_differs = g.isnan() != e.isnan()
    inf_differs = (g.isinf() != e.isinf()) | (g.isinf() & (g.sign() != e.sign()))
    for what, differs in (("NaN", nan_differs), ("infinity", inf_differs)):
        if differs.any():
            at = differs.nonzero()[:5].flatten().tolist()
            return f"{name} {dtype}: {what} differs at {at}: ours {g[at]} eager {e[at]}"
    finite = g.isfinite() & e.isfinite() & p.isfinite()
    if not strict and name in _INTERPRETER_SKIPS and dtype != torch.float64:
        finite &= ~_INTERPRETER_SKIPS[name](*inputs).cpu()
    g, e, p = g[finite], e[finite], p[finite]
    ours, theirs = (g - p).abs(), (e - p).abs()
    if not strict:
        relative, absolute = _LOOSE.get(dtype, (2.0**-7, 2.0**-7))
        apart = (g - e).abs() > relative * e.abs() + absolute
        bad = (ours > relative * p.abs() + absolute) & apart & (ours > 2 * theirs)
    elif dtype == torch.float64:
        bad = (g - e).abs() > 1e-12 * e.abs() + 1e-300
    elif dtype == torch.float32:
        bad = (ours > 2e-6 * p.abs() + 1e-30) & (ours > 2 * theirs)
    else:
        bad = ((g - e).abs() > 2.0**-7 * e.abs()) & (ours > theirs)
    if bad.any():
        return (
            f"{name} {dtype}: {int(bad.sum())} values out of bounds, e.g. ours "
            f"{g[bad][:3].tolist()} eager {e[bad][:3].tolist()} precise {p[bad][:3].tolist()}"
        )
    return None


def _check_group(group: str, dtype: torch.dtype, device: str) -> list[str]:
    fns, args = _groups(device)[group]
    inputs = tuple(a.to(dtype).to(device) for a in args)
    fns = {name: fn for name, fn in fns.items() if _eager_supports(fn, inputs)}
    assert fns, f"eager supports none of {group} in {dtype}"
    got = _triton(fns, inputs)
    precise_dtype = torch.float32 if dtype == torch.bfloat16 else torch.float64
    failures = []
    for (name, fn), g in zip(fns.items(), got, strict=True):
        eager = fn(*inputs)
        precise = fn(*(a.to(precise_dtype) for a in inputs))
        failure = _bounds_failures(name, g, eager, precise, dtype, inputs, strict=device == "cuda")
        if failure:
            failures.append(failure)
    return failures


def _nan_degree(device: str) -> list[str]:
    """A NaN degree is degree 0 (CUDA's conversion): every polynomial is 1 there, at
    every x, NaN included; a degree of -inf is negative: 0."""
    x = torch.tensor(XS, device=device)
    failures = []
    for degree, want in ((math.nan, 1.0), (-math.inf, 0.0)):
        n = torch.full_like(x, degree)
        for name, got in zip(POLYNOMIALS, _triton(POLYNOMIALS, (x, n)), strict=True):
            if not bool((got == want).all()):
                failures.append(f"{name} at degree {degree}: {got.tolist()}")
    return failures


def run_case(name: str, device: str) -> dict[str, Any]:
    if name == "nan_degree":
        failures = _nan_degree(device)
    else:
        group, dtype = name.rsplit("_", 1)
        failures = _check_group(group, DTYPES[dtype], device)
    return {"case": name, "ok": not failures, "error": "\n".join(failures)}


@pytest.fixture(scope="module")
def interpreter_results() -> dict[str, dict[str, Any]]:
    return interpret(__file__, CASES, workers=2)


@pytest.mark.parametrize("case", CASES)
def test_special_function_in_interpreter(
    case: str, interpreter_results: dict[str, dict[str, Any]]
) -> None:
    record = interpreter_results.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")


# Measured on the H100 (2026-11-24): each of these cases has values out of bounds, so
# the ops are off in the Triton op table (optable.UNSUPPORTED) until fixed.
_GPU_MISMATCHES = {
    "unary_float32": "Airy Ai about 1e-5 off eager in float32",
    "unary_float64": "Airy Ai off eager in one float64 value",
    "unary_bfloat16": "polygamma(2..4) up to 7% off eager in bfloat16",
    "zeta_float32": "zeta gives 0 where eager gives NaN",
    "polynomials_float32": "T_n etc. give 1 where CUDA eager gives 0 (NaN degrees)",
    "polynomials_float64": "T_n etc. give 1 where CUDA eager gives 0 (NaN degrees)",
}


@pytest.mark.cuda
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(reason=_GPU_MISMATCHES[c], strict=True))
        if c in _GPU_MISMATCHES
        else c
        for c in CASES
        if c != "nan_degree"
    ],
)
def test_special_function_on_gpu(case: str) -> None:
    """Against eager on the GPU, NaN degrees included (eager converts them there as
    ember's helpers do)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    record = run_case(case, "cuda")
    assert record["ok"], record["error"]


if __name__ == "__main__":
    report(run_case, sys.argv[1:])
