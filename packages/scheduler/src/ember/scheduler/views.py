"""Loads through view externs read the viewed buffer.

A graph output that is a view of a computed buffer (a training forward's saved batch
mean, an `as_strided` of its statistics) is an extern call in the program: torch
makes the view at run time, no kernel runs. A loop node that reads that view, rather
than the buffer, depended on the extern, so the fuser saw a step between the
buffer's kernel and the reader and could not put them together. Since a view shares
its base's storage and a load's index counts storage elements (ember.ir.expr.Load),
a load of the view is the same load of the base: this pass renames it, and the
reader depends on the base alone.

Only `as_strided` views (what outputs become) of computed buffers that nothing
writes later are renamed; a view with a storage of its own kind (a dtype view) would
count elements differently.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ember.ir import BufferRef, ComputedBuffer, ExternKernel, Load, Program
from ember.ir.expr import Node, map_dag
from ember.ir.loops import Pointwise, Reduction, Scan, Scatter, Sort
from ember.ir.nodes import ComputeNode


def read_through_views(program: Program) -> Program:
    """`program` with loads of `as_strided` views of computed buffers reading the
    buffers themselves (the same program when there are none)."""
    computed = {n.name: n for n in program.nodes if isinstance(n, ComputedBuffer)}
    written = {n.mutates for n in program.nodes if isinstance(n, ComputedBuffer) and n.mutates}
    bases: dict[str, str] = {}
    for node in program.nodes:
        if not isinstance(node, ExternKernel) or node.op is not torch.ops.aten.as_strided.default:
            continue
        source = node.args[0] if node.args else None
        if not isinstance(source, BufferRef) or source.name not in computed:
            continue
        base, view = computed[source.name], node.outputs[0] if node.outputs else None
        if base.name in written or view is None or base.layout.dtype != view.dtype:
            continue
        bases[node.name] = base.name
    if not bases:
        return program
    nodes: list[ComputeNode] = []
    changed = False
    for node in program.nodes:
        if isinstance(node, ComputedBuffer) and bases.keys() & set(node.reads()):
            node = replace(node, loop=_renamed(node.loop, bases))
            changed = True
        nodes.append(node)
    return replace(program, nodes=nodes) if changed else program


def _renamed(
    loop: Pointwise | Reduction | Scan | Sort | Scatter, bases: dict[str, str]
) -> Pointwise | Reduction | Scan | Sort | Scatter:
    def rename(node: Node) -> Node:
        if isinstance(node, Load) and node.buffer in bases:
            return replace(node, buffer=bases[node.buffer])
        return node

    if isinstance(loop, Scatter):
        indirect = tuple(map_dag(i, rename) for i in loop.indirect)
        return replace(loop, body=map_dag(loop.body, rename), indirect=indirect)
    return replace(loop, body=map_dag(loop.body, rename))
