"""Canonical iteration spaces: loops in the order of the stored layout, and adjacent
loop dimensions that address memory as one merged (e.g. the two dimensions of a
contiguous [B, N] tensor become one loop of B*N).

A loop's points run in the logical (size) order of its output, but a channels-last
output [N, C, H, W] has C innermost in memory: iterated in logical order, neighbouring
threads would store 2*C bytes apart. So before merging, the outer variables of a
computed buffer are put in descending order of their stride in the store index; the
channels-last loop becomes [N, H, W, C], which then merges into one contiguous loop.

Fewer, longer loops mean simpler index math and longer contiguous runs for the
codegens. Two adjacent variables (a, b) with ranges (Ra, Rb) merge when every index
expression of the kernel is affine in both with coef(a) == Rb * coef(b); then
substituting a -> 0, b -> j (j the merged variable over Ra*Rb) is exact, because
coef(b) * (Rb * (j // Rb) + j % Rb) == coef(b) * j.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from ember.ir import ComputedBuffer
from ember.ir.expr import replace_index
from ember.ir.loops import Pointwise, Reduction, Scan, Scatter, Sort
from ember.ir.symbolic import index_var, size_hint
from ember.scheduler.indexing import affine_coefficient, body_exprs
from ember.scheduler.kernel import FusedKernel, KernelMember


def merge_dimensions(kernel: FusedKernel) -> FusedKernel:
    """The same kernel over the fewest loop dimensions the index expressions allow."""
    if kernel.is_scatter:
        return kernel
    ranges, reduction_ranges = list(kernel.ranges), list(kernel.reduction_ranges)
    members = list(kernel.members)
    for prefix, dims in (("i", ranges), ("r", reduction_ranges)):
        d = len(dims) - 2
        while d >= 0:
            a, b = index_var(prefix, d), index_var(prefix, d + 1)
            if _mergeable(members, a, b, dims[d + 1]):
                members = [_merge(m, prefix, d, len(dims)) for m in members]
                dims[d : d + 2] = [sympy.expand(dims[d] * dims[d + 1])]
            d -= 1
    if len(ranges) == len(kernel.ranges) and len(reduction_ranges) == len(kernel.reduction_ranges):
        return kernel
    return replace(
        kernel,
        ranges=tuple(ranges),
        reduction_ranges=tuple(reduction_ranges),
        members=tuple(members),
    )


def _exprs(members: list[KernelMember]) -> list[sympy.Expr]:
    found = body_exprs([m.body for m in members])
    return found + [m.index for m in members]


def _mergeable(
    members: list[KernelMember], a: sympy.Symbol, b: sympy.Symbol, range_b: sympy.Expr
) -> bool:
    return _mergeable_exprs(_exprs(members), a, b, range_b)


def _mergeable_exprs(
    exprs: list[sympy.Expr], a: sympy.Symbol, b: sympy.Symbol, range_b: sympy.Expr
) -> bool:
    for expr in exprs:
        if not expr.has(a) and not expr.has(b):
            continue
        ca, cb = affine_coefficient(expr, a), affine_coefficient(expr, b)
        if ca is None or cb is None or sympy.expand(ca - range_b * cb) != 0:
            return False
    return True


def _merge_mapping(prefix: str, d: int, count: int) -> dict[sympy.Symbol, sympy.Expr]:
    """Substitute (v_d, v_{d+1}) -> (0, v_d) and shift the later variables down by one."""
    mapping: dict[sympy.Symbol, sympy.Expr] = {index_var(prefix, d): sympy.Integer(0)}
    mapping[index_var(prefix, d + 1)] = index_var(prefix, d)
    for k in range(d + 2, count):
        mapping[index_var(prefix, k)] = index_var(prefix, k - 1)
    return mapping


def merge_loop(
    buffer: ComputedBuffer, index: sympy.Expr, prefixes: tuple[str, ...] = ("i", "r")
) -> tuple[ComputedBuffer, sympy.Expr]:
    """The same computed buffer over the fewest loop dimensions its indices allow, and
    its store index in the merged variables. Done before fusion, so that a layer norm
    over [B, S] x [D] meets its epilogue read back as [B*S, D] (a view for a matmul).
    `prefixes` picks the dimensions to merge: outer ('i'), reduction ('r') or both."""
    loop = buffer.loop
    if isinstance(loop, (Scatter, Scan, Sort)) or buffer.mutates is not None:
        # a scan's or sort's outer dimensions merge later, in its kernel
        # (merge_dimensions)
        return buffer, index
    ranges = list(loop.ranges)
    inner = list(loop.reduction_ranges) if isinstance(loop, Reduction) else []
    body = loop.body
    order = _storage_order(index, loop.ranges) if "i" in prefixes else None
    if order is not None:
        mapping = {index_var("i", old): index_var("i", new) for new, old in enumerate(order)}
        body = replace_index(body, mapping)
        index = sympy.expand(index.xreplace(mapping))
        ranges = [loop.ranges[old] for old in order]
    for prefix, dims in (("i", ranges), ("r", inner)):
        d = len(dims) - 2 if prefix in prefixes else -1
        while d >= 0:
            a, b = index_var(prefix, d), index_var(prefix, d + 1)
            if _mergeable_exprs([*body_exprs([body]), index], a, b, dims[d + 1]):
                mapping = _merge_mapping(prefix, d, len(dims))
                body = replace_index(body, mapping)
                index = sympy.expand(index.xreplace(mapping))
                dims[d : d + 2] = [sympy.expand(dims[d] * dims[d + 1])]
            d -= 1
    unchanged = order is None and len(ranges) == len(loop.ranges)
    if unchanged and len(inner) == len(getattr(loop, "reduction_ranges", ())):
        return buffer, index
    merged: Pointwise | Reduction
    if isinstance(loop, Reduction):
        merged = Reduction(tuple(ranges), tuple(inner), loop.kind, body, loop.whole)
    else:
        merged = Pointwise(tuple(ranges), body)
    return replace(buffer, loop=merged), index


def _storage_order(index: sympy.Expr, ranges: tuple[sympy.Expr, ...]) -> list[int] | None:
    """The outer loop dimensions in descending order of their stride in `index` (the
    store index), or None when that is the given order or the index is not affine.
    Symbolic strides are compared at a size guess; the order only affects speed."""
    strides: list[int] = []
    for d in range(len(ranges)):
        coefficient = affine_coefficient(index, index_var("i", d))
        if coefficient is None:
            return None
        strides.append(size_hint(coefficient))
    # size-1 dimensions keep their places (their stride is 0 and means nothing)
    movable = [d for d in range(len(ranges)) if ranges[d] != 1]
    order = list(range(len(ranges)))
    for slot, d in zip(movable, sorted(movable, key=lambda d: -strides[d]), strict=True):
        order[slot] = d
    return None if order == list(range(len(ranges))) else order


def _merge(member: KernelMember, prefix: str, d: int, count: int) -> KernelMember:
    """`member` with (v_d, v_{d+1}) merged (see `_merge_mapping`)."""
    mapping = _merge_mapping(prefix, d, count)
    return replace(
        member,
        body=replace_index(member.body, mapping),
        index=sympy.expand(member.index.xreplace(mapping)),
    )
