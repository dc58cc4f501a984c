"""Triton sort kernels (sort, argsort, topk) run and compared with the IR interpreter
(bit for bit) and eager: both directions, rows and columns, NaN, ties and signed
zeros, integer, bool and half types, padded rows, strided inputs.

On the CPU they run in Triton's interpreter, in a subprocess (`TRITON_INTERPRET=1`
must be set before Triton is imported and must not leak into other tests), which
prints one JSON line per case; `cuda` tests run every case on a GPU.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_triton_kernels import _same_layout
from triton_harness import interpret, lower_for_triton, report, run_with_triton

from ember.ir import run_program

NAN, INF = float("nan"), float("inf")


def _ties(device: str) -> list[Any]:
    x = torch.randint(0, 3, (6, 300), generator=torch.Generator().manual_seed(0)).float()
    x[1, 7] = x[1, 250] = NAN
    x[2, :] = -INF
    x[3, ::2] = -0.0
    x[4, ::3] = -NAN
    x[5, 1::2] = INF
    return [x.to(device)]


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> Callable[[str], list[Any]]:
    def make(device: str) -> list[Any]:
        g = torch.Generator().manual_seed(0)
        return [torch.randn(shape, generator=g).to(dtype).to(device)]

    return make


def _distinct(*shape: int) -> Callable[[str], list[Any]]:
    def make(device: str) -> list[Any]:
        g = torch.Generator().manual_seed(0)
        count = 1
        for s in shape:
            count *= s
        return [(torch.randperm(count, generator=g).float() / 3 - 50).view(shape).to(device)]

    return make


def _stable(dim: int, descending: bool = False) -> Callable[[torch.Tensor], Any]:
    return lambda x: torch.sort(x, dim=dim, descending=descending, stable=True)


# name -> (function, inputs, options: eager=False compares with the interpreter only)
CASES: dict[str, tuple[Callable[..., Any], Callable[[str], list[Any]], dict[str, Any]]] = {
    "rows": (lambda x: (_stable(1)(x), _stable(1, True)(x * 2)), _randn(5, 300), {}),
    "short_rows": (lambda x: _stable(1)(x), _randn(37, 5), {}),
    "one": (lambda x: (_stable(1)(x), torch.topk(x, 1, 1)), _randn(9, 1), {}),
    "columns": (lambda x: _stable(0, True)(x), _randn(100, 70), {}),
    "full_block": (lambda x: _stable(-1)(x), _randn(3, 1024), {}),
    "topk": (
        lambda x: (torch.topk(x, 5, 1), torch.topk(x, 7, 0, largest=False)),
        _distinct(40, 90),
        {},
    ),
    "ties_nans": (lambda x: (_stable(1)(x), _stable(1, True)(x), _stable(0)(x)), _ties, {}),
    "median": (lambda x: (torch.median(x[:3]), torch.median(x[3:])), _ties, {}),
    "unstable": (lambda x: torch.sort(x, 1, descending=True), _ties, {"eager": False}),
    "ints": (
        lambda x: (
            _stable(1)(x.long() - 2),
            _stable(0, True)(x.to(torch.int32)),
            _stable(1)(x > 0),
        ),
        _randn(9, 40),
        {},
    ),
    "int8": (lambda x: _stable(1)((x * 40).to(torch.int8)), _randn(6, 100), {}),
    "bf16": (lambda x: _stable(1, True)(x), _randn(4, 100, dtype=torch.bfloat16), {}),
    "float64": (lambda x: _stable(0)(x), _randn(50, 3, dtype=torch.float64), {}),
    "strided": (lambda x: _stable(1)(x.transpose(0, 1)[::2]), _randn(30, 40), {}),
}


def _leaves(tree: Any) -> list[Any]:
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


def run_case(name: str, device: str) -> dict[str, Any]:
    fn, make_args, options = CASES[name]
    args = make_args(device)
    program, schedule = lower_for_triton(fn, [a.cpu() for a in args], False)
    with tempfile.TemporaryDirectory() as cache:
        actual, kinds = run_with_triton(
            program, schedule, [_same_layout(a) for a in args], seed=0, cache_dir=Path(cache)
        )
    reference = _leaves(run_program(program, [_same_layout(a.cpu()) for a in args], seed=0))
    actual = _leaves(actual)
    for a, r in zip(actual, reference, strict=True):
        assert a.dtype == r.dtype and a.shape == r.shape, (a.dtype, r.dtype, a.shape, r.shape)
        # the same bits: signed zeros and NaN included
        torch.testing.assert_close(a.cpu(), r, rtol=0, atol=0, equal_nan=True)
        if r.is_floating_point():
            assert torch.equal(a.cpu().signbit() | a.cpu().isnan(), r.signbit() | r.isnan())
    if options.get("eager", True):
        # eager on the CPU: its order is the one the kernels implement (eager's CUDA
        # sort puts NaNs with the sign bit set elsewhere, which is why CUDA compiles
        # keep sorts ATen calls: `ember.runtime.kernels.sort_limits`)
        expected = _leaves(fn(*[_same_layout(a).cpu() for a in args]))
        for a, e in zip(actual, expected, strict=True):
            torch.testing.assert_close(a.cpu(), e.cpu(), rtol=0, atol=0, equal_nan=True)
    else:  # an unstable sort: eager's values, and positions that gather them
        values, indices = actual
        (x,) = args
        eager = fn(x.cpu()).values
        torch.testing.assert_close(values.cpu(), eager, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(indices.cpu().sort(1).values, torch.arange(x.shape[1]).expand_as(x))
        torch.testing.assert_close(x.gather(1, indices).cpu(), values.cpu(), equal_nan=True)
    return {"case": name, "ok": True, "kinds": kinds, "kernels": len(schedule.kernels)}


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    return interpret(__file__, list(CASES), timeout=900)


@pytest.mark.parametrize("case", list(CASES))
def test_sort_kernel_in_interpreter(case: str, interpreted: dict[str, dict[str, Any]]) -> None:
    record = interpreted.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")


def test_one_sort_kernel_per_sort(interpreted: dict[str, dict[str, Any]]) -> None:
    sorts_only = {k for n, r in interpreted.items() if n != "median" for k in r.get("kinds", [])}
    assert sorts_only == {"sort"}
    assert interpreted["topk"]["kernels"] == 2  # values and indices together, per topk
    # a median: one sort (its positions unused), then a pointwise pick of the middle
    assert sorted(interpreted["median"]["kinds"]) == ["pointwise", "pointwise", "sort", "sort"]


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_sort_kernel_on_gpu(case: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert run_case(case, "cuda")["ok"]


if __name__ == "__main__":
    report(run_case, sys.argv[1:])
