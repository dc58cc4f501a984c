"""From fusion groups to `FusedKernel`s: decide what each kernel stores, what it
reads, its name, and its canonical loop ranges."""

from __future__ import annotations

import re
from collections.abc import Iterable

from ember.ir import ComputedBuffer, Load, Program, Rand, iter_refs, walk
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
    MatmulSpec,
    SortSpec,
)


def build_kernels(
    program: Program,
    groups: list[Group],
    matmuls: frozenset[str] = frozenset(),
    matmul: MatmulSpec | None = None,
) -> dict[int, FusedKernel]:
    """One kernel per group, keyed by the group's position in the program. A group
    that starts with one of `matmuls` (ember.scheduler.epilogue) is a matmul kernel
    computed as `matmul` says, its dimensions left as they are (the codegen reads
    the roles M, N, K and batch off them)."""
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
        origins = tuple(dict.fromkeys(o for m in group.members for o in _origins(m.buffer)))
        template = group.members[0].buffer.name in matmuls
        kernel = FusedKernel(
            name=_kernel_name(number, group, origins, template),
            ranges=group.ranges,
            reduction_ranges=group.reduction_ranges,
            members=tuple(members),
            inputs=tuple(inputs),
            outputs=tuple(m.name for m in members if m.stored),
            device=group.members[0].buffer.layout.device,
            origins=origins,
            computes=tuple(m.buffer.name for m in group.members),
            matmul=(matmul or MatmulSpec()) if template else None,
        )
        kernels[group.position] = kernel if template else merge_dimensions(kernel)
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


def _origins(buffer: ComputedBuffer) -> tuple[str, ...]:
    """The FX nodes a buffer computes (its one origin for IR built by hand)."""
    return buffer.origins or ((buffer.origin,) if buffer.origin else ())


# FX nodes of ops that only reshape, alias or copy: they compute nothing worth naming a
# kernel after (the nodes are still in the kernel's `origins`).
_SHAPE_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "permute", "expand", "t", "transpose", "unsqueeze",
    "squeeze", "slice", "select", "as_strided", "alias", "detach", "clone", "contiguous",
    "_to_copy", "copy", "unfold", "split", "split_with_sizes", "chunk", "getitem",
})  # fmt: skip
NAME_LENGTH = 48


def _kernel_name(number: int, group: Group, origins: tuple[str, ...], matmul: bool = False) -> str:
    """`k<n>_<kind>_<what it computes>`: the ops of the FX nodes whose computation
    it holds (numbers stripped, each once, views and copies left out), whole words
    only, so a name lists only what the kernel computes. Where the words do not fit,
    the name says how many more ops there are (`_and3`)."""
    words: list[str] = []
    for origin in origins:
        word = re.sub(r"_\d+$", "", re.sub(r"[^0-9a-zA-Z_]", "_", origin)).strip("_")
        if word and word not in _SHAPE_OPS and word not in words:
            words.append(word)
    if not words:  # only copies and views (or hand-built IR): say what kind of loop
        words = list(dict.fromkeys(m.kind for m in group.members))
    kind = (
        "mm"
        if matmul
        else "scan"
        if any(m.kind == SCAN for m in group.members)
        else "sort"
        if any(m.kind == SORT for m in group.members)
        else "red"
        if group.reduction_ranges
        else "scatter"
        if group.closed and any(isinstance(m.buffer.loop, Scatter) for m in group.members)
        else "pw"
    )
    shown: list[str] = []
    for k, word in enumerate(words):
        rest = len(words) - k - 1
        tail = f"_and{rest}" if rest else ""
        if len("_".join([*shown, word])) + len(tail) > NAME_LENGTH and shown:
            shown.append(f"and{len(words) - k}")
            break
        shown.append(word)
    return f"k{number}_{kind}_" + "_".join(shown)
