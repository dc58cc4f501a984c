"""Loop nests of sort kernels (sort, argsort, topk).

A sort kernel's members order, at every outer point, the values of their body along
the kernel's one inner dimension `r0`. Members with the same body (a sort's values
and its indices) share one sort: per outer point, the row's values are computed into
a scratch array, `ember::sort_row` orders their positions (a stable sort of an index
array; `std::partial_sort` or `std::nth_element` with ties broken by position when a
topk keeps only the first k, which is the same order), and each member stores the
first `count` values or positions, `r0` being the position in the order.

Rows are independent: they run in parallel over OpenMP threads, each thread with its
own scratch arrays, allocated once per kernel call (any row length). The order is
ember.ir.loops.Sort's, which `ember::sort_before` spells out: NaN largest, -0.0 equal
to 0.0, ties in input order. Values are sorted in their compute type (float for the
half types, which converts exactly), so the stored values are the inputs' bits.
"""

from __future__ import annotations

from contextlib import ExitStack

from ember.codegen.cpp.emitter import Emitter
from ember.codegen.cpp.loops import nested_loops, parallel_clause, size, store
from ember.ir import Node
from ember.scheduler import SORT, KernelMember


def emit_sort(e: Emitter) -> None:
    kernel = e.ctx.kernel
    members = list(kernel.members)
    if any(m.kind != SORT or m.sort is None for m in members):
        raise e.ctx.error("a sort kernel holds sorts only")
    if len(kernel.reduction_ranges) != 1:
        raise e.ctx.error("a sort kernel sorts along one inner dimension")
    rows: dict[Node, list[KernelMember]] = {}
    for m in members:
        rows.setdefault(m.body, []).append(m)
    length = size(e, kernel.reduction_ranges[0])
    ranges = list(kernel.ranges)
    clause = parallel_clause(e, [*ranges, kernel.reduction_ranges[0]]) if ranges else None
    if clause is not None:
        e.line(f"#pragma omp parallel{clause}")
    with e.block(""):
        scratch = []
        for number, (body, group) in enumerate(rows.items()):
            element = e.ctx.ctype(body.dtype)
            element = "uint8_t" if element == "bool" else element
            values, order = f"ember_values{number}", f"ember_order{number}"
            e.line(f"{element}* {values} = new {element}[{length} > 0 ? {length} : 1];")
            e.line(f"int64_t* {order} = new int64_t[{length} > 0 ? {length} : 1];")
            scratch.append((body, group, values, order))
        if clause is not None:
            collapse = f" collapse({len(ranges)})" if len(ranges) > 1 else ""
            e.line(f"#pragma omp for{collapse}")
        variables = [f"i{d}" for d in range(len(ranges))]
        with nested_loops(e, variables, [size(e, r) for r in ranges]):
            for body, group, values, order in scratch:
                _sort_row(e, body, group, values, order, length)
        for _, _, values, order in scratch:
            e.line(f"delete[] {values};")
            e.line(f"delete[] {order};")


def _sort_row(
    e: Emitter, body: Node, group: list[KernelMember], values: str, order: str, length: str
) -> None:
    """Fill the row's values, order them, store each member's first `count`."""
    spec = group[0].sort
    assert spec is not None
    e.ctx.member = group[0].name
    with e.block(f"for (int64_t r0 = 0; r0 < {length}; ++r0)"):
        e.line(f"{values}[r0] = {e.value(body)};")
    count = size(e, spec.count)
    descending = "true" if spec.descending else "false"
    e.line(f"ember::sort_row<{descending}>({values}, {order}, {length}, {count});")
    with ExitStack() as stack:
        stack.enter_context(e.block(f"for (int64_t r0 = 0; r0 < {count}; ++r0)"))
        e.line(f"const int64_t ember_at = {order}[r0];")
        for m in group:
            e.ctx.member = m.name
            assert m.sort is not None
            if m.stored:
                store(e, m, "ember_at" if m.sort.indices else f"{values}[ember_at]", m.index)
    e.ctx.member = None
