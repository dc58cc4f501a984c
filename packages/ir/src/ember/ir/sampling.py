"""Lowering of `grid_sampler_3d`: a volume [N, C, D, H, W] sampled at the points of a
grid [N, D', H', W', 3] of (x, y, z) in [-1, 1], trilinearly or at the nearest voxel,
with zeros, border or reflection padding (the 5-d `F.grid_sample`).

Pointwise, over the output [N, C, D', H', W']: each point reads its grid point, maps
each coordinate to a source position as eager's kernel does (unnormalized by
`align_corners`, then clipped for border padding, reflected and clipped for
reflection), and reads the 2^3 corners around it (or the nearest voxel) through
masked indirect loads. A corner outside the volume reads nothing and adds nothing;
it is found by float comparisons, so a NaN coordinate lands nowhere, as in eager.

Non-finite grid points follow eager's CPU kernel on every device. Eager's CUDA
kernel differs from its own CPU kernel there (its clipping uses fmax/fmin, which
drop a NaN, where the CPU kernel's std::max/std::min keep their argument order):
on the H100, a grid point (NaN, 0.5, inf) gave other values on CUDA than ember's,
which are the CPU kernel's (3 of 144 values, 2026-11-25). Such a point has no
defined sample; ember gives one answer for it, the CPU kernel's.

The arithmetic is eager's CPU kernel's, op by op and in the input's type: a half
type rounds after every op, as c10's half types do, so a nearest voxel chosen at a
rounding boundary is eager's. The 2-d op is torch's decomposition
(ember.graphpasses); this lowering is written over the grid's last dimension, the
number of spatial dimensions, and registered for three.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sympy
import torch
import torch.fx

from ember.ir.assemble import all_of
from ember.ir.expr import IndexExpr, Load, Node, Where
from ember.ir.indexing import address, gather_from
from ember.ir.lowering import GraphLowering, NotLowerable, int_arg, register_lowering
from ember.ir.pointwise import op
from ember.ir.tensor import Index, LazyTensor, cast, const

aten = torch.ops.aten

BILINEAR, NEAREST = 0, 1
ZEROS, BORDER, REFLECTION = 0, 1, 2


class _Scalar:
    """Arithmetic in eager's scalar type `dtype`: computed in float32 for a half type
    and rounded back to it after each op, as c10's Half and BFloat16 operators do."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype

    def rounded(self, x: Node) -> Node:
        return x if self.compute == self.dtype else cast(cast(x, self.dtype), self.compute)

    def __call__(self, name: str, *args: Node) -> Node:
        return self.rounded(op(name, *args))

    def number(self, value: int | sympy.Expr) -> Node:
        """An integer of the kernel (a size, a corner) converted to the scalar type."""
        return self.rounded(cast(IndexExpr(sympy.sympify(value)), self.compute))


def _unnormalize(s: _Scalar, coord: Node, size: int, align: bool) -> Node:
    """-1 and 1 are the centres of the end voxels (align_corners) or their outer edges."""
    one, two = s.number(1), s.number(2)
    if align:
        return s("mul", s("truediv", s("add", coord, one), two), s.number(size - 1))
    return s("truediv", s("sub", s("mul", s("add", coord, one), s.number(size)), one), two)


def _clip(s: _Scalar, coord: Node, size: int) -> Node:
    """min(size - 1, max(coord, 0)) with std::min and std::max's NaN rules: NaN is
    kept by the max, then replaced by size - 1."""
    zero, top = s.number(0), s.number(size - 1)
    above = Where(op("lt", coord, zero), zero, coord)
    return Where(op("lt", above, top), above, top)


def _reflect(s: _Scalar, coord: Node, twice_low: int, twice_high: int) -> Node:
    """`coord` reflected off [twice_low / 2, twice_high / 2] until it lies inside."""
    if twice_low == twice_high:
        return s.number(0)
    two = s.number(2)
    low = s("truediv", s.number(twice_low), two)
    span = s("truediv", s.number(twice_high - twice_low), two)
    distance = s("abs", s("sub", coord, low))
    extra = s("fmod", distance, span)
    flips = cast(op("floor", s("truediv", distance, span)), torch.int64)
    even = op("eq", op("remainder", flips, const(2, torch.int64)), const(0, torch.int64))
    return Where(even, s("add", extra, low), s("add", s("sub", span, extra), low))


def _source(s: _Scalar, coord: Node, size: int, padding: int, align: bool) -> Node:
    """The source position (in voxels) of a grid coordinate along one dimension."""
    position = _unnormalize(s, coord, size, align)
    if padding == BORDER:
        return _clip(s, position, size)
    if padding == REFLECTION:
        if align:
            position = _reflect(s, position, 0, 2 * (size - 1))
        else:
            position = _reflect(s, position, -1, 2 * size - 1)
        return _clip(s, position, size)
    return position


@register_lowering(aten.grid_sampler_3d.default)
def lower_grid_sampler_3d(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    mode, padding = int_arg(a["interpolation_mode"]), int_arg(a["padding_mode"])
    align = bool(a["align_corners"])
    if mode not in (BILINEAR, NEAREST) or padding not in (ZEROS, BORDER, REFLECTION):
        raise NotLowerable(f"grid sampling mode {mode}, padding {padding}")
    name, layout = gather_from(lowering, a["input"])
    grid = lowering.tensor(a["grid"])
    dims = layout.ndim - 2
    if not all(isinstance(n, sympy.Integer) for n in layout.size[2:]):
        raise NotLowerable("grid sampling of symbolic spatial sizes")
    # spatial sizes in the grid's coordinate order: x is the last dimension
    sizes = [int(n) for n in reversed(layout.size[2:])]
    s = _Scalar(layout.dtype)
    out_size = lowering.out_size(node)

    def voxel(index: Index, corner: Sequence[Node]) -> tuple[Node, Node]:
        """(inside the volume, the masked load) at float voxel coordinates `corner`
        (grid order); the inside test is in floats, so NaN is outside."""
        checks: list[Node] = []
        for at, size in zip(corner, sizes, strict=True):
            checks += [op("ge", at, s.number(0)), op("le", at, s.number(size - 1))]
        inside = all_of(checks)
        positions = [index[0], index[1], *(cast(at, torch.int64) for at in reversed(corner))]
        offset, indirect = address(layout, positions)
        load = Load(name, offset, layout.dtype, mask=inside, indirect=indirect)
        return inside, cast(load, s.compute)

    def sample(index: Index) -> Node:
        n, spatial = index[0], list(index[2:])
        sources = [
            _source(s, cast(grid.loader([n, *spatial, k]), s.compute), size, padding, align)
            for k, size in enumerate(sizes)
        ]
        if mode == NEAREST:
            inside, value = voxel(index, [op("round", x) for x in sources])
            return cast(Where(inside, value, s.number(0)), layout.dtype)
        lows = [op("floor", x) for x in sources]
        highs = [op("add", low, s.number(1)) for low in lows]
        # eager's corner weights: (high - x) for the low corner, (x - low) for the high
        weights = [
            (s("sub", s.rounded(high), x), s("sub", x, s.rounded(low)))
            for x, low, high in zip(sources, lows, highs, strict=True)
        ]
        total = s.number(0)
        # eager's order: the last coordinate (z) outermost, x innermost
        for picks in itertools.product((0, 1), repeat=dims):
            sides = list(reversed(picks))  # grid order: x first
            corner = [(lows[k], highs[k])[side] for k, side in enumerate(sides)]
            weight = weights[0][sides[0]]
            for k in range(1, dims):
                weight = s("mul", weight, weights[k][sides[k]])
            inside, value = voxel(index, corner)
            total = Where(inside, s("add", total, s("mul", value, weight)), total)
        return cast(total, layout.dtype)

    return LazyTensor(layout.device, layout.dtype, out_size, sample)
