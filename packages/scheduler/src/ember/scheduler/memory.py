"""Liveness: the last step that reads each value, and so when it can be freed."""

from __future__ import annotations

from collections.abc import Sequence

from ember.ir import InputBuffer, Program, iter_refs
from ember.scheduler.schedule import MemoryPlan, Step


def plan_memory(program: Program, steps: Sequence[Step]) -> MemoryPlan:
    """Free each value right after its last reader.

    Outputs are never freed. Values with no reader at all are freed right after the
    step that made them (inputs: at entry). Constants belong to the compiled module
    and are never freed.
    """
    keep = program.output_names() | {c.name for c in program.constants}
    last_use: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step.node.reads():
            last_use[name] = index
        last_use.setdefault(step.name, index)
    for ref in iter_refs(program.outputs):
        last_use.pop(ref.name, None)

    plan = MemoryPlan(frees_after=[[] for _ in steps])
    for node in program.inputs:
        if isinstance(node, InputBuffer) and node.name not in keep and node.name not in last_use:
            plan.frees_at_entry.append(node.name)
    for name, index in last_use.items():
        if name not in keep:
            plan.frees_after[index].append(name)
    for frees in plan.frees_after:
        frees.sort()
    return plan
