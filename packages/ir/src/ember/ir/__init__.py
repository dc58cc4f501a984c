"""ember.ir: the loop-level IR of Ember.

Lowers an ATen FX graph (from AOTAutograd or torch.export) into a `Program` of
buffers and computations, verifies it, prints it, and runs it with the reference
interpreter. Sits on ember.graphpasses; the scheduler consumes its Programs.
"""

# The lowering modules register their entries in LOWERINGS when imported.
from ember.ir import (  # noqa: F401
    arith,
    assemble,
    distances,
    factories,
    indexing,
    norms,
    pointwise,
    pool_gradients,
    pooling,
    random,
    reduction,
    scan,
    scatters,
    sort,
    views,
)
from ember.ir.errors import (
    IndexOutOfBounds,
    LoweringError,
    VerificationError,
    index_error_message,
)
from ember.ir.expr import (
    Cast,
    CheckIndex,
    Const,
    IndexExpr,
    Load,
    Node,
    Op,
    Rand,
    Where,
    float_valued,
    loads,
    size_value,
    walk,
)
from ember.ir.interpreter import (
    ExternShapeMismatch,
    argument_value,
    bind_symbols,
    call_extern,
    conform_extern_result,
    ensure_layout,
    run_program,
)
from ember.ir.layout import Layout, conforms, laid_out, offset_symbol
from ember.ir.loops import (
    REDUCTION_KINDS,
    SCAN_KINDS,
    Pointwise,
    Reduction,
    Scan,
    Scatter,
    Sort,
)
from ember.ir.lowering import (
    INTENTIONAL_EXTERNS,
    LOWERINGS,
    LoweringOptions,
    NotLowerable,
    lower_graph,
    register_lowering,
)
from ember.ir.nodes import (
    BufferRef,
    ComputedBuffer,
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
from ember.ir.ops import OP_NAMES, OpsHandler
from ember.ir.printer import format_arg, format_body, format_program
from ember.ir.program import Program
from ember.ir.symbolic import SIZE_HINT, as_expr, evaluate, size_hint
from ember.ir.verify import verify

__all__ = [
    "INTENTIONAL_EXTERNS",
    "LOWERINGS",
    "OP_NAMES",
    "REDUCTION_KINDS",
    "SCAN_KINDS",
    "SIZE_HINT",
    "BufferRef",
    "Cast",
    "CheckIndex",
    "ComputeNode",
    "ComputedBuffer",
    "Const",
    "ConstantBuffer",
    "ExternKernel",
    "ExternShapeMismatch",
    "IRNode",
    "IndexExpr",
    "IndexOutOfBounds",
    "InputBuffer",
    "Layout",
    "Load",
    "LoweringError",
    "LoweringOptions",
    "MultiOutput",
    "Node",
    "NotLowerable",
    "Op",
    "OpaqueInput",
    "OpsHandler",
    "Pointwise",
    "Program",
    "Rand",
    "Reduction",
    "Scan",
    "Scatter",
    "SizeInput",
    "Sort",
    "VerificationError",
    "Where",
    "argument_value",
    "as_expr",
    "bind_symbols",
    "call_extern",
    "conform_extern_result",
    "conforms",
    "ensure_layout",
    "evaluate",
    "float_valued",
    "format_arg",
    "format_body",
    "format_program",
    "index_error_message",
    "iter_exprs",
    "iter_refs",
    "laid_out",
    "loads",
    "lower_graph",
    "offset_symbol",
    "register_lowering",
    "run_program",
    "size_hint",
    "size_value",
    "verify",
    "walk",
]
