"""Communication overlap: each collective starts as early, and is waited for as late,
as its data allows.

A functional collective in a graph is two extern calls: the issue
(`_c10d_functional.all_reduce(x, "sum", group)`, `all_gather_into_tensor`,
`reduce_scatter_tensor`, ...), which starts the communication and returns at once with
a tensor that the communication fills, and `_c10d_functional.wait_tensor(t)`, which
blocks until then (gloo) or makes the compute stream wait for it (NCCL). Whatever runs
between the two overlaps the communication. `overlap_collectives` moves every issue
up, past the steps it does not depend on, to just after the last step that makes what
it reads, and then every wait down, to just before the first step that reads what it
returns (or to the end). Only the collectives move; compute keeps its order.
(Inductor's `torch/_inductor/comms.py` raises communication and sinks waits in the same
spirit, and also reorders compute around them.)

What a collective may not move past, so that the schedule computes the same values:
a step that makes what it reads (or, for a wait, reads what it reads or returns), a step
that writes into an existing buffer (an in-place member, an extern that writes its
arguments: the IR's names would no longer say which values a step sees), a step that
binds a data-dependent size symbol, and another collective of the same kind (issues
keep their order among themselves, as do waits, so every rank issues the same
sequence). In-place collectives (`all_reduce_`) and waits on anything but an
out-of-place issue stay where they are.

The memory plan (ember.scheduler.memory) keeps every argument of an issue out of the
reuse pool: the communication may read it after the issue returns (an all-gather's
input is read on the NCCL stream, or by a gloo thread), so a later kernel must not
write its storage.
"""

from __future__ import annotations

from collections.abc import Sequence

from ember.ir import Program
from ember.scheduler.fusion import symbol_definitions
from ember.scheduler.schedule import ExternCall, KernelStep, SelectOutput, Step

NAMESPACE = "_c10d_functional"
WAIT = "wait_tensor"
# Out-of-place collectives: they read their arguments and return new tensors, which a
# `wait_tensor` each makes ready. Only these move (and their waits).
ISSUES = frozenset(
    {
        "all_reduce", "all_reduce_coalesced", "all_gather_into_tensor",
        "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
        "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast",
    }
)  # fmt: skip


def _op_name(step: Step) -> str | None:
    """`all_reduce`, `wait_tensor`, ... for a step calling a `_c10d_functional` op."""
    if not isinstance(step, ExternCall):
        return None
    op = step.node.op
    return op._opname if op.namespace == NAMESPACE else None


def is_issue(step: Step) -> bool:
    """A step that starts an out-of-place collective."""
    return _op_name(step) in ISSUES


def is_wait(step: Step) -> bool:
    return _op_name(step) == WAIT


def communicates(step: Step) -> bool:
    """Any `_c10d_functional` call but a wait: issues, in-place collectives, sends and
    receives. Their order is the order of communication on every rank, which no
    move changes."""
    name = _op_name(step)
    return name is not None and name not in (WAIT, "wait_tensors")


def overlap_collectives(program: Program, steps: Sequence[Step]) -> list[Step]:
    """`steps` with each out-of-place collective issued as early and waited for as
    late as the data allows (see the module's docstring)."""
    order = list(steps)
    if not any(_op_name(s) is not None for s in order):
        return order
    binders = {program.nodes[position].name for position in symbol_definitions(program).values()}
    movable_issues = {s.name for s in order if is_issue(s)}
    issue_of = {  # a name an issue returns (itself, or one of its results) -> the issue
        s.name: s.name for s in order if s.name in movable_issues
    }
    for s in order:
        if isinstance(s, SelectOutput) and s.node.source in movable_issues:
            issue_of[s.name] = s.node.source

    for issue in [s for s in order if s.name in movable_issues]:
        at = order.index(issue)
        reads = set(issue.reads())
        target = at
        while target > 0:
            before = order[target - 1]
            if communicates(before) or _barrier(before, binders) or reads & set(before.writes()):
                break
            target -= 1
        order.insert(target, order.pop(at))

    waits = [s for s in order if is_wait(s) and _waits_on_movable_issue(s, issue_of)]
    for wait in reversed(waits):
        at = order.index(wait)
        touched = set(wait.reads()) | set(wait.writes())
        target = at
        while target + 1 < len(order):
            after = order[target + 1]
            blocks = (_op_name(after) is not None and not is_issue(after)) or _barrier(
                after, binders
            )
            if blocks or touched & set(after.reads()):
                break
            target += 1
        order.insert(target, order.pop(at))
    return order


def _waits_on_movable_issue(wait: Step, issue_of: dict[str, str]) -> bool:
    reads = list(wait.reads())
    return len(reads) == 1 and reads[0] in issue_of


def _writes_arguments(step: Step) -> bool:
    return isinstance(step, ExternCall) and step.node.writes_arguments


def _barrier(step: Step, binders: set[str]) -> bool:
    """A step no collective moves past, whatever it reads: one that writes into an
    existing buffer or binds a data-dependent size. (Data dependences and the order
    among issues and among waits are the callers' checks.)"""
    if step.name in binders or _writes_arguments(step):
        return True
    if isinstance(step, KernelStep):
        return any(m.mutates is not None for m in step.kernel.members)
    return False


def collective_arguments(steps: Sequence[Step]) -> set[str]:
    """Names a communicating step reads: their storage must not be handed to a later
    buffer, since the communication may still be reading it."""
    return {name for s in steps if communicates(s) for name in s.reads()}
