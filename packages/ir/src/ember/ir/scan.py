"""Lowerings of cumulative ops: cumsum, cumprod, logcumsumexp, cummax and cummin.

Each becomes a `Scan` (ember.ir.loops): one pass along the scanned dimension that
carries the running value, linear in its length. The input is not stored first: its
producer's body is inlined into the scan body, as for reductions.

The running value is carried in the type eager accumulates in, which depends on the
device: on the CPU float32 scans run in float64 (ATen's CPU `acc_type`), on CUDA in
float32; float16/bfloat16 run in float32 everywhere; integer and bool cumsum/cumprod
give int64. The stored result is the node's own dtype. cumsum/cumprod with `dtype=`
convert the input to that dtype first, as eager does, then accumulate.

cummax/cummin are two scans over the same input, the values and the indices, which
the scheduler runs in one kernel.

A Scan runs each row in one program, so on a GPU a long row with few beside it is
serial: cumsum of 1M float32 elements took 379 us on the H100 where eager's took 12.
On devices in `SEGMENTED_DEVICES`, a sum or product scan of such rows is split into
segments of about `SEGMENT` elements: each segment's total (a Reduction), the running
combination of the totals before each segment (a short Scan), then each segment
scanned alone (a Scan over all segments at once) starting from the totals before it.
That is three kernels when a segment length divides the row; otherwise the segments
are scanned alone and a fourth, pointwise kernel combines them with the totals.

On devices in `SINGLE_PASS_DEVICES`, such a row carried in float32 (sums, products and
logsumexps of float32, float16 and bfloat16) stays one Scan: the Triton codegen scans
it in one pass, tile by tile, each tile carried in from those before it by decoupled
look-back (ember.codegen.triton.lookback). It reads the input once where the segments
read it twice: 1M float32 elements moved 1.5x the bytes of eager's CUB scan in
segments. Integer and float64 scans keep the segments (the look-back packs a 32-bit
running value beside its status in one 64-bit word).
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv

from ember.ir.assemble import guard, in_range
from ember.ir.expr import Node, Where
from ember.ir.layout import Layout
from ember.ir.loops import Reduction, Scan
from ember.ir.lowering import GraphLowering, NotLowerable, int_arg, register_lowering
from ember.ir.pointwise import op
from ember.ir.symbolic import index_var
from ember.ir.tensor import LazyTensor, cast, const
from ember.ir.views import norm_dim

aten = torch.ops.aten


def carried_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype eager carries a running sum, product or logsumexp of `dtype` in."""
    if dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    if dtype == torch.float32 and device.type == "cpu":
        return torch.float64
    if not dtype.is_floating_point:
        return torch.int64
    return dtype


def scan(
    lowering: GraphLowering,
    source: LazyTensor,
    dim: int,
    kind: str,
    carried: torch.dtype,
    stored: torch.dtype,
) -> LazyTensor:
    """Store the `kind` scan of `source` along `dim`, carried as `carried`, stored as
    `stored` in a contiguous buffer of `source`'s sizes."""
    ranges = tuple(s for d, s in enumerate(source.size) if d != dim)
    if _segmented_pays(source, dim, kind, ranges) and not _single_pass(source, kind, carried):
        return _segmented(lowering, source, dim, kind, carried, stored)
    index: list[sympy.Expr] = []
    for d in range(source.ndim):
        index.append(index_var("r", 0) if d == dim else index_var("i", d - (d > dim)))
    body = cast(source.loader(index), carried)
    loop = Scan(ranges, source.size[dim], dim, kind, body, stored)
    ref = lowering.store(loop, Layout.contiguous(source.device, stored, source.size))
    return lowering.tensor(ref)


SEGMENTED_DEVICES: tuple[str, ...] = ("cuda",)
SINGLE_PASS_DEVICES: tuple[str, ...] = ("cuda",)
SINGLE_PASS_KINDS = ("sum", "prod", "logsumexp")
SEGMENT = 2048  # elements per segment of a segmented scan, when nothing divides the row
_DIVIDING = (1024, 4096)  # the segment lengths that may divide a row
LONG_SCAN = 32768  # the shortest row scanned in segments (or in one pass with look-back)
FEW_ROWS = 32  # the most rows beside it (more rows keep a GPU busy one program each)
_COMBINE = {"sum": ("add", 0), "prod": ("mul", 1)}


def _segmented_pays(
    source: LazyTensor, dim: int, kind: str, ranges: tuple[sympy.Expr, ...]
) -> bool:
    length, rows = source.size[dim], sympy.Mul(*ranges)
    static = isinstance(length, sympy.Integer) and isinstance(rows, sympy.Integer)
    return (
        source.device.type in SEGMENTED_DEVICES
        and kind in _COMBINE
        and static
        and int(length) >= LONG_SCAN
        and int(rows) <= FEW_ROWS
    )


def _single_pass(source: LazyTensor, kind: str, carried: torch.dtype) -> bool:
    """Whether a long scan stays one Scan for a one-pass look-back kernel."""
    return (
        source.device.type in SINGLE_PASS_DEVICES
        and kind in SINGLE_PASS_KINDS
        and carried == torch.float32
    )


def segment_length(length: int) -> tuple[int, bool]:
    """The segment length for a row of `length`, and whether it divides the row. Of the
    divisors of `length` in `_DIVIDING`, the one that fills its power-of-two block
    best (a GPU program's lanes), then the one nearest `SEGMENT`; with none, `SEGMENT`
    and a partial last segment."""
    low, high = _DIVIDING
    divisors = [d for d in range(low, high + 1) if length % d == 0]
    if not divisors:
        return SEGMENT, False

    def cost(d: int) -> tuple[float, int]:
        return (1 << (d - 1).bit_length()) / d, abs(d - SEGMENT)

    return min(divisors, key=cost), True


def _segmented(
    lowering: GraphLowering,
    source: LazyTensor,
    dim: int,
    kind: str,
    carried: torch.dtype,
    stored: torch.dtype,
) -> LazyTensor:
    """The `kind` scan of `source` along `dim` in segments (see the module docstring).
    The totals and their running combination are stored with the rows (the other
    dimensions) first, then the segment. When the segment length divides the row,
    the segments are scanned straight into the result: their loop is (rows before
    `dim`, segment, position, rows after `dim`), which is the result's own row-major
    order, and each segment's first element is combined with the totals before it.
    Otherwise they are scanned into a buffer of whole segments and combined with the
    totals pointwise."""
    combine, identity_value = _COMBINE[kind]
    identity = const(identity_value, carried)
    length = int(source.size[dim])
    width, divides = segment_length(length)
    count = -(-length // width)
    rows = tuple(s for d, s in enumerate(source.size) if d != dim)
    row_vars = [index_var("i", k) for k in range(len(rows))]
    segment, position = index_var("i", len(rows)), index_var("r", 0)
    counted, wide = sympy.Integer(count), sympy.Integer(width)

    def element(row: list[sympy.Expr], at: sympy.Expr) -> Node:
        """The source at position `at` of the row, the identity past its end."""
        index = list(row)
        index.insert(dim, at)
        if divides:
            return cast(source.loader(index), carried)
        inside = in_range(at, sympy.Integer(0), source.size[dim])
        return Where(inside, guard(cast(source.loader(index), carried), inside), identity)

    def store(loop: Reduction | Scan, size: tuple[sympy.Expr, ...]) -> LazyTensor:
        return lowering.tensor(
            lowering.store(loop, Layout.contiguous(source.device, carried, size))
        )

    totals = store(
        Reduction(
            (*rows, counted),
            (wide,),
            kind,
            element(row_vars, segment * width + position),
            whole=True,  # one GPU program per segment already
        ),
        (*rows, counted),
    )
    previous = position - 1  # the totals before segment r0: an exclusive scan
    has_previous = in_range(previous, sympy.Integer(0), counted)
    before = Where(
        has_previous, guard(totals.loader([*row_vars, previous]), has_previous), identity
    )
    offsets = store(Scan(rows, counted, len(rows), kind, before, carried), (*rows, counted))
    if divides:
        # loop variables: i0.. the rows before dim, i{dim} the segment, the rest after
        outer = [index_var("i", k) for k in range(len(rows) + 1)]
        row = outer[:dim] + outer[dim + 1 :]
        first = in_range(position, sympy.Integer(0), sympy.Integer(1))
        carry_in = Where(first, guard(offsets.loader([*row, outer[dim]]), first), identity)
        body = cast(op(combine, carry_in, element(row, outer[dim] * width + position)), carried)
        loop = Scan((*rows[:dim], counted, *rows[dim:]), wide, dim + 1, kind, body, stored)
        ref = lowering.store(loop, Layout.contiguous(source.device, stored, source.size))
        return lowering.tensor(ref)
    pieces = store(
        Scan(
            (*rows, counted),
            wide,
            len(rows) + 1,
            kind,
            element(row_vars, segment * width + position),
            carried,
        ),
        (*rows, counted, wide),
    )

    def load(index: Sequence[sympy.Expr]) -> Node:
        row = [e for d, e in enumerate(index) if d != dim]
        at = index[dim]
        which = FloorDiv(at, width)
        within = at - width * which
        joined = op(combine, offsets.loader([*row, which]), pieces.loader([*row, which, within]))
        return cast(joined, stored)

    return LazyTensor(source.device, stored, source.size, load)


def _source(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, int | None]:
    """The input and the normalised dim (None for a 0-d input, where every cumulative
    op is the element itself)."""
    source = lowering.tensor(node.args[0])
    if source.dtype.is_complex:
        raise NotLowerable("a scan of complex values")
    if source.ndim == 0:
        norm_dim(int_arg(node.args[1]), 1)  # eager accepts dim 0 and -1 only
        return source, None
    return source, norm_dim(int_arg(node.args[1]), source.ndim)


def _as(value: LazyTensor, dtype: torch.dtype) -> LazyTensor:
    load = value.loader
    return LazyTensor(value.device, dtype, value.size, lambda index: cast(load(index), dtype))


@register_lowering(aten.cumsum.default, aten.cumprod.default)
def lower_cumsum(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source, dim = _source(lowering, node)
    stored = lowering.out_val(node).dtype  # int64 for integer and bool inputs
    source = _as(source, stored)  # `dtype=` converts before accumulating
    if dim is None:
        return source
    kind = "sum" if node.target is aten.cumsum.default else "prod"
    return scan(lowering, source, dim, kind, carried_dtype(stored, source.device), stored)


@register_lowering(aten.logcumsumexp.default)
def lower_logcumsumexp(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source, dim = _source(lowering, node)
    stored = lowering.out_val(node).dtype
    if not stored.is_floating_point:
        raise NotLowerable(f"logcumsumexp of {stored}")
    source = _as(source, stored)
    if dim is None:
        return source
    return scan(lowering, source, dim, "logsumexp", carried_dtype(stored, source.device), stored)


@register_lowering(aten.cummax.default, aten.cummin.default)
def lower_cummax(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, LazyTensor]:
    source, dim = _source(lowering, node)
    if dim is None:
        zero = const(0, torch.int64)
        return source, LazyTensor(source.device, torch.int64, source.size, lambda index: zero)
    kind = "max" if node.target is aten.cummax.default else "min"
    values = scan(lowering, source, dim, kind, source.dtype, source.dtype)
    indices = scan(lowering, source, dim, "arg" + kind, source.dtype, torch.int64)
    return values, indices
