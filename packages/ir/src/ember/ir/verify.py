"""The verifier: invariants every Program must keep, checked after lowering.

Names are unique and every read names a value defined before it and still live (a
buffer superseded by a mutation must be read through its new name); size expressions
use only bound symbols; loop bodies are well typed (the ops protocol's dtype rules,
bool masks and conditions, loads of a buffer's own dtype) and use only their own loop
variables; and a load whose index bounds can be proven from static sizes stays inside
the buffer it reads.
"""

from __future__ import annotations

import sympy
import torch
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from ember.ir.errors import VerificationError
from ember.ir.expr import (
    Cast,
    CheckIndex,
    IndexExpr,
    Load,
    Node,
    Op,
    Rand,
    Where,
    float_valued,
    walk,
)
from ember.ir.layout import Layout
from ember.ir.loops import (
    REDUCTION_KINDS,
    SCAN_KINDS,
    SCATTER_REDUCE,
    Reduction,
    Scan,
    Scatter,
    Sort,
    loop_bodies,
)
from ember.ir.nodes import (
    BufferRef,
    ComputedBuffer,
    ExternKernel,
    InputBuffer,
    MultiOutput,
    iter_exprs,
    iter_refs,
)
from ember.ir.ops import BOOL_RESULT, MIXED_ARGS, OP_NAMES, arity
from ember.ir.program import Program
from ember.ir.symbolic import index_var, indirect_var, split_groups


def verify(program: Program) -> None:
    """Raise VerificationError at the first broken invariant."""
    defined: set[str] = set()
    superseded: dict[str, str] = {}
    layouts: dict[str, Layout] = {}
    extents = _Extents(layouts)
    symbols = set(program.size_symbols())

    def define(name: str) -> None:
        if name in defined:
            raise VerificationError(f"{program.name}: {name!r} is defined twice")
        defined.add(name)

    for node in program.inputs:
        define(node.name)
        if isinstance(node, InputBuffer):
            layouts[node.name] = node.layout
    for const in program.constants:
        define(const.name)
        layouts[const.name] = const.layout
    if program.rng_seed is not None:
        define(program.rng_seed)
        layouts[program.rng_seed] = Layout(torch.device("cpu"), torch.int64, (), ())
    for item in program.nodes:
        for read in item.reads():
            if read not in defined:
                raise VerificationError(
                    f"{program.name}: {item.name!r} reads {read!r}, which is not defined before it"
                )
            if read in superseded and not (
                isinstance(item, ComputedBuffer) and item.mutates == read
            ):
                raise VerificationError(
                    f"{program.name}: {item.name!r} reads {read!r} after {superseded[read]!r} "
                    "overwrote it; read the new name"
                )
        if isinstance(item, ExternKernel):
            for expr in iter_exprs((item.args, item.kwargs)):
                unbound = expr.free_symbols - symbols
                if unbound:
                    raise VerificationError(
                        f"{program.name}: {item.name!r} ({item.op}) uses unbound size symbols "
                        f"{sorted(map(str, unbound))}"
                    )
            if item.symbol is not None:
                symbols.add(item.symbol)
            if not item.multi and item.outputs[0] is not None:
                layouts[item.name] = item.outputs[0]
        elif isinstance(item, MultiOutput):
            if item.index < 0:
                raise VerificationError(f"{program.name}: {item.name!r} has a negative index")
            if item.layout is not None:
                layouts[item.name] = item.layout
        elif isinstance(item, ComputedBuffer):
            _check_loop(program.name, item, layouts, extents, symbols)
            layouts[item.name] = item.layout
            if item.mutates is not None:
                superseded[item.mutates] = item.name
        define(item.name)
    for ref in iter_refs(program.outputs):
        if ref.name not in defined:
            raise VerificationError(f"{program.name}: output {ref.name!r} is not defined")
    for out in program.outputs:
        if not isinstance(out, BufferRef):
            for expr in iter_exprs(out):
                if expr.free_symbols - symbols:
                    raise VerificationError(f"{program.name}: output {expr} has unbound symbols")


class _Extents:
    """Each buffer's storage extent, worked out (a sympy expansion) the first time a
    load of it is checked and kept: names are defined once, so an extent never
    changes. Computing every live buffer's extent for every loop made verifying
    quadratic: BERT's 196 loops on the GPU spent 3.4 s there (cProfile, H100 machine)."""

    def __init__(self, layouts: dict[str, Layout]) -> None:
        self.layouts = layouts
        self.known: dict[str, sympy.Expr] = {}

    def __getitem__(self, name: str) -> sympy.Expr:
        extent = self.known.get(name)
        if extent is None:
            extent = self.known[name] = self.layouts[name].storage_extent()
        return extent


def _check_loop(
    program: str,
    buffer: ComputedBuffer,
    layouts: dict[str, Layout],
    extents: _Extents,
    symbols: set[sympy.Symbol],
) -> None:
    loop = buffer.loop
    where = f"{program}: {buffer.name!r}"
    variables = {index_var("i", d) for d in range(len(loop.ranges))}
    if isinstance(loop, Reduction):
        if loop.kind not in REDUCTION_KINDS:
            raise VerificationError(f"{where}: unknown reduction {loop.kind!r}")
        if not loop.reduction_ranges:  # codegens would store the body: wrong for argmax
            raise VerificationError(f"{where}: {loop.kind} reduction over no dimension")
        variables |= {index_var("r", d) for d in range(len(loop.reduction_ranges))}
    if isinstance(loop, Scan):
        _check_scan(where, buffer, loop)
        variables.add(index_var("r", 0))
    if isinstance(loop, Sort):
        _check_sort(where, buffer, loop)
        variables.add(index_var("r", 0))
    if isinstance(loop, Scatter) and loop.reduce not in SCATTER_REDUCE:
        raise VerificationError(f"{where}: unknown scatter reduction {loop.reduce!r}")
    if buffer.layout.dtype != loop.dtype:
        raise VerificationError(f"{where}: stores {loop.dtype} in a {buffer.layout.dtype} buffer")
    if (isinstance(loop, Scatter) or buffer.mutates) and buffer.mutates not in layouts:
        raise VerificationError(f"{where}: writes {buffer.mutates!r}, which is not a buffer")
    ranges = {index_var("i", d): r for d, r in enumerate(loop.ranges)}
    if isinstance(loop, Reduction):
        ranges |= {index_var("r", d): r for d, r in enumerate(loop.reduction_ranges)}
    if isinstance(loop, (Scan, Sort)):
        ranges[index_var("r", 0)] = loop.length
    for root in loop_bodies(loop):
        for node in walk(root):
            _check_node(where, node, layouts, variables | symbols, extents, ranges)
    if isinstance(loop, Scatter):
        allowed = variables | symbols | {indirect_var(k) for k in range(len(loop.indirect))}
        _check_symbols(where, loop.index, allowed)


def _check_sort(where: str, buffer: ComputedBuffer, loop: Sort) -> None:
    """A sort's axis, result sizes, kept count and stored dtype."""
    if not 0 <= loop.axis <= len(loop.ranges):
        raise VerificationError(f"{where}: sort axis {loop.axis} of {len(loop.ranges) + 1} dims")
    if tuple(buffer.layout.size) != loop.result_size:
        raise VerificationError(
            f"{where}: sort result {list(loop.result_size)} stored as {list(buffer.layout.size)}"
        )
    over = sympy.simplify(loop.count - loop.length)
    if loop.count.is_negative or (over.is_number and over > 0):
        raise VerificationError(f"{where}: keeps {loop.count} of {loop.length} sorted values")
    wanted = torch.int64 if loop.indices else loop.body.dtype
    if loop.dtype != wanted:
        what = "indices" if loop.indices else "values"
        raise VerificationError(f"{where}: sort {what} stored as {loop.dtype}, not {wanted}")
    if loop.body.dtype.is_complex:
        raise VerificationError(f"{where}: sort of complex values")


def _check_scan(where: str, buffer: ComputedBuffer, loop: Scan) -> None:
    """A scan's kind, axis and result sizes, and the dtypes it carries and stores."""
    if loop.kind not in SCAN_KINDS:
        raise VerificationError(f"{where}: unknown scan {loop.kind!r}")
    if not 0 <= loop.axis <= len(loop.ranges):
        raise VerificationError(f"{where}: scan axis {loop.axis} of {len(loop.ranges) + 1} dims")
    ones = sympy.Integer(1)
    stored = [s for s in buffer.layout.size if s != ones]
    if split_groups([s for s in loop.result_size if s != ones], stored) is None:
        # the same sizes, or some dimensions of the result merged in the layout in
        # the same row-major order (a long row scanned as segment and position)
        raise VerificationError(
            f"{where}: scan result {list(loop.result_size)} stored as {list(buffer.layout.size)}"
        )
    if loop.kind in ("argmax", "argmin") and loop.dtype != torch.int64:
        raise VerificationError(f"{where}: {loop.kind} scan stores int64, not {loop.dtype}")
    if loop.kind == "logsumexp" and not loop.body.dtype.is_floating_point:
        raise VerificationError(f"{where}: logsumexp scan of {loop.body.dtype} values")


def _check_node(
    where: str,
    node: Node,
    layouts: dict[str, Layout],
    allowed: set[sympy.Symbol],
    extents: _Extents,
    ranges: dict[sympy.Symbol, sympy.Expr],
) -> None:
    if isinstance(node, Load):
        layout = layouts.get(node.buffer)
        if layout is None:
            raise VerificationError(f"{where}: loads {node.buffer!r}, which is not a live buffer")
        if layout.dtype != node.dtype:
            raise VerificationError(
                f"{where}: loads {layout.dtype} {node.buffer!r} as {node.dtype}"
            )
        if node.mask is not None and node.mask.dtype != torch.bool:
            raise VerificationError(f"{where}: mask of a load of {node.buffer!r} is not bool")
        indirect = {indirect_var(k) for k in range(len(node.indirect))}
        _check_symbols(where, node.index, allowed | indirect)
        if node.mask is None and not node.indirect:
            _check_bounds(where, node, extents[node.buffer], ranges)
    elif isinstance(node, Op):
        if node.name not in OP_NAMES:
            raise VerificationError(f"{where}: {node.name!r} is not in the ops protocol")
        if len(node.args) != arity(node.name):
            raise VerificationError(f"{where}: {node.name} takes {arity(node.name)} arguments")
        if node.name not in MIXED_ARGS and len({a.dtype for a in node.args}) > 1:
            raise VerificationError(
                f"{where}: {node.name} mixes dtypes {[str(a.dtype) for a in node.args]}"
            )
        expected = torch.bool if node.name in BOOL_RESULT else node.args[-1].dtype
        if node.dtype != expected:
            raise VerificationError(f"{where}: {node.name} gives {expected}, not {node.dtype}")
    elif isinstance(node, Where):
        if node.cond.dtype != torch.bool or node.a.dtype != node.b.dtype:
            raise VerificationError(f"{where}: where needs a bool condition and equal dtypes")
    elif isinstance(node, IndexExpr):
        wanted = torch.float64 if float_valued(node.expr) else None
        if wanted is not None and node.dtype != wanted:
            raise VerificationError(f"{where}: {node.expr} has a float value, held as {wanted}")
        if wanted is None and (node.dtype.is_floating_point or node.dtype == torch.bool):
            raise VerificationError(f"{where}: index values are integers, not {node.dtype}")
        _check_symbols(where, node.expr, allowed)
    elif isinstance(node, Rand):
        if node.distribution not in ("uniform", "normal") or node.dtype != torch.float32:
            raise VerificationError(f"{where}: bad random draw {node.distribution} {node.dtype}")
        _check_symbols(where, node.index, allowed)
    elif isinstance(node, CheckIndex):
        if node.index.dtype != torch.int64 or node.size.dtype != torch.int64:
            raise VerificationError(f"{where}: an index check takes int64 index and size")
        if node.mask is not None and node.mask.dtype != torch.bool:
            raise VerificationError(f"{where}: mask of an index check is not bool")
    elif isinstance(node, Cast) and node.x.dtype == node.to:
        raise VerificationError(f"{where}: cast to its own dtype {node.to}")


def _check_symbols(where: str, expr: sympy.Expr, allowed: set[sympy.Symbol]) -> None:
    stray = sympy.sympify(expr).free_symbols - allowed
    if stray:
        raise VerificationError(
            f"{where}: index {expr} uses unknown symbols {sorted(map(str, stray))}"
        )


def _check_bounds(
    where: str, node: Load, extent: sympy.Expr, ranges: dict[sympy.Symbol, sympy.Expr]
) -> None:
    """Loads whose index range is computable from static sizes stay in the buffer."""
    if not isinstance(extent, sympy.Integer) or not all(
        isinstance(r, sympy.Integer) for r in ranges.values()
    ):
        return
    index = sympy.sympify(node.index)
    if index.free_symbols - set(ranges):
        return
    if any(int(r) == 0 for r in ranges.values()):
        return
    bounds = {v: ValueRanges(0, int(r) - 1) for v, r in ranges.items() if v in index.free_symbols}
    try:
        found = bound_sympy(index, bounds)
    except Exception:
        return
    low, high = found.lower, found.upper
    if (low.is_number and low < 0) or (high.is_number and high >= int(extent)):
        raise VerificationError(
            f"{where}: load {node.buffer}[{node.index}] spans [{low}, {high}] outside [0, {extent})"
        )
