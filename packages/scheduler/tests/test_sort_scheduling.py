"""Sorts in the scheduler: one kernel for a sort's values and indices, what they do
not fuse with, and schedules with sorts computing what the program computes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sympy
import torch

from ember.ir import Program, run_program
from ember.scheduler import SORT, Schedule, SortSpec, run_schedule, schedule_program

NAN = float("nan")


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


def test_sort_values_and_indices_run_in_one_kernel(schedule: Callable[..., Schedule]) -> None:
    (kernel,) = schedule(
        lambda x: torch.sort(x * 2, 0, descending=True), torch.randn(7, 4, 5)
    ).kernels
    assert kernel.is_sort and not kernel.is_scan
    assert kernel.ranges == (sympy.Integer(20),) and kernel.reduction_ranges == (7,)
    assert kernel.inputs == ("x_1",)  # x * 2 is inlined into the body
    assert kernel.name.startswith("k0_sort_")
    values, indices = kernel.members
    assert values.kind == indices.kind == SORT
    assert values.sort == SortSpec(True, sympy.Integer(7), False)
    assert indices.sort == SortSpec(True, sympy.Integer(7), True)
    assert str(values.index) == "i0 + 20*r0"
    assert "sort descending indices first 7 store [i0 + 20*r0]" in str(kernel)


def test_topk_stores_the_first_k_along_the_sorted_dim(schedule: Callable[..., Schedule]) -> None:
    (kernel,) = schedule(lambda x: torch.topk(x, 3, 1), torch.randn(6, 50)).kernels
    assert kernel.reduction_ranges == (50,)
    assert [m.sort.count for m in kernel.members if m.sort] == [3, 3]
    assert [str(m.index) for m in kernel.members] == ["3*i0 + r0", "3*i0 + r0"]


def test_argsort_stores_only_the_indices(schedule: Callable[..., Schedule]) -> None:
    (kernel,) = schedule(lambda x: torch.argsort(x, dim=1), torch.randn(6, 50)).kernels
    ((member,),) = [kernel.members]
    assert member.sort is not None and member.sort.indices
    assert kernel.outputs == (member.name,)


def test_sorts_fuse_with_nothing_else(schedule: Callable[..., Schedule]) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = torch.sort(x, 1).values
        return s - 1, s.sum(1), torch.sort(x, 1, descending=True).values, x.cumsum(1)

    kernels = schedule(fn, torch.randn(4, 6)).kernels
    sorts = [k for k in kernels if k.is_sort]
    assert len(sorts) == 2  # the descending sort is not a sibling of the ascending one
    assert all(m.kind == SORT for k in sorts for m in k.members)
    assert all(m.kind != SORT for k in kernels if not k.is_sort for m in k.members)


def test_a_sort_never_overwrites_its_input_in_place(schedule: Callable[..., Schedule]) -> None:
    planned = schedule(lambda x: torch.sort((x + 1).exp(), 1).values, torch.randn(8, 300))
    assert not any(a.inplace for step in planned.memory.allocations for a in step)


CASES: dict[str, tuple[Callable[..., Any], list[torch.Tensor]]] = {
    "rows": (lambda x: torch.sort(x, -1), [torch.randn(4, 33)]),
    "columns": (lambda x: torch.sort(x, 0, descending=True), [torch.randn(33, 4, 3)]),
    "middle_topk": (lambda x: torch.topk(x * 2, 4, 1, largest=False), [torch.randn(3, 17, 5)]),
    "nan_ties": (
        lambda x: (
            torch.sort(x, dim=1, stable=True),
            torch.sort(x, dim=0, descending=True, stable=True),
        ),
        [torch.tensor([[1.0, NAN, 3.0, 3.0], [2.0, 2.0, -1.0, NAN]])],
    ),
    "ints": (
        lambda x: (torch.sort(x, dim=1, stable=True), torch.argsort(x, dim=0, stable=True)),
        [torch.arange(24).view(4, 6) % 5],
    ),
    "empty": (lambda x: (torch.sort(x, 1), torch.topk(x, 0, 0)), [torch.randn(0, 5)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sort_schedules_compute_what_the_program_computes(
    case: str, lower: Callable[..., Program]
) -> None:
    fn, args = CASES[case]
    program = lower(fn, *args)
    actual = _flat(run_schedule(schedule_program(program), [a.clone() for a in args]))
    expected = _flat(run_program(program, [a.clone() for a in args]))
    eager = _flat(fn(*args))
    for a, e, f in zip(actual, expected, eager, strict=True):
        torch.testing.assert_close(a, e, equal_nan=True, rtol=0, atol=0)
        torch.testing.assert_close(a, f, equal_nan=True)
