"""From fusion groups to `FusedKernel`s: decide what each kernel stores, what it
reads, its name, and its canonical loop ranges."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ember.ir import Load, Program, Rand, iter_refs, walk
from ember.ir.loops import Scan, Scatter, Sort
from ember.scheduler.fusion import Group
from ember.scheduler.iteration import merge_dimensions
from ember.scheduler.kernel import (
    POINTWISE,
    REDUCTION,
    SCAN,
    SCATTER,
    SORT,
    FusedKernel,
    KernelMember,
    SortSpec,
)


def build_kernels(program: Program, groups: list[Group]) -> dict[int, FusedKernel]:
    """One kernel per group, keyed by the group's position in the program."""
    read_outside = _read_outside(program, groups)
    kernels: dict[int, FusedKernel] = {}
    for number, group in enumerate(groups):
        members: list[KernelMember] = []
        for m in group.members:
            buffer = m.buffer
            stored = buffer.name in read_outside or buffer.mutates is not None
            if m.kind == POINTWISE and not stored:
                continue  # fully inlined into the members that read it
            if m.kind == SORT and not stored:
                continue  # an argsort's values: read by nobody
            loop = buffer.loop
            members.append(
                KernelMember(
                    name=buffer.name,
                    layout=buffer.layout,
                    kind=m.kind,
                    body=m.body,
                    index=m.index,
                    stored=stored,
                    over_reduction=m.over_reduction,
                    reduction=getattr(loop, "kind", None) if m.kind == REDUCTION else None,
                    scan=loop.kind if isinstance(loop, Scan) else None,
                    sort=(
                        SortSpec(loop.descending, loop.count, loop.indices)
                        if isinstance(loop, Sort)
                        else None
                    ),
                    indirect=loop.indirect if isinstance(loop, Scatter) else (),
                    scatter_reduce=loop.reduce if isinstance(loop, Scatter) else None,
                    mutates=buffer.mutates,
                    origin=buffer.origin,
                )
            )
        if not members:
            # Nothing stored: every member was inlined into readers elsewhere or is
            # read by nobody (a batch norm's `num_batches_tracked + 1`, whose `copy_`
            # back into the input recomputes it). An empty kernel would still be
            # launched, and a Triton launcher has no tensor to take a device from.
            continue
        local = {m.name for m in members if m.kind == REDUCTION}
        inputs = sorted(_reads(members) - local)
        kernel = FusedKernel(
            name=_kernel_name(number, group, members),
            ranges=group.ranges,
            reduction_ranges=group.reduction_ranges,
            members=tuple(members),
            inputs=tuple(inputs),
            outputs=tuple(m.name for m in members if m.stored),
            device=group.members[0].buffer.layout.device,
        )
        kernels[group.position] = merge_dimensions(kernel)
    return kernels


def _reads(members: Iterable[KernelMember]) -> set[str]:
    names: set[str] = set()
    for m in members:
        roots = (m.body, *m.indirect)
        for root in roots:
            for node in walk(root):
                if isinstance(node, Load):
                    names.add(node.buffer)
                elif isinstance(node, Rand):
                    names.add(node.seed)
        if m.kind == SCATTER and m.mutates is not None and m.scatter_reduce is not None:
            names.add(m.mutates)
    return names


def _read_outside(program: Program, groups: list[Group]) -> set[str]:
    """Buffers read by something outside the group that computes them."""
    group_of = {m.buffer.name: id(g) for g in groups for m in g.members}
    outside: set[str] = set(program.output_names())
    for node in program.nodes:
        own = group_of.get(node.name)
        for name in node.reads():
            if name in group_of and group_of[name] != own:
                outside.add(name)
    for ref in iter_refs(program.outputs):
        outside.add(ref.name)
    return outside


def _kernel_name(number: int, group: Group, members: list[KernelMember]) -> str:
    """`k<n>_<what it fuses>`: the FX origins of its members, for profiles and logs."""
    words: list[str] = []
    for m in group.members:
        origin = m.buffer.origin or m.kind
        word = re.sub(r"_\d+$", "", re.sub(r"[^0-9a-zA-Z_]", "_", origin)).strip("_") or m.kind
        if word not in words:
            words.append(word)
    kind = (
        "scan"
        if any(m.kind == SCAN for m in group.members)
        else "sort"
        if any(m.kind == SORT for m in group.members)
        else "red"
        if group.reduction_ranges
        else "scatter"
        if group.closed and any(isinstance(m.buffer.loop, Scatter) for m in group.members)
        else "pw"
    )
    return f"k{number}_{kind}_" + "_".join(words)[:48].rstrip("_")
