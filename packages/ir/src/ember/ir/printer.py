"""A readable text form of a Program (for the debug dir and for tests)."""

from __future__ import annotations

from typing import Any

import sympy
import torch

from ember.ir.expr import Cast, CheckIndex, Const, IndexExpr, Load, Node, Op, Rand, Where, walk
from ember.ir.loops import Pointwise, Reduction, Scan, Scatter, Sort
from ember.ir.nodes import (
    BufferRef,
    ComputedBuffer,
    ExternKernel,
    InputBuffer,
    MultiOutput,
    OpaqueInput,
    SizeInput,
)
from ember.ir.program import Program


def format_arg(arg: Any) -> str:
    if isinstance(arg, BufferRef):
        return arg.name
    if isinstance(arg, tuple):
        return "[" + ", ".join(format_arg(a) for a in arg) + "]"
    if isinstance(arg, dict):
        return "{" + ", ".join(f"{k}: {format_arg(v)}" for k, v in arg.items()) + "}"
    if isinstance(arg, sympy.Basic):
        return str(arg)
    return repr(arg)


def format_program(program: Program) -> str:
    lines = [f"program {program.name}"]
    for node in program.inputs:
        if isinstance(node, InputBuffer):
            lines.append(f"  input {node.name}: {node.layout}")
        elif isinstance(node, SizeInput):
            lines.append(f"  size  {node.name} = {node.expr}")
        elif isinstance(node, OpaqueInput):
            lines.append(f"  input {node.name}: opaque {node.type_name}")
    for const in program.constants:
        lines.append(f"  const {const.name}: {const.layout}")
    if program.rng_seed is not None:
        lines.append(f"  seed  {program.rng_seed}: int64 (random ops)")
    for item in program.nodes:
        if isinstance(item, ExternKernel):
            args = [format_arg(a) for a in item.args]
            args += [f"{k}={format_arg(v)}" for k, v in item.kwargs]
            result = (
                str(item.symbol)
                if item.symbol is not None
                else "(" + ", ".join(str(o) for o in item.outputs) + ")"
                if item.multi
                else str(item.outputs[0])
            )
            tag = " [fallback]" if item.fallback else ""
            tag += f"  # from {item.origin}" if item.origin else ""
            lines.append(f"  {item.name} = extern {item.op}({', '.join(args)}) -> {result}{tag}")
        elif isinstance(item, MultiOutput):
            lines.append(f"  {item.name} = {item.source}[{item.index}] -> {item.layout}")
        elif isinstance(item, ComputedBuffer):
            lines.extend(_format_loop(item))
    lines.append("  return " + ", ".join(format_arg(o) for o in program.outputs))
    return "\n".join(lines)


def format_body(root: Node) -> str:
    """A body DAG as numbered lines, shared nodes printed once: `%3 = exp(%2)`."""
    names: dict[int, str] = {}
    lines: list[str] = []
    for node in walk(root):
        names[id(node)] = f"%{len(names)}"
        lines.append(f"{names[id(node)]} = {_format_node(node, names)}")
    return "\n".join(lines)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _format_node(node: Node, names: dict[int, str]) -> str:
    if isinstance(node, Const):
        return f"const {node.value!r}: {_dtype(node.dtype)}"
    if isinstance(node, IndexExpr):
        return f"index {node.expr}: {_dtype(node.dtype)}"
    if isinstance(node, Load):
        text = f"load {node.buffer}[{node.index}]"
        if node.indirect:
            text += " with " + ", ".join(
                f"ind{k}={names[id(n)]}" for k, n in enumerate(node.indirect)
            )
        if node.mask is not None:
            text += f" if {names[id(node.mask)]} else {node.other!r}"
        return f"{text}: {_dtype(node.dtype)}"
    if isinstance(node, Op):
        return f"{node.name}({', '.join(names[id(a)] for a in node.args)}): {_dtype(node.dtype)}"
    if isinstance(node, Cast):
        return f"cast({names[id(node.x)]}): {_dtype(node.dtype)}"
    if isinstance(node, Where):
        return f"where({names[id(node.cond)]}, {names[id(node.a)]}, {names[id(node.b)]})"
    if isinstance(node, CheckIndex):
        span = "[-size, size)" if node.wraps else "[0, size)"
        text = f"check_index({names[id(node.index)]} in {span}, size={names[id(node.size)]})"
        text += f" dim {node.dim} of {node.describe()}"
        if node.mask is not None:
            text += f" if {names[id(node.mask)]}"
        return text
    if isinstance(node, Rand):
        return f"rand_{node.distribution}(seed={node.seed}, {node.offset} + {node.index})"
    return repr(node)


def _format_loop(buffer: ComputedBuffer) -> list[str]:
    loop = buffer.loop
    ranges = ", ".join(str(r) for r in loop.ranges)
    if isinstance(loop, Pointwise):
        head = f"pointwise [{ranges}]"
    elif isinstance(loop, Reduction):
        reduced = ", ".join(str(r) for r in loop.reduction_ranges)
        head = f"reduction {loop.kind} [{ranges}] over [{reduced}]"
        if loop.whole:
            head += " whole"  # never split by the scheduler
    elif isinstance(loop, Scan):
        carried = _dtype(loop.body.dtype)
        head = f"scan {loop.kind} [{ranges}] along [{loop.length}] at dim {loop.axis} ({carried})"
    elif isinstance(loop, Sort):
        order = "descending" if loop.descending else "ascending"
        what = "indices" if loop.indices else "values"
        head = (
            f"sort {order} {what} [{ranges}] along [{loop.length}] at dim {loop.axis}"
            f" first {loop.count}"
        )
    else:
        how = f" reduce={loop.reduce}" if loop.reduce else ""
        head = f"scatter [{ranges}] at [{loop.index}]{how}"
    mutates = f" (writes {buffer.mutates})" if buffer.mutates else ""
    origins = f"  # from {', '.join(buffer.origins)}" if buffer.origins else ""
    lines = [f"  {buffer.name}: {buffer.layout} = {head}{mutates}{origins}"]
    roots = [loop.body] if not isinstance(loop, Scatter) else [*loop.indirect, loop.body]
    names: dict[int, str] = {}
    for root in roots:
        for node in walk(root):
            if id(node) not in names:
                names[id(node)] = f"%{len(names)}"
                lines.append(f"    {names[id(node)]} = {_format_node(node, names)}")
    if isinstance(loop, Scatter) and loop.indirect:
        binds = ", ".join(f"ind{k}={names[id(n)]}" for k, n in enumerate(loop.indirect))
        lines.append(f"    store {names[id(loop.body)]} with {binds}")
    else:
        lines.append(f"    -> {names[id(loop.body)]}")
    return lines
