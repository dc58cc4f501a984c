"""The memory plan: liveness, frees after last use, reuse of dead buffers, in-place.

One pass over the steps in order. Before a kernel, each buffer it stores gets
storage: the storage of an input of the same kernel that dies there and that the
kernel reads only at the very element it writes (in place), else that of a dead
buffer with the same layout (reuse), else a fresh allocation. After each step, the
names nobody reads later die: a buffer ember allocated and nothing aliases goes to
the reuse pool, anything else is dropped. Pool entries that no one reuses are freed
at the step where they died. Graph outputs and constants never die.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from ember.ir import InputBuffer, Layout, Load, Program, iter_refs, size_hint, walk
from ember.scheduler.collectives import collective_arguments
from ember.scheduler.kernel import POINTWISE, FusedKernel
from ember.scheduler.schedule import Allocation, ExternCall, KernelStep, MemoryPlan, Step


def _bytes(layout: Layout) -> int:
    return size_hint(layout.storage_extent()) * layout.dtype.itemsize


def _same_storage_shape(a: Layout, b: Layout) -> bool:
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.size == b.size
        and a.stride == b.stride
        and a.offset == b.offset == 0
    )


def plan_memory(program: Program, steps: Sequence[Step]) -> MemoryPlan:
    keep = program.output_names() | {c.name for c in program.constants}
    last_use: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step.reads():
            last_use[name] = index
        for name in step.writes():
            last_use.setdefault(name, index)
    for ref in iter_refs(program.outputs):
        last_use.pop(ref.name, None)
    _extend_to_versions(steps, keep, last_use)

    # Buffers another name may alias: arguments of views, and of externs that write
    # their arguments in place (`sort.values(x, values=buf)` returns `buf` itself).
    # And arguments of collectives, which the communication may read after the issue
    # returns (ember.scheduler.collectives). Their storage is never handed to a later
    # buffer.
    aliased = {
        name
        for step in steps
        if isinstance(step, ExternCall) and (not step.launches_kernel or step.node.writes_arguments)
        for name in step.reads()
    } | collective_arguments(steps)
    ours: dict[str, Layout] = {}  # buffers ember allocates (reusable storage)
    plan = MemoryPlan(allocations=[[] for _ in steps], frees_after=[[] for _ in steps])
    for node in program.inputs:
        if isinstance(node, InputBuffer) and node.name not in keep and node.name not in last_use:
            plan.frees_at_entry.append(node.name)

    pool: dict[str, tuple[Layout, int]] = {}  # dead buffer -> (layout, step it died)
    handed_over: set[str] = set()
    live = peak = 0
    for index, step in enumerate(steps):
        if isinstance(step, KernelStep):
            for member in step.kernel.members:
                if not member.stored or member.mutates is not None:
                    continue
                layout = member.layout
                donor = _inplace_donor(
                    step.kernel,
                    member.name,
                    layout,
                    index,
                    last_use,
                    ours,
                    aliased,
                    keep,
                    handed_over,
                )
                if donor is not None:
                    plan.allocations[index].append(
                        Allocation(member.name, layout, donor, inplace=True)
                    )
                    handed_over.add(donor)
                else:
                    reuse = next(
                        (n for n, (lay, _) in pool.items() if _same_storage_shape(lay, layout)),
                        None,
                    )
                    if reuse is not None:
                        del pool[reuse]
                        plan.allocations[index].append(Allocation(member.name, layout, reuse))
                    else:
                        plan.allocations[index].append(Allocation(member.name, layout))
                        live += _bytes(layout)
                ours[member.name] = layout
        elif isinstance(step, ExternCall) and step.launches_kernel:
            live += sum(_bytes(layout) for layout in step.node.outputs if layout is not None)
        peak = max(peak, live)
        for name, died in list(last_use.items()):
            if died != index or name in keep or name in handed_over:
                continue
            if name in ours and name not in aliased:
                pool[name] = (ours[name], index)
            else:
                plan.frees_after[index].append(name)
                live -= _bytes_of(name, ours, steps)
    for name, (_, died) in pool.items():
        plan.frees_after[died].append(name)
    for frees in plan.frees_after:
        frees.sort()
    plan.peak_bytes = peak
    return plan


def _extend_to_versions(steps: Sequence[Step], keep: set[str], last_use: dict[str, int]) -> None:
    """A member that writes into another buffer's storage (a scatter into zeros, an
    in-place update) is a new name for that storage: the storage lives as long as its
    last version is read, and never dies when a version is a graph output. Without
    this the storage went back to the pool once its first name was last read, and the
    next buffer of that layout overwrote a returned gradient (GPT-2 with as many
    positions as tokens: both embedding gradients are index_puts into zeros of one
    shape, and the second one landed in the first's storage)."""
    storage: dict[str, str] = {}
    for step in steps:
        if isinstance(step, KernelStep):
            for member in step.kernel.members:
                if member.mutates is not None:
                    storage[member.name] = storage.get(member.mutates, member.mutates)
    for version, root in storage.items():
        if version in keep:
            keep.add(root)
            last_use.pop(root, None)
        elif root not in keep and version in last_use:
            last_use[root] = max(last_use.get(root, -1), last_use[version])


def _bytes_of(name: str, ours: dict[str, Layout], steps: Sequence[Step]) -> int:
    if name in ours:
        return _bytes(ours[name])
    for step in steps:
        if isinstance(step, ExternCall) and step.name == name and step.launches_kernel:
            return sum(_bytes(layout) for layout in step.node.outputs if layout is not None)
    return 0


def _inplace_donor(
    kernel: FusedKernel,
    name: str,
    layout: Layout,
    index: int,
    last_use: dict[str, int],
    ours: dict[str, Layout],
    aliased: set[str],
    keep: set[str],
    handed_over: set[str],
) -> str | None:
    """An input of `kernel` dying here whose storage the member can write in place."""
    if kernel.is_reduction:
        return None
    member = kernel.member(name)
    if member.kind != POINTWISE:
        return None
    for candidate in kernel.inputs:
        if (
            candidate in ours
            and candidate not in handed_over
            and candidate not in aliased
            and candidate not in keep
            and last_use.get(candidate) == index
            and _same_storage_shape(ours[candidate], layout)
            and _read_only_at(kernel, candidate, member.index)
            and not _read_after(kernel, candidate, name)
        ):
            return candidate
    return None


def _read_after(kernel: FusedKernel, buffer: str, name: str) -> bool:
    """Whether a member computed after `name` in the kernel loads `buffer`: it would
    read what `name` stored there in place (fuzzer seed 60799: silu(x) stored over
    gelu(tanh(silu(x))), which the next member then read back as if it were the gelu)."""
    names = [m.name for m in kernel.members]
    later = kernel.members[names.index(name) + 1 :]
    return any(
        isinstance(node, Load) and node.buffer == buffer for m in later for node in walk(m.body)
    )


def _read_only_at(kernel: FusedKernel, buffer: str, index: sympy.Expr) -> bool:
    for m in kernel.members:
        for node in walk(m.body):
            if (
                isinstance(node, Load)
                and node.buffer == buffer
                and (
                    node.mask is not None or node.indirect or sympy.expand(node.index - index) != 0
                )
            ):
                return False
    return True
