"""A readable text form of a Program (for the debug dir and for tests)."""

from __future__ import annotations

from typing import Any

import sympy

from ember.ir.nodes import (
    BufferRef,
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
            lines.append(f"  {item.name} = extern {item.op}({', '.join(args)}) -> {result}{tag}")
        elif isinstance(item, MultiOutput):
            lines.append(f"  {item.name} = {item.source}[{item.index}] -> {item.layout}")
    lines.append("  return " + ", ".join(format_arg(o) for o in program.outputs))
    return "\n".join(lines)
