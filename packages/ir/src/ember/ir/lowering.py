"""Lowering: interpret an ATen FX graph into an IR `Program`.

Each FX node becomes IR: placeholders become inputs with the example's real strides
(or size inputs when they are SymInts), `get_attr` tensors become constants, and each
`call_function` goes through one table from ATen overload to a lowering function.
An op with no entry becomes an `ExternKernel` calling the ATen op itself: some on
purpose (`INTENTIONAL_EXTERNS`: matmul, convolution, attention), the rest as a
fallback, logged once per op, so that every graph lowers. With fallback disabled
(`LoweringOptions(allow_fallback=False)`; the runtime maps `EMBER_FALLBACK=0` to it)
an op without a lowering is a `LoweringError` naming the op and the node.

With `LoweringOptions(loops=True)` the ops that have an entry in `LOWERINGS` become
loop-level IR instead: their values are `LazyTensor`s (ember.ir.tensor) that compose
into explicit bodies, realized into `ComputedBuffer`s when a value is a graph output,
feeds an extern, is the result of a reduction, is read by several users and is costly
to recompute, or grows too big to inline. The lowerings live in files by concept
(pointwise, reduction, views, indexing, factories, random, norms) and register here.

Nodes whose value is a size (SymInt arithmetic, `aten.sym_size`) produce no code: their
value is the sympy expression the graph's ShapeEnv already holds.
"""

from __future__ import annotations

import keyword
import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv

from ember.graphpasses.effects import storage_key
from ember.ir.errors import LoweringError
from ember.ir.errors import NotLowerable as NotLowerable
from ember.ir.expr import Load, Node, Op, Rand, may_divide_by_zero, walk
from ember.ir.externs import INTENTIONAL_EXTERNS as INTENTIONAL_EXTERNS
from ember.ir.layout import Layout
from ember.ir.loops import Loop, Pointwise
from ember.ir.mutation import aliased_buffer, inplace_lowering, mutate, snapshot_readers
from ember.ir.nodes import (
    BufferRef,
    ComputedBuffer,
    ComputeNode,
    ConstantBuffer,
    ExternKernel,
    InputBuffer,
    InputNode,
    MultiOutput,
    OpaqueInput,
    SizeInput,
    returns_view,
)
from ember.ir.program import Program
from ember.ir.symbolic import as_expr, loop_vars, product, simplify_index, size_hint
from ember.ir.tensor import Index, LazyTensor, buffer_loader

log = logging.getLogger("ember.ir")
aten = torch.ops.aten

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


@dataclass(frozen=True)
class LoweringOptions:
    """Switches for lowering.

    `allow_fallback=False` turns fallbacks into errors. `loops=True` lowers the ops in
    `LOWERINGS` to loop nodes (the default keeps every op an `ExternKernel`, for layers
    that cannot run loop nodes yet). A value read by several users is stored once its
    body costs more than `realize_cost` or reads more than `realize_reads` buffers;
    any body costing more than `max_inline_cost` is stored, which bounds recomputation
    and body size. The reads bound matters for chains such as a transformer's
    residual stream (h = h + block(h) per layer, each sum read by the next norm and
    the next sum): kept lazy, every norm re-read all the earlier addends from memory.
    """

    allow_fallback: bool = True
    loops: bool = False
    # Op names (of the ops protocol) the target codegen cannot render: an ATen op whose
    # body would use one stays an ATen call, so the rest of the graph still fuses.
    unsupported_ops: frozenset[str] = frozenset()
    realize_cost: int = 8
    realize_reads: int = 1
    max_inline_cost: int = 200
    # Recompute a shared value wider than its inputs instead of storing it (see
    # `GraphLowering._cheaper_to_recompute`); the runtime asks for CUDA graphs
    # (EMBER_RECOMPUTE).
    recompute_shared: bool = False
    recompute_cost: int = 32
    # Check every data-dependent index (embedding, gather, index, scatter, ...) against
    # its dimension (`CheckIndex`): out of range, the program raises as eager does
    # instead of reading or writing outside the buffer. The runtime maps
    # EMBER_INDEX_CHECKS=0 to False, for kernels whose indices are known good.
    index_checks: bool = True
    # (device type, longest row its codegen sorts): a sort or topk along a longer (or a
    # symbolic) dimension on such a device stays an ATen call, with the reason logged.
    # The runtime asks for the Triton codegen's limit on CUDA; C++ sorts any length.
    sort_limits: tuple[tuple[str, int], ...] = ()
    # Device types whose 2-d depthwise convolutions stay ATen calls (ember.ir.depthwise
    # lowers them elsewhere). The runtime asks for the device types whose record says
    # the library kernel wins (`DeviceRecord.lowers_depthwise`).
    extern_depthwise: tuple[str, ...] = ()


# The lowering table: ATen overload -> function building IR for one node (used with
# `loops=True`); an op without an entry is an extern call. Lowerings return a
# LazyTensor, a BufferRef, a sympy expression, or a tuple of those.
LoweringFn = Callable[["GraphLowering", torch.fx.Node], Any]
LOWERINGS: dict[torch._ops.OpOverload, LoweringFn] = {}
_F = TypeVar("_F", bound=LoweringFn)


def register_lowering(*ops: torch._ops.OpOverload) -> Callable[[_F], _F]:
    """Decorator: `fn` lowers each of `ops`."""

    def register(fn: _F) -> _F:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"{op} has two lowerings")
            LOWERINGS[op] = fn
        return fn

    return register


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
        self._views: set[str] = set()  # as_strided views made for extern arguments
        self._input_storages: dict[str, Any] = {}  # input name -> its storage's identity
        self._counter = 0
        # Layout of every named buffer, and for a mutated buffer the name of its
        # newest version (see ComputedBuffer.mutates).
        self.layouts: dict[str, Layout] = {}
        self.versions: dict[str, str] = {}
        self._rng_offset: sympy.Expr = sympy.Integer(0)
        self.current_node: torch.fx.Node | None = None

    def run(self) -> Program:
        for node in self.gm.graph.nodes:
            self.current_node = node
            handler = getattr(self, f"_lower_{node.op}")
            result = handler(node)
            self._stamp_origins(result)
            self.env[node] = result
        return self.program

    # -- provenance ---------------------------------------------------------------

    def _stamp_origins(self, result: Any) -> None:
        """Give each new lazy value of the current node its provenance: the node, after
        the origins of the unstored lazy values it read (their bodies are inlined in
        its own). Values that already carry origins (a getitem of a tuple) keep them."""
        fresh = [v for v in _lazy_values(result) if not v.origins]
        if fresh:
            origins = self.origins_here()
            for value in fresh:
                value.origins = origins

    def origins_here(self) -> tuple[str, ...]:
        """The provenance of a value the current node computes now: the origins of its
        arguments that are still unstored lazy values (inlined into whatever reads
        them), then the node itself."""
        node = self.current_node
        if node is None:
            return ()
        found: dict[str, None] = {}
        for arg in node.all_input_nodes:
            for value in _lazy_values(self.env.get(arg)):
                if value.realized is None:
                    found.update(dict.fromkeys(value.origins))
        if node.op == "call_function":  # not the graph's output node: it computes nothing
            found[node.name] = None
        return tuple(found)

    # -- node kinds ---------------------------------------------------------------

    def _lower_placeholder(self, node: torch.fx.Node) -> Any:
        val = node.meta.get("val")
        name = _identifier(node.name)
        entry: InputNode
        if isinstance(val, torch.Tensor):
            # the example's storage offset is no promise about later calls' inputs
            entry = InputBuffer(name, Layout.of(val).runtime_offset(name))
            self._input_storages[name] = storage_key(val)
            self.layouts[name] = entry.layout
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
        self.layouts[const.name] = const.layout
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
        if node.target is torch.ops.higher_order.with_effects:
            return self._lower_with_effects(node)
        if not isinstance(node.target, torch._ops.OpOverload):
            raise LoweringError(
                node.name,
                str(node.target),
                "only ATen operator overloads can be lowered; trace the graph at the ATen "
                "level (AOTAutograd, torch.export or make_fx) first",
            )
        if val is _MISSING and node.target._schema.returns:
            raise LoweringError(
                node.name,
                str(node.target),
                "node has no meta['val']; run FakeTensorProp or trace with make_fx first",
            )
        declined = ""
        moves = _moves_between_devices(node)
        if self.options.loops and not moves:
            lowering = LOWERINGS.get(node.target) or inplace_lowering(node.target)
            if lowering is not None and not _has_complex(node):
                try:
                    result = lowering(self, node)
                    self._check_renderable(result)
                    return self._maybe_realize(node, result)
                except NotLowerable as why:
                    declined = f" (its lowering declined: {why})"
        intentional = (
            moves or node.target.overloadpacket in INTENTIONAL_EXTERNS or _has_complex(node)
        )
        if not intentional:
            op_name = str(node.target)
            if not self.options.allow_fallback:
                raise LoweringError(
                    node.name,
                    op_name,
                    f"no lowering for this op{declined} and fallbacks are disabled "
                    "(EMBER_FALLBACK=0); enable fallbacks or add a lowering to "
                    "ember.ir.lowering.LOWERINGS",
                )
            self.program.fallback_ops.add(op_name)
            if op_name not in _fallbacks_logged:
                _fallbacks_logged.add(op_name)
                log.info("no lowering for %s: falling back to the ATen kernel", op_name)
        return self._extern(node, fallback=not intentional)

    def intentional_extern(self, node: torch.fx.Node, reason: str) -> Any:
        """Keep `node` an ATen call on purpose, from inside its lowering (a case the
        codegens do not cover by design, such as a sort longer than a GPU block): not a
        fallback, so allowed under EMBER_FALLBACK=0; `reason` is logged once."""
        message = f"{node.target} stays an ATen call: {reason}"
        if message not in _fallbacks_logged:
            _fallbacks_logged.add(message)
            log.info("%s", message)
        return self._extern(node)

    def _lower_with_effects(self, node: torch.fx.Node) -> tuple[Any, ...]:
        """`with_effects(token, op, *args)`: AOTAutograd threads an effect token through
        ops registered as effectful (the error checks of linalg ops). The op becomes an
        extern call (no op with effects has a lowering; intentional for the ops of
        INTENTIONAL_EXTERNS, such as `_linalg_check_errors`, a fallback otherwise), kept
        in graph order like every extern, and the token passes through: (token, *op's
        results)."""
        token, op, *args = node.args
        if not isinstance(op, torch._ops.OpOverload):
            raise LoweringError(node.name, str(op), "with_effects around a non-ATen op")
        op_name = str(op)
        intentional = op.overloadpacket in INTENTIONAL_EXTERNS
        if not intentional and not self.options.allow_fallback:
            raise LoweringError(
                node.name, op_name, "an op with effects has no lowering and fallbacks are "
                "disabled (EMBER_FALLBACK=0); enable fallbacks to call it as an ATen op",
            )  # fmt: skip
        if not intentional:
            self.program.fallback_ops.add(op_name)
        if op_name not in _fallbacks_logged:
            _fallbacks_logged.add(op_name)
            log.info("%s has effects: calling the ATen op", op_name)
        val = node.meta.get("val")
        results = list(val[1:]) if isinstance(val, (tuple, list)) else []
        outputs = tuple(Layout.of(v) if isinstance(v, torch.Tensor) else None for v in results)
        if len(outputs) > 1:
            raise LoweringError(node.name, op_name, "with_effects around a multi-output op")
        kernel = ExternKernel(
            name=self._new_name("buf"),
            op=op,
            args=tuple(self._extern_arg(a) for a in args),
            kwargs=tuple((k, self._extern_arg(v)) for k, v in node.kwargs.items()),
            outputs=outputs,
            origin=node.name,
            fallback=not intentional,
        )
        self.add(kernel)
        if outputs and outputs[0] is not None:
            self.layouts[kernel.name] = outputs[0]
        token_value = self._convert(token)
        return (token_value, BufferRef(kernel.name)) if outputs else (token_value,)

    def _check_renderable(self, result: Any) -> None:
        if not self.options.unsupported_ops:
            return
        values = result if isinstance(result, tuple) else (result,)
        for value in values:
            if isinstance(value, LazyTensor):
                for item in walk(value.body()):
                    if isinstance(item, Op) and item.name in self.options.unsupported_ops:
                        raise NotLowerable(f"the code generator has no {item.name!r}")

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
        self.program.outputs = [self._output(r) for r in flat]
        return None

    def _output(self, arg: Any) -> Any:
        """A graph output, stored with the strides its FX metadata promises.

        AOTAutograd compiles the backward against the forward's fake outputs, and users
        see output strides: a saved `w.t()` must come back with the transposed strides,
        not as a contiguous copy. Dense (permuted) and gapped strides (a select or strided
        slice of an intermediate: eager returns a view of the whole) are honoured, the
        buffer spanning the gaps unwritten (at storage offset 0); overlapping ones
        (expand) get a contiguous buffer."""
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if self.options.loops and isinstance(arg, torch.fx.Node) and isinstance(val, torch.Tensor):
            lazy = self.env[arg]
            wanted = Layout.of(val)
            if isinstance(lazy, LazyTensor) and lazy.realized is None:
                # A reshape or transpose of an intermediate buffer is returned as a view
                # of it (eager returns a view too); views of graph inputs are copied,
                # unless the graph's output is a view of that input too: AOTAutograd
                # then rebuilds the user's view from the input with this output's
                # storage offset (torch 2.11 does), which a copy at offset 0 would lose.
                body = lazy.body()
                inputs = {n.name for n in self.program.inputs}
                if isinstance(body, Load) and (
                    body.buffer not in inputs or self._aliases(val, body.buffer)
                ):
                    view = self._strided_view(lazy)
                    if view is not None and _same_strides(self.layouts[view.name], wanted):
                        return view
            if (
                isinstance(lazy, LazyTensor)
                and lazy.realized is None
                and lazy.size == wanted.size
                and non_overlapping(wanted)
                and self.whole_buffer(lazy) is None
            ):
                layout = Layout(wanted.device, wanted.dtype, wanted.size, wanted.stride)
                lazy.realized = self.store(Pointwise(lazy.size, lazy.body()), layout)
                return lazy.realized
        value = self._convert(arg, copy_inputs=True)
        if isinstance(value, BufferRef) and value.name in self._views and not _is_view_op(arg):
            # A view ember made for an extern argument: eager returns a fresh tensor
            # here, and an output must not alias storage the user does not expect.
            have = self.layouts[value.name]
            return self._copy(value.name, Layout.contiguous(have.device, have.dtype, have.size))
        if (
            not self.options.loops
            or not isinstance(value, BufferRef)
            or not isinstance(val, torch.Tensor)
        ):
            return value
        wanted = Layout.of(val)
        current = self.layouts.get(value.name)
        if current is None or not non_overlapping(wanted) or _same_strides(current, wanted):
            return value
        return self._copy(
            value.name, Layout(wanted.device, wanted.dtype, wanted.size, wanted.stride)
        )

    def _copy(self, name: str, layout: Layout) -> BufferRef:
        """A new buffer holding the values of buffer `name`, stored with `layout`."""
        source = self.layouts[name]
        load = buffer_loader(name, source)
        return self.store(Pointwise(source.size, load(loop_vars(source.ndim))), layout)

    # -- helpers --------------------------------------------------------------------

    def _lower_getitem(self, node: torch.fx.Node) -> Any:
        source = node.args[0]
        assert isinstance(source, torch.fx.Node)
        index = node.args[1]
        parent = self.env[source]
        if isinstance(parent, (tuple, list)):
            return self._maybe_realize(node, parent[index])  # type: ignore[index]  # index is an int from the graph
        if not isinstance(parent, BufferRef):
            raise LoweringError(node.name, "getitem", f"cannot index {type(parent).__name__}")
        val = node.meta.get("val")
        layout = Layout.of(val) if isinstance(val, torch.Tensor) else None
        out = MultiOutput(self._new_name("buf"), parent.name, int_arg(index), layout)
        self.program.nodes.append(out)
        if layout is not None:
            self.layouts[out.name] = layout
        return BufferRef(out.name)

    def _extern(
        self, node: torch.fx.Node, *, symbol: sympy.Symbol | None = None, fallback: bool = False
    ) -> Any:
        assert isinstance(node.target, torch._ops.OpOverload)
        if self.options.loops:
            self._check_extern_mutation(node)
        val = node.meta.get("val")
        multi = isinstance(val, (tuple, list))
        vals = list(val) if multi else [val]  # type: ignore[arg-type]  # checked just above
        outputs = tuple(Layout.of(v) if isinstance(v, torch.Tensor) else None for v in vals)
        kernel = ExternKernel(
            name=self._new_name("buf"),
            op=node.target,
            args=tuple(self._extern_arg(a, node.target) for a in node.args),
            kwargs=tuple((k, self._extern_arg(v, node.target)) for k, v in node.kwargs.items()),
            outputs=outputs,
            multi=multi,
            symbol=symbol,
            origin=node.name,
            fallback=fallback,
        )
        self.add(kernel)
        for layout in outputs if not multi else ():
            if layout is not None:
                self.layouts[kernel.name] = layout
        if symbol is not None:
            self._bound_symbols.add(symbol)
            return symbol
        return BufferRef(kernel.name)

    def _extern_arg(self, arg: Any, op: Any = None) -> Any:
        """An extern's argument: a lazy value that only reads a stored buffer through an
        affine index (a transpose, slice, expand...) is passed as a strided view of that
        buffer instead of being copied: ATen kernels take any strides (matmul reads a
        transposed weight directly), and every Linear layer would otherwise copy its
        weight on every call. A view of a computed value is passed the same way over
        that value once it is stored (`_view_of_source`). Arguments the op writes are
        never views (see `_check_extern_mutation`)."""
        if isinstance(arg, (list, tuple)):
            return tuple(self._extern_arg(a, op) for a in arg)
        if isinstance(arg, torch.fx.Node) and self.options.loops:
            value = self.env[arg]
            if isinstance(value, LazyTensor) and value.realized is None:
                view = self._strided_view(value)
                if view is None:
                    view = self._view_of_source(value, op)
                if view is not None:
                    return view
        return self._convert(arg)

    def _view_of_source(self, value: LazyTensor, op: Any) -> BufferRef | None:
        """`value`, a view (or chain of views) of a computed value, passed as a strided
        view of that value's buffer: of the nearest one already stored, or, for a
        matrix product (which reads either operand transposed at no cost), of the
        chain's source, stored now when the views read all of it (a permute or a
        reshape, not a slice). A backward's matmuls read one gradient both as it is
        and transposed (T5's attention: `clone -> view -> mm` and `permute -> mm`);
        storing each view on its own made two copies of the same cast."""
        maps: list[Callable[[Index], Sequence[sympy.Expr]]] = []
        source = value
        while source.realized is None and source.view_source is not None:
            assert source.view_map is not None
            maps.append(source.view_map)
            source = source.view_source
        if source is value:
            return None
        if source.realized is None:
            if op not in _TRANSPOSING_PRODUCTS or not _same_numel(value, source):
                return None
            trial = Layout.contiguous(source.device, source.dtype, source.size)
            if source.stride_hint is not None:
                trial = Layout(source.device, source.dtype, source.size, source.stride_hint)
            if _affine_view(_through(value, maps, "__source__", trial)) is None:
                return None  # a reshape that splits a dimension unevenly: store the view
            self.realize(source)
        assert source.realized is not None
        name = self.current(source.realized).name
        layout = self.layouts.get(name)
        if layout is None:
            return None
        view = self._strided_view(_through(value, maps, name, layout))
        if view is not None:
            value.realized = view
        return view

    def _aliases(self, value: torch.Tensor, name: str) -> bool:
        """Whether the graph value `value` lives in the storage of input `name`."""
        storage = storage_key(value)
        return storage is not None and self._input_storages.get(name) == storage

    def _strided_view(self, value: LazyTensor) -> BufferRef | None:
        found = _affine_view(value)
        if found is None:
            return None
        buffer, strides, offset = found
        layout = self.layouts.get(buffer)
        if layout is None or layout.dtype != value.dtype:
            return None
        if any(c.is_number and c < 0 for c in (*strides, offset)):
            return None
        if value.stride_hint is not None and tuple(strides) != tuple(value.stride_hint):
            return None  # asked for another layout (a channels-last clone): store it so
        view = ExternKernel(
            name=self._new_name("buf"),
            op=torch.ops.aten.as_strided.default,
            args=(BufferRef(buffer), tuple(value.size), tuple(strides), offset),
            kwargs=(),
            outputs=(Layout(value.device, value.dtype, tuple(value.size), tuple(strides), offset),),
            origin=self.current_node.name if self.current_node is not None else "",
        )
        self.add(view)
        self.layouts[view.name] = view.outputs[0]  # type: ignore[assignment]  # a tensor result
        self._views.add(view.name)
        value.realized = BufferRef(view.name)
        return value.realized

    def add(self, node: ComputeNode) -> None:
        self.program.nodes.append(node)

    def _convert(self, arg: Any, *, copy_inputs: bool = False) -> Any:
        """An FX argument as an IR argument tree (lazy tensors realized)."""
        if isinstance(arg, torch.fx.Node):
            return self._realize_tree(self.env[arg], copy_inputs)
        if isinstance(arg, (list, tuple)):
            return tuple(self._convert(a, copy_inputs=copy_inputs) for a in arg)
        if isinstance(arg, dict):
            return {k: self._convert(v, copy_inputs=copy_inputs) for k, v in arg.items()}
        if isinstance(arg, _SYM_TYPES):
            return as_expr(arg)
        return arg

    def _new_name(self, prefix: str) -> str:
        name = f"{prefix}{self._counter}"
        self._counter += 1
        return name

    # -- loop mode: values, realization, mutation -------------------------------

    def tensor(self, arg: Any) -> LazyTensor:
        """The tensor value of an FX argument as a LazyTensor (buffers read through
        their layout). Raises NotLowerable for anything that is not a tensor."""
        value = self.env[arg] if isinstance(arg, torch.fx.Node) else arg
        if isinstance(value, LazyTensor):
            if value.realized is None:
                return value
            value = value.realized
        if isinstance(value, BufferRef):
            name = self.current(value).name
            layout = self.layouts.get(name)
            if layout is None:
                raise NotLowerable(f"{name} is not a tensor buffer")
            return LazyTensor(layout.device, layout.dtype, layout.size, buffer_loader(name, layout))
        raise NotLowerable(f"expected a tensor, got {type(value).__name__}")

    def current(self, ref: BufferRef) -> BufferRef:
        name = ref.name
        while name in self.versions:
            name = self.versions[name]
        return ref if name == ref.name else BufferRef(name)

    def realize(self, value: Any, *, copy_inputs: bool = False) -> BufferRef:
        """Store a LazyTensor in a ComputedBuffer (a BufferRef is returned as is).

        A value that is a plain read of a whole buffer is that buffer, unless
        `copy_inputs` asks for a fresh one (graph outputs must not alias inputs the
        graph does not return as such)."""
        if isinstance(value, BufferRef):
            return self.current(value)
        if not isinstance(value, LazyTensor):
            raise NotLowerable(f"cannot realize {type(value).__name__}")
        if value.realized is not None:
            return value.realized
        whole = self.whole_buffer(value)
        if whole is not None and not (
            copy_inputs and any(n.name == whole for n in self.program.inputs)
        ):
            value.realized, value.borrowed = BufferRef(whole), True
            return value.realized
        layout = Layout.contiguous(value.device, value.dtype, value.size)
        if value.stride_hint is not None:
            layout = Layout(value.device, value.dtype, value.size, value.stride_hint)
        loop = Pointwise(value.size, value.body())
        value.realized = self.store(loop, layout, origins=value.origins or None)
        return value.realized

    def node_layout(
        self, device: torch.device, dtype: torch.dtype, size: tuple[sympy.Expr, ...]
    ) -> Layout:
        """The layout to store a value of the current node in: channels-last when eager
        would make it so (the node's first tensor value of this size is channels-last:
        pooling a channels-last input), else contiguous."""
        node = self.current_node
        val = node.meta.get("val") if node is not None else None
        for item in val if isinstance(val, (tuple, list)) else [val]:
            if isinstance(item, torch.Tensor) and _channels_last(item):
                layout = Layout.of(item)
                if layout.size == tuple(size):
                    return Layout(device, dtype, layout.size, layout.stride)
        return Layout.contiguous(device, dtype, size)

    def whole_buffer(self, value: LazyTensor) -> str | None:
        """The buffer `value` reads exactly as it is stored (same sizes, strides and
        dtype), if any: storing `value` again would be a copy."""
        body = value.body()
        if not isinstance(body, Load) or body.mask is not None or body.indirect:
            return None
        layout = self.layouts.get(body.buffer)
        if layout is None or layout.size != value.size or layout.dtype != value.dtype:
            return None
        if value.stride_hint is not None and tuple(layout.stride) != tuple(value.stride_hint):
            return None  # a copy into another layout (a channels-last clone)
        expected = buffer_loader(body.buffer, layout)(loop_vars(value.ndim))
        return body.buffer if isinstance(expected, Load) and expected.index == body.index else None

    def store(
        self,
        loop: Loop,
        layout: Layout,
        *,
        mutates: str | None = None,
        origins: tuple[str, ...] | None = None,
    ) -> BufferRef:
        """Add a ComputedBuffer for `loop` and return a reference to it. `origins`: the
        FX nodes its body computes (default: the current node and the unstored lazy
        values it reads, `origins_here`)."""
        if mutates is not None:
            snapshot_readers(self, mutates)
        name = self._new_name("buf")
        if origins is None:
            origins = self.origins_here()
        origin = origins[-1] if origins else ""
        self.add(ComputedBuffer(name, layout, loop, mutates, origin, origins))
        self.layouts[name] = layout
        if mutates is not None:
            self.versions[mutates] = name
        return BufferRef(name)

    def mutate(self, target: Any, value: LazyTensor) -> Any:
        """Write `value` into the buffer behind `target` in place (ember.ir.mutation)."""
        return mutate(self, target, value)

    def seed_buffer(self) -> str:
        """The name of the program's random seed (created on first use)."""
        if self.program.rng_seed is None:
            self.program.rng_seed = "rng_seed"
            self.layouts["rng_seed"] = Layout(torch.device("cpu"), torch.int64, (), ())
        return self.program.rng_seed

    def rng_offset(self, count: sympy.Expr) -> sympy.Expr:
        """Reserve `count` numbers of the program's random stream; return the first."""
        start = self._rng_offset
        self._rng_offset = simplify_index(start + count)
        return start

    def _maybe_realize(self, node: torch.fx.Node, result: Any, val: Any = None) -> Any:
        if val is None:
            val = node.meta.get("val")
        if isinstance(result, tuple):
            vals = val if isinstance(val, (tuple, list)) and len(val) == len(result) else ()
            return tuple(
                self._maybe_realize(node, r, vals[k] if vals else ()) for k, r in enumerate(result)
            )
        if not isinstance(result, LazyTensor) or result.realized is not None:
            return result
        return self.read_by(result, len(node.users), val)

    def read_by(self, value: LazyTensor, readers: int, like: Any = None) -> LazyTensor:
        """`value`, stored if a value that `readers` loops read should be, by the rule
        every node's result follows (its readers are then the node's users).

        For a lowering that reads one lazy value in several loops of its own: a batch
        norm's backward reads its incoming gradient in two reductions and a pointwise
        pass, as the three users it had when the op was decomposed. `like` (the value's
        fake tensor, or one of its size and strides) makes a channels-last value stored
        channels-last."""
        if value.realized is not None:
            return value
        if isinstance(like, torch.Tensor) and _channels_last(like):
            # Eager keeps channels-last values channels-last (convolutions pick their
            # kernels by it): when this one is stored, it is stored that way too.
            layout = Layout.of(like)
            if layout.size == value.size:
                value.stride_hint = layout.stride
        if any(may_divide_by_zero(n) for n in walk(value.body())):
            # Eager divides every element, so it raises for a zero divisor wherever it
            # sits; a lazy value is computed only where read (`(a // b)[0]`), and would
            # miss it. Stored, every element is computed and checked.
            self.realize(value)
            return value
        cost = value.cost()
        shared = readers > 1
        if cost > self.options.max_inline_cost or (
            shared
            and (
                cost > self.options.realize_cost
                or value.buffers_read() > self.options.realize_reads
            )
            and not self._cheaper_to_recompute(value, cost)
        ):
            self.realize(value)
        return value

    def _cheaper_to_recompute(self, value: LazyTensor, cost: int) -> bool:
        """Whether every reader should recompute `value` instead of one kernel storing
        it: a cheap body, reading buffers of the value's size and otherwise only
        buffers at most 1/16 of it (per-row statistics, per-channel parameters), whose
        full-size inputs take fewer bytes per element than the value. Storing such a
        value moves more bytes than recomputing it for any number of readers (written
        once, read back by each, against each reader reading the narrower inputs).

        The case it is for: a batch norm's backward stores the float32 ReLU gradient
        `where(mask, 0, dy)` (3 bytes of inputs, 4 of value) and the centred input
        `x - mean` (2 against 4), then reads them back in three kernels; recomputed,
        resnet50's backward graph moves 10.7 GB instead of 18.4 (traffic_report.py),
        and its training step took 29.6 ms instead of 32.2 (H100 machine, both in one
        process, benchmarks/ab_knob.py), cnn_block's 2.35 instead of 2.59.

        Values no wider than their inputs stay stored, even where recomputing would
        move fewer bytes: a softmax read by a column reduction and a later sum
        (softmax_chain) took 1.75 ms instead of 1.41 recomputed, layernorm_chain's
        training step 11.2 instead of 10.4. A residual sum stays stored too (kept
        lazy, every later reader would re-read all the earlier addends), and so do
        bodies drawing random numbers. Recomputing values exactly as wide as two or
        more full-size inputs (a float32 `where(out <= 0, 0, dy)` over bfloat16 `out`
        and `dy`) cut the backward graphs' bytes (mobilenetv3 2.48 -> 1.87 GB,
        layernorm_chain 12.9 -> 8.3) but not their steps: mobilenetv3, layernorm_chain,
        cnn_block, transformer_block, bert and resnet50 training moved by -1.4% to +2.9%
        (H200, one process per model, 2026-11-24), so the rule stays strict."""
        if not self.options.recompute_shared or cost > self.options.recompute_cost:
            return False
        body = value.body()
        if any(isinstance(n, Rand) for n in walk(body)):
            return False
        numel = sympy.Mul(*value.size)
        large: list[Layout] = []
        for name in {n.buffer for n in walk(body) if isinstance(n, Load)}:
            layout = self.layouts.get(name)
            if layout is None:
                return False
            size = layout.numel()
            if sympy.simplify(size - numel) == 0:
                large.append(layout)
            elif not (size.is_number and numel.is_number and 16 * int(size) <= int(numel)):
                return False
        return bool(large) and sum(x.dtype.itemsize for x in large) < value.dtype.itemsize

    def _realize_tree(self, value: Any, copy_inputs: bool) -> Any:
        if isinstance(value, LazyTensor):
            return self.realize(value, copy_inputs=copy_inputs)
        if isinstance(value, BufferRef):
            return self.current(value)
        if isinstance(value, tuple):
            return tuple(self._realize_tree(v, copy_inputs) for v in value)
        return value

    def _check_extern_mutation(self, node: torch.fx.Node) -> None:
        """An extern that writes an argument must get the real buffer, not a copy; the
        pending lazy values that read that buffer are stored first, as they hold its
        value from before the write (unstored, their readers after the extern would
        read the written data: a shared value recomputed by its readers, or a value
        with one reader, as `renorm_` in a graph that is not functionalized).

        Written arguments are found by schema, positional or keyword (`out=`), alone
        or in a list (`_foreach_add_`). A written view of a stored buffer (`x[:, :3]`
        in `x[:, :3].addmm_(...)`) is passed as a strided alias of that buffer, whose
        pending readers are stored first too; views of `x` taken before the write
        stay aliases (their later readers see the new data, as in eager). A written
        view ember cannot pass as an alias of a stored buffer is refused."""
        for written in _written_arguments(node):
            current = self.env[written]
            if isinstance(current, BufferRef):
                snapshot_readers(self, self.current(current).name, keep_aliases=True)
                continue
            if not isinstance(current, LazyTensor):
                continue
            base = self._alias_for_extern(written, current)
            if base is not None:
                snapshot_readers(self, base, keep_aliases=True)
            elif _is_view_op(written):
                raise LoweringError(
                    node.name,
                    str(node.target),
                    f"the op writes {written.name!r}, a view ember cannot pass as an alias "
                    "of a stored buffer (a view of a computed value, or of a copy); "
                    "functionalize the graph first (AOTAutograd and torch.export do)",
                )
            elif len(written.users) > 1:
                # a written lazy value read by nobody else may be passed as a stored copy
                raise LoweringError(
                    node.name,
                    str(node.target),
                    "the op writes an argument that is a view or an unstored value; "
                    "functionalize the graph first (AOTAutograd and torch.export do)",
                )

    def _alias_for_extern(self, written: torch.fx.Node, value: LazyTensor) -> str | None:
        """The stored buffer that the view `value` (computed by `written`) aliases, once
        it is passed to an extern as a strided view of that buffer; None when it
        cannot be (not a view of a stored buffer, or already stored as a copy)."""
        base = aliased_buffer(written, value)
        if base is None:
            return None
        if value.realized is None:
            if self._strided_view(value) is None:
                return None
        elif not value.borrowed and value.realized.name not in self._views:
            return None
        return self.current(BufferRef(base)).name

    def args(self, node: torch.fx.Node) -> dict[str, Any]:
        """The node's arguments by schema name, defaults filled in."""
        assert isinstance(node.target, torch._ops.OpOverload)
        bound: dict[str, Any] = {}
        for i, arg in enumerate(node.target._schema.arguments):
            if i < len(node.args) and not arg.kwarg_only:
                bound[arg.name] = node.args[i]
            elif arg.name in node.kwargs:
                bound[arg.name] = node.kwargs[arg.name]
            else:
                bound[arg.name] = arg.default_value if arg.has_default_value() else None
        return bound

    def out_val(self, node: torch.fx.Node) -> torch.Tensor:
        val = node.meta["val"]
        if not isinstance(val, torch.Tensor):
            raise NotLowerable("the result is not a single tensor")
        return val

    def out_size(self, node: torch.fx.Node) -> tuple[sympy.Expr, ...]:
        return tuple(as_expr(s) for s in self.out_val(node).shape)


def arg_val(arg: Any) -> Any:
    """The example value (fake tensor) of a node argument, None for anything else."""
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None


def int_arg(value: Any) -> int:
    """An integer argument of an FX node (FX types them as any argument)."""
    return int(value)


def list_arg(value: Any) -> list[Any]:
    """A list argument of an FX node."""
    return list(value)


_COPIES = frozenset({"_to_copy", "copy", "copy_", "to", "_copy_from", "_copy_from_and_resize"})


def _moves_between_devices(node: torch.fx.Node) -> bool:
    """Whether `node` copies data from one device to another (`x.cpu()`, `x.cuda()`,
    a `copy_` across devices): an ATen call on purpose, never a fused kernel, which
    would read one device's memory from the other's code (a C++ kernel reading a
    CUDA pointer crashed the process)."""
    packet = getattr(node.target, "overloadpacket", None)
    if packet is None or packet.__name__ not in _COPIES:
        return False
    devices = {
        v.device
        for v in [node.meta.get("val"), *(a.meta.get("val") for a in node.all_input_nodes)]
        if isinstance(v, torch.Tensor)
    }
    return len(devices) > 1


def _has_complex(node: torch.fx.Node) -> bool:
    vals = [node.meta.get("val")]
    vals += [a.meta.get("val") for a in node.all_input_nodes]
    flat: list[Any] = []
    for v in vals:
        flat.extend(v if isinstance(v, (tuple, list)) else [v])
    return any(isinstance(v, torch.Tensor) and v.is_complex() for v in flat)


_MISSING = object()


# Names the generated code uses for itself: inputs must not shadow them.
_RESERVED = frozenset({"args", "call", "torch", "math"})


def _written_arguments(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The FX nodes whose tensors the ATen op of `node` writes in place, by its schema:
    positional or keyword arguments (`out=`), alone or in lists (`Tensor(a!)[]`)."""
    assert isinstance(node.target, torch._ops.OpOverload)
    schema = node.target._schema.arguments
    values = [(arg, value) for arg, value in zip(schema, node.args, strict=False)]
    by_name = {arg.name: arg for arg in schema}
    values += [(by_name[k], v) for k, v in node.kwargs.items() if k in by_name]
    written: list[torch.fx.Node] = []
    for arg, value in values:
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        written += [item for item in items if isinstance(item, torch.fx.Node)]
    return written


def _is_view_op(arg: Any) -> bool:
    """The FX node's op returns an alias of its input (so eager's output is a view)."""
    target = getattr(arg, "target", None)
    return isinstance(target, torch._ops.OpOverload) and returns_view(target)


def non_overlapping(layout: Layout) -> bool:
    """No two indices share a storage element (dense, or with gaps): strides a kernel
    can store to in a fresh `empty_strided` buffer. Proven for all sizes: each stride,
    smallest first, reaches past the farthest element the smaller dimensions reach,
    either exactly (each floor division as an opaque positive integer) or against an
    upper bound (a // b <= a / b, for slices like [::2] of a symbolic size). The
    dimensions are tried in the order of their strides at the size guess
    (`symbolic.size_hint`): the proof holds for whatever order it succeeds in, so a
    guess that orders them wrongly fails it (a copy), never passes a wrong one."""
    dims = sorted(
        ((st, sz) for st, sz in zip(layout.stride, layout.size, strict=True) if sz != 1),
        key=lambda pair: size_hint(pair[0]),
    )
    divisions = sorted(
        {e for st, sz in dims for e in (st, sz) for e in sympy.preorder_traversal(e)
         if isinstance(e, FloorDiv)}, key=str,
    )  # fmt: skip
    opaque = {
        d: sympy.Symbol(f"q{k}", integer=True, positive=True) for k, d in enumerate(divisions)
    }

    def upper(e: sympy.Expr) -> sympy.Expr:
        return e.replace(lambda x: isinstance(x, FloorDiv), lambda x: x.args[0] / x.args[1])

    def proven(difference: sympy.Expr) -> bool:
        return sympy.factor(sympy.expand(difference)).is_nonnegative is True  # t*(s - 1)

    exact: sympy.Expr = sympy.Integer(1)  # past the farthest element the smaller dims reach
    bound: sympy.Expr = sympy.Integer(1)  # an upper bound of it
    for stride, size in dims:
        if not (proven((stride - exact).xreplace(opaque)) or proven(stride - bound)):
            return False
        exact = sympy.expand(exact + (size - 1) * stride)
        bound = sympy.expand(bound + (upper(size) - 1) * stride)
    return True


def _same_strides(a: Layout, b: Layout) -> bool:
    return a.size == b.size and all(
        sympy.expand(x - y) == 0
        for x, y, n in zip(a.stride, b.stride, a.size, strict=True)
        if n != 1
    )


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


def _channels_last(val: torch.Tensor) -> bool:
    """A 4-D tensor value stored channels-last (and not also plain contiguous)."""
    return (
        val.dim() == 4
        and val.is_contiguous(memory_format=torch.channels_last)
        and not val.is_contiguous()
    )


def _lazy_values(tree: Any) -> list[LazyTensor]:
    """The lazy tensors in a lowered value (a tuple tree of values)."""
    if isinstance(tree, LazyTensor):
        return [tree]
    if isinstance(tree, (tuple, list)):
        return [v for item in tree for v in _lazy_values(item)]
    return []


# Extern ops that read an operand through any two strides without a copy (cuBLAS
# takes either operand transposed): `_view_of_source` may store a view's source for them.
_TRANSPOSING_PRODUCTS = frozenset(
    {
        torch.ops.aten.mm.default,
        torch.ops.aten.bmm.default,
        torch.ops.aten.addmm.default,
        torch.ops.aten.baddbmm.default,
    }
)


def _same_numel(a: LazyTensor, b: LazyTensor) -> bool:
    return bool(sympy.expand(product(a.size) - product(b.size)) == 0)


def _through(
    value: LazyTensor,
    maps: Sequence[Callable[[Index], Sequence[sympy.Expr]]],
    buffer: str,
    layout: Layout,
) -> LazyTensor:
    """`value` read from `buffer` (laid out as `layout`) through the view maps that
    lead from `value` to the value stored there."""
    load = buffer_loader(buffer, layout)

    def loader(index: Index) -> Node:
        for index_map in maps:
            index = index_map(index)
        return load(index)

    return LazyTensor(value.device, value.dtype, value.size, loader, stride_hint=value.stride_hint)


def _affine_view(value: LazyTensor) -> tuple[str, list[sympy.Expr], sympy.Expr] | None:
    """(buffer, strides, offset) where `value` reads one buffer at an affine index of
    its loop variables, else None."""
    body = value.body()
    if not isinstance(body, Load) or body.mask is not None or body.indirect:
        return None
    index = sympy.expand(body.index)
    variables = loop_vars(len(value.size))
    strides = [sympy.expand(sympy.diff(index, v)) for v in variables]
    offset = sympy.expand(index.xreplace(dict.fromkeys(variables, sympy.Integer(0))))
    affine = sympy.expand(
        index
        - offset
        - sum((c * v for c, v in zip(strides, variables, strict=True)), sympy.Integer(0))
    )
    if affine != 0 or any(c.free_symbols & set(variables) for c in strides):
        return None
    return body.buffer, strides, offset
