"""Triton kernels of the newer scatter lowerings (index_reduce, scatter_reduce's mean,
put, masked_scatter, as_strided_scatter) and of frexp and bilinear: every case renders,
and runs in Triton's interpreter against the IR interpreter and eager.

As in test_triton_scans, the interpreter runs in a subprocess (`TRITON_INTERPRET=1`
must be set before Triton is imported), one JSON line per case; `cuda` runs every case
on a GPU. Repeated indices only where the combination does not depend on the order
(sum, max, min, and counts; products of powers of two, or of one value repeated): a
GPU scatter's order of atomics is not eager's. The products and the 16-bit maxima and
minima combine in compare-and-swap loops, 16-bit elements by the 32-bit word holding
them (`scatter_neighbours_*` writes every element of a large tensor once, so that on
a GPU lanes and programs race on the two halves of each word).
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
import torch.nn.functional as F
from test_triton_kernels import _compare, _same_layout
from triton_harness import interpret, lower_for_triton, report, run_with_triton

from ember.ir import run_program


def _args(*make: Callable[[torch.Generator], torch.Tensor]) -> Callable[[str], list[Any]]:
    def build(device: str) -> list[Any]:
        g = torch.Generator().manual_seed(0)
        return [m(g).to(device) for m in make]

    return build


def _x(g: torch.Generator) -> torch.Tensor:
    return torch.randn(12, 5, generator=g)


def _src(g: torch.Generator) -> torch.Tensor:
    return torch.randn(20, 5, generator=g)


def _dups(g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 12, (20,), generator=g)


def _mask(g: torch.Generator) -> torch.Tensor:
    return torch.rand(12, 5, generator=g) > 0.5


def _powers_of_two(dtype: torch.dtype) -> Callable[[torch.Generator], torch.Tensor]:
    def make(g: torch.Generator) -> torch.Tensor:
        magnitude = torch.tensor([0.5, 1.0, 2.0])[torch.randint(0, 3, (20, 5), generator=g)]
        sign = torch.where(torch.rand(20, 5, generator=g) < 0.3, -1.0, 1.0)
        return (sign * magnitude).to(dtype)

    return make


def _with_nans(dtype: torch.dtype, rows: int) -> Callable[[torch.Generator], torch.Tensor]:
    def make(g: torch.Generator) -> torch.Tensor:
        x = torch.randn(rows, 5, generator=g)
        picked = torch.rand(rows, 5, generator=g)
        x = torch.where(picked < 0.1, math.nan, x)
        return torch.where((picked >= 0.1) & (picked < 0.2), -torch.full_like(x, math.nan), x)

    return lambda g: make(g).to(dtype)


# repeated target rows, and a source whose rows are one value per target row: the
# products round alike in any order
_ROWS = torch.randint(0, 12, (20,), generator=torch.Generator().manual_seed(1))


def _repeated(g: torch.Generator) -> torch.Tensor:
    per_row = (1 + torch.rand(12, 5, generator=g) * 0.4).to(torch.float16)
    return per_row[_ROWS]


def _neighbours(dtype: torch.dtype) -> Callable[[torch.Generator], list[torch.Tensor]]:
    def make(g: torch.Generator) -> list[torch.Tensor]:
        x = torch.randint(1, 4, (4096,), generator=g).to(dtype)
        order = torch.randperm(4096, generator=g)
        return [x, order, x[order] + 1]

    return make


# name -> (function, inputs, options: atol/rtol)
CASES: dict[str, tuple[Callable[..., Any], Callable[[str], list[Any]], dict[str, Any]]] = {
    "index_reduce_mean_amax": (
        lambda x, i, s: (
            x.index_reduce(0, i, s, "mean"),
            x.index_reduce(0, i, s, "amax", include_self=False),
        ),
        _args(_x, _dups, _src),
        {},
    ),
    "scatter_reduce_mean": (
        lambda x, i, s: x.scatter_reduce(0, i.view(4, 5), s[:4], "mean", include_self=False),
        _args(_x, _dups, _src),
        {},
    ),
    "put_accumulate": (
        lambda x, i, s: x.put(i * 3 - 60, s, accumulate=True),
        _args(_x, _dups, lambda g: torch.randn(20, generator=g)),
        {},
    ),
    "masked_scatter": (
        lambda x, m, s: x.masked_scatter(m, s),
        _args(_x, _mask, lambda g: torch.randn(60, generator=g)),
        {},
    ),
    "as_strided_scatter": (
        lambda x, s: x.as_strided_scatter(s, (3, 4), (10, 1), 2),
        _args(_x, lambda g: torch.randn(3, 4, generator=g)),
        {},
    ),
    "index_reduce_prod_bf16": (
        lambda x, i, s: (
            x.index_reduce(0, i, s, "prod"),
            x.index_reduce(0, i, s, "prod", include_self=False),
        ),
        _args(lambda g: _x(g).to(torch.bfloat16), _dups, _powers_of_two(torch.bfloat16)),
        {"atol": 0, "rtol": 0},
    ),
    "index_reduce_prod_repeated_fp16": (
        lambda x, i, s: x.index_reduce(0, i, s, "prod"),
        _args(lambda g: _x(g).to(torch.float16), lambda g: _ROWS.clone(), _repeated),
        # the IR interpreter's products round once (eager's CPU scatter_reduce does),
        # eager's index_reduce and its GPU kernels, and ours, at every step
        {"atol": 0, "rtol": 0, "reference": (0, 2e-3)},
    ),
    "scatter_reduce_extrema_nan": (
        lambda x, i, s, h, hs: (
            x.scatter_reduce(0, i.view(4, 5), s[:4], "amin"),
            x.index_reduce(0, i, s, "amax", include_self=False),
            h.scatter_reduce(0, i.view(4, 5), hs[:4], "amax", include_self=False),
            h.index_reduce(0, i, hs, "amin"),
        ),
        _args(
            _with_nans(torch.float32, 12),
            _dups,
            _with_nans(torch.float32, 20),
            _with_nans(torch.float16, 12),
            _with_nans(torch.float16, 20),
        ),
        {"atol": 0, "rtol": 0},
    ),
    **{
        f"scatter_neighbours_{name}": (
            lambda x, o, s: (
                x.scatter_reduce(0, o, s, "amax"),
                x.scatter_reduce(0, o, s, "prod"),
            ),
            lambda device, dtype=dtype: [
                a.to(device) for a in _neighbours(dtype)(torch.Generator().manual_seed(0))
            ],
            {"atol": 0, "rtol": 0},
        )
        for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16))
    },
    "frexp": (
        lambda x: torch.frexp(x * 1e20),
        _args(_x),
        {"atol": 0, "rtol": 0},
    ),
    "bilinear": (
        lambda a, b, w: F.bilinear(a, b, w),
        _args(
            _x,
            lambda g: torch.randn(12, 3, generator=g),
            lambda g: torch.randn(4, 5, 3, generator=g),
        ),
        {"atol": 1e-5, "rtol": 1e-4},
    ),
}


def run_case(name: str, device: str) -> dict[str, Any]:
    fn, make_args, options = CASES[name]
    args = make_args(device)
    program, schedule = lower_for_triton(fn, [a.cpu() for a in args], False)
    assert not program.fallback_ops, program.fallback_ops
    atol, rtol = options.get("atol", 1e-5), options.get("rtol", 1e-4)
    with tempfile.TemporaryDirectory() as cache:
        actual, kinds = run_with_triton(
            program, schedule, [_same_layout(a) for a in args], seed=0, cache_dir=Path(cache)
        )
    reference = run_program(program, [_same_layout(a.cpu()) for a in args], seed=0)
    _compare(actual, reference, *options.get("reference", (atol, rtol)))
    expected = fn(*[_same_layout(a) for a in args])
    _compare(actual, list(expected) if isinstance(expected, tuple) else [expected], atol, rtol)
    return {"case": name, "ok": True, "kinds": kinds, "kernels": len(schedule.kernels)}


def test_every_case_renders() -> None:
    from ember.codegen.triton import render_kernel

    for name, (fn, make_args, _) in CASES.items():
        _program, schedule = lower_for_triton(fn, make_args("cpu"), False)
        assert schedule.kernels, name
        for kernel in schedule.kernels:
            assert "@triton.jit" in render_kernel(kernel).source, name


@pytest.fixture(scope="module")
def interpreted() -> dict[str, dict[str, Any]]:
    return interpret(__file__, list(CASES))


@pytest.mark.parametrize("case", list(CASES))
def test_scatter_kernel_in_interpreter(case: str, interpreted: dict[str, dict[str, Any]]) -> None:
    record = interpreted.get(case)
    assert record is not None, f"case {case} did not report"
    assert record["ok"], record.get("error")


@pytest.mark.cuda
@pytest.mark.parametrize("case", list(CASES))
def test_scatter_kernel_on_gpu(case: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    assert run_case(case, "cuda")["ok"]


if __name__ == "__main__":
    report(run_case, sys.argv[1:])
