"""Lowerings of max pooling's backward as a gather: `max_pool2d_with_indices_backward`,
`max_pool3d_with_indices_backward`, `adaptive_max_pool2d_backward` and
`adaptive_max_pool3d_backward`.

The input's gradient at a position is the sum of the output gradient over the output
positions whose window covers it and whose saved index is that position. Along each
spatial dimension the windows covering a position are few and follow from index
arithmetic, so each input element reads a fixed, small set of candidates: no scatter
and no atomics, and a deterministic sum, taken in ascending output order as eager's
CPU kernel adds (its CUDA kernel gathers the same way). The half types sum in float32
and round once, as on CUDA. Up to `UNROLL_WINDOW` candidates in all are unrolled into
pointwise code, more are a sum `Reduction` over the candidate offsets. Every division
is of a nonnegative number (a codegen's `//` may truncate), and the loads of
candidates outside the output are masked.

The saved indices are taken to lie in their windows, as the forward op leaves them.
Where they do not (indices from elsewhere; or a dilated window with no tap inside
the input, whose index eager sets past its first tap in the padding), the gradient
of that output goes nowhere, where eager's CPU kernel adds it at the index anyway.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv

from ember.ir.assemble import all_of, guard, in_range
from ember.ir.expr import IndexExpr, Node, Where
from ember.ir.loops import Reduction
from ember.ir.lowering import GraphLowering, register_lowering
from ember.ir.pointwise import op
from ember.ir.pooling import UNROLL_WINDOW, flat_position, spatial_arg
from ember.ir.reduction import acc_dtype
from ember.ir.symbolic import index_var, loop_vars
from ember.ir.tensor import Index, LazyTensor, cast, const

aten = torch.ops.aten

Candidate = tuple[sympy.Expr, list[Node]]  # (output position, when its window covers)


class _Windows:
    """Fixed windows along one spatial dimension (kernel, stride, padding, dilation):
    `count` candidate outputs per input position, the shorter of two enumerations,
    both in ascending output order. With `y = x + pad` the position among the padded
    ones and `e = (kernel - 1) * dilation` a window's extent less one:
    - by output: `o` from `ceil((y - e) / stride)`, `e // stride + 1` of them; `o`
      covers `y` where `o * stride <= y` at a multiple of the dilation;
    - by tap: `r` from `kernel - 1` down to 0, `o = (y - r * dilation) / stride`
      where the division is exact: `kernel` of them (fewer where the dilation
      exceeds the stride)."""

    def __init__(self, kernel: int, stride: int, pad: int, dilation: int, out: sympy.Expr):
        self.kernel, self.stride, self.pad, self.dilation = kernel, stride, pad, dilation
        self.out = out
        self.extent = (kernel - 1) * dilation
        by_output = self.extent // stride + 1
        self.by_tap = kernel < by_output
        self.count = kernel if self.by_tap else by_output
        # a multiple of the stride added before a division keeps its numerator >= 0
        self.lift = -(-self.extent // stride)

    def candidate(self, x: sympy.Expr, j: sympy.Expr) -> Candidate:
        """The `j`-th candidate output position for input position `x`."""
        y = x + self.pad
        s, lift = self.stride, self.lift
        zero = sympy.Integer(0)
        if self.by_tap:
            t = y - (self.kernel - 1 - j) * self.dilation  # where that window starts
            o = FloorDiv(t + s * lift, s) - lift
            exact = op("eq", IndexExpr(o * s), IndexExpr(t))
            return o, [exact, in_range(o, zero, self.out)]
        o = FloorDiv(y - self.extent + s - 1 + s * lift, s) - lift + j
        checks = [in_range(o, zero, self.out), op("le", IndexExpr(o * s), IndexExpr(y))]
        if self.dilation > 1:
            gap = y - o * s  # the tap's offset in the window, where o covers y
            whole = FloorDiv(gap, self.dilation) * self.dilation
            checks.append(op("eq", IndexExpr(whole), IndexExpr(gap)))
        return o, checks


class _AdaptiveWindows:
    """Adaptive windows along one dimension of `size` inputs and `out` outputs: output
    `o` covers `[floor(o * size / out), ceil((o + 1) * size / out))`, so input `x`
    is covered by the outputs from `floor(x * out / size)` while `o * size <
    (x + 1) * out`; `count`, the most of them for any input."""

    def __init__(self, size: int, out: int):
        self.size, self.out = size, out
        self.count = max(
            (-(-(x + 1) * out // size) - x * out // size for x in range(size)), default=1
        )

    def candidate(self, x: sympy.Expr, j: sympy.Expr) -> Candidate:
        o = FloorDiv(x * self.out, self.size) + j
        covers = op("lt", IndexExpr(o * self.size), IndexExpr((x + 1) * self.out))
        return o, [covers, op("lt", IndexExpr(o), IndexExpr(sympy.Integer(self.out)))]


Axis = _Windows | _AdaptiveWindows


@register_lowering(
    aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default
)
def lower_max_pool_backward(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    dims = 2 if node.target is aten.max_pool2d_with_indices_backward.default else 3
    a = lowering.args(node)
    kernel = spatial_arg(a["kernel_size"], dims)
    stride = spatial_arg(a["stride"], dims, kernel)
    pad, dilation = spatial_arg(a["padding"], dims), spatial_arg(a["dilation"], dims)
    out = lowering.tensor(a["grad_output"]).size[-dims:]
    axes = [
        _Windows(k, s, p, d, o)
        for k, s, p, d, o in zip(kernel, stride, pad, dilation, out, strict=True)
    ]
    return _gather(lowering, node, axes, readers=math.prod(kernel))


@register_lowering(
    aten.adaptive_max_pool2d_backward.default, aten.adaptive_max_pool3d_backward.default
)
def lower_adaptive_max_pool_backward(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    dims = 2 if node.target is aten.adaptive_max_pool2d_backward.default else 3
    grad = lowering.tensor(node.args[0])
    sizes = lowering.out_val(node).shape[-dims:]
    axes = [_AdaptiveWindows(int(n), int(m)) for n, m in zip(sizes, grad.size[-dims:], strict=True)]
    readers = math.prod(
        -(-int(n) // max(int(m), 1)) for n, m in zip(sizes, grad.size[-dims:], strict=True)
    )
    return _gather(lowering, node, axes, readers)


def _gather(
    lowering: GraphLowering, node: torch.fx.Node, axes: Sequence[Axis], readers: int
) -> LazyTensor:
    """The input gradient of `node` (arguments `grad_output` and `indices`) over the
    windows `axes` of its last len(axes) dimensions. `readers`: about how many input
    positions read each output (its window's size), which decides whether a lazy
    gradient is stored first or recomputed by each (`GraphLowering.read_by`)."""
    a = lowering.args(node)
    grad, saved = (
        lowering.read_by(lowering.tensor(a[name]), readers, a[name].meta.get("val"))
        for name in ("grad_output", "indices")
    )
    val = lowering.out_val(node)
    size = lowering.out_size(node)
    dims = len(axes)
    dtype = acc_dtype(val.dtype)

    def term(i: Index, offsets: Sequence[sympy.Expr]) -> Node:
        """What input position `i` takes from its candidate at `offsets` (0 or the
        output's gradient)."""
        found = [ax.candidate(x, j) for ax, x, j in zip(axes, i[-dims:], offsets, strict=True)]
        covers = all_of([check for _, checks in found for check in checks])
        at = [*i[:-dims], *(o for o, _ in found)]
        position = IndexExpr(flat_position(i[-dims:], size[-dims:]))
        hit = op("logical_and", covers, op("eq", guard(saved.loader(at), covers), position))
        return Where(hit, cast(guard(grad.loader(at), covers), dtype), const(0.0, dtype))

    counts = [ax.count for ax in axes]
    summed: LazyTensor
    if math.prod(counts) <= UNROLL_WINDOW:

        def total(i: Index) -> Node:
            offsets = itertools.product(*(range(n) for n in counts))
            parts = [term(i, [sympy.Integer(j) for j in js]) for js in offsets]
            acc = parts[0]
            for part in parts[1:]:
                acc = op("add", acc, part)
            return acc

        summed = LazyTensor(val.device, dtype, size, total)
    else:
        body = term(loop_vars(len(size)), [index_var("r", d) for d in range(dims)])
        window = tuple(sympy.Integer(n) for n in counts)
        layout = lowering.node_layout(val.device, dtype, size)
        summed = lowering.tensor(lowering.store(Reduction(size, window, "sum", body), layout))
    return LazyTensor(val.device, val.dtype, size, lambda i: cast(summed.loader(i), val.dtype))
