"""Functional collectives: issued as early and waited for as late as their data allow,
so that the compute between them overlaps the communication; their arguments are
never handed to a later buffer while the communication may read them.

The graphs are traced with fake tensors: tracing and scheduling need no process group.
"""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, lower_graph, verify
from ember.scheduler import ExternCall, KernelStep, Schedule, schedule_program
from ember.scheduler.collectives import is_issue, is_wait

c10d = torch.ops._c10d_functional


def schedule_of(fn: object, *shapes: tuple[int, ...]) -> Schedule:
    args = [torch.randn(shape) for shape in shapes]
    gm = make_fx(fn, decomposition_table=ember_decompositions(), tracing_mode="fake")(*args)
    program = lower_graph(gm, name="comm", options=LoweringOptions(loops=True))
    verify(program)
    return schedule_program(program)


def op_of(step: object) -> str:
    if isinstance(step, ExternCall):
        return step.node.op._opname
    return "kernel" if isinstance(step, KernelStep) else "select"


def reduce_then_compute(
    x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Written as eager code reads: the wait right after the issue, then compute
    that does not need the reduced value, then its reader."""
    reduced = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", "0"))
    independent = torch.relu(y @ y.t()).sum(0)
    return reduced + 1, independent, y.sin()


def test_independent_compute_runs_between_the_issue_and_the_wait() -> None:
    schedule = schedule_of(reduce_then_compute, (8, 8), (16, 16))
    ops = [op_of(s) for s in schedule.steps]
    issue, wait = ops.index("all_reduce"), ops.index("wait_tensor")
    between = ops[issue + 1 : wait]
    assert "mm" in between and between.count("kernel") >= 1, ops
    # The issue follows the kernel that makes its argument; the wait precedes the
    # first step that reads its result.
    producer = schedule.steps[issue - 1]
    assert isinstance(producer, KernelStep)
    assert set(schedule.steps[issue].reads()) <= set(producer.writes())
    reader = schedule.steps[wait + 1]
    assert schedule.steps[wait].name in set(reader.reads()), ops
    # The dump shows it in that order.
    text = schedule.format().split("schedule comm:")[1]
    at = {op: text.index(op) for op in ("all_reduce", "aten.mm", "wait_tensor")}
    assert at["all_reduce"] < at["aten.mm"] < at["wait_tensor"], text


def two_collectives(
    x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    before = (y * 3).sum(0)
    reduced = c10d.wait_tensor(c10d.all_reduce(x * 2, "sum", "0"))
    after = torch.relu(y @ y.t()).sum(0)
    gathered = c10d.wait_tensor(c10d.all_gather_into_tensor(x + 1, 2, "0"))
    return reduced + 1, before, after, gathered


def test_issues_keep_their_order_and_waits_sink_to_their_readers() -> None:
    schedule = schedule_of(two_collectives, (8, 8), (16, 16))
    ops = [op_of(s) for s in schedule.steps]
    reduce_at, gather_at = ops.index("all_reduce"), ops.index("all_gather_into_tensor")
    waits = [i for i, s in enumerate(schedule.steps) if is_wait(s)]
    assert reduce_at < gather_at < min(waits), ops  # both issued before either wait
    assert "mm" in ops[gather_at : min(waits)], ops
    # The gathered value is only returned: its wait sinks to the end.
    assert waits[-1] == len(ops) - 1, ops


def test_arguments_of_collectives_are_not_reused() -> None:
    """An all-gather reads its input after the issue returns (on the NCCL stream, or in
    a gloo thread): no later kernel may write into that storage. (Before, the output
    of `reduced + 1` took the storage of `x * 2`, the all-reduce's argument.)"""
    schedule = schedule_of(two_collectives, (8, 8), (16, 16))
    arguments = {n for s in schedule.steps if is_issue(s) for n in s.reads()}
    reused = {a.reuse for allocs in schedule.memory.allocations for a in allocs if a.reuse}
    assert arguments and not arguments & reused


def reduce_of_matmul(x: torch.Tensor, w: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A row-parallel linear layer's pattern: the partial product is reduced across
    ranks; another layer's work does not depend on it."""
    partial = x @ w
    other = torch.tanh(x @ v)
    reduced = c10d.wait_tensor(c10d.all_reduce(partial, "sum", "0"))
    return reduced, other


def test_an_issue_moves_up_to_its_producer_and_no_further() -> None:
    schedule = schedule_of(reduce_of_matmul, (4, 8), (8, 8), (8, 8))
    ops = [op_of(s) for s in schedule.steps]
    issue = ops.index("all_reduce")
    producer = schedule.steps[issue - 1]
    assert op_of(producer) == "mm" and producer.name in set(schedule.steps[issue].reads())
    wait = ops.index("wait_tensor")
    assert ops.index("mm", issue) < wait and "kernel" in ops[issue:wait], ops


def test_graphs_without_collectives_keep_program_order() -> None:
    def plain(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x * 2).sum(0), torch.relu(y @ y.t())

    schedule = schedule_of(plain, (8, 8), (16, 16))
    assert not any(is_issue(s) or is_wait(s) for s in schedule.steps)
    positions = {node.name: i for i, node in enumerate(schedule.program.nodes)}
    order = [positions[s.name] for s in schedule.steps if s.name in positions]
    assert order == sorted(order)
