"""Loop nests of scan kernels (cumsum, cumprod, logcumsumexp, cummax, cummin).

A scan kernel's members carry running values along its one inner dimension `r0`,
which runs in order, once: linear in the scanned length. Each member keeps a state
(the running value; for argmax/argmin also the index of the running extreme), folds
in the body's value at each point and stores the state there. The outer points are
independent and run in parallel over OpenMP threads. Two shapes, as for reductions:

- *row* (the scanned dimension is the contiguous one, or no outer dimension is): one
  outer point at a time, walking its row;
- *column* (the innermost outer dimension is contiguous and the scanned one is not,
  e.g. cumsum over dim 0 of a row-major matrix): `kColumnLanes` consecutive outer
  points as lanes of an `omp simd` loop inside the walk along `r0`, so each step reads
  and writes whole cache lines instead of one element per line.

The fold follows ember.ir.loops.SCAN_KINDS: cummax/cummin take a new element when it is
NaN or when the state is not NaN and the element is >= (<=) it (`ember::scan_take_*`),
logcumsumexp combines as ATen's CPU kernel does (`ember::log_add_exp`). The state is
the body's dtype, which lowering made eager's accumulation type (float64 for float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ember.codegen.cpp.emitter import Emitter
from ember.codegen.cpp.loops import nested_loops, parallel_pragma, size, store
from ember.codegen.cpp.reductions import extreme
from ember.ir import Load, walk
from ember.ir.symbolic import index_var, static_int
from ember.scheduler import SCAN, KernelMember
from ember.scheduler.indexing import affine_coefficient

LANES = 64  # ember::kColumnLanes


@dataclass(frozen=True)
class ScanRule:
    """How one member's state starts, takes in a value `{x}` at position `{r}`, and
    which of its fields is stored."""

    init: str  # the running value's initial value; `{T}`: the state's C++ type
    update: str  # `{s}` the running value, `{k}` the index field, `{x}`, `{r}`
    stores_index: bool = False


def scan_rule(kind: str, dtype: torch.dtype, ctype: str) -> ScanRule | None:
    """The rule of scan `kind` over values of `dtype` (carried as `ctype`)."""
    if kind == "sum":
        return ScanRule("{T}(0)", "{s} = {s} + {x};")
    if kind == "prod":
        return ScanRule("{T}(1)", "{s} = {s} * {x};")
    if kind == "logsumexp":
        return ScanRule(
            "-std::numeric_limits<{T}>::infinity()", "{s} = ember::log_add_exp({x}, {s});"
        )
    if kind in ("max", "min", "argmax", "argmin"):
        direction = kind.removeprefix("arg")
        # the extreme a first element always replaces (NaN included): see the docstring
        init = extreme(direction == "max", dtype, ctype)
        update = (
            f"{{{{ const bool take = ember::scan_take_{direction}({{x}}, {{s}}); "
            "{s} = take ? {x} : {s}; {k} = take ? {r} : {k}; }}"
        )
        return ScanRule(init, update, stores_index=kind.startswith("arg"))
    return None


def column_shape(e: Emitter) -> bool:
    """Whether the innermost outer variable is the contiguous one of some access and
    the scanned variable is not (then the column shape's lanes read whole lines)."""
    kernel = e.ctx.kernel
    if not kernel.ranges or (static_int(kernel.ranges[-1]) or LANES) < 4:
        return False
    outer, inner = index_var("i", len(kernel.ranges) - 1), index_var("r", 0)
    for m in kernel.members:
        indices = [n.index for n in walk(m.body) if isinstance(n, Load)] + [m.index]
        for index in indices:
            along_inner = affine_coefficient(index, inner)
            if affine_coefficient(index, outer) == 1 and along_inner not in (0, 1):
                return True
    return False


def emit_scan(e: Emitter) -> None:
    kernel = e.ctx.kernel
    members = list(kernel.members)
    if any(m.kind != SCAN for m in members) or len(kernel.reduction_ranges) != 1:
        raise e.ctx.error("a scan kernel holds scans over one inner dimension only")
    rules = []
    for m in members:
        assert m.scan is not None
        ctype = e.ctx.ctype(m.body.dtype)
        rule = scan_rule(m.scan, m.body.dtype, ctype)
        if rule is None:
            raise e.ctx.error(f"scan {m.scan!r}")
        rules.append((m, rule, ctype))
    ranges = list(kernel.ranges)
    n = len(ranges)
    length = size(e, kernel.reduction_ranges[0])
    bounds = [size(e, r) for r in ranges]
    variables = [f"i{d}" for d in range(n)]
    column = column_shape(e)
    if column:
        e.line(f"const int64_t ember_blocks = ({bounds[-1]} + {LANES} - 1) / {LANES};")
        variables[-1], bounds[-1] = "ibk", "ember_blocks"
    parallel_pragma(e, [*ranges, kernel.reduction_ranges[0]], n)
    with nested_loops(e, variables, bounds):
        if column:
            last = size(e, ranges[-1])
            e.line(f"const int64_t ib = ibk * {LANES};")
            e.line(f"const int64_t ln = std::min<int64_t>({LANES}, {last} - ib);")
        lane = f"[{LANES}]" if column else ""
        for m, rule, ctype in rules:
            name = _state(m)
            indexed = "{k}" in rule.update
            e.line(f"{ctype} s_{name}{lane};")
            if indexed:
                e.line(f"int64_t k_{name}{lane};")
            init = f"s_{name}{{at}} = {rule.init.format(T=ctype)};"
            init += f" k_{name}{{at}} = 0;" if indexed else ""
            if column:
                with e.block(f"for (int64_t l = 0; l < {LANES}; ++l)"):
                    e.line(init.format(at="[l]"))
            else:
                e.line(init.format(at=""))
        with e.block(f"for (int64_t r0 = 0; r0 < {length}; ++r0)"):
            if column:
                with e.simd_loop("for (int64_t l = 0; l < ln; ++l)", index_var("i", n - 1)):
                    e.line(f"const int64_t i{n - 1} = ib + l;")
                    _step(e, rules, "[l]")
            else:
                _step(e, rules, "")


def _step(e: Emitter, rules: list[tuple[KernelMember, ScanRule, str]], at: str) -> None:
    """Fold each member's value at the current point into its state and store it."""
    for m, rule, ctype in rules:
        e.ctx.member = m.name
        value = e.value(m.body)
        state, index = f"s_{_state(m)}{at}", f"k_{_state(m)}{at}"
        e.line(rule.update.format(s=state, k=index, x=value, r="r0", T=ctype))
        if m.stored:
            stored = index if rule.stores_index else state
            target = e.ctx.ctype(m.dtype)
            if not rule.stores_index and target != ctype:
                stored = f"static_cast<{target}>({stored})"
            store(e, m, stored, m.index)
    e.ctx.member = None


def _state(member: KernelMember) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in member.name)
