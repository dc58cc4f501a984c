"""The reference interpreter: runs any Program with plain torch ops.

It is the oracle of the stack. Lowering is tested by comparing its results with eager,
and codegens by comparing their kernels with it, which tells codegen bugs from
lowering bugs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from ember.ir.evaluate import run_loop
from ember.ir.layout import Layout, conforms, laid_out
from ember.ir.nodes import (
    BufferRef,
    ComputedBuffer,
    ExternKernel,
    InputBuffer,
    MultiOutput,
    SizeInput,
)
from ember.ir.program import Program
from ember.ir.symbolic import evaluate


def bind_symbols(program: Program, args: Sequence[Any]) -> dict[sympy.Symbol, int]:
    """Values of the program's size symbols, read off the actual inputs."""
    bindings: dict[sympy.Symbol, int] = {}
    for node, arg in zip(program.inputs, args, strict=True):
        if isinstance(node, SizeInput) and isinstance(node.expr, sympy.Symbol):
            bindings[node.expr] = int(arg)
        elif isinstance(node, InputBuffer):
            for symbol, method, dim in node.layout.runtime_symbols():
                read = getattr(arg, method)
                bindings.setdefault(symbol, int(read() if dim is None else read(dim)))
    return bindings


class ExternShapeMismatch(RuntimeError):
    """An extern call returned other sizes than the graph's metadata promised."""


def ensure_layout(
    tensor: torch.Tensor,
    size: Sequence[int],
    stride: Sequence[int],
    offset: int = 0,
    what: str = "an extern call",
) -> torch.Tensor:
    """`tensor` itself when it has the layout (`conforms`), else a copy that has it.

    The IR reads an extern call's result through the layout its FX metadata promised;
    an ATen kernel may choose other strides at run time (SDPA's backends differ), and
    reading through the wrong strides or offset would be a silent wrong answer. The
    interpreter and the runtime's generated code both pass extern results through this.
    """
    if conforms(tensor, size, stride, offset):
        return tensor
    if tuple(tensor.shape) != tuple(size):
        # torch 2.11's shape function of linalg_vector_norm over a size-1 dimension
        # keeps it, say; the graph was traced (and planned) with those sizes
        raise ExternShapeMismatch(
            f"ember: {what} returned sizes {tuple(tensor.shape)} where the graph's "
            f"metadata (torch's shape function for the op) says {tuple(size)}, and ember "
            "planned the graph's kernels for those; a newer torch may fix the shape "
            "function, else run this graph with another backend"
        )
    return laid_out(tensor, size, stride, offset)


def conform_extern_result(
    node: ExternKernel, result: Any, bindings: Mapping[sympy.Symbol, int]
) -> Any:
    """An extern's result with the strides the program planned for it (see ensure_layout)."""
    if node.multi or node.is_view or node.writes_arguments:
        return result
    return conform(result, node.outputs[0], bindings, str(node.op))


def conform(
    value: Any,
    layout: Layout | None,
    bindings: Mapping[sympy.Symbol, int],
    what: str = "an extern call",
) -> Any:
    """A tensor with the strides of `layout` (itself when they already match)."""
    if layout is None or not isinstance(value, torch.Tensor):
        return value
    size = [int(evaluate(s, bindings)) for s in layout.size]
    stride = [int(evaluate(s, bindings)) for s in layout.stride]
    return ensure_layout(value, size, stride, int(evaluate(layout.offset, bindings)), what)


def argument_value(tree: Any, env: Mapping[str, Any], bindings: Mapping[sympy.Symbol, int]) -> Any:
    """An IR argument tree with buffers and size expressions replaced by their values."""
    if isinstance(tree, BufferRef):
        return env[tree.name]
    if isinstance(tree, sympy.Basic):
        return evaluate(tree, bindings)
    if isinstance(tree, tuple):
        return [argument_value(t, env, bindings) for t in tree]
    if isinstance(tree, dict):
        return {k: argument_value(v, env, bindings) for k, v in tree.items()}
    return tree


def call_extern(
    node: ExternKernel, env: Mapping[str, Any], bindings: dict[sympy.Symbol, int]
) -> Any:
    """Run an extern call on the values in `env`; binds the symbol it defines, if any,
    and conforms its result to the planned strides."""
    args = argument_value(node.args, env, bindings)
    kwargs = {k: argument_value(v, env, bindings) for k, v in node.kwargs}
    result = node.op(*args, **kwargs)
    if node.symbol is not None:
        bindings[node.symbol] = int(result)
    return conform_extern_result(node, result, bindings)


def run_program(program: Program, args: Sequence[Any], *, seed: int | None = None) -> list[Any]:
    """Execute `program` on concrete `args` (in the program's input order).

    Inputs the program mutates (`ComputedBuffer.mutates`) are updated in place. `seed`
    seeds the program's random ops (ember.ir.random); by default it is drawn from
    torch's default generator, so `torch.manual_seed` makes runs repeatable."""
    env: dict[str, Any] = {node.name: arg for node, arg in zip(program.inputs, args, strict=True)}
    env.update({c.name: c.value for c in program.constants})
    bindings = bind_symbols(program, args)
    if program.rng_seed is not None:
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()).item())
        env[program.rng_seed] = torch.tensor(seed, dtype=torch.int64)

    for item in program.nodes:
        if isinstance(item, ExternKernel):
            env[item.name] = call_extern(item, env, bindings)
        elif isinstance(item, MultiOutput):
            env[item.name] = conform(env[item.source][item.index], item.layout, bindings)
        elif isinstance(item, ComputedBuffer):
            env[item.name] = run_loop(item, env, bindings)
    return [argument_value(out, env, bindings) for out in program.outputs]
