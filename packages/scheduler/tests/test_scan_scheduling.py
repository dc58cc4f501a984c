"""Scans in the scheduler: their kernels, sibling fusion, what they do not fuse with,
and schedules with scans computing what the program computes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sympy
import torch

from ember.ir import Program, run_program
from ember.scheduler import SCAN, Schedule, run_schedule


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


def test_cumsum_is_one_scan_kernel_over_the_merged_outer_dims(
    schedule: Callable[..., Schedule],
) -> None:
    (kernel,) = schedule(lambda x: x.cumsum(0), torch.randn(7, 4, 5)).kernels
    assert kernel.is_scan and kernel.is_reduction  # the scanned dim is the inner one
    assert kernel.ranges == (sympy.Integer(20),) and kernel.reduction_ranges == (7,)
    (member,) = kernel.members
    assert member.kind == SCAN and member.scan == "sum" and member.stored
    assert str(member.index) == "i0 + 20*r0"
    assert "scan sum store [i0 + 20*r0]" in str(kernel)


def test_cummax_values_and_indices_run_in_one_kernel(schedule: Callable[..., Schedule]) -> None:
    (kernel,) = schedule(lambda x: torch.cummax(x * 2, 1), torch.randn(3, 9)).kernels
    assert [m.scan for m in kernel.members] == ["max", "argmax"]
    assert kernel.inputs == ("x_1",)  # x * 2 is inlined into both bodies
    assert kernel.name.startswith("k0_scan_")


def test_scans_fuse_with_no_pointwise_or_reduction(schedule: Callable[..., Schedule]) -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c = x.cumsum(1)
        return c - 1, c.sum(1), x.sum(1), torch.cumprod(c, 1)

    kernels = schedule(fn, torch.randn(4, 6)).kernels
    scans = [k for k in kernels if k.is_scan]
    assert len(scans) == 2  # the cumprod reads the cumsum: not a sibling
    for k in scans:
        assert all(m.kind == SCAN for m in k.members) and len(k.members) == 1
    others = [k for k in kernels if not k.is_scan]
    assert others and all(m.kind != SCAN for k in others for m in k.members)


def test_scans_over_other_dims_stay_apart(schedule: Callable[..., Schedule]) -> None:
    kernels = schedule(lambda x: (x.cumsum(0), x.cumsum(1)), torch.randn(5, 5)).kernels
    assert len(kernels) == 2


def test_a_scan_never_overwrites_its_input_in_place(schedule: Callable[..., Schedule]) -> None:
    planned = schedule(lambda x: (x + 1).exp().cumsum(1), torch.randn(8, 300))
    assert not any(a.inplace for step in planned.memory.allocations for a in step)


CASES: dict[str, tuple[Callable[..., Any], list[torch.Tensor]]] = {
    "cumsum_rows": (lambda x: x.cumsum(-1) * 2, [torch.randn(4, 33)]),
    "cumsum_columns": (lambda x: x.cumsum(0), [torch.randn(33, 4, 3)]),
    "cumprod_middle": (lambda x: (x * 0.1 + 1).cumprod(1), [torch.randn(3, 17, 5)]),
    "cummax_nan": (
        lambda x: (torch.cummax(x, 1), torch.cummin(x, 0)),
        [torch.tensor([[1.0, float("nan"), 3.0, 3.0], [2.0, 2.0, -1.0, float("nan")]])],
    ),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x.t(), 1), [torch.randn(40, 3)]),
    "int_cumsum": (lambda x: (x.cumsum(1), (x > 2).cumsum(0)), [torch.arange(24).view(4, 6)]),
    "empty": (lambda x: (x.cumsum(1), torch.cummax(x, 0)), [torch.randn(0, 5)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_scan_schedules_compute_what_the_program_computes(
    case: str, lower: Callable[..., Program]
) -> None:
    from ember.scheduler import schedule_program

    fn, args = CASES[case]
    program = lower(fn, *args)
    schedule = schedule_program(program)
    actual = _flat(run_schedule(schedule, [a.clone() for a in args]))
    expected = _flat(run_program(program, [a.clone() for a in args]))
    eager = _flat(fn(*args))
    for a, e, f in zip(actual, expected, eager, strict=True):
        torch.testing.assert_close(a, e, equal_nan=True)
        torch.testing.assert_close(a, f, equal_nan=True)
