"""Text forms of kernels and schedules (the debug dir's schedule.txt, and tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ember.ir import format_body, format_program

if TYPE_CHECKING:
    from ember.scheduler.kernel import FusedKernel, KernelMember
    from ember.scheduler.schedule import Schedule


def format_kernel(kernel: FusedKernel) -> str:
    ranges = ", ".join(str(r) for r in kernel.ranges)
    head = f"kernel {kernel.name} [{ranges}]"
    if kernel.reduction_ranges:
        head += " over [" + ", ".join(str(r) for r in kernel.reduction_ranges) + "]"
    lines = [
        head + f" reads {', '.join(kernel.inputs) or '-'} writes {', '.join(kernel.outputs) or '-'}"
    ]
    if kernel.origins:
        lines.append(f"  from {', '.join(kernel.origins)}")
    for m in kernel.members:
        detail = m.reduction or m.scan or _sort(m)
        what = m.kind if detail is None else f"{m.kind} {detail}"
        where = " over inner" if m.over_reduction else ""
        store = f" store [{m.index}]" if m.stored else " local"
        into = f" into {m.mutates}" if m.mutates else ""
        lines.append(f"  {m.name}: {what}{where}{store}{into}")
        lines += ["    " + line for line in format_body(m.body).splitlines()]
    return "\n".join(lines)


def format_schedule(schedule: Schedule) -> str:
    from ember.scheduler.schedule import ExternCall, KernelStep

    memory = schedule.memory
    lines = [format_program(schedule.program), "", f"schedule {schedule.program.name}:"]
    if memory.frees_at_entry:
        lines.append(f"  free at entry: {', '.join(memory.frees_at_entry)}")
    for index, step in enumerate(schedule.steps):
        allocs = memory.allocations[index]
        for a in allocs:
            how = (
                f" in place of {a.reuse}" if a.inplace else f" reusing {a.reuse}" if a.reuse else ""
            )
            lines.append(f"  alloc  {a.name}{how}")
        if isinstance(step, KernelStep):
            lines += ["  " + line for line in format_kernel(step.kernel).splitlines()]
        elif isinstance(step, ExternCall):
            origin = f"  # from {step.node.origin}" if step.node.origin else ""
            lines.append(f"  extern {step.name} = {step.node.op}{origin}")
        else:
            lines.append(f"  select {step.name}")
        if memory.frees_after[index]:
            lines.append(f"  free   {', '.join(memory.frees_after[index])}")
    lines.append(
        f"  planned peak: {memory.peak_bytes} bytes; {schedule.kernel_count} kernel launches"
    )
    for note in schedule.fusion_notes:
        where = f"not fused into {note.other}" if note.other else "alone"
        lines.append(f"  fusion: {note.kernel} {where}: {note.reason}")
    return "\n".join(lines)


def _sort(member: KernelMember) -> str | None:
    spec = member.sort
    if spec is None:
        return None
    order = "descending" if spec.descending else "ascending"
    return f"{order} {'indices' if spec.indices else 'values'} first {spec.count}"
