"""The Schedule: what the runtime executes, in order, and when memory is freed.

A schedule is a list of steps over one IR `Program`. Each step is a `FusedKernel`
(one generated kernel computing one or more IR nodes) or an `ExternCall` (one ATen
call), plus a `MemoryPlan` saying after which step each value is dead. It is plain
data: printable, comparable in tests, and independent of any codegen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.ir import ExternKernel, MultiOutput, Program, format_program


@dataclass(frozen=True)
class ExternCall:
    """One call of an ATen op (an IR `ExternKernel`)."""

    node: ExternKernel

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def launches_kernel(self) -> bool:
        """False for pure views, which only make an alias and run no device code."""
        return not self.node.is_view


@dataclass(frozen=True)
class SelectOutput:
    """Reading one result of a multi-output extern call (no device code)."""

    node: MultiOutput

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def launches_kernel(self) -> bool:
        return False


Step = ExternCall | SelectOutput


@dataclass
class MemoryPlan:
    """When each value dies.

    `frees_after[i]` lists the names that no step after step `i` reads and that are
    not outputs: the runtime drops them right after step `i`. `frees_at_entry` lists
    graph inputs that nothing reads at all. Graph inputs are included when the caller
    hands ownership over (AOTAutograd's boxed calling convention), so activations
    saved for backward are freed as soon as backward is done with them.
    """

    frees_after: list[list[str]] = field(default_factory=list)
    frees_at_entry: list[str] = field(default_factory=list)


@dataclass
class Schedule:
    program: Program
    steps: list[Step]
    memory: MemoryPlan

    @property
    def kernel_count(self) -> int:
        """Steps that launch device code (fused kernels and non-view extern calls)."""
        return sum(1 for s in self.steps if s.launches_kernel)

    def format(self) -> str:
        lines = [format_program(self.program), "", f"schedule {self.program.name}:"]
        if self.memory.frees_at_entry:
            lines.append(f"  free at entry: {', '.join(self.memory.frees_at_entry)}")
        for step, frees in zip(self.steps, self.memory.frees_after, strict=True):
            kind = "extern" if isinstance(step, ExternCall) else "select"
            free = f"   free {', '.join(frees)}" if frees else ""
            lines.append(f"  {kind:<7}{step.name}{free}")
        return "\n".join(lines)
