"""Compiled C++ sort kernels (sort, argsort, topk, median) against the IR interpreter and eager:
rows and columns, both directions, NaN and ties, int and bool, half types, strided,
long, empty and symbolic sizes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from cpp_harness import Case, case_fixtures, check_case, leaves, run_compiled

NAN, INF = float("nan"), float("inf")


def _ties_and_nans() -> torch.Tensor:
    x = torch.randint(0, 4, (70, 90)).float()  # many ties
    x[3, 10] = x[5, 0] = x[5, 60] = x[40, 89] = NAN
    x[6, ::3] = -NAN
    x[7, :] = -INF
    x[8, ::2] = -0.0
    x[9, 1::2] = INF
    return x


def _stable(dim: int, descending: bool = False) -> Callable[[torch.Tensor], Any]:
    return lambda x: torch.sort(x, dim=dim, descending=descending, stable=True)


CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], bool]] = {
    "rows": (lambda x: (_stable(1)(x), _stable(1, True)(x * 2)), (torch.randn(33, 517),), False),
    "columns": (
        lambda x: (_stable(0, True)(x), torch.argsort(x, dim=0)),
        (torch.randn(300, 130),),
        False,
    ),
    "middle_topk": (
        lambda x: (torch.topk(x, 5, 1), torch.topk(x, 35, 1, largest=False)),
        (torch.randn(5, 40, 70),),
        False,
    ),
    # distinct values: topk's indices are eager's only where values differ
    "long": (
        lambda x: (_stable(0)(x), torch.topk(x, 1000, 0)),
        (torch.randperm(200_000).float() / 7 - 10_000,),
        False,
    ),
    "ties_nans": (
        lambda x: (_stable(1)(x), _stable(1, True)(x), _stable(0)(x), _stable(0, True)(x)),
        (_ties_and_nans(),),
        False,
    ),
    "ints": (
        lambda x: (
            _stable(1)(x),
            _stable(0, True)(x),
            torch.topk(x * 1000 + torch.arange(30), 7, 1),
        ),
        (torch.randint(-3, 4, (20, 30), dtype=torch.int64),),
        False,
    ),
    "int8_bool": (
        lambda x: (_stable(1)(x), _stable(0, True)(x > 0)),
        (torch.randint(-100, 100, (20, 70), dtype=torch.int8),),
        False,
    ),
    "bf16": (
        lambda x: (_stable(1)(x), _stable(0, True)(x.float())),
        (torch.randn(30, 50).bfloat16(),),
        False,
    ),
    "strided": (lambda x: _stable(1)(x.transpose(0, 2)[:, ::3]), (torch.randn(40, 30, 20),), False),
    "empty": (lambda x: (torch.sort(x, 1), torch.topk(x, 0, 0)), (torch.randn(0, 9),), False),
    # the median of all elements: NaN where any is; the lower middle of an even count
    "median": (
        lambda x, n, h: (
            torch.median(x),
            torch.median(x[10:20]),
            torch.median(x[10:20, :7].t()),
            torch.median(n),
            torch.median(h),
        ),
        (
            _ties_and_nans(),
            torch.randint(-50, 50, (6, 7), dtype=torch.int32),
            torch.randn(4, 25).bfloat16(),
        ),
        False,
    ),
    "dynamic": (lambda x: (_stable(1)(x), torch.topk(x, 1, 0)), (torch.randn(6, 50),), True),
}
OTHER_INPUTS = {"dynamic": [(torch.randn(3, 700),), (torch.randn(100, 2),)]}


_exact_ir_evaluation, traced, compiled = case_fixtures(CASES, "cpp-sort-cache")


@pytest.mark.parametrize("name", sorted(CASES))
def test_sort_kernels_match_interpreter_and_eager_bit_for_bit(
    name: str, traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    case = traced[name]
    assert case.kernels and any(k.is_sort for k in case.kernels)

    def against_eager(output: torch.Tensor) -> bool:
        # argsort is unstable in eager: its ties are checked in the IR tests
        return not (name == "columns" and output.dtype == torch.int64)

    check_case(case, compiled, OTHER_INPUTS.get(name, []), eager=against_eager)


def test_sorted_values_keep_the_sign_of_zero(
    traced: dict[str, Case], compiled: dict[str, Any]
) -> None:
    case = traced["ties_nans"]
    got = leaves(run_compiled(case, compiled, case.args))[0]
    eager = torch.sort(case.args[0], dim=1, stable=True).values
    assert torch.equal(got.signbit(), eager.signbit())


def test_values_and_indices_share_one_sort_per_row(traced: dict[str, Case]) -> None:
    from ember.codegen.cpp import render_kernel

    (kernel,) = traced["middle_topk"].kernels[:1]
    text = render_kernel(kernel)[0]
    assert text.count("ember::sort_row<true>(") == 1  # one sort for values and indices
    assert "#pragma omp parallel" not in text  # 200 rows of 40: too little to wake threads
    (long_sort, _) = traced["long"].kernels
    text = render_kernel(long_sort)[0]
    assert "ember::sort_row<false>(ember_values0, ember_order0, 200000, 200000);" in text
