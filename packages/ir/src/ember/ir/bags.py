"""Lowering of `embedding_bag` (`_embedding_bag`, `_embedding_bag_forward_only`): for
each bag, a run of positions of `indices` that `offsets` starts, the sum, mean or max
of the weight rows those positions name; per-sample weights scale the rows of a sum,
and positions naming `padding_idx` count for nothing.

Where a bag starts is data, so a bag's length is unknown when compiling: the only
static bound is the number of positions N, and a reduction per bag over N positions
would do B x N x D work. This lowering is linear instead. It walks the positions once
per pass and scatters each one into its bag, as eager's CPU kernel does (2-d indices,
bags of one fixed length that a plain reduction could take, go this way too; on a
GPU the sums are atomic adds, in no fixed order):

1. `offset2bag`, each position's bag: per position, the number of bags starting
   there (N + 1 slots, as empty bags at the end start at N; slot 0 starts from -1),
   then a running sum (`Scan`). O(N + B). A position before `offsets[0]` gets bag -1,
   which the bag checks below refuse (eager refuses `offsets[0] != 0`).
2. sum and mean: a scatter-add of each position's row (times its weight) into its
   bag, accumulated as eager accumulates (float32 for the half types); a mean then
   divides by the bag's size (`bag_size`: a scatter-add of 1 per non-padding
   position), and an empty bag gives 0. O(N x D).
3. max, eager's rule: a bag's first non-padding value, then each later one that is
   strictly greater. So ties go to the first, and NaN wins only where it comes first
   (after that, comparisons with it are false). Three scatters: the first non-padding
   position of each bag (a min, O(N)), the maximum of its non-NaN values (a max,
   O(N x D)), the first position holding that maximum (a min of positions,
   O(N x D)). The result is the first value where that is NaN, else the maximum, 0
   for an empty bag; `max_indices` is the weight row it came from.

Each scatter is a kernel of its own, so each checks what it addresses: the indices
against the weight's rows, the offsets against [0, N], each position's bag against
[0, B). With `include_last_offset` the last offset should be N; where it is less,
eager's general kernel (and this lowering) runs the last bag to N all the same, while
its fast path for a plain float sum or mean stops at the offset. The offset is
checked either way.

The outputs have the sizes the meta function gives (they depend on the device and the
mode: no `offset2bag` for the CPU's plain float sum, a `bag_size` per offset for
`_embedding_bag_forward_only`), with 0 past the bags. Their values are eager's CPU
ones, which a backward ATen call reads: `bag_size` is 0 for a sum, and outside max
mode `max_indices` repeats `bag_size`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx

from ember.ir.assemble import all_of, guard, in_range, index_value
from ember.ir.expr import IndexExpr, Load, Node, Where
from ember.ir.indexing import Position, address, checked_index, gather_from, indirect_load
from ember.ir.layout import Layout
from ember.ir.loops import Pointwise, Scatter
from ember.ir.lowering import GraphLowering, NotLowerable, int_arg, register_lowering
from ember.ir.nodes import BufferRef
from ember.ir.pointwise import op
from ember.ir.reduction import acc_dtype
from ember.ir.scan import scan
from ember.ir.symbolic import as_expr, loop_vars
from ember.ir.tensor import Index, LazyTensor, buffer_loader, cast, const

aten = torch.ops.aten

MODE_SUM, MODE_MEAN, MODE_MAX = 0, 1, 2


class _Bags:
    """The pieces every pass over the positions shares: the weight table, the indices
    (both stored: they are read at data-dependent positions), the sizes, and each
    position's bag."""

    def __init__(self, lowering: GraphLowering, node: torch.fx.Node, a: dict[str, Any]):
        self.lowering, self.node = lowering, node
        self.weight, self.weight_layout = gather_from(lowering, a["weight"])
        self.ids, self.ids_layout = gather_from(lowering, a["indices"])
        if self.weight_layout.ndim != 2 or self.ids_layout.ndim != 1:
            raise NotLowerable("embedding_bag of a weight that is not 2-d or indices not 1-d")
        self.rows, self.width = self.weight_layout.size
        self.n = self.ids_layout.size[0]
        self.device = self.weight_layout.device
        self.dtype = self.weight_layout.dtype
        self.acc = acc_dtype(self.dtype)
        padding = a["padding_idx"]
        self.padding = -1 if padding is None else int_arg(padding)
        offsets = lowering.tensor(a["offsets"])
        self.count = offsets.size[0] - (1 if a["include_last_offset"] else 0)
        self.offset2bag = self._offset2bag(offsets)

    # -- values at a position p (a sympy index) --------------------------------------

    def index(self, p: sympy.Expr) -> Node:
        """The index at position p, as int64."""
        return cast(buffer_loader(self.ids, self.ids_layout)([p]), torch.int64)

    def row(self, index: Node) -> Node:
        """The weight row an index names, checked against the rows."""
        return checked_index(self.lowering, self.node, index, self.rows, 0, wraps=False)

    def keep(self, p: sympy.Expr) -> Node | None:
        """Whether position p counts (its index is not the padding row); None: all do."""
        if self.padding < 0:
            return None
        return op("ne", self.index(p), const(self.padding, torch.int64))

    def bag(self, p: sympy.Expr) -> Node:
        """Position p's bag, checked against the bags."""
        at = self.offset2bag.loader([p])
        return checked_index(self.lowering, self.node, at, self.count, 0, wraps=False)

    def value(self, row: Node, col: sympy.Expr, mask: Node | None) -> Node:
        """weight[row, col] in the accumulation type (read only where `mask` holds)."""
        index, indirect = address(self.weight_layout, [row, col])
        return cast(Load(self.weight, index, self.dtype, mask=mask, indirect=indirect), self.acc)

    # -- buffers -----------------------------------------------------------------------

    def fresh(self, size: tuple[sympy.Expr, ...], fill: Node) -> tuple[str, Layout]:
        """A new contiguous buffer of `size` holding `fill` (a body over its index)."""
        layout = Layout.contiguous(self.device, fill.dtype, size)
        return self.lowering.store(Pointwise(size, fill), layout).name, layout

    def stored(self, name: str) -> LazyTensor:
        return self.lowering.tensor(BufferRef(name))

    def scatter(
        self,
        into: tuple[str, Layout],
        ranges: tuple[sympy.Expr, ...],
        at: Sequence[Position],
        body: Node,
        reduce: str,
    ) -> str:
        """Combine `body` at every point of `ranges` into element `at` of `into`."""
        name, layout = into
        index, indirect = address(layout, at)
        loop = Scatter(ranges, index, indirect, body, reduce)
        return self.lowering.store(loop, layout, mutates=name).name

    def _offset2bag(self, offsets: LazyTensor) -> LazyTensor:
        """Each position's bag: bags starting at or before it, less one (int64 [N])."""
        (i,) = loop_vars(1)
        slots = (self.n + 1,)
        first = op("eq", IndexExpr(i), index_value(0))
        starts = self.fresh(slots, Where(first, const(-1, torch.int64), const(0, torch.int64)))
        start = checked_index(
            self.lowering, self.node, offsets.loader([i]), slots[0], 0, wraps=False
        )
        # with include_last_offset the last offset starts no bag (but is checked)
        opens = Where(
            op("lt", IndexExpr(i), index_value(self.count)),
            const(1, torch.int64),
            const(0, torch.int64),
        )
        name = self.scatter(starts, offsets.size, [start], opens, "sum")
        layout = starts[1]
        running = LazyTensor(self.device, torch.int64, (self.n,), buffer_loader(name, layout))
        return scan(self.lowering, running, 0, "sum", torch.int64, torch.int64)

    # -- the passes --------------------------------------------------------------------

    def sizes(self) -> LazyTensor:
        """bag_size: each bag's non-padding positions (int64 [B])."""
        (p,) = loop_vars(1)
        keep = self.keep(p)
        one = const(1, torch.int64) if keep is None else cast(keep, torch.int64)
        into = self.fresh((self.count,), const(0, torch.int64))
        name = self.scatter(into, (self.n,), [self.bag(p)], one, "sum")
        return self.stored(name)

    def sums(self, weights: LazyTensor | None) -> LazyTensor:
        """Each bag's sum of rows, times their per-sample weights (acc dtype [B, D])."""
        p, col = loop_vars(2)
        keep = self.keep(p)
        term = self.value(self.row(self.index(p)), col, keep)
        if weights is not None:
            term = op("mul", term, cast(weights.loader([p]), self.acc))
        if keep is not None:
            term = Where(keep, term, const(0, self.acc))
        into = self.fresh((self.count, self.width), const(0, self.acc))
        name = self.scatter(into, (self.n, self.width), [self.bag(p), col], term, "sum")
        return self.stored(name)

    def maxima(self) -> tuple[LazyTensor, LazyTensor]:
        """Each bag's maximum by eager's rule (acc dtype [B, D]) and the weight row it
        came from (int64 [B, D]; 0 for an empty bag)."""
        p, col = loop_vars(2)
        keep = self.keep(p)
        position, nowhere = IndexExpr(p), index_value(self.n)
        bag = self.bag(p)
        start = position if keep is None else Where(keep, position, nowhere)
        first = self.scatter(self.fresh((self.count,), nowhere), (self.n,), [bag], start, "min")
        value = self.value(self.row(self.index(p)), col, keep)
        counted = op("logical_not", op("isnan", value))
        if keep is not None:
            counted = op("logical_and", keep, counted)
        lowest = const(float("-inf"), self.acc)
        into = self.fresh((self.count, self.width), lowest)
        top = self.scatter(
            into, (self.n, self.width), [bag, col], Where(counted, value, lowest), "max"
        )
        top_layout = self.lowering.layouts[top]
        hit = op("eq", value, indirect_load(top, top_layout, [bag, col]))  # never NaN
        if keep is not None:
            hit = op("logical_and", keep, hit)
        into = self.fresh((self.count, self.width), nowhere)
        at = self.scatter(
            into, (self.n, self.width), [bag, col], Where(hit, position, nowhere), "min"
        )
        firsts, tops, ats = (self.stored(name) for name in (first, top, at))

        def index_at(where: Node) -> Node:
            """The index at a data-dependent position (< N where read)."""
            return cast(indirect_load(self.ids, self.ids_layout, [where]), torch.int64)

        def first_row(b: sympy.Expr) -> tuple[Node, Node]:
            """(the bag has a non-padding position, the row of the first one)."""
            where = firsts.loader([b])
            filled = op("lt", where, nowhere)
            return filled, guard(self.row(index_at(where)), filled)

        def maximum(index: Index) -> Node:
            b, c = index
            filled, row = first_row(b)
            leading = guard(self.value(row, c, None), filled)
            picked = Where(op("isnan", leading), leading, tops.loader(index))
            return Where(filled, picked, const(0, self.acc))

        def source(index: Index) -> Node:
            b, c = index
            filled, row = first_row(b)
            leading = guard(self.value(row, c, None), filled)
            where = ats.loader(index)
            found = op("lt", where, nowhere)
            row_at = guard(index_at(where), found)
            picked = Where(op("isnan", leading), row, row_at)
            return Where(filled, picked, const(0, torch.int64))

        size = (self.count, self.width)
        return (
            LazyTensor(self.device, self.acc, size, maximum),
            LazyTensor(self.device, torch.int64, size, source),
        )


def _as_output(value: LazyTensor | None, val: torch.Tensor) -> LazyTensor:
    """`value` with the size and dtype of the node's output `val`: read where the two
    overlap, 0 elsewhere (and everywhere for no value)."""
    size = tuple(as_expr(s) for s in val.shape)
    dtype = val.dtype

    def load(index: Index) -> Node:
        if value is None or len(size) != value.ndim:
            return const(0, dtype)
        element = cast(value.loader(index), dtype)
        if size == value.size:
            return element
        inside = all_of(
            [in_range(i, sympy.Integer(0), s) for i, s in zip(index, value.size, strict=True)]
        )
        return Where(inside, guard(element, inside), const(0, dtype))

    return LazyTensor(val.device, dtype, size, load)


@register_lowering(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def lower_embedding_bag(
    lowering: GraphLowering, node: torch.fx.Node
) -> tuple[LazyTensor, LazyTensor, LazyTensor, LazyTensor]:
    a = lowering.args(node)
    mode = int_arg(a["mode"])
    if mode not in (MODE_SUM, MODE_MEAN, MODE_MAX):
        raise NotLowerable(f"embedding_bag mode {mode}")
    vals = node.meta["val"]
    bags = _Bags(lowering, node, a)
    weights = a["per_sample_weights"]
    sizes: LazyTensor | None = None
    indices: LazyTensor | None = None
    if mode == MODE_MAX:
        result, indices = bags.maxima()
        sizes = bags.sizes()
    else:
        result = bags.sums(None if weights is None else lowering.tensor(weights))
        if mode == MODE_MEAN:
            sizes = bags.sizes()
            counts, totals = sizes, result

            def mean(index: Index) -> Node:
                count = cast(counts.loader(index[:1]), totals.dtype)
                safe = op("maximum", count, const(1, totals.dtype))
                return op("truediv", totals.loader(index), safe)

            result = LazyTensor(result.device, result.dtype, result.size, mean)
        indices = sizes
    return (
        _as_output(result, vals[0]),
        _as_output(bags.offset2bag, vals[1]),
        _as_output(sizes, vals[2]),
        _as_output(indices, vals[3]),
    )
