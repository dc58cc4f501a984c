"""Lowering: interpret an ATen FX graph into an IR `Program`.

Each FX node becomes IR: placeholders become inputs with the example's real strides
(or size inputs when they are SymInts), `get_attr` tensors become constants, and each
`call_function` goes through one table from ATen overload to a lowering function.
An op with no entry becomes an `ExternKernel` calling the ATen op itself: some on
purpose (`INTENTIONAL_EXTERNS`: matmul, convolution, attention), the rest as a
fallback, logged once per op, so that every graph lowers. With fallback disabled
(`LoweringOptions(allow_fallback=False)`; the runtime maps `EMBER_FALLBACK=0` to it)
an op without a lowering is a `LoweringError` naming the op and the node.

Nodes whose value is a size (SymInt arithmetic, `aten.sym_size`) produce no code: their
value is the sympy expression the graph's ShapeEnv already holds.
"""

from __future__ import annotations

import keyword
import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx

from ember.ir.errors import LoweringError
from ember.ir.layout import Layout
from ember.ir.nodes import (
    BufferRef,
    ComputeNode,
    ConstantBuffer,
    ExternKernel,
    InputBuffer,
    InputNode,
    MultiOutput,
    OpaqueInput,
    SizeInput,
)
from ember.ir.program import Program
from ember.ir.symbolic import as_expr

log = logging.getLogger("ember.ir")
aten = torch.ops.aten

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)

# Ops that stay ATen calls by design: vendor libraries beat generated code here.
INTENTIONAL_EXTERNS: frozenset[torch._ops.OpOverloadPacket] = frozenset(
    {
        aten.mm,
        aten.addmm,
        aten.bmm,
        aten.baddbmm,
        aten.convolution,
        aten.convolution_backward,
        aten._scaled_dot_product_flash_attention,
        aten._scaled_dot_product_flash_attention_backward,
        aten._scaled_dot_product_efficient_attention,
        aten._scaled_dot_product_efficient_attention_backward,
        aten._scaled_dot_product_cudnn_attention,
        aten._scaled_dot_product_cudnn_attention_backward,
        aten._scaled_dot_product_flash_attention_for_cpu,
        aten._scaled_dot_product_flash_attention_for_cpu_backward,
    }
)


@dataclass(frozen=True)
class LoweringOptions:
    """Switches for lowering. `allow_fallback=False` turns fallbacks into errors."""

    allow_fallback: bool = True


# The lowering table: ATen overload -> function building IR for one node. Empty
# entries mean "extern"; the loop-level lowerings register themselves here.
LoweringFn = Callable[["GraphLowering", torch.fx.Node], Any]
LOWERINGS: dict[torch._ops.OpOverload, LoweringFn] = {}

_fallbacks_logged: set[str] = set()


def lower_graph(
    gm: torch.fx.GraphModule, *, name: str = "graph", options: LoweringOptions | None = None
) -> Program:
    """Lower an ATen-level graph module (with `meta['val']` on its nodes) to a Program."""
    return GraphLowering(gm, name, options or LoweringOptions()).run()


class GraphLowering:
    """Walks the FX graph once, in order, building the program."""

    def __init__(self, gm: torch.fx.GraphModule, name: str, options: LoweringOptions) -> None:
        self.gm = gm
        self.options = options
        self.program = Program(name=name, inputs=[], constants=[], nodes=[], outputs=[])
        # FX node -> its IR value: a BufferRef, a sympy expression, or a plain value.
        self.env: dict[torch.fx.Node, Any] = {}
        self._bound_symbols: set[sympy.Symbol] = set()
        self._counter = 0

    def run(self) -> Program:
        for node in self.gm.graph.nodes:
            handler = getattr(self, f"_lower_{node.op}")
            self.env[node] = handler(node)
        return self.program

    # -- node kinds ---------------------------------------------------------------

    def _lower_placeholder(self, node: torch.fx.Node) -> Any:
        val = node.meta.get("val")
        name = _identifier(node.name)
        entry: InputNode
        if isinstance(val, torch.Tensor):
            entry = InputBuffer(name, Layout.of(val))
            self._bound_symbols |= entry.layout.free_symbols
            result: Any = BufferRef(name)
        elif isinstance(val, (*_SYM_TYPES, int, float, bool)):
            expr = as_expr(val)
            entry = SizeInput(name, expr)
            self._bound_symbols |= expr.free_symbols
            result = expr
        else:
            entry = OpaqueInput(name, type(val).__name__)
            result = BufferRef(name)
        self.program.inputs.append(entry)
        return result

    def _lower_get_attr(self, node: torch.fx.Node) -> Any:
        value = _fetch_attr(self.gm, str(node.target))
        if not isinstance(value, torch.Tensor):
            return value
        # No tensor op here: lowering may run under AOTAutograd's active fake mode.
        const = ConstantBuffer(self._new_name("const"), value)
        self.program.constants.append(const)
        return BufferRef(const.name)

    def _lower_call_function(self, node: torch.fx.Node) -> Any:
        val = node.meta.get("val", _MISSING)
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            return self._lower_getitem(node)
        if isinstance(val, _SYM_TYPES) or (
            isinstance(val, (int, float, bool))
            and not isinstance(node.target, torch._ops.OpOverload)
        ):
            expr = as_expr(val)
            if expr.free_symbols <= self._bound_symbols:
                return expr  # pure size arithmetic: no code
            if isinstance(node.target, torch._ops.OpOverload) and isinstance(expr, sympy.Symbol):
                return self._extern(node, symbol=expr)  # defines an unbacked symbol
            raise LoweringError(
                node.name, str(node.target), f"size {expr} depends on unbound symbols"
            )
        if not isinstance(node.target, torch._ops.OpOverload):
            raise LoweringError(
                node.name,
                str(node.target),
                "only ATen operator overloads can be lowered; trace the graph at the ATen "
                "level (AOTAutograd, torch.export or make_fx) first",
            )
        if val is _MISSING:
            raise LoweringError(
                node.name,
                str(node.target),
                "node has no meta['val']; run FakeTensorProp or trace with make_fx first",
            )
        lowering = LOWERINGS.get(node.target)
        if lowering is not None:
            return lowering(self, node)
        intentional = node.target.overloadpacket in INTENTIONAL_EXTERNS
        if not intentional:
            op_name = str(node.target)
            if not self.options.allow_fallback:
                raise LoweringError(
                    node.name,
                    op_name,
                    "no lowering for this op and fallbacks are disabled (EMBER_FALLBACK=0); "
                    "enable fallbacks or add a lowering to ember.ir.lowering.LOWERINGS",
                )
            self.program.fallback_ops.add(op_name)
            if op_name not in _fallbacks_logged:
                _fallbacks_logged.add(op_name)
                log.info("no lowering for %s: falling back to the ATen kernel", op_name)
        return self._extern(node, fallback=not intentional)

    def _lower_call_method(self, node: torch.fx.Node) -> Any:
        raise LoweringError(
            node.name, str(node.target), "method calls are not ATen ops; trace with make_fx first"
        )

    def _lower_call_module(self, node: torch.fx.Node) -> Any:
        raise LoweringError(
            node.name, str(node.target), "module calls are not ATen ops; trace with make_fx first"
        )

    def _lower_output(self, node: torch.fx.Node) -> Any:
        (results,) = node.args
        flat = results if isinstance(results, (list, tuple)) else [results]
        self.program.outputs = [self._convert(r) for r in flat]
        return None

    # -- helpers --------------------------------------------------------------------

    def _lower_getitem(self, node: torch.fx.Node) -> Any:
        source = node.args[0]
        assert isinstance(source, torch.fx.Node)
        index = node.args[1]
        parent = self.env[source]
        if isinstance(parent, (tuple, list)):
            return parent[index]  # type: ignore[index]  # index is an int from the graph
        if not isinstance(parent, BufferRef):
            raise LoweringError(node.name, "getitem", f"cannot index {type(parent).__name__}")
        val = node.meta.get("val")
        layout = Layout.of(val) if isinstance(val, torch.Tensor) else None
        if not isinstance(index, int):
            raise LoweringError(node.name, "getitem", f"index {index!r} is not an int")
        out = MultiOutput(self._new_name("buf"), parent.name, index, layout)
        self.program.nodes.append(out)
        return BufferRef(out.name)

    def _extern(
        self, node: torch.fx.Node, *, symbol: sympy.Symbol | None = None, fallback: bool = False
    ) -> Any:
        assert isinstance(node.target, torch._ops.OpOverload)
        val = node.meta.get("val")
        multi = isinstance(val, (tuple, list))
        vals = list(val) if multi else [val]  # type: ignore[arg-type]  # checked just above
        outputs = tuple(Layout.of(v) if isinstance(v, torch.Tensor) else None for v in vals)
        kernel = ExternKernel(
            name=self._new_name("buf"),
            op=node.target,
            args=tuple(self._convert(a) for a in node.args),
            kwargs=tuple((k, self._convert(v)) for k, v in node.kwargs.items()),
            outputs=outputs,
            multi=multi,
            symbol=symbol,
            origin=node.name,
            fallback=fallback,
        )
        self.add(kernel)
        if symbol is not None:
            self._bound_symbols.add(symbol)
            return symbol
        return BufferRef(kernel.name)

    def add(self, node: ComputeNode) -> None:
        self.program.nodes.append(node)

    def _convert(self, arg: Any) -> Any:
        """An FX argument as an IR argument tree."""
        if isinstance(arg, torch.fx.Node):
            return self.env[arg]
        if isinstance(arg, (list, tuple)):
            return tuple(self._convert(a) for a in arg)
        if isinstance(arg, dict):
            return {k: self._convert(v) for k, v in arg.items()}
        if isinstance(arg, _SYM_TYPES):
            return as_expr(arg)
        return arg

    def _new_name(self, prefix: str) -> str:
        name = f"{prefix}{self._counter}"
        self._counter += 1
        return name


_MISSING = object()


# Names the generated code uses for itself: inputs must not shadow them.
_RESERVED = frozenset({"args", "call", "torch", "math"})


def _identifier(name: str) -> str:
    """The FX name as a safe Python identifier (generated code uses it verbatim)."""
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    if (
        not cleaned
        or cleaned[0].isdigit()
        or keyword.iskeyword(cleaned)
        or cleaned in _RESERVED
        or cleaned.startswith(("sym_", "buf", "const", "op", "obj"))
    ):
        return f"in_{cleaned}"
    return cleaned


def _fetch_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
