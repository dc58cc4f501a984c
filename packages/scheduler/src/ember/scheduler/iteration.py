"""Canonical iteration spaces: merge adjacent loop dimensions that address memory as
one (e.g. the two dimensions of a contiguous [B, N] tensor become one loop of B*N).

Fewer, longer loops mean simpler index math and longer contiguous runs for the
codegens. Two adjacent variables (a, b) with ranges (Ra, Rb) merge when every index
expression of the kernel is affine in both with coef(a) == Rb * coef(b); then
substituting a -> 0, b -> j (j the merged variable over Ra*Rb) is exact, because
coef(b) * (Rb * (j // Rb) + j % Rb) == coef(b) * j.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from ember.ir.expr import replace_index
from ember.ir.symbolic import index_var
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
    for expr in _exprs(members):
        if not expr.has(a) and not expr.has(b):
            continue
        ca, cb = affine_coefficient(expr, a), affine_coefficient(expr, b)
        if ca is None or cb is None or sympy.expand(ca - range_b * cb) != 0:
            return False
    return True


def _merge(member: KernelMember, prefix: str, d: int, count: int) -> KernelMember:
    """Substitute (v_d, v_{d+1}) -> (0, v_d) and shift the later variables down by one."""
    mapping: dict[sympy.Symbol, sympy.Expr] = {index_var(prefix, d): sympy.Integer(0)}
    mapping[index_var(prefix, d + 1)] = index_var(prefix, d)
    for k in range(d + 2, count):
        mapping[index_var(prefix, k)] = index_var(prefix, k - 1)
    return replace(
        member,
        body=replace_index(member.body, mapping),
        index=sympy.expand(member.index.xreplace(mapping)),
    )
