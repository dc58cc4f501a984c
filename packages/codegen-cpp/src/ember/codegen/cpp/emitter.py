"""The body emitter: an IR body DAG (ember.ir.expr) as C++ statements.

Every node becomes one `const <type> tN = ...;` line, emitted once per scope (the DAG
is walked children first and memoised, so shared subexpressions cost once, and a value
computed in an enclosing scope is reused by inner ones). Loads read `p_<buffer>[index]`
with the index printed by ember.codegen.cpp.indexing; half types convert through bits;
masked loads read memory only where the mask holds; indirect loads rename `ind<k>` to
the temporary of their k-th indirect value.

Inside an `omp simd` loop, a masked load whose index never leaves the elements it
reads where its mask holds (a pool's taps that padding cannot push out), or that does
not move along the loop (a padded broadcast), reads unconditionally, clamped to those
elements where needed, then selects `mask ? value : other`: the same values, with no
masked load to keep the loop scalar (ember.codegen.cpp.masked_loads; other masked
loads keep the masked form). Loads of a kernel-local reduction read the
C++ value the loop emitter registered for it (`KernelContext.local_values`). Float32
GELU as ember.ir lowers it is written as one prelude call, `ember::gelu(x)`
(`gelu_operand`), its formula's inner nodes not emitted.

Errors found while a kernel runs (an index out of its dimension, an integer division
by zero) cannot throw through C: each is one of the kernel's `KernelCheck`s, and the
code that finds it records its number, the bad value and the size in the kernel's
error record (`ember_error`, a parameter of kernels that have checks), which the
runtime reads after the kernel returns. Meanwhile the kernel goes on with a harmless
value: index 0 (a load or store guarded by `size > 0` where the size may be 0), a
divisor of 1, so it never faults. Inside an `omp simd` loop (`Emitter.simd_loop`) an
index check is branch-free, so the loop still vectorises: each lane takes the index
or 0, the loop keeps the smallest and largest index seen (min/max reductions), and
one test after the loop records the error.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import sympy
import torch

from ember.codegen.cpp.dtypes import (
    HALF_TYPES,
    compute_type,
    int_literal,
    literal,
    load_value,
    round_to,
    storage_type,
    store_value,
)
from ember.codegen.cpp.errors import CppRenderError
from ember.codegen.cpp.indexing import IndexPrintError, print_index
from ember.codegen.cpp.info import KernelCheck
from ember.codegen.cpp.masked_loads import Box, clamp_bounds, loop_box, moves_with
from ember.codegen.cpp.ops_table import render_op
from ember.ir import Cast, CheckIndex, Const, IndexExpr, Load, Node, Op, Rand, Where, walk
from ember.ir.expr import may_divide_by_zero
from ember.ir.symbolic import indirect_var
from ember.scheduler import FusedKernel

ERROR_RECORD = "ember_error"  # the kernel parameter: int64_t[3], check + 1, value, size


@dataclass
class KernelContext:
    """What rendering one kernel needs to know beyond the body being emitted."""

    kernel: FusedKernel
    pointers: dict[str, str]  # buffer -> C++ parameter name
    pointer_dtypes: dict[str, torch.dtype]  # buffer -> dtype of its parameter
    local_values: dict[str, tuple[str, ...]] = field(default_factory=dict)
    member: str | None = None  # the member being emitted (for error messages)
    # loads read from elsewhere than their buffer (a transposed stack tile): the
    # C++ element, in the load's storage type
    load_overrides: dict[Load, str] = field(default_factory=dict)
    counter: Iterator[int] = field(default_factory=itertools.count)
    checks: list[KernelCheck] = field(default_factory=list)
    _loops: Box | None = None

    @property
    def loops(self) -> Box:
        """The kernel's loop variables with static ranges, and their ranges."""
        if self._loops is None:
            self._loops = loop_box(self.kernel)
        return self._loops

    def check(self, check: KernelCheck) -> int:
        """The number of `check` in this kernel's error record (one per distinct check)."""
        if check not in self.checks:
            self.checks.append(check)
        return self.checks.index(check)

    def error(self, what: str) -> CppRenderError:
        return CppRenderError(what, self.kernel.name, self.member)

    def ctype(self, dtype: torch.dtype) -> str:
        return compute_type(dtype, self.kernel.name)

    def index(self, expr: sympy.Expr, names: dict[sympy.Symbol, str] | None = None) -> str:
        try:
            return print_index(expr, names)
        except IndexPrintError as exc:
            raise self.error(str(exc)) from exc


@dataclass(frozen=True)
class SimdCheck:
    """An index check inside a simd loop: the loop's min/max reduction variables, and
    what to test against after it."""

    number: int
    low: str  # C++ of the smallest valid index (loop-invariant)
    size: str
    smallest: str
    largest: str


class Emitter:
    """C++ lines at a current indentation, with nested scopes of memoised temporaries."""

    def __init__(self, ctx: KernelContext, depth: int = 1) -> None:
        self.ctx = ctx
        self.lines: list[str] = []
        self.depth = depth
        self.scopes: list[dict[Node, str]] = [{}]
        self.simd_checks: list[SimdCheck] | None = None  # inside a simd loop
        self.lane: sympy.Symbol | None = None  # the variable a simd loop advances

    def line(self, text: str) -> None:
        self.lines.append("  " * self.depth + text if text else "")

    def raw(self, text: str) -> None:
        """A line without indentation (preprocessor directives)."""
        self.lines.append(text)

    @contextmanager
    def block(self, header: str, close: str = "}") -> Iterator[None]:
        self.line(f"{header} {{" if header else "{")
        self.depth += 1
        self.scopes.append({})
        try:
            yield
        finally:
            self.scopes.pop()
            self.depth -= 1
            self.line(close)

    @contextmanager
    def simd_loop(self, header: str, lane: sympy.Symbol | None = None) -> Iterator[None]:
        """`#pragma omp simd` and the loop `header`, with the reductions and the
        after-loop test of the index checks emitted inside (see the module docstring).
        `lane`: the kernel variable (`i2`, `r1`) that goes up by one from each
        iteration to the next, where there is one (which masked loads read
        unconditionally depends on it: ember.codegen.cpp.masked_loads)."""
        at = len(self.lines)
        self.line("#pragma omp simd")
        outer, self.simd_checks = self.simd_checks, []
        outer_lane, self.lane = self.lane, lane
        try:
            with self.block(header):
                yield
            found = self.simd_checks
        finally:
            self.simd_checks = outer
            self.lane = outer_lane
        if not found:
            return
        indent = "  " * self.depth
        smallest = ", ".join(c.smallest for c in found)
        largest = ", ".join(c.largest for c in found)
        self.lines[at] += f" reduction(min:{smallest}) reduction(max:{largest})"
        self.lines[at:at] = [
            f"{indent}int64_t {c.smallest} = INT64_MAX, {c.largest} = INT64_MIN;" for c in found
        ]
        for c in found:
            self.line(
                f"if ({c.smallest} < {c.low} || {c.largest} >= {c.size}) ember::fail("
                f"{ERROR_RECORD}, {c.number}, {c.largest} >= {c.size} ? {c.largest} : "
                f"{c.smallest}, {c.size});"
            )

    def fresh(self) -> str:
        return f"t{next(self.ctx.counter)}"

    def _known(self, node: Node) -> str | None:
        for scope in reversed(self.scopes):
            if node in scope:
                return scope[node]
        return None

    def value(self, root: Node) -> str:
        """The temporary holding `root`'s value, emitting what is not yet computed."""
        for node in _walk_with_gelu(root):
            if self._known(node) is None:
                self.scopes[-1][node] = self._emit(node)
        known = self._known(root)
        assert known is not None
        return known

    def _define(self, dtype: torch.dtype, expression: str) -> str:
        name = self.fresh()
        self.line(f"const {self.ctx.ctype(dtype)} {name} = {expression};")
        return name

    def _emit(self, node: Node) -> str:
        ctx = self.ctx
        if isinstance(node, Const):
            return self._define(node.dtype, literal(node.value, node.dtype, ctx.kernel.name))
        if isinstance(node, IndexExpr):
            text = ctx.index(node.expr)
            if node.dtype != torch.int64:
                text = f"static_cast<{ctx.ctype(node.dtype)}>({text})"
            return self._define(node.dtype, text)
        if isinstance(node, Load):
            return self._load(node)
        if isinstance(node, Op):
            gelu = gelu_operand(node)
            if gelu is not None:
                return self._define(node.dtype, f"ember::gelu({self._known(gelu)})")
            args = [self._known(a) or "" for a in node.args]
            if may_divide_by_zero(node):
                check = ctx.check(
                    KernelCheck("division", f"{node.name} of kernel {ctx.kernel.name}")
                )
                args[1] = f"ember::divisor({args[1]}, {ERROR_RECORD}, {check})"
            expression = render_op(node.name, args, ctx.kernel.name, ctx.member)
            return self._define(node.dtype, round_to(node.dtype, expression))
        if isinstance(node, Cast):
            return self._define(node.dtype, self._cast(node))
        if isinstance(node, Where):
            c, a, b = (self._known(n) for n in (node.cond, node.a, node.b))
            return self._define(node.dtype, f"{c} ? {a} : {b}")
        if isinstance(node, Rand):
            return self._rand(node)
        if isinstance(node, CheckIndex):
            return self._check_index(node)
        raise ctx.error(f"body node {type(node).__name__}")

    def _check_index(self, node: CheckIndex) -> str:
        index, size, low = self._known(node.index), self._known(node.size), self.value(node.low)
        number = self.ctx.check(KernelCheck("index", node.describe(), node.dim))
        mask = self._known(node.mask) if node.mask is not None else None
        if self.simd_checks is not None and isinstance(node.size, IndexExpr):
            # branch-free: a call on the error path would keep the loop scalar
            smallest, largest = f"{self.fresh()}_lo", f"{self.fresh()}_hi"
            size_text = self.ctx.index(node.size.expr)
            low_text = "0" if not node.wraps else f"-({size_text})"
            self.simd_checks.append(SimdCheck(number, low_text, size_text, smallest, largest))
            seen = index if mask is None else f"{mask} ? {index} : {low}"
            self.line(f"{smallest} = std::min<int64_t>({smallest}, {seen});")
            self.line(f"{largest} = std::max<int64_t>({largest}, {seen});")
            return self._define(
                torch.int64, f"({index} >= {low} && {index} < {size}) ? {index} : 0"
            )
        checked = f"ember::checked_index({index}, {low}, {size}, {ERROR_RECORD}, {number})"
        if mask is not None:
            checked = f"{mask} ? {checked} : {index}"
        return self._define(torch.int64, checked)

    def size_guards(self, roots: tuple[Node, ...]) -> list[str]:
        """Conditions `size > 0` for the checked dimensions under `roots` (indirect
        values) whose size may be 0: there, even the index a failed check leaves (0)
        is outside, so the access itself must be skipped."""
        guards = []
        for root in roots:
            for node in walk(root):
                if isinstance(node, CheckIndex) and not _positive(node.size):
                    guard = f"{self.value(node.size)} > 0"
                    if guard not in guards:
                        guards.append(guard)
        return guards

    def _cast(self, node: Cast) -> str:
        source = self._known(node.x)
        if node.to == torch.bool:
            return f"{source} != 0"
        target = self.ctx.ctype(node.to)
        if self.ctx.ctype(node.x.dtype) == target and node.to not in HALF_TYPES:
            return f"{source}"
        return round_to(node.to, f"static_cast<{target}>({source})")

    def _rand(self, node: Rand) -> str:
        seed = self.pointer(node.seed, torch.int64)
        counter = self.ctx.index(sympy.expand(node.offset + node.index))
        function = "rand_uniform" if node.distribution == "uniform" else "rand_normal"
        if node.distribution not in ("uniform", "normal"):
            raise self.ctx.error(f"random distribution {node.distribution!r}")
        value = f"ember::{function}({seed}[0], {counter})"
        if node.dtype != torch.float32:
            value = round_to(node.dtype, f"static_cast<{self.ctx.ctype(node.dtype)}>({value})")
        return self._define(node.dtype, value)

    def pointer(self, buffer: str, dtype: torch.dtype) -> str:
        """The C++ pointer to `buffer`'s storage, seen as elements of `dtype`."""
        name = self.ctx.pointers[buffer]
        if self.ctx.pointer_dtypes[buffer] == dtype:
            return name
        const = "" if name.startswith("out_") else "const "
        return f"reinterpret_cast<{const}{storage_type(dtype)}*>({name})"

    def stored_bits(self, body: Node, dtype: torch.dtype) -> str:
        """C++ for the stored bits of `body` computed as `dtype`. A half-typed load
        stored as its own dtype copies its bits, as torch's copies do: no conversion
        through float, and a NaN keeps its sign and payload."""
        if (
            isinstance(body, Load)
            and body.dtype == dtype
            and dtype in HALF_TYPES
            and body.mask is None
            and body.buffer not in self.ctx.local_values
            and not self.size_guards(body.indirect)
        ):
            return self._element(body)
        return store_value(dtype, self.value(body))

    def _element(self, node: Load) -> str:
        """The stored element a direct load reads (its storage type, unconverted)."""
        ctx = self.ctx
        if node in ctx.load_overrides:
            return ctx.load_overrides[node]
        names = {
            indirect_var(k): f"static_cast<int64_t>({self.value(n)})"
            for k, n in enumerate(node.indirect)
        }
        index = ctx.index(node.index, names)
        if node.indirect:
            index_name = self.fresh()
            self.line(f"const int64_t {index_name} = {index};")
            check = f'ember::check_index("{ctx.kernel.name}", "{node.buffer}", {index_name}, -1);'
            if node.mask is not None:
                check = f"if ({self._known(node.mask)}) {check}"
            self.raw("#ifdef EMBER_DEBUG_BOUNDS")
            self.line(check)
            self.raw("#endif")
            index = index_name
        return f"{self.pointer(node.buffer, node.dtype)}[{index}]"

    def _load(self, node: Load) -> str:
        ctx = self.ctx
        if node.buffer in ctx.local_values:
            member, which = ctx.kernel.local_value(node)
            return self._define(node.dtype, ctx.local_values[member.name][which])
        bounds = self._clamp_bounds(node)
        if bounds is not None and node.mask is not None:
            # every lane reads (a plain or a broadcast load); masked-off lanes read an
            # element the masked form reads elsewhere, and drop it
            low, high = bounds
            index = ctx.index(node.index)
            if low is not None:
                index = f"std::max<int64_t>({index}, {int_literal(low)})"
            if high is not None:
                index = f"std::min<int64_t>({index}, {int_literal(high)})"
            pointer = self.pointer(node.buffer, node.dtype)
            element = f"{pointer}[{index}]"
            value = self._define(node.dtype, load_value(node.dtype, element))
            other = literal(node.other, node.dtype, ctx.kernel.name)
            return self._define(node.dtype, f"{self._known(node.mask)} ? {value} : {other}")
        element = load_value(node.dtype, self._element(node))
        conditions = self.size_guards(node.indirect)
        if node.mask is not None:
            conditions.insert(0, self._known(node.mask) or "")
        if conditions:
            other = literal(node.other, node.dtype, ctx.kernel.name)
            element = f"{' && '.join(conditions)} ? {element} : {other}"
        return self._define(node.dtype, element)

    def _clamp_bounds(self, node: Load) -> tuple[int | None, int | None] | None:
        """Where a masked load in a simd loop reads unconditionally, the bounds its
        index is clamped to (None for a side it never passes): where no clamp is
        needed, or where the index does not move along the loop (a clamped load is a
        broadcast there, but a gather elsewhere: slower than the scalar loop). See
        ember.codegen.cpp.masked_loads."""
        ctx = self.ctx
        if node.mask is None or self.lane is None or node in ctx.load_overrides:
            return None
        if node.buffer in ctx.local_values:
            return None
        bounds = clamp_bounds(node, ctx.loops)
        if bounds is None or bounds == (None, None):
            return bounds
        return None if moves_with(node.index, self.lane) else bounds


def gelu_operand(node: Node) -> Node | None:
    """x where `node` is float32 GELU as ember.ir lowers `aten.gelu` (approximate
    "none"): `(x * 0.5) * (1 + erf(x * sqrt(1/2)))`, else None. The emitter writes it
    as one call, `ember::gelu(x)` (the prelude's: fewer operations than the formula,
    and more precise for negative x); anything else in that shape, or another
    dtype, stays op by op."""
    if not (isinstance(node, Op) and node.name == "mul" and node.dtype == torch.float32):
        return None
    for half, one_plus in (node.args, node.args[::-1]):
        x = _times_constant(half, 0.5)
        if x is None or not (isinstance(one_plus, Op) and one_plus.name == "add"):
            continue
        for one, erf in (one_plus.args, one_plus.args[::-1]):
            if not (_is_constant(one, 1.0) and isinstance(erf, Op) and erf.name == "erf"):
                continue
            if _times_constant(erf.args[0], math.sqrt(0.5)) is x:
                return x
    return None


def _is_constant(node: Node, value: float) -> bool:
    return isinstance(node, Const) and node.dtype == torch.float32 and node.value == value


def _times_constant(node: Node, value: float) -> Node | None:
    """y where `node` is `y * value` (either order) in float32, else None."""
    if not (isinstance(node, Op) and node.name == "mul" and node.dtype == torch.float32):
        return None
    a, b = node.args
    if _is_constant(b, value) and a.dtype == torch.float32:
        return a
    if _is_constant(a, value) and b.dtype == torch.float32:
        return b
    return None


def _walk_with_gelu(root: Node) -> Iterator[Node]:
    """`walk(root)`, children before parents, but a GELU (`gelu_operand`) has x as its
    only child: the formula's inner nodes are not emitted for it."""
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            yield node
            continue
        stack.append((node, True))
        x = gelu_operand(node)
        for child in reversed((x,) if x is not None else node.children()):
            if id(child) not in seen:
                stack.append((child, False))


def _positive(size: Node) -> bool:
    """Whether a checked dimension's size is known to be at least 1."""
    if not isinstance(size, IndexExpr):
        return False
    expr = sympy.sympify(size.expr)
    return bool(expr.is_Integer and int(expr) > 0)
