"""Loop nests of pointwise and scatter kernels, and the helpers every loop emitter uses.

Pointwise kernels run their outer dimensions in parallel (one OpenMP `parallel for`,
collapsed over the dimensions and over blocks of the innermost one, skipped when the
work is too small to pay for waking threads) and the innermost dimension as a
contiguous `omp simd` loop (transposes are in ember.codegen.cpp.transpose_loops). Scatter
kernels store at a data-dependent index: in parallel with atomics when the combination
is a plain store or a sum of a native type, sequentially otherwise (correctness
first). Reduction kernels are in
ember.codegen.cpp.reduction_loops.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import sympy
import torch

from ember.codegen.cpp.dtypes import HALF_TYPES, load_value, store_value
from ember.codegen.cpp.emitter import Emitter
from ember.ir import CheckIndex, IndexExpr, Load, Node, Rand, walk
from ember.ir.symbolic import index_var, indirect_var, product, static_int
from ember.scheduler import KernelMember

BLOCK = 1024  # elements of the innermost dimension per parallel work item
PARALLEL_MIN = 32768  # ember::kParallelMin: less work than this runs on one thread


def size(e: Emitter, expr: sympy.Expr) -> str:
    return e.ctx.index(expr)


def work(e: Emitter, ranges: Sequence[sympy.Expr]) -> str:
    return size(e, sympy.expand(product(ranges))) if ranges else "1"


def parallel_clause(e: Emitter, ranges: Sequence[sympy.Expr], extra: str = "") -> str | None:
    """None when the work is statically too small for threads, else what follows
    `#pragma omp parallel [for]`: nothing, or a runtime `if` when the work is symbolic."""
    total = static_int(sympy.expand(product(ranges))) if ranges else 1
    if total is not None and total < PARALLEL_MIN:
        return None
    return "" if total is not None else f" if({work(e, ranges)}{extra} >= ember::kParallelMin)"


def parallel_pragma(
    e: Emitter,
    ranges: Sequence[sympy.Expr],
    loops: int,
    extra: str = "",
    schedule: str = "",
    before: str = "",
) -> None:
    """`#pragma omp parallel for` over the next `loops` loops, unless the work is
    statically small; with a runtime `if` when it is symbolic, and `schedule(...)` when
    `schedule` names one (the implementation's default, static in libgomp, otherwise).
    `before`: a statement for the line in front of the pragma, where there is one (the
    object that sets a `schedule(runtime)` loop's schedule)."""
    clause = parallel_clause(e, ranges, extra)
    if loops == 0 or clause is None:
        return
    if before:
        e.line(before)
    collapse = f" collapse({loops})" if loops > 1 else ""
    scheduled = f" schedule({schedule})" if schedule else ""
    e.line(f"#pragma omp parallel for{collapse}{scheduled}{clause}")


@contextmanager
def nested_loops(e: Emitter, variables: Sequence[str], bounds: Sequence[str]) -> Iterator[None]:
    with ExitStack() as stack:
        for var, bound in zip(variables, bounds, strict=True):
            stack.enter_context(e.block(f"for (int64_t {var} = 0; {var} < {bound}; ++{var})"))
        yield


def store_member(e: Emitter, member: KernelMember) -> None:
    """Compute a pointwise member's body and write it at the member's index."""
    target = member.mutates or member.name
    pointer = e.pointer(target, member.dtype)
    bits = e.stored_bits(member.body, member.dtype)
    e.line(f"{pointer}[{e.ctx.index(member.index)}] = {bits};")


def store(e: Emitter, member: KernelMember, value: str, index: sympy.Expr) -> None:
    """Write a member's computed value at `index` of its storage (or of the storage
    it mutates)."""
    target = member.mutates or member.name
    pointer = e.pointer(target, member.dtype)
    e.line(f"{pointer}[{e.ctx.index(index)}] = {store_value(member.dtype, value)};")


def emit_pointwise(e: Emitter) -> None:
    kernel = e.ctx.kernel
    ranges = kernel.ranges
    count = len(ranges)
    if count == 0:
        _pointwise_body(e)
        return
    last = static_int(ranges[-1])
    blocked = last is None or last > BLOCK
    bounds = [size(e, r) for r in ranges]
    parallel_pragma(e, ranges, count if blocked else count - 1)
    inner = f"i{count - 1}"
    lane = index_var("i", count - 1)
    with nested_loops(e, [f"i{d}" for d in range(count - 1)], bounds[:-1]):
        if blocked:
            with e.block(f"for (int64_t ib = 0; ib < {bounds[-1]}; ib += {BLOCK})"):
                e.line(f"const int64_t ie = std::min<int64_t>(ib + {BLOCK}, {bounds[-1]});")
                hoist_checks(e, inner)
                with e.simd_loop(f"for (int64_t {inner} = ib; {inner} < ie; ++{inner})", lane):
                    _pointwise_body(e)
        else:
            hoist_checks(e, inner)
            with e.simd_loop(f"for (int64_t {inner} = 0; {inner} < {bounds[-1]}; ++{inner})", lane):
                _pointwise_body(e)


def hoist_checks(e: Emitter, inner: str) -> None:
    """Emit, before the innermost loop, the index checks (and the index loads they
    check) that do not depend on its variable: an embedding's row check then runs once
    per row, and the loop over the row stays a branch-free simd loop of contiguous
    loads. Checks that vary along it stay inside (a gather along the last dimension)."""
    for member in e.ctx.kernel.members:
        e.ctx.member = member.name
        for root in (member.body, *member.indirect):
            for node in walk(root):
                if isinstance(node, CheckIndex) and not _uses(node, inner):
                    e.value(node)
    e.ctx.member = None


def _uses(root: Node, variable: str) -> bool:
    """Whether `root`'s value depends on the loop variable named `variable`."""
    for node in walk(root):
        if isinstance(node, Load):
            expr = node.index
        elif isinstance(node, (IndexExpr, Rand)):
            expr = node.expr if isinstance(node, IndexExpr) else node.index
        else:
            continue
        if any(s.name == variable for s in sympy.sympify(expr).free_symbols):
            return True
    return False


def _pointwise_body(e: Emitter) -> None:
    for member in e.ctx.kernel.members:
        e.ctx.member = member.name
        store_member(e, member)
    e.ctx.member = None


def emit_scatter(e: Emitter) -> None:
    kernel = e.ctx.kernel
    (member,) = [m for m in kernel.members if m.mutates is not None]
    e.ctx.member = member.name
    dtype = member.dtype
    reduce = member.scatter_reduce
    atomic = reduce in (None, "sum") and dtype not in HALF_TYPES and dtype != torch.bool
    ranges = kernel.ranges
    if atomic:
        parallel_pragma(e, ranges, len(ranges))
    bounds = [size(e, r) for r in ranges]
    with nested_loops(e, [f"i{d}" for d in range(len(ranges))], bounds):
        value = e.value(member.body)
        names = {
            indirect_var(k): f"static_cast<int64_t>({e.value(node)})"
            for k, node in enumerate(member.indirect)
        }
        e.line(f"const int64_t at = {e.ctx.index(member.index, names)};")
        e.raw("#ifdef EMBER_DEBUG_BOUNDS")
        e.line(f'ember::check_index("{kernel.name}", "{member.mutates}", at, -1);')
        e.raw("#endif")
        guards = e.size_guards(member.indirect)
        if guards:  # a checked dimension of size 0: no index is inside, store nothing
            e.line(f"if (!({' && '.join(guards)})) continue;")
        assert member.mutates is not None
        element = f"{e.pointer(member.mutates, dtype)}[at]"
        old = load_value(dtype, element)
        combined = {
            None: value,
            "sum": f"{old} + {value}",
            "prod": f"{old} * {value}",
            "max": f"ember::maximum<{e.ctx.ctype(dtype)}>({old}, {value})",
            "min": f"ember::minimum<{e.ctx.ctype(dtype)}>({old}, {value})",
        }
        if reduce not in combined:
            raise e.ctx.error(f"scatter reduction {reduce!r}")
        if atomic and reduce is None:
            e.line("#pragma omp atomic write")
            e.line(f"{element} = {value};")
        elif atomic:
            e.line("#pragma omp atomic")
            e.line(f"{element} += {value};")
        else:
            e.line(f"{element} = {store_value(dtype, combined[reduce])};")
    e.ctx.member = None
