"""ember.ir: the loop-level IR of Ember.

Lowers an ATen FX graph (from AOTAutograd or torch.export) into a `Program` of
buffers and computations, verifies it, prints it, and runs it with the reference
interpreter. Sits on ember.graphpasses; the scheduler consumes its Programs.
"""

from ember.ir.errors import LoweringError, VerificationError
from ember.ir.interpreter import bind_symbols, run_program
from ember.ir.layout import Layout
from ember.ir.lowering import INTENTIONAL_EXTERNS, LOWERINGS, LoweringOptions, lower_graph
from ember.ir.nodes import (
    BufferRef,
    ComputeNode,
    ConstantBuffer,
    ExternKernel,
    InputBuffer,
    IRNode,
    MultiOutput,
    OpaqueInput,
    SizeInput,
    iter_exprs,
    iter_refs,
)
from ember.ir.printer import format_arg, format_program
from ember.ir.program import Program
from ember.ir.symbolic import as_expr, evaluate
from ember.ir.verify import verify

__all__ = [
    "INTENTIONAL_EXTERNS",
    "LOWERINGS",
    "BufferRef",
    "ComputeNode",
    "ConstantBuffer",
    "ExternKernel",
    "IRNode",
    "InputBuffer",
    "Layout",
    "LoweringError",
    "LoweringOptions",
    "MultiOutput",
    "OpaqueInput",
    "Program",
    "SizeInput",
    "VerificationError",
    "as_expr",
    "bind_symbols",
    "evaluate",
    "format_arg",
    "format_program",
    "iter_exprs",
    "iter_refs",
    "lower_graph",
    "run_program",
    "verify",
]
