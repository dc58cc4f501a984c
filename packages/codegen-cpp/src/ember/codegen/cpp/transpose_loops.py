"""Transpose-like pointwise loops: register-transposed tiles and streamed rows.

A pointwise kernel whose stores are contiguous along the innermost dimension while some
load is contiguous along an outer dimension `d` (x.t().contiguous(), a permute, a
transposed operand of an add) runs in tiles of ROWS values of `d` by COLS of the
innermost dimension. Per tile, each transposed load is read along its contiguous
dimension (whole cache lines) and turned in registers by `ember::transpose_tile` into a
small row-major stack tile; the body then runs as a contiguous `omp simd` loop over that
tile, and each result row goes to memory with `ember::store_row` (non-temporal for
outputs of at least `ember::kStreamMin` bytes). Partial tiles at the edges run the
plain per-element loops. Why: element by element, a transposed load is a gather of 16
lines per vector, and the 16 output rows of a tile, all a multiple of 4 KiB apart, fight
over one L1 set while each line is read for ownership (4096x2048 floats: 14 ms, where a
memcpy of the same bytes takes 2.5 ms).
"""

from __future__ import annotations

import sympy

from ember.codegen.cpp.dtypes import storage_type
from ember.codegen.cpp.emitter import Emitter
from ember.codegen.cpp.loops import (
    hoist_checks,
    nested_loops,
    parallel_clause,
    size,
    store_member,
)
from ember.ir import Load, walk
from ember.ir.symbolic import index_var, product, static_int
from ember.scheduler import FusedKernel
from ember.scheduler.indexing import affine_coefficient

ROWS = 16  # values of the transposed dimension per tile (one 16x16 register transpose)
COLS = 32  # values of the innermost dimension per tile (a whole line of a 2-byte row)
STREAM_MIN = 1 << 22  # ember::kStreamMin: output bytes from which rows bypass the cache


def transposed_dim(kernel: FusedKernel) -> int | None:
    """The outer dimension along which some load is contiguous while the stores are
    contiguous along the innermost one (a transpose), or None."""
    count = len(kernel.ranges)
    if count < 2:
        return None
    last = index_var("i", count - 1)
    if any(affine_coefficient(m.index, last) != 1 for m in kernel.members):
        return None
    for d in range(count - 1):
        rows, cols = static_int(kernel.ranges[d]), static_int(kernel.ranges[-1])
        if (rows is not None and rows < ROWS) or (cols is not None and cols < COLS):
            continue
        var = index_var("i", d)
        for member in kernel.members:
            for node in walk(member.body):
                if (
                    isinstance(node, Load)
                    and not node.indirect
                    and affine_coefficient(node.index, var) == 1
                    and affine_coefficient(node.index, last) != 1
                ):
                    return d
    return None


def transposed_loads(kernel: FusedKernel, d: int) -> list[Load]:
    """The loads a tile reads along dimension `d`: unmasked, direct, affine in `d` (unit
    stride) and in the innermost dimension (a stride other than 0 and 1), in order of
    first appearance."""
    var, last = index_var("i", d), index_var("i", len(kernel.ranges) - 1)
    found: list[Load] = []
    for member in kernel.members:
        for node in walk(member.body):
            if not isinstance(node, Load) or node.indirect or node.mask is not None:
                continue
            step = affine_coefficient(node.index, last)
            if (
                affine_coefficient(node.index, var) == 1
                and step is not None
                and step not in (0, 1)
                and node not in found
            ):
                found.append(node)
    return found


def emit_transposed(e: Emitter, d: int) -> None:
    """Tiles of dimension `d` (ROWS) by the innermost one (COLS), in parallel, the
    innermost dimension outside so that consecutive tiles read on along the same lines
    of the transposed loads. Without a load to turn in registers (one not affine in the
    innermost dimension), every tile runs the per-element loops."""
    kernel = e.ctx.kernel
    ranges = kernel.ranges
    count = len(ranges)
    bounds = [size(e, r) for r in ranges]
    others = [k for k in range(count - 1) if k != d]
    loads = transposed_loads(kernel, d)
    if loads:
        itemsizes = sum(m.dtype.itemsize for m in kernel.members)
        total = static_int(sympy.expand(product(ranges)))
        if total is not None:
            stream = "true" if total * itemsizes >= STREAM_MIN else "false"
        else:
            stream = f"{size(e, sympy.expand(product(ranges)))} * {itemsizes} >= ember::kStreamMin"
        e.line(f"const bool stream = {stream};")
    clause = parallel_clause(e, ranges)
    if clause is not None:
        e.line(f"#pragma omp parallel{clause}")
    with e.block(""):
        if clause is not None:
            e.line(f"#pragma omp for collapse({len(others) + 2})")
        with (
            nested_loops(e, [f"i{k}" for k in others], [bounds[k] for k in others]),
            e.block(f"for (int64_t ib = 0; ib < {bounds[-1]}; ib += {COLS})"),
            e.block(f"for (int64_t jb = 0; jb < {bounds[d]}; jb += {ROWS})"),
        ):
            if loads:
                full = f"jb + {ROWS} <= {bounds[d]} && ib + {COLS} <= {bounds[-1]}"
                with e.block(f"if ({full})"):
                    _full_tile(e, d, loads)
                with e.block("else"):
                    _partial_tile(e, d)
            else:
                _partial_tile(e, d)
        if loads:
            e.line("ember::stream_fence();")


def _partial_tile(e: Emitter, d: int) -> None:
    bounds = [size(e, r) for r in e.ctx.kernel.ranges]
    inner = f"i{len(bounds) - 1}"
    e.line(f"const int64_t je = std::min<int64_t>(jb + {ROWS}, {bounds[d]});")
    e.line(f"const int64_t ie = std::min<int64_t>(ib + {COLS}, {bounds[-1]});")
    with e.block(f"for (int64_t i{d} = jb; i{d} < je; ++i{d})"):
        hoist_checks(e, inner)
        lane = index_var("i", len(bounds) - 1)
        with e.simd_loop(f"for (int64_t {inner} = ib; {inner} < ie; ++{inner})", lane):
            for member in e.ctx.kernel.members:
                e.ctx.member = member.name
                store_member(e, member)
            e.ctx.member = None


def _full_tile(e: Emitter, d: int, loads: list[Load]) -> None:
    """Transposed loads into row-major stack tiles, the body over the tile as a
    contiguous simd loop into one row buffer per member, each row stored whole."""
    kernel = e.ctx.kernel
    count = len(kernel.ranges)
    var, last = index_var("i", d), index_var("i", count - 1)
    ib, jb = (sympy.Symbol(n, integer=True, nonnegative=True) for n in ("ib", "jb"))
    overrides = {}
    for k, load in enumerate(loads):
        stride = affine_coefficient(load.index, last)
        assert stride is not None
        origin = e.ctx.index(load.index.subs({var: jb, last: ib}))
        pointer = e.pointer(load.buffer, load.dtype)
        e.line(f"alignas(64) {storage_type(load.dtype)} tile{k}[{ROWS * COLS}];")
        e.line(
            f"ember::transpose_tile<{COLS}>({pointer} + {origin}, {e.ctx.index(stride)}, tile{k});"
        )
        overrides[load] = f"tile{k}[{COLS} * a + b]"
    for k, member in enumerate(kernel.members):
        e.line(f"alignas(64) {storage_type(member.dtype)} row{k}[{ROWS * COLS}];")
    with e.block(f"for (int64_t a = 0; a < {ROWS}; ++a)"):
        e.line(f"const int64_t i{d} = jb + a;")
        with e.simd_loop(f"for (int64_t b = 0; b < {COLS}; ++b)", last):
            e.line(f"const int64_t i{count - 1} = ib + b;")
            e.ctx.load_overrides = overrides
            for k, member in enumerate(kernel.members):
                e.ctx.member = member.name
                bits = e.stored_bits(member.body, member.dtype)
                e.line(f"row{k}[{COLS} * a + b] = {bits};")
            e.ctx.member = None
            e.ctx.load_overrides = {}
        for k, member in enumerate(kernel.members):
            target = e.pointer(member.mutates or member.name, member.dtype)
            start = e.ctx.index(member.index.subs(last, ib))
            row_bytes = COLS * member.dtype.itemsize
            e.line(
                f"ember::store_row<{row_bytes}>({target} + {start}, row{k} + {COLS} * a, stream);"
            )
