"""Triton scan kernels (cumsum, cumprod, cummax, cummin, logcumsumexp), persistent,
looped and with look-back, run and compared with the IR interpreter and eager.

On the CPU they run in Triton's interpreter, in a subprocess (`TRITON_INTERPRET=1`
must be set before Triton is imported and must not leak into other tests), which
prints one JSON line per case. logcumsumexp's combine calls libdevice, which the
interpreter lacks: that case runs on a GPU only (`cuda` tests run every case there).
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_triton_kernels import _compare, _same_layout
from triton_harness import interpret, lower_for_triton, report, run_with_triton

from ember.ir import run_program

NAN = float("nan")


def _ties(device: str) -> list[Any]:
    x = torch.randint(0, 3, (6, 300), generator=torch.Generator().manual_seed(0)).float()
    x[1, 7] = x[1, 250] = NAN
    x[2, :] = -float("inf")
    x[3, ::2] = -0.0
    return [x.to(device)]


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> Callable[[str], list[Any]]:
    def make(device: str) -> list[Any]:
        g = torch.Generator().manual_seed(0)
        return [torch.randn(shape, generator=g).to(dtype).to(device)]

    return make


def _integers(*shape: int, dtype: torch.dtype) -> Callable[[str], list[Any]]:
    def make(device: str) -> list[Any]:
        g = torch.Generator().manual_seed(0)
        return [torch.randint(-2, 3, shape, generator=g).to(dtype).to(device)]

    return make


# name -> (function, inputs, options: reduction='looped' forces the looped form,
# interpret=False skips the interpreter)
CASES: dict[str, tuple[Callable[..., Any], Callable[[str], list[Any]], dict[str, Any]]] = {
    "cumsum_rows": (lambda x: x.cumsum(1), _randn(5, 300), {}),
    "cumsum_rows_looped": (lambda x: x.cumsum(1), _randn(5, 300), {"reduction": "looped"}),
    "cumsum_long": (lambda x: x.cumsum(0), _randn(5000), {}),
    "cumsum_columns": (lambda x: x.cumsum(0), _randn(300, 70), {}),
    "cumprod": (lambda x: (x * 0.01 + 1).cumprod(1), _randn(4, 200), {"reduction": "looped"}),
    "cummax_ties": (lambda x: (torch.cummax(x, 1), torch.cummin(x, 1)), _ties, {}),
    "cummax_ties_looped": (
        lambda x: (torch.cummax(x, 1), torch.cummin(x, 1)),
        _ties,
        {"reduction": "looped"},
    ),
    "int_bool": (
        lambda x: ((x > 0).cumsum(1), (x * 3).to(torch.int32).cumsum(0), torch.cummax(x > 0, 1)),
        _randn(9, 40),
        {},
    ),
    # ember carries the running sum in float32 and rounds each result once; eager's
    # CUDA result was up to 1.3x its own size away from ember's where a sum cancels
    # (H100, torch 2.11), so the two are not compared with each other but with the
    # float64 sum: ember within an ulp of it, and at most an ulp farther from it
    # than eager anywhere.
    "bf16": (
        lambda x: x.cumsum(1),
        _randn(4, 100, dtype=torch.bfloat16),
        {"rtol": 1e-2, "exact": True},  # against the interpreter: an ulp apart
    ),
    "logcumsumexp": (
        lambda x: torch.logcumsumexp(x, 1),
        _randn(4, 3000),
        {"interpret": False},
    ),
    # long rows carried in float32: one pass with look-back, its workspace from the
    # launcher; small integers, so every float32 sum is exact (and a float16 one)
    "cumsum_lookback": (
        lambda x: x.cumsum(1),
        _integers(2, 33001, dtype=torch.float16),
        {"atol": 0, "rtol": 0},
    ),
}


def run_case(name: str, device: str) -> dict[str, Any]:
    fn, make_args, options = CASES[name]
    args = make_args(device)
    program, schedule = lower_for_triton(fn, [a.cpu() for a in args], False)
    atol, rtol = options.get("atol", 1e-5), options.get("rtol", 1e-4)
    with tempfile.TemporaryDirectory() as cache:
        actual, kinds = run_with_triton(
            program,
            schedule,
            [_same_layout(a) for a in args],
            seed=0,
            cache_dir=Path(cache),
            reduction=options.get("reduction"),
        )
    reference = run_program(program, [_same_layout(a.cpu()) for a in args], seed=0)
    _compare(actual, reference, atol, rtol)
    expected = fn(*[_same_layout(a) for a in args])
    expected = list(expected) if isinstance(expected, tuple) else [expected]
    if options.get("exact"):
        exact = fn(*[_same_layout(a).double() for a in args])
        exact = list(exact) if isinstance(exact, tuple) else [exact]
        for ours, eager, truth in zip(actual, expected, exact, strict=True):
            torch.testing.assert_close(ours.cpu().double(), truth.cpu(), atol=1e-6, rtol=2**-7)
            ours_error = (ours.cpu().double() - truth.cpu()).abs()
            eager_error = (eager.cpu().double() - truth.cpu()).abs()
            assert bool((ours_error <= eager_error + 2**-7 * truth.cpu().abs()).all())
    else:
        _compare(actual, expected, atol, rtol)
    return {"case": name, "ok": True, "kinds": kinds, "kernels": len(schedule.kernels)}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    names = [n for n, (_, _, o) in CASES.items() if o.get("interpret", True)]
    return interpret(__file__, names)


@pytest.mark.parametrize("case", [n for n, (_, _, o) in CASES.items() if o.get("interpret", True)])
def test_scan_kernel_in_interpreter(case: str, interpreted: dict[str, dict[str, Any]]) -> None:
    record = interpreted.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")


def test_both_scan_forms_ran(interpreted: dict[str, dict[str, Any]]) -> None:
    kinds = {k for r in interpreted.values() for k in r.get("kinds", [])}
    assert {"persistent_scan", "looped_scan", "lookback_scan"} <= kinds
    assert interpreted["cummax_ties"]["kernels"] == 1  # values and indices together


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_scan_kernel_on_gpu(case: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert run_case(case, "cuda")["ok"]


if __name__ == "__main__":
    report(run_case, sys.argv[1:])
