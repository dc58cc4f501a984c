"""Compiled C++ scan kernels (cumsum, cumprod, logcumsumexp, cummax, cummin) against
the IR interpreter and eager: rows and columns, int and bool, half types, NaN and ties,
strided inputs, empty and symbolic sizes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from cpp_harness import Case, case_fixtures, check_case

NAN, INF = float("nan"), float("inf")


def _ties_and_nans() -> torch.Tensor:
    x = torch.randint(0, 4, (70, 90)).float()  # many ties
    x[3, 10] = x[5, 0] = x[5, 60] = x[40, 89] = NAN
    x[7, :] = -INF
    x[8, ::2] = -0.0
    return x


def _lse_edges() -> torch.Tensor:
    x = torch.randn(6, 100) * 30
    x[0, :4] = -INF
    x[1, 10] = INF
    x[1, 20] = INF
    x[2, 50] = NAN
    x[3, :] = -INF
    return x


CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], bool]] = {
    "rows": (
        lambda x: (x.cumsum(1), x.cumsum(-1, dtype=torch.float64)),
        (torch.randn(33, 517),),
        False,
    ),
    # x * 0.01 + 1 may compile to one fused multiply-add: not bit for bit
    "products": (lambda x: (x * 0.01 + 1).cumprod(-1), (torch.randn(33, 517),), False),
    "columns": (lambda x: (x.cumsum(0), torch.cummax(x, 0)), (torch.randn(300, 130),), False),
    "middle": (lambda x: (x.cumsum(1), torch.cummin(x, 1)), (torch.randn(5, 40, 70),), False),
    "long_1d": (lambda x: x.cumsum(0), (torch.randn(100_000),), False),
    "ties_nans": (
        lambda x: (torch.cummax(x, 1), torch.cummin(x, 1), torch.cummax(x, 0), torch.cummin(x, 0)),
        (_ties_and_nans(),),
        False,
    ),
    "logcumsumexp": (
        lambda x: (torch.logcumsumexp(x, 1), torch.logcumsumexp(x, 0)),
        (_lse_edges(),),
        False,
    ),
    "ints": (
        lambda x: (x.cumsum(1), x.cumprod(0), torch.cummax(x, 1), torch.cummin(x, 0)),
        (torch.randint(-3, 4, (20, 30), dtype=torch.int32),),
        False,
    ),
    "bools": (
        lambda x: ((x > 0).cumsum(1), torch.cummax(x > 0, 1), torch.cummin(x > 0, 0)),
        (torch.randn(20, 70),),
        False,
    ),
    "half": (
        lambda x: (x.cumsum(1), torch.logcumsumexp(x, 1), torch.cummax(x, 0)),
        (torch.randn(8, 300).to(torch.bfloat16),),
        False,
    ),
    "strided": (
        lambda x: (x.transpose(0, 1).cumsum(0), x[:, ::3].cumprod(1), torch.cummax(x.t(), 1)),
        (torch.randn(64, 96),),
        False,
    ),
    "empty": (lambda x: (x.cumsum(1), torch.cummax(x, 0)), (torch.randn(0, 9),), False),
    "dynamic": (lambda x: (x.cumsum(1), torch.cummax(x, 0)), (torch.randn(6, 50),), True),
}
OTHER_INPUTS = {"dynamic": [(torch.randn(3, 700),), (torch.randn(100, 1),)]}


_exact_ir_evaluation, traced, compiled = case_fixtures(CASES, "cpp-scan-cache")


@pytest.mark.parametrize("name", sorted(CASES))
def test_scan_kernels_match_interpreter_and_eager(
    name: str, traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    case = traced[name]
    assert case.kernels and all(k.is_scan for k in case.kernels)

    def tolerance(output: torch.Tensor) -> tuple[float, float]:
        if output.dtype == torch.bfloat16:
            return 1e-2, 1e-2
        # float32 sums carry float64 as eager's CPU kernel does: the same numbers
        exact = not output.dtype.is_floating_point or name in ("rows", "columns", "long_1d")
        return (0.0, 0.0) if exact else (1e-5, 1e-5)

    check_case(case, compiled, OTHER_INPUTS.get(name, []), tolerance=tolerance)


def test_sibling_scans_share_one_kernel_and_column_scans_use_lanes(
    traced: dict[str, Case],
) -> None:
    from ember.codegen.cpp import render_kernel

    (kernel,) = traced["columns"].kernels  # the cumsum, cummax's values and indices
    assert [m.scan for m in kernel.members] == ["sum", "max", "argmax"]
    text = render_kernel(kernel)[0]
    assert "#pragma omp simd" in text and "s_buf1[64]" in text  # 64 columns as lanes
    assert text.count("for (int64_t r0 = 0; r0 < 300; ++r0)") == 1  # one walk, linear
