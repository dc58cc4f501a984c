"""The entry point: turn a Program into a Schedule."""

from __future__ import annotations

from ember.ir import ComputedBuffer, ExternKernel, MultiOutput, Program
from ember.scheduler.build import build_kernels
from ember.scheduler.choices import DEFAULT_CHOICES, DeviceChoices
from ember.scheduler.collectives import overlap_collectives
from ember.scheduler.epilogue import template_matmuls
from ember.scheduler.fusion import Fuser, Group
from ember.scheduler.kernel import FusedKernel, MatmulSpec
from ember.scheduler.memory import plan_memory
from ember.scheduler.schedule import (
    ExternCall,
    FusionNote,
    KernelStep,
    Schedule,
    SelectOutput,
    Step,
)
from ember.scheduler.split import split_reductions
from ember.scheduler.views import read_through_views


def schedule_program(
    program: Program, choices: DeviceChoices = DEFAULT_CHOICES, keep: frozenset[str] = frozenset()
) -> Schedule:
    """Split the reductions `choices` asks for, fuse the program's loop nodes into
    kernels, order the steps, plan memory.

    Steps run in program order, each kernel at the place of its first member (fusion
    only ever moves a node up to a group whose inputs are all ready by then), except
    functional collectives: each is issued as early and waited for as late as its data
    allows, so that communication overlaps compute (ember.scheduler.collectives). The
    schedule's `program` is the one its kernels compute: `program` itself, or a copy
    with split reductions (ember.scheduler.split) and their partial buffers, and
    with the matmul calls that `choices` turn into templates as loop nodes
    (ember.scheduler.epilogue), but the calls named in `keep`, which stay ATen calls
    (the runtime keeps those its measurements found faster unfused). The schedule's
    `matmuls` names the call each matmul kernel replaces.
    """
    split = split_reductions(program, choices)
    while True:
        program, products = template_matmuls(split, choices, keep)
        program = read_through_views(program)
        fuser = Fuser(program, choices, frozenset(products))
        groups = fuser.run()
        alone = {
            products[g.members[0].buffer.name]
            for g in groups
            if len(g.members) == 1 and g.members[0].buffer.name in products
        }
        if not alone:
            break
        keep |= alone  # nothing joined them: cuBLAS alone does better
    matmul = MatmulSpec(tf32=choices.matmul_tf32)
    kernels = build_kernels(program, groups, frozenset(products), matmul)
    steps: list[Step] = []
    for position, node in enumerate(program.nodes):
        if isinstance(node, ExternKernel):
            steps.append(ExternCall(node))
        elif isinstance(node, MultiOutput):
            steps.append(SelectOutput(node))
        elif isinstance(node, ComputedBuffer):
            kernel = kernels.get(position)
            if kernel is not None:
                steps.append(KernelStep(kernel))
        else:  # pragma: no cover - the IR has no other compute node
            raise TypeError(f"cannot schedule {type(node).__name__} {node.name!r}")
    steps = overlap_collectives(program, steps)
    notes = fusion_notes(fuser, groups, kernels)
    matmuls = {
        k.name: products[k.members[0].name] for k in kernels.values() if k.matmul is not None
    }
    return Schedule(program, steps, plan_memory(program, steps), notes, matmuls)


def fusion_notes(
    fuser: Fuser, groups: list[Group], kernels: dict[int, FusedKernel]
) -> list[FusionNote]:
    """The fuser's reasons, by kernel name: for each kernel whose first buffer joined no
    earlier kernel, why each one it was tried against refused it."""
    kernel_of = {
        g.members[0].buffer.name: kernels[g.position].name for g in groups if g.position in kernels
    }
    notes: list[FusionNote] = []
    for first, kernel in kernel_of.items():
        if first in fuser.alone:
            notes.append(FusionNote(kernel, "", fuser.alone[first]))
        for other, reason in fuser.refusals.get(first, {}).items():
            if other in kernel_of:
                notes.append(FusionNote(kernel, kernel_of[other], reason))
    return notes
