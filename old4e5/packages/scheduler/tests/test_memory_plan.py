"""The schedule's memory plan: values die right after their last reader."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.ir import lower_graph
from ember.scheduler import ExternCall, schedule_program


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
