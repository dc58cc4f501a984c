"""The Schedule: what the runtime executes, in order, and when memory is allocated,
reused and freed.

A schedule is a list of steps over one IR `Program`: `KernelStep`s (one generated
kernel, a `FusedKernel`), `ExternCall`s (one ATen call) and `SelectOutput`s (one
result of a multi-output call), plus a `MemoryPlan`. It is plain data: printable,
comparable in tests, independent of any codegen.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ember.ir import ExternKernel, Layout, MultiOutput, Program
from ember.scheduler.kernel import FusedKernel


@dataclass(frozen=True)
class ExternCall:
    """One call of an ATen op (an IR `ExternKernel`)."""

    node: ExternKernel

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def origins(self) -> tuple[str, ...]:
        """The FX node the call came from (provenance, as `FusedKernel.origins`)."""
        return (self.node.origin,) if self.node.origin else ()

    @property
    def launches_kernel(self) -> bool:
        """False for pure views, which only make an alias and run no device code."""
        return not self.node.is_view

    def reads(self) -> Iterator[str]:
        return self.node.reads()

    def writes(self) -> tuple[str, ...]:
        return (self.node.name,)


@dataclass(frozen=True)
class SelectOutput:
    """Reading one result of a multi-output extern call (no device code)."""

    node: MultiOutput

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def origins(self) -> tuple[str, ...]:
        return ()

    @property
    def launches_kernel(self) -> bool:
        return False

    def reads(self) -> Iterator[str]:
        return self.node.reads()

    def writes(self) -> tuple[str, ...]:
        return (self.node.name,)


@dataclass(frozen=True)
class KernelStep:
    """One launch of a generated kernel."""

    kernel: FusedKernel

    @property
    def name(self) -> str:
        return self.kernel.name

    @property
    def origins(self) -> tuple[str, ...]:
        return self.kernel.origins

    @property
    def launches_kernel(self) -> bool:
        return True

    def reads(self) -> Iterator[str]:
        yield from self.kernel.inputs
        for m in self.kernel.members:
            if m.mutates is not None:
                yield m.mutates

    def writes(self) -> tuple[str, ...]:
        return self.kernel.outputs


Step = ExternCall | SelectOutput | KernelStep


@dataclass(frozen=True)
class Allocation:
    """A buffer a kernel writes: fresh (`reuse` None) or in the storage of `reuse`, a
    dead buffer of the same layout (`inplace`: one the same kernel reads, element by
    element at the same point)."""

    name: str
    layout: Layout
    reuse: str | None = None
    inplace: bool = False


@dataclass
class MemoryPlan:
    """When each value is made and when it dies.

    `allocations[i]`: buffers to create before step `i` (kernel outputs; mutations
    write into their target instead). `frees_after[i]`: names no later step reads, not
    outputs, dropped after step `i` (a name whose storage is reused later is handed
    over instead of freed). `frees_at_entry`: graph inputs nothing reads. Graph inputs
    are included: the wrapper owns them (AOTAutograd's boxed calling convention).
    `peak_bytes`: planned peak of memory the schedule allocates (kernel and extern
    outputs; inputs excluded), with size symbols counted as `ember.ir.SIZE_HINT`.
    """

    allocations: list[list[Allocation]] = field(default_factory=list)
    frees_after: list[list[str]] = field(default_factory=list)
    frees_at_entry: list[str] = field(default_factory=list)
    peak_bytes: int = 0


@dataclass(frozen=True)
class FusionNote:
    """Why a kernel was not fused into another: its first buffer was tried against
    `other` (a kernel that runs earlier) and refused for `reason`. With `other` empty,
    the kernel runs alone by its kind (a scatter, a write into an input)."""

    kernel: str
    other: str
    reason: str


@dataclass
class Schedule:
    program: Program
    steps: list[Step]
    memory: MemoryPlan
    fusion_notes: list[FusionNote] = field(default_factory=list)
    # matmul kernel name -> the ATen matmul call it replaces (ember.scheduler.epilogue)
    matmuls: dict[str, str] = field(default_factory=dict)

    @property
    def kernel_count(self) -> int:
        """Steps that launch device code (fused kernels and non-view extern calls)."""
        return sum(1 for s in self.steps if s.launches_kernel)

    @property
    def kernels(self) -> list[FusedKernel]:
        return [s.kernel for s in self.steps if isinstance(s, KernelStep)]

    def format(self) -> str:
        from ember.scheduler.printing import format_schedule

        return format_schedule(self)
