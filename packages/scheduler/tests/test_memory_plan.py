"""The schedule's memory plan: values die right after their last reader."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.ir import Load, LoweringOptions, lower_graph, walk
from ember.scheduler import ExternCall, KernelStep, schedule_program


def chain(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x.exp()
    b = a * 2
    c = b + y
    return c.relu(), b


def test_each_value_is_freed_after_its_last_use() -> None:
    program = lower_graph(make_fx(chain)(torch.randn(4), torch.randn(4)))
    schedule = schedule_program(program)
    names = [s.name for s in schedule.steps]
    freed_after = {
        n: names[i] for i, frees in enumerate(schedule.memory.frees_after) for n in frees
    }
    exp, mul, add, relu = names
    assert freed_after["x_1"] == exp  # inputs are owned by the wrapper and freed too
    assert freed_after[exp] == mul
    assert freed_after["y_1"] == add and freed_after[add] == relu
    assert mul not in freed_after and relu not in freed_after  # outputs live on


def test_every_value_is_freed_at_most_once_and_outputs_never() -> None:
    program = lower_graph(make_fx(chain)(torch.randn(4), torch.randn(4)))
    schedule = schedule_program(program)
    freed = [n for frees in schedule.memory.frees_after for n in frees]
    assert len(freed) == len(set(freed))
    assert not set(freed) & program.output_names()


def test_unused_inputs_are_freed_at_entry_and_views_launch_nothing() -> None:
    program = lower_graph(
        make_fx(lambda x, unused: x.t().contiguous())(torch.randn(2, 3), torch.randn(1))
    )
    schedule = schedule_program(program)
    assert schedule.memory.frees_at_entry == ["unused_1"]
    kinds = [(type(s).__name__, s.launches_kernel) for s in schedule.steps]
    assert kinds[0] == ("ExternCall", False)  # t() is a view
    assert schedule.kernel_count == sum(
        1 for s in schedule.steps if isinstance(s, ExternCall) and not s.node.is_view
    )
    assert "schedule" in schedule.format()


def _fuzz_60799(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = torch.nn.functional.silu(x)
    g = torch.nn.functional.gelu(torch.tanh(s))
    return s, s + g, g.amin(-2, keepdim=True)


def test_no_in_place_write_over_a_value_a_later_member_reads() -> None:
    """Fuzzer seed 60799: g = gelu(tanh(silu(x))) is stored (a min reads it), and one
    kernel then computes s = silu(x) and s + g. Writing s in place of g let the second
    member read s where it meant g (error 0.57). In place is allowed only when no
    later member of the kernel reads the donor."""
    gm = make_fx(_fuzz_60799)(torch.randn(2, 2, 2, 2))
    schedule = schedule_program(lower_graph(gm, options=LoweringOptions(loops=True)))
    for step, allocations in zip(schedule.steps, schedule.memory.allocations, strict=True):
        for allocation in (a for a in allocations if a.inplace):
            assert isinstance(step, KernelStep)
            members = list(step.kernel.members)
            later = members[[m.name for m in members].index(allocation.name) + 1 :]
            reads = {n.buffer for m in later for n in walk(m.body) if isinstance(n, Load)}
            assert allocation.reuse not in reads, allocation
    kernels = [s for s in schedule.steps if isinstance(s, KernelStep)]
    assert any(len(k.kernel.members) == 2 for k in kernels)  # s and s + g share a kernel


def _two_scatters(
    i: torch.Tensor, j: torch.Tensor, g: torch.Tensor, h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.zeros(4, 3).index_put((i,), g, accumulate=True)
    b = torch.zeros(4, 3).index_put((j,), h, accumulate=True)
    return a, b


def test_storage_a_returned_scatter_writes_is_never_reused() -> None:
    """An index_put into zeros stores into the zeros' buffer under a new name. GPT-2's
    two embedding gradients have one shape when there are as many positions as
    tokens: the first one's zeros died with its first name, and the second gradient's
    zeros were allocated in that storage, overwriting a returned gradient."""
    i, j = torch.tensor([0, 2, 2]), torch.tensor([1, 3, 1])
    gm = make_fx(_two_scatters)(i, j, torch.randn(3, 3), torch.randn(3, 3))
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    schedule = schedule_program(program)
    storage = {
        m.name: m.mutates
        for step in schedule.steps
        if isinstance(step, KernelStep)
        for m in step.kernel.members
        if m.mutates is not None
    }
    returned = {storage.get(name, name) for name in program.output_names()}
    assert len(returned) == 2 and not returned & program.output_names()  # both are scatters
    reused = {a.reuse for allocations in schedule.memory.allocations for a in allocations}
    freed = {n for frees in schedule.memory.frees_after for n in frees}
    assert not returned & (reused | freed)
