"""The entry point: turn a Program into a Schedule."""

from __future__ import annotations

from ember.ir import ExternKernel, MultiOutput, Program
from ember.scheduler.memory import plan_memory
from ember.scheduler.schedule import ExternCall, Schedule, SelectOutput, Step


def schedule_program(program: Program) -> Schedule:
    """Order the program's computations into steps and plan their memory.

    Every IR node is its own step in program order for now; fusion groups loop nodes
    into `FusedKernel`s once the IR has them.
    """
    steps: list[Step] = []
    for node in program.nodes:
        if isinstance(node, ExternKernel):
            steps.append(ExternCall(node))
        elif isinstance(node, MultiOutput):
            steps.append(SelectOutput(node))
        else:  # pragma: no cover - the IR has no other compute node yet
            raise TypeError(f"cannot schedule {type(node).__name__} {node.name!r}")
    return Schedule(program, steps, plan_memory(program, steps))
