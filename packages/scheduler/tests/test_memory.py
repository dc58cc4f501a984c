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


def test_a_buffer_an_extern_writes_in_place_is_never_reused_while_its_alias_lives() -> None:
    """`sort(x, out=(values, indices))` returns `values` itself: its storage stays
    `values`'s after the sort, read through the result; handing it to a later buffer
    overwrote the sorted values before they were copied into x (a graph that is not
    functionalized, traced by make_fx alone)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ember.ir import LoweringOptions, lower_graph
    from ember.scheduler import run_schedule

    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x + 1
        values, indices = torch.empty_like(x), torch.empty(x.shape, dtype=torch.long)
        torch.sort(x, 1, out=(values, indices))
        x.copy_(values)
        return y * 2, x

    x = torch.randn(4, 6)
    program = lower_graph(make_fx(f)(x.clone()), options=LoweringOptions(loops=True))
    sched = schedule_program(program)
    actual, expected = run_schedule(sched, [x.clone()]), f(x.clone())
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e)
    (sort,) = [s for s in sched.steps if "sort" in str(getattr(s, "node", ""))]
    written = set(sort.reads())
    reused = [a.reuse for allocs in sched.memory.allocations for a in allocs if a.reuse]
    assert not written & set(reused), (written, reused)
