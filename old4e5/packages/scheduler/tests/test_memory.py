"""The memory plan: frees after last use, reuse, in place, planned peak."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ember.ir import Program, format_program
from ember.scheduler import KernelStep, Schedule, schedule_program


def test_each_value_is_freed_once_after_its_last_reader_and_outputs_never(
    lower: Callable[..., Program],
) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x @ w)
        return (h @ w.t()).sum(-1)

    program = lower(f, torch.randn(8, 16), torch.randn(16, 16))
    sched = schedule_program(program)
    freed = [n for frees in sched.memory.frees_after for n in frees]
    assert len(freed) == len(set(freed))
    assert not set(freed) & program.output_names()
    steps = [s.name for s in sched.steps]
    for index, frees in enumerate(sched.memory.frees_after):
        for name in frees:
            later = [s for s in sched.steps[index + 1 :] if name in set(s.reads())]
            assert not later, (name, steps[index], format_program(program))


def test_a_dying_input_of_a_pointwise_kernel_is_overwritten_in_place(
    schedule: Callable[..., Schedule],
) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = x.exp()  # stored: a matmul reads it
        m = a @ w
        return a + m  # `a` dies in this kernel, which reads it element by element

    sched = schedule(f, torch.randn(8, 8), torch.randn(8, 8))
    allocations = [a for allocs in sched.memory.allocations for a in allocs]
    inplace = [a for a in allocations if a.inplace]
    assert len(inplace) == 1
    last = [s for s in sched.steps if isinstance(s, KernelStep)][-1]
    assert inplace[0].name in last.kernel.outputs and inplace[0].reuse in last.kernel.inputs


def test_planned_peak_is_below_keeping_everything_alive(schedule: Callable[..., Schedule]) -> None:
    def chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = torch.tanh(x @ w)
        return x

    sched = schedule(chain, torch.randn(32, 32), torch.randn(32, 32))
    everything = sum(32 * 32 * 4 for s in sched.steps if s.launches_kernel)
    assert 0 < sched.memory.peak_bytes < everything
    assert "planned peak" in sched.format()
