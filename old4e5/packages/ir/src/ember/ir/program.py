"""Program: the IR of one graph (inputs, computations in order, outputs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy

from ember.ir.nodes import (
    BufferRef,
    ComputeNode,
    ConstantBuffer,
    ExternKernel,
    InputBuffer,
    InputNode,
    SizeInput,
)


@dataclass
class Program:
    """One lowered graph.

    `inputs` are in the graph's calling order. `nodes` are the constants and
    computations in a valid execution order. `outputs` are `BufferRef`s, sympy
    expressions (size outputs) or plain values (None), in the graph's output order.
    """

    name: str
    inputs: list[InputNode]
    constants: list[ConstantBuffer]
    nodes: list[ComputeNode]
    outputs: list[Any]
    fallback_ops: set[str] = field(default_factory=set)
    # Name of the int64 scalar that seeds the program's random ops (ember.ir.random);
    # the caller supplies it at run time. None when the program draws no random numbers.
    rng_seed: str | None = None

    def size_symbols(self) -> set[sympy.Symbol]:
        """The symbols the program's sizes are expressed in."""
        symbols: set[sympy.Symbol] = set()
        for node in self.inputs:
            if isinstance(node, SizeInput):
                symbols |= node.expr.free_symbols
            elif isinstance(node, InputBuffer):
                symbols |= node.layout.free_symbols
        return symbols

    def output_names(self) -> set[str]:
        return {o.name for o in self.outputs if isinstance(o, BufferRef)}

    def extern_kernels(self) -> list[ExternKernel]:
        return [n for n in self.nodes if isinstance(n, ExternKernel)]
