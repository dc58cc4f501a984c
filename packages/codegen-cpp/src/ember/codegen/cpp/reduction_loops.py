"""Loop nests of reduction kernels (with their prologues and epilogues).

A reduction kernel's members run in *phases*: one pass over the reduction ranges
evaluates consecutive inner members (reductions, pointwise members over the inner
points) until a member reads a reduction of the current pass (softmax: max, then sum
of exp(x - max), then the division: three passes). Pointwise members over the outer
points only read finished reductions, so they run after the last pass.

Two loop shapes, chosen by which index is contiguous in the loads (column as soon as
one load reads a column):

- *row* (the innermost reduction variable is contiguous, e.g. a sum over the last
  axis): outer points in parallel; each pass keeps `ember::kLanes` accumulators, one
  per vector lane, over whole chunks of the innermost reduction variable (a constant
  trip count, so the accumulators stay in vector registers) and one partial chunk,
  then combines the lanes in order.
- *column* (the innermost outer variable is contiguous, e.g. a sum over axis 0):
  blocks of `kColumnLanes` (64) consecutive outer points in parallel; each lane
  accumulates one outer point while the reduction variables advance, so every load is
  contiguous and each row contributes whole cache lines (16 lanes read one line per
  row, 8 KiB apart for a 2048-wide row: the prefetchers lose track).

When there are fewer outer work items than threads and the reduction is long, each
pass splits the outermost reduction variable over the threads, each thread with its
own partial state, combined in thread order afterwards (per-thread partials).

The loop over outer points is `schedule(runtime)` (the prelude's
`EMBER_REDUCTION_SCHEDULE`), its schedule set just before it by thread count
(`ember::ReductionSchedule`: static on one thread, guided on more). It
cannot change a result: one call of `ember_point` reduces an outer point (or a column
block) whole, in an order fixed by the loops inside it, so a schedule only decides
which thread makes that call. Per-thread partials do not use the schedule: their
`omp parallel` splits the reduction by thread number into fixed ranges and the
partials are combined in thread order, so their result depends on the thread count,
as it always did, and on nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from ember.codegen.cpp.dtypes import round_to
from ember.codegen.cpp.emitter import Emitter
from ember.codegen.cpp.loops import nested_loops, parallel_pragma, size, store, store_member, work
from ember.codegen.cpp.reductions import ReductionRule, reduction_rule
from ember.ir import Load, Node, Op, walk
from ember.ir.symbolic import index_var, product, static_int
from ember.scheduler import POINTWISE, REDUCTION, FusedKernel, KernelMember
from ember.scheduler.indexing import affine_coefficient

LANES = 16  # ember::kLanes
ROW_CACHE_MAX = 8192  # elements of a reduction row whose costly values may be kept
COSTLY = frozenset({"exp", "exp2", "expm1", "log", "log2", "log1p", "erf", "tanh", "sigmoid"})
COSTLY |= {"pow", "sin", "cos", "atan2", "truediv", "sqrt"}
COLUMN_LANES = 64  # ember::kColumnLanes: a column block spans whole cache lines of a row
SPLIT_MIN = 4096  # ember::kSplitMin
MAX_THREADS = 256  # ember::kMaxThreads
SPLIT = (
    "const bool ember_split = "
    "ember_outer < omp_get_max_threads() && ember_inner >= ember::kSplitMin;"
)
SCHEDULE = "EMBER_REDUCTION_SCHEDULE"  # a macro of the prelude: runtime unless redefined
# sets the schedule that `schedule(runtime)` reads for the loop after it (the prelude)
SCHEDULE_SCOPE = "const ember::ReductionSchedule ember_schedule;"
THREADS = "#pragma omp parallel num_threads(std::min(omp_get_max_threads(), ember::kMaxThreads))"

Rules = list[tuple[KernelMember, ReductionRule, str]]  # member, its rule, accumulator type
Fields = list[tuple[str, str, str]]  # state variable suffix, C++ type, initial value


def phases(kernel: FusedKernel) -> list[list[KernelMember]]:
    """The inner members grouped into passes over the reduction ranges."""
    passes: list[list[KernelMember]] = []
    current: list[KernelMember] = []
    for member in kernel.members:
        if member.kind == POINTWISE and not member.over_reduction:
            continue
        reads = {n.buffer for n in walk(member.body) if isinstance(n, Load)}
        if reads & {m.name for m in current if m.kind == REDUCTION}:
            passes.append(current)
            current = []
        current.append(member)
    if current:
        passes.append(current)
    return passes


def column_layout(kernel: FusedKernel) -> bool:
    """True when some load is contiguous along the innermost outer variable and strided
    along the innermost reduction variable (a column read).

    Row loops would read such a load a whole column per outer point, a working set of
    one cache line per reduction point that falls out of L1 before the next outer point
    reuses it (a fused backward kernel summing columns while it writes rows ran at
    18 ns per element). Column loops read it contiguously, and read the row-contiguous
    loads as kColumnLanes lines that each serve 16 consecutive reduction points."""
    if not kernel.ranges or (static_int(kernel.ranges[-1]) or 64) < 4:
        return False
    outer = index_var("i", len(kernel.ranges) - 1)
    inner = index_var("r", len(kernel.reduction_ranges) - 1)
    local = kernel.local_reductions
    for member in kernel.members:
        for node in walk(member.body):
            if isinstance(node, Load) and node.buffer not in local:
                along_inner = affine_coefficient(node.index, inner)
                if affine_coefficient(node.index, outer) == 1 and along_inner not in (0, 1):
                    return True
    return False


class ReductionEmitter:
    """Emits one reduction kernel's body."""

    def __init__(self, e: Emitter) -> None:
        self.e = e
        self.kernel = e.ctx.kernel
        self.column = column_layout(self.kernel)
        self.width = "ember::kColumnLanes" if self.column else "ember::kLanes"
        self.n = len(self.kernel.ranges)
        self.m = len(self.kernel.reduction_ranges)
        self.cached: list[tuple[Node, int]] = []  # row cache: (value, pass computing it)
        self.cache_size = 0
        self.current = 0  # the pass being emitted

    def emit(self) -> None:
        e, kernel = self.e, self.kernel
        ranges = list(kernel.ranges)
        variables = [f"i{d}" for d in range(self.n)]
        bounds = [size(e, r) for r in ranges]
        if self.column:
            variables[-1] = "ib"
            e.line(
                f"const int64_t ember_blocks = ({bounds[-1]} + {self.width} - 1) / {self.width};"
            )
            bounds[-1] = "ember_blocks"
            outer = " * ".join(bounds)
        else:
            outer = work(e, ranges)
        e.line(f"const int64_t ember_outer = {outer};")
        e.line(f"const int64_t ember_inner = {work(e, kernel.reduction_ranges)};")
        if self._may_split():
            e.line(SPLIT)
        else:
            e.line("const bool ember_split = false;  // too little work to split over threads")
        params = "".join(f"int64_t {v}, " for v in variables)
        with e.block(f"auto ember_point = [&]({params}bool split)", close="};"):
            if self.column:
                last = size(e, ranges[-1])
                e.line(f"const int64_t ln = std::min<int64_t>({self.width}, {last} - ib);")
            passes = phases(kernel)
            self.cached = self._row_cache(passes)
            for k, (node, _) in enumerate(self.cached):
                self.e.line(f"{e.ctx.ctype(node.dtype)} ember_cache{k}[{self.cache_size}];")
            for number, members in enumerate(passes):
                self.current = number
                self._phase(members)
            self._outer_members()
        if self.n == 0:
            e.line("ember_point(ember_split);")
            return
        loop_vars = [*variables[:-1], "ibk" if self.column else variables[-1]]
        args = [*variables[:-1], f"ibk * {self.width}" if self.column else variables[-1]]
        call = "ember_point(" + "".join(f"{a}, " for a in args)
        with e.block("if (ember_split)"), nested_loops(e, loop_vars, bounds):
            e.line(call + "true);")
        with e.block("else"):
            parallel_pragma(
                e,
                [*ranges, *kernel.reduction_ranges],
                self.n,
                schedule=SCHEDULE,
                before=SCHEDULE_SCOPE,
            )
            with nested_loops(e, loop_vars, bounds):
                e.line(call + "false);")

    def _row_cache(self, passes: list[list[KernelMember]]) -> list[tuple[Node, int]]:
        """Costly values that a later pass recomputes at the same reduction points
        (softmax: exp(x - max) in the sum and again in the division): the first pass
        keeps them in a per-row stack array and later ones read it. Row shape only, for
        static reductions that fit the cache and are never split over threads."""
        inner = static_int(sympy.expand(product(self.kernel.reduction_ranges)))
        if self.column or inner is None or inner > ROW_CACHE_MAX or self._may_split():
            return []
        self.cache_size = inner
        seen: dict[Node, int] = {}
        found: dict[Node, int] = {}
        for number, members in enumerate(passes):
            nodes = {n for m in members for n in walk(m.body)}
            for node in nodes:
                if node in seen and seen[node] < number and _costly(node):
                    found.setdefault(node, seen[node])
            for node in nodes:
                seen.setdefault(node, number)
        inside = {n for node in found for n in walk(node) if n is not node}
        return [(node, first) for node, first in found.items() if node not in inside]

    def _may_split(self) -> bool:
        """Whether per-thread partials can ever pay off (decided at run time)."""
        kernel = self.kernel
        inner = static_int(sympy.expand(product(kernel.reduction_ranges)))
        outer = static_int(sympy.expand(product(kernel.ranges))) if kernel.ranges else 1
        if self.column and outer is not None:
            outer = -(-outer // COLUMN_LANES)
        return (inner is None or inner >= SPLIT_MIN) and (outer is None or outer < MAX_THREADS)

    # -- one pass ---------------------------------------------------------------------

    def _rules(self, members: Sequence[KernelMember]) -> Rules:
        found = []
        for member in members:
            if member.kind != REDUCTION:
                continue
            assert member.reduction is not None
            ctype = self.e.ctx.ctype(member.body.dtype)
            rule = reduction_rule(member.reduction, member.body.dtype, ctype)
            if rule is None:
                raise self.e.ctx.error(f"reduction {member.reduction!r}")
            found.append((member, rule, ctype))
        return found

    def _fields(self, rules: Rules) -> Fields:
        """(name suffix, C++ type, init) of every state field of the pass."""
        return [
            (f"{member.name}_{j}", ftype.format(T=ctype), init)
            for member, rule, ctype in rules
            for j, (ftype, init) in enumerate(rule.fields)
        ]

    def _phase(self, members: list[KernelMember]) -> None:
        e = self.e
        rules = self._rules(members)
        fields = self._fields(rules)
        lane = f"[{self.width}]" if self.column else ""
        at = "[l]" if self.column else ""
        e.line("// pass over the reduction: " + ", ".join(m.name for m in members))
        for name, ftype, _ in fields:
            e.line(f"{ftype} a_{name}{lane};")
        self._init(fields, "a", at)
        with e.block(""):
            ref = "*" if self.column else "&"
            params = "".join(f", {ftype}{ref} s_{name}" for name, ftype, _ in fields)
            with e.block(f"auto ember_run = [&](int64_t r_lo, int64_t r_hi{params})", close="};"):
                if self.column:
                    self._column_loops(members, rules)
                else:
                    self._row_loops(members, rules, fields)
            if self._may_split():
                self._drive(fields, rules)
            else:
                args = "".join(f", a_{name}" for name, _, _ in fields)
                e.line(f"ember_run(0, {size(e, self.kernel.reduction_ranges[0])}{args});")
        self._finish(rules)

    def _init(self, fields: Fields, prefix: str, at: str, lanes: bool = True) -> None:
        if not fields:
            return
        if at and lanes:
            with self.e.block(f"for (int64_t l = 0; l < {self.width}; ++l)"):
                for name, _, init in fields:
                    self.e.line(f"{prefix}_{name}{at} = {init};")
        else:
            for name, _, init in fields:
                self.e.line(f"{prefix}_{name}{at} = {init};")

    def _linear(self) -> str:
        dims = self.kernel.reduction_ranges
        terms = [index_var("r", d) * product(dims[d + 1 :]) for d in range(self.m)]
        return self.e.ctx.index(sympy.expand(sympy.Add(*terms)))

    def _evaluate(
        self,
        members: list[KernelMember],
        rules: Rules,
        state: str,
        uniform: bool = False,
    ) -> None:
        """The pass's bodies at one point: reductions update `state`, inner pointwise
        members store. `uniform`: every lane has seen as many values as there are whole
        chunks so far (`ember_w` is 1 / that count, for rules that use it)."""
        e = self.e
        rule_of = {m.name: (rule, ctype) for m, rule, ctype in rules}
        for k, (node, first) in enumerate(self.cached):
            if first < self.current and any(node in walk(m.body) for m in members):
                name = e.fresh()
                e.line(
                    f"const {e.ctx.ctype(node.dtype)} {name} = ember_cache{k}[{self._linear()}];"
                )
                e.scopes[-1][node] = name
        for member in members:
            e.ctx.member = member.name
            value = e.value(member.body)
            if member.name not in rule_of:
                store(e, member, value, member.index)
                continue
            rule, ctype = rule_of[member.name]
            slots = {f"s{j}": f"{state}_{member.name}_{j}[l]" for j in range(len(rule.fields))}
            update = rule.uniform_update if uniform and rule.uniform_update else rule.update
            e.line(update.format(x=value, r=self._linear(), T=ctype, w="ember_w", **slots))
        e.ctx.member = None
        for k, (node, first) in enumerate(self.cached):
            if first == self.current:
                e.line(f"ember_cache{k}[{self._linear()}] = {e.value(node)};")

    def _row_loops(self, members: list[KernelMember], rules: Rules, fields: Fields) -> None:
        e = self.e
        ranges = self.kernel.reduction_ranges
        for name, ftype, _ in fields:
            e.line(f"{ftype} l_{name}[ember::kLanes];")
        self._init(fields, "l", "[l]")
        last = self.m - 1
        lo, hi = ("r_lo", "r_hi") if self.m == 1 else ("0", size(e, ranges[-1]))
        outermost = e.block("for (int64_t r0 = r_lo; r0 < r_hi; ++r0)" if self.m > 1 else "")
        middle = [f"r{d}" for d in range(1, last)]
        lane = index_var("r", last)
        # lanes see equal counts in whole chunks unless a partial chunk comes between
        whole = static_int(ranges[-1])
        uniform = any(rule.uniform_update for _, rule, _ in rules) and (
            self.m == 1 or (whole is not None and whole % LANES == 0)
        )
        if uniform:
            e.line("int64_t ember_chunks = 0;")
        with outermost, nested_loops(e, middle, [size(e, r) for r in ranges[1:last]]):
            # whole chunks with a constant trip count (one or two vectors, accumulators
            # kept in registers), then one partial chunk: a variable count in every
            # chunk costs a vector prologue and epilogue per 16 elements
            e.line(f"const int64_t rm = {lo} + ({hi} - {lo}) / ember::kLanes * ember::kLanes;")
            with e.block("for (int64_t rb = " + lo + "; rb < rm; rb += ember::kLanes)"):
                if uniform:
                    e.line("const double ember_w = 1.0 / double(++ember_chunks);")
                with e.simd_loop("for (int64_t l = 0; l < ember::kLanes; ++l)", lane):
                    e.line(f"const int64_t r{last} = rb + l;")
                    self._evaluate(members, rules, "l", uniform)
            with e.block(f"if (rm < {hi})"):
                e.line(f"const int64_t rb = rm, rn = {hi} - rm;")
                with e.simd_loop("for (int64_t l = 0; l < rn; ++l)", lane):
                    e.line(f"const int64_t r{last} = rb + l;")
                    self._evaluate(members, rules, "l")
        if fields:
            self._combine_lanes(rules)

    def _combine_lanes(self, rules: Rules) -> None:
        """Fold the kLanes accumulators into the state in a fixed tree: lane l takes
        lane l + h for h = 8, 4, 2, 1, each level a vector operation. A sequential
        fold is 16 dependent scalar steps, as long as the whole row for rows of a
        few hundred elements (softmax over 128: 40% of the kernel)."""
        width = LANES // 2
        while width > 1:
            with self.e.simd_loop(f"for (int64_t l = 0; l < {width}; ++l)"):
                self._combine(rules, "l", "[l]", "l", f"[l + {width}]")
            width //= 2
        self._combine(rules, "l", "[0]", "l", "[1]")
        self._combine(rules, "s", "", "l", "[0]")

    def _column_loops(self, members: list[KernelMember], rules: Rules) -> None:
        e = self.e
        ranges = self.kernel.reduction_ranges
        with (
            e.block("for (int64_t r0 = r_lo; r0 < r_hi; ++r0)"),
            nested_loops(e, [f"r{d}" for d in range(1, self.m)], [size(e, r) for r in ranges[1:]]),
            e.simd_loop("for (int64_t l = 0; l < ln; ++l)", index_var("i", self.n - 1)),
        ):
            e.line(f"const int64_t i{self.n - 1} = ib + l;")
            self._evaluate(members, rules, "s")

    def _combine(self, rules: Rules, a: str, a_at: str, b: str, b_at: str) -> None:
        for member, rule, ctype in rules:
            slots = {f"a{j}": f"{a}_{member.name}_{j}{a_at}" for j in range(len(rule.fields))}
            slots |= {f"b{j}": f"{b}_{member.name}_{j}{b_at}" for j in range(len(rule.fields))}
            self.e.line(rule.combine.format(T=ctype, **slots))

    def _drive(self, fields: Fields, rules: Rules) -> None:
        """Run the pass over the whole reduction, or split over threads."""
        e = self.e
        first = size(e, self.kernel.reduction_ranges[0])
        lane = f"[{self.width}]" if self.column else ""
        args = "".join(f", a_{name}" for name, _, _ in fields)
        with e.block("if (split)"):
            for name, ftype, _ in fields:
                e.line(f"{ftype} part_{name}[ember::kMaxThreads]{lane};")
            e.line("int ember_nt = 1;")
            e.line(THREADS)
            with e.block(""):
                e.line("const int t = omp_get_thread_num(), nt = omp_get_num_threads();")
                e.line("if (t == 0) ember_nt = nt;")
                if self.column:
                    self._init(fields, "part", "[t][l]")
                else:
                    self._init(fields, "part", "[t]", lanes=False)
                parts = "".join(f", part_{name}[t]" for name, _, _ in fields)
                e.line(f"ember_run({first} * t / nt, {first} * (t + 1) / nt{parts});")
            with e.block("for (int t = 0; t < ember_nt; ++t)"):
                if self.column:
                    with e.block(f"for (int64_t l = 0; l < {self.width}; ++l)"):
                        self._combine(rules, "a", "[l]", "part", "[t][l]")
                else:
                    self._combine(rules, "a", "", "part", "[t]")
        with e.block("else"):
            e.line(f"ember_run(0, {first}{args});")

    def _finish(self, rules: Rules) -> None:
        """Register the pass's results for later loads, and store the stored ones."""
        e = self.e
        at = "[l]" if self.column else ""
        stored = [(m, rule) for m, rule, _ in rules if m.stored]
        for member, rule, _ in rules:
            e.ctx.local_values[member.name] = tuple(
                round_to(member.dtype, f"a_{member.name}_{j}{at}") for j in rule.results
            )
        if not stored:
            return
        if self.column:
            with e.simd_loop("for (int64_t l = 0; l < ln; ++l)", index_var("i", self.n - 1)):
                e.line(f"const int64_t i{self.n - 1} = ib + l;")
                self._store_results(stored)
        else:
            self._store_results(stored)

    def _store_results(self, stored: list[tuple[KernelMember, ReductionRule]]) -> None:
        for member, _ in stored:
            values = self.e.ctx.local_values[member.name]
            store(self.e, member, values[0], member.index)
            if len(values) > 1:  # welford: M2 next to the mean
                store(
                    self.e, member, values[1], sympy.expand(member.index + member.layout.stride[-1])
                )

    def _outer_members(self) -> None:
        e = self.e
        outer = [m for m in self.kernel.members if m.kind == POINTWISE and not m.over_reduction]
        if not outer:
            return
        e.line("// pointwise members over the outer points")
        if self.column:
            with e.simd_loop("for (int64_t l = 0; l < ln; ++l)", index_var("i", self.n - 1)):
                e.line(f"const int64_t i{self.n - 1} = ib + l;")
                self._outer_bodies(outer)
        else:
            self._outer_bodies(outer)

    def _outer_bodies(self, members: list[KernelMember]) -> None:
        for member in members:
            self.e.ctx.member = member.name
            store_member(self.e, member)
        self.e.ctx.member = None


def _costly(node: Node) -> bool:
    """Whether a value is worth keeping rather than recomputing: an op (not a plain load)
    with a transcendental or a division inside."""
    return isinstance(node, Op) and any(isinstance(n, Op) and n.name in COSTLY for n in walk(node))
