"""The IR's node types: program inputs, constants and computations.

A tensor value in the IR is a named buffer. `InputBuffer`s are the graph's tensor
inputs, `SizeInput`s its integer (possibly symbolic) inputs, `ConstantBuffer`s tensors
the graph carries, and `ExternKernel`s calls to an ATen op (matmul and convolution on
purpose; any op without a lowering as the fallback, so every graph compiles).
`MultiOutput` picks one result of an extern call that returns several.

Arguments of extern calls are trees (tuples, dicts) whose leaves are `BufferRef`s,
sympy expressions (sizes, possibly symbolic) or plain Python values (dtypes, floats,
None...). All node types are frozen dataclasses: hashable, comparable and printable.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from ember.ir.expr import Load, Rand, walk
from ember.ir.layout import Layout
from ember.ir.loops import Loop, Scatter, loop_bodies


@dataclass(frozen=True)
class BufferRef:
    """A reference to a named value (buffer, input or extern result) of the program."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class InputBuffer:
    """A tensor input of the graph, with the real strides of the example input."""

    name: str
    layout: Layout


@dataclass(frozen=True)
class SizeInput:
    """An integer input of the graph (a SymInt under dynamic shapes)."""

    name: str
    expr: sympy.Expr


@dataclass(frozen=True)
class OpaqueInput:
    """An input that is neither a tensor nor a size (a generator, say): passed through."""

    name: str
    type_name: str


@dataclass(frozen=True, eq=False)
class ConstantBuffer:
    """A tensor the graph carries (a lifted constant or a `get_attr` attribute)."""

    name: str
    value: torch.Tensor

    @property
    def layout(self) -> Layout:
        return Layout.of(self.value)


@dataclass(frozen=True)
class ExternKernel:
    """A call to an ATen (or other registered) operator.

    `outputs` holds the layout of each tensor result (None where a result is not a
    tensor); `multi` says the op returns a tuple, read through `MultiOutput`s. When the
    op returns a number that the graph uses as a size (`aten._local_scalar_dense`),
    `symbol` is the unbacked symbol the call defines.
    """

    name: str
    op: torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    outputs: tuple[Layout | None, ...]
    multi: bool = False
    symbol: sympy.Symbol | None = None
    origin: str = ""
    fallback: bool = False

    @property
    def layout(self) -> Layout | None:
        return None if self.multi else self.outputs[0]

    @property
    def is_view(self) -> bool:
        """The op returns an alias of an input (no data is moved, no kernel runs)."""
        return returns_view(self.op)

    @property
    def writes_arguments(self) -> bool:
        """The op mutates one of its arguments (an in-place or out= op)."""
        return any(
            a.alias_info is not None and a.alias_info.is_write for a in self.op._schema.arguments
        )

    def reads(self) -> Iterator[str]:
        yield from (ref.name for ref in iter_refs((self.args, self.kwargs)))


def returns_view(op: torch._ops.OpOverload) -> bool:
    """`op` returns aliases of its inputs only (a view op: no data moves)."""
    returns = op._schema.returns
    return bool(returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in returns
    )


@dataclass(frozen=True)
class MultiOutput:
    """Result `index` of the multi-output extern call `source`."""

    name: str
    source: str
    index: int
    layout: Layout | None

    def reads(self) -> Iterator[str]:
        yield self.source


@dataclass(frozen=True)
class ComputedBuffer:
    """A realized buffer: the result of a loop node, stored with `layout`.

    `mutates` names an existing buffer (a graph input for AOTAutograd's `copy_`
    epilogues, or a computed buffer for scatter) whose storage this node writes: the
    node's own name then is a new name for that same storage, holding the updated
    values, and later readers read through the new name. Buffers are otherwise
    written once.
    """

    name: str
    layout: Layout
    loop: Loop
    mutates: str | None = None
    origin: str = ""  # the FX node whose value this is (the last of `origins`)
    # Every FX node whose computation the loop's body holds, in graph order: the
    # pointwise chain that was inlined into it, not only the node that stored it.
    origins: tuple[str, ...] = ()

    def reads(self) -> Iterator[str]:
        seen: set[str] = set()
        if self.mutates is not None:
            seen.add(self.mutates)
            yield self.mutates
        for root in loop_bodies(self.loop):
            for node in walk(root):
                name = (
                    node.buffer
                    if isinstance(node, Load)
                    else node.seed
                    if isinstance(node, Rand)
                    else None
                )
                if name is not None and name not in seen:
                    seen.add(name)
                    yield name

    @property
    def is_scatter(self) -> bool:
        return isinstance(self.loop, Scatter)


InputNode = InputBuffer | SizeInput | OpaqueInput
ComputeNode = ExternKernel | MultiOutput | ComputedBuffer
IRNode = InputNode | ConstantBuffer | ComputeNode


def iter_refs(tree: Any) -> Iterator[BufferRef]:
    """Every `BufferRef` in an argument tree, in order."""
    if isinstance(tree, BufferRef):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            yield from iter_refs(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from iter_refs(item)


def iter_exprs(tree: Any) -> Iterator[sympy.Expr]:
    """Every sympy expression in an argument tree, in order."""
    if isinstance(tree, sympy.Basic):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for item in tree:
            yield from iter_exprs(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from iter_exprs(item)
