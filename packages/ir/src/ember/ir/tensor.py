"""Unrealized tensor values during lowering.

While lowering walks the graph with `loops=True`, a tensor value is either a named
buffer (`BufferRef`: an input, a constant, an extern result, a computed buffer) or a
`LazyTensor`: sizes plus a *loader*, a function from an index (one sympy expression per
dimension) to the body node computing that element. Lowering a pointwise op or a view
composes loaders, so chains of them inline into one body; realizing a value
(ember.ir.lowering.GraphLowering.realize) calls the loader once with the loop variables
and stores the resulting explicit DAG in a `ComputedBuffer`. The loader closures never
leave lowering: the IR holds only the DAGs they build.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import sympy
import torch

from ember.ir.expr import Cast, Const, IndexExpr, Load, Node, Scalar, walk
from ember.ir.layout import Layout
from ember.ir.nodes import BufferRef
from ember.ir.symbolic import loop_vars, simplify_index

Index = Sequence[sympy.Expr]
Loader = Callable[[Index], Node]


@dataclass(eq=False)
class LazyTensor:
    """A tensor value not stored anywhere yet: sizes and how to compute an element."""

    device: torch.device
    dtype: torch.dtype
    size: tuple[sympy.Expr, ...]
    loader: Loader
    realized: BufferRef | None = None
    # True when `realized` is a buffer the value merely reads whole (no copy was made)
    borrowed: bool = False
    # Strides to store the value with when it is realized, instead of contiguous ones:
    # set for channels-last values of the graph (see GraphLowering._maybe_realize).
    stride_hint: tuple[sympy.Expr, ...] | None = None
    # The FX nodes whose computation the body holds, in graph order (provenance: set
    # by GraphLowering once the node that made the value is lowered).
    origins: tuple[str, ...] = ()
    # For a view (ember.ir.views.view_of): the value it reads and the map from its
    # index to that value's index. Lowering uses them to pass an extern a strided view
    # of the source once the source is stored, instead of storing a second copy.
    view_source: LazyTensor | None = field(default=None, repr=False)
    view_map: Callable[[Index], Sequence[sympy.Expr]] | None = field(default=None, repr=False)
    _body: Node | None = field(default=None, repr=False)
    _buffers: frozenset[str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # A consumer of the same shape reads this value at its own loop variables, the
        # index the body is built at: it gets the body built once instead of a rebuild.
        # Without this, checking each value's body as it was lowered rebuilt every
        # chain of pointwise ops once per link (convnext_tiny: 1246 body builds for 543
        # nodes, 0.28 of lowering's 0.39 s).
        build, own = self.loader, loop_vars(len(self.size))

        def load(index: Index) -> Node:
            if self._body is not None and tuple(index) == own:
                return self._body
            return build(index)

        self.loader = load

    @property
    def ndim(self) -> int:
        return len(self.size)

    def body(self) -> Node:
        """The body over the loop variables `i0..` (computed once)."""
        if self._body is None:
            self._body = self.loader(loop_vars(len(self.size)))
        return self._body

    def cost(self) -> int:
        """How much work recomputing one element costs (ops, random draws, loads)."""
        return sum(0 if isinstance(n, (Const, IndexExpr, Cast)) else 1 for n in walk(self.body()))

    def buffers(self) -> frozenset[str]:
        """The names of the buffers computing one element loads from (computed once,
        like the body they come from: a body never changes). Lowering asks this of
        every pending value at each in-place write (ember.ir.mutation), so walking the
        body each time made training graphs with many writes quadratic."""
        if self._buffers is None:
            self._buffers = frozenset(n.buffer for n in walk(self.body()) if isinstance(n, Load))
        return self._buffers

    def buffers_read(self) -> int:
        """How many distinct buffers computing one element loads from."""
        return len(self.buffers())


def buffer_loader(name: str, layout: Layout) -> Loader:
    """The loader reading a stored buffer through its layout."""

    def load(index: Index) -> Node:
        offset = layout.offset
        for i, stride in zip(index, layout.stride, strict=True):
            offset = offset + i * stride
        return Load(name, simplify_index(sympy.sympify(offset)), layout.dtype)

    return load


def cast(node: Node, dtype: torch.dtype) -> Node:
    """`node` as `dtype` (no node when it already is)."""
    if node.dtype == dtype:
        return node
    if isinstance(node, Const):
        return const(node.value, dtype)
    return Cast(node, dtype)


def const(value: Scalar, dtype: torch.dtype) -> Const:
    """A constant converted the way torch converts a Python scalar to `dtype`."""
    if dtype == torch.bool:
        return Const(bool(value), dtype)
    if not dtype.is_floating_point and not dtype.is_complex:
        return Const(int(value), dtype)
    return Const(float(value), dtype)


def broadcast_loader(value: LazyTensor, out_size: tuple[sympy.Expr, ...]) -> Loader:
    """Read `value` broadcast to `out_size` (right-aligned; size-1 dims index 0)."""
    lead = len(out_size) - value.ndim
    keep = [not (s == 1 and out_size[lead + d] != 1) for d, s in enumerate(value.size)]

    def load(index: Index) -> Node:
        inner = [index[lead + d] if k else sympy.Integer(0) for d, k in enumerate(keep)]
        return value.loader(inner)

    return load
