"""Fusion: group the program's loop nodes into kernels, greedily and deterministically.

The algorithm walks the program once, in order. Each computed buffer joins the
existing group where fusing it saves the most bytes (ties: the earliest group), or
starts a new group. Joining group G is legal when

1. everything the node reads is computed inside G or before G starts, every
   data-dependent size it uses is bound before G starts, and no mutation lies
   between G's start and the node (the node moves up to G's place);
2. the iteration spaces line up: same ranges (pointwise with pointwise), a pointwise
   node over `outer ++ inner` or over `outer` of a reduction group (epilogue), a
   reduction over `outer x inner` of a pointwise group (prologue), or another
   reduction over the same `outer x inner`;
3. every load of a member of G reads exactly the element G computes at the same point
   (no mask, no indirection): a pointwise member is then inlined into the reader, a
   reduction member is read as the kernel-local value;
4. inlining copies no body heavier than `DeviceChoices.max_inline_ops`.

A scan (cumsum, cummax, ...) joins only another scan over the same outer x inner
space that reads nothing the group computes (cummax's values beside its indices):
its inner dimension is walked in order carrying running values, which no pointwise
or reduction member of a kernel expects. Its producer is already inlined into its
body by lowering; its readers run in kernels of their own. A sort likewise joins only
a sort of the same body over the same space in the same direction (sort's values
beside its indices), so that codegens sort the row once for both.

Scatters and mutations of inputs stay alone; extern calls are never fused and nothing
is fused across them when they read what a node of the group computes.

A matmul product (`matmuls`: ember.scheduler.epilogue) starts a kernel of its own and
joins none; its kernel takes only pointwise epilogues over its outer space that read
something the kernel computes.

Score: the bytes that fusing keeps out of memory, counted with all size symbols at
`ember.ir.SIZE_HINT` (only the order of candidates matters). Vertical fusion saves the
producer's reads; horizontal fusion (siblings sharing an input, same iteration space)
saves one read of the shared input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy
from torch.utils._sympy.functions import ModularIndexing

from ember.ir import (
    ComputedBuffer,
    ExternKernel,
    Load,
    MultiOutput,
    Node,
    Op,
    Program,
    walk,
)
from ember.ir.expr import map_dag, map_indices, replace_index
from ember.ir.loops import Pointwise, Reduction, Scan, Scatter, Sort, loop_bodies
from ember.ir.nodes import ComputeNode
from ember.ir.symbolic import index_var, product, size_hint
from ember.scheduler.choices import DeviceChoices
from ember.scheduler.indexing import affine_coefficient, body_exprs, store_index
from ember.scheduler.iteration import merge_loop
from ember.scheduler.kernel import POINTWISE, REDUCTION, SCAN, SCATTER, SORT


@dataclass
class Member:
    """A computed buffer placed in a group, its body and index in the group's variables."""

    buffer: ComputedBuffer
    kind: str
    body: Node
    index: sympy.Expr
    over_reduction: bool


@dataclass
class Group:
    position: int  # index in program.nodes of the first member: where the kernel runs
    ranges: tuple[sympy.Expr, ...]
    reduction_ranges: tuple[sympy.Expr, ...]
    members: list[Member] = field(default_factory=list)
    closed: bool = False  # scatters and mutations take no company
    # a closed group of pointwise writes into inputs that other such writes over the
    # same space may join (`Fuser._join_write_batch`)
    batch: bool = False
    # inputs (alias roots) a member writes in place (`Fuser._join_as_write`): nothing
    # reading their old values may join later
    writes: set[str] = field(default_factory=set)

    def names(self) -> set[str]:
        return {m.buffer.name for m in self.members}

    def member(self, name: str) -> Member | None:
        for m in self.members:
            if m.buffer.name == name:
                return m
        return None

    def loads(self) -> set[str]:
        return {n.buffer for m in self.members for n in walk(m.body) if isinstance(n, Load)}


def body_cost(body: Node) -> int:
    return sum(1 for n in walk(body) if isinstance(n, Op))


def _kind(buffer: ComputedBuffer) -> str:
    if isinstance(buffer.loop, Scatter):
        return SCATTER
    if isinstance(buffer.loop, Scan):
        return SCAN
    if isinstance(buffer.loop, Sort):
        return SORT
    return REDUCTION if isinstance(buffer.loop, Reduction) else POINTWISE


def _space_map(
    src: tuple[sympy.Expr, ...],
    outer: tuple[sympy.Expr, ...],
    inner: tuple[sympy.Expr, ...],
    partial: bool = False,
) -> tuple[dict[sympy.Symbol, sympy.Expr], bool] | None:
    """How a pointwise loop over `src` (variables i0..) maps onto a kernel space of
    `outer` (i0..) and `inner` (r0..) dimensions: (variable mapping, covers inner).

    Either dimension by dimension (`src` is `outer`, or `outer ++ inner`), or, when the
    loop was merged into fewer dimensions, by splitting each of its dimensions row-major
    over a run of consecutive kernel dimensions whose product it is: i0 -> i0 * (...) +
    ... + r0, exact because every index is affine in it. A loop merged into one
    dimension is the plain case; a loop whose merging stopped at a broadcast operand
    ([B*H*Q, K] beside a softmax kernel over [B*H, Q] x [K]) is the partial one, mapped
    only with `partial` (epilogues: as prologues such maps split resnet50's batch-norm
    backward sums apart)."""
    if src == outer:
        return {}, False
    if inner and src == (*outer, *inner):
        return {index_var("i", len(outer) + j): index_var("r", j) for j in range(len(inner))}, True
    if len(src) != 1 and not partial:
        return None
    for target, covers_inner in (((*outer, *inner), True), (outer, False)):
        if len(target) <= len(src) or (covers_inner and not inner):
            continue
        names = [index_var("i", k) for k in range(len(outer))]
        names += [index_var("r", k) for k in range(len(inner))] if covers_inner else []
        runs = _runs(src, target)
        if runs is None:
            continue
        mapping: dict[sympy.Symbol, sympy.Expr] = {}
        for j, (start, stop) in enumerate(runs):
            linear: sympy.Expr = sympy.Integer(0)
            for k in range(start, stop):
                linear = linear + names[k] * product(target[k + 1 : stop])
            mapping[index_var("i", j)] = sympy.expand(linear)
        return mapping, covers_inner
    return None


def _runs(
    src: tuple[sympy.Expr, ...], target: tuple[sympy.Expr, ...]
) -> list[tuple[int, int]] | None:
    """Consecutive [start, stop) runs of `target` whose products are `src`'s dimensions
    in order, covering all of `target` (None: there are none). Size-1 target
    dimensions after the last run join it."""
    runs: list[tuple[int, int]] = []
    start = 0
    for size in src:
        stop = start
        acc: sympy.Expr = sympy.Integer(1)
        while stop < len(target):
            acc = sympy.expand(acc * target[stop])
            stop += 1
            if sympy.expand(acc - size) == 0:
                break
        else:
            return None
        runs.append((start, stop))
        start = stop
    if not runs or any(target[k] != 1 for k in range(start, len(target))):
        return None
    runs[-1] = (runs[-1][0], len(target))
    return runs


@dataclass(frozen=True)
class Placement:
    """How a pointwise group's variables become those of a reduction's outer x inner
    space when the group turns into the reduction's prologue: a substitution of the
    group's variables. When the group is a row-major loop read back through the
    reduction's index `read` (a one-to-one map onto its points), `linear` is the
    group's linear point index: an index affine in it (the store, a contiguous load)
    becomes affine in `read`, where substituting each variable (a floor/mod of
    `read`) would leave a sum of floors and mods that no analysis sees through."""

    mapping: dict[sympy.Symbol, sympy.Expr]
    linear: sympy.Expr | None = None
    read: sympy.Expr | None = None

    def expr(self, expr: sympy.Expr) -> sympy.Expr:
        if self.linear is not None and self.read is not None:
            last = max(self.mapping, key=lambda v: int(v.name[1:]))  # the innermost variable
            scale = affine_coefficient(sympy.expand(expr), last)
            if scale is not None:
                rest = sympy.expand(expr - scale * self.linear)
                if not any(v in self.mapping for v in rest.free_symbols):
                    return sympy.expand(scale * self.read + rest)
        return sympy.expand(sympy.sympify(expr).xreplace(self.mapping))

    def body(self, root: Node) -> Node:
        return map_indices(root, self.expr)


def _prologue_map(group: Group, loop: Reduction) -> Placement | None:
    """How the variables of a pointwise group become those of `loop`'s outer x inner
    space when the group turns into that reduction's prologue (None: they cannot).

    Following the reduction's own read of a member when it reads one at a different
    point of each (outer, inner) pair, covering the member once: a column sum reads a
    row-major producer across its outputs, which no row-major split of the producer's
    loop matches. Otherwise row-major over the kernel's space (`_space_map`)."""
    placed = _space_map(group.ranges, loop.ranges, loop.reduction_ranges)
    covered = Placement(placed[0]) if placed is not None and placed[1] else None
    if len(group.ranges) != 1 and covered is not None:
        return covered  # dimension by dimension: no floors and mods to compute
    return _read_map(group, loop) or covered


def _read_map(group: Group, loop: Reduction) -> Placement | None:
    """The group's variables as functions of E, when some member stores the group's
    point at its linear (row-major) storage element and `loop` reads that member at
    E, a one-to-one map of its outer x inner points onto the member's elements.

    One merged loop maps as {i0: E}. A loop the merging left in several dimensions
    (a broadcast operand, such as an attention mask shared by the heads, keeps them
    apart) maps each variable to a floor and mod of E; its static sizes are needed."""
    ranges = group.ranges
    if not ranges or (len(ranges) > 1 and not all(isinstance(r, sympy.Integer) for r in ranges)):
        return None
    variables = [index_var("i", k) for k in range(len(ranges))]
    places = [product(ranges[k + 1 :]) for k in range(len(ranges))]
    linear = sympy.expand(
        sum((v * p for v, p in zip(variables, places, strict=True)), sympy.S.Zero)
    )
    stored_at_point = {m.buffer.name for m in group.members if sympy.expand(m.index - linear) == 0}
    space = [(index_var("i", k), r) for k, r in enumerate(loop.ranges)]
    space += [(index_var("r", k), r) for k, r in enumerate(loop.reduction_ranges)]
    for node in walk(loop.body):
        if (
            isinstance(node, Load)
            and node.buffer in stored_at_point
            and node.mask is None
            and not node.indirect
            and _one_to_one(node.index, space, product(ranges))
        ):
            if len(ranges) == 1:
                return Placement({variables[0]: node.index})
            mapping = {
                v: ModularIndexing(node.index, p, r)
                for v, p, r in zip(variables, places, ranges, strict=True)
            }
            return Placement(mapping, linear, node.index)
    return None


def _one_to_one(
    expr: sympy.Expr, space: list[tuple[sympy.Symbol, sympy.Expr]], extent: sympy.Expr
) -> bool:
    """`expr` maps the points of `space` one to one onto 0 .. extent-1: it is affine
    with no constant term and its coefficients, smallest first, are the mixed-radix
    place values of the ranges (1, r_a, r_a*r_b, ...)."""
    if expr.xreplace({v: sympy.Integer(0) for v, _ in space}) != 0:
        return False
    terms: list[tuple[sympy.Expr, sympy.Expr]] = []
    for var, extent_of_var in space:
        if extent_of_var == 1:
            continue
        coefficient = affine_coefficient(expr, var)
        if coefficient is None:
            return False
        terms.append((coefficient, extent_of_var))
    place: sympy.Expr = sympy.Integer(1)
    while terms:
        hit = next((t for t in terms if sympy.expand(t[0] - place) == 0), None)
        if hit is None:
            return False
        terms.remove(hit)
        place = sympy.expand(place * hit[1])
    return bool(sympy.expand(place - extent) == 0)


def _var_map(
    buffer: ComputedBuffer, ranges: tuple[sympy.Expr, ...], reduction_ranges: tuple[sympy.Expr, ...]
) -> tuple[dict[sympy.Symbol, sympy.Expr], bool] | None:
    """How `buffer`'s loop variables become the group's: (mapping, over_reduction)."""
    loop = buffer.loop
    if isinstance(loop, Reduction):
        if loop.ranges == ranges and loop.reduction_ranges == reduction_ranges:
            return {}, False
        return None
    if not isinstance(loop, Pointwise):
        return None
    # partly merged loops map only here, where a later buffer joins a group (an
    # epilogue): as prologues they split resnet50's batch-norm backward sums apart
    return _space_map(loop.ranges, ranges, reduction_ranges, partial=True)


class Fuser:
    """Builds the groups for one program."""

    def __init__(
        self, program: Program, choices: DeviceChoices, matmuls: frozenset[str] = frozenset()
    ) -> None:
        self.program = program
        self.choices = choices
        self.matmuls = matmuls  # matmul products (ember.scheduler.epilogue)
        self.groups: list[Group] = []
        self.group_of: dict[str, Group] = {}
        self.position_of: dict[str, int] = {}
        # Steps that write memory other steps may read: (position, buffers written,
        # as alias roots; None: anything). Nothing reading what a barrier writes may
        # join a group placed before it.
        self.barriers: list[tuple[int, frozenset[str] | None]] = []
        self.alias_root: dict[str, str] = {}  # view -> the buffer it aliases
        self.sizes: dict[str, int] = {}
        self.store_indices: dict[str, sympy.Expr] = {}  # in each buffer's merged loop
        self._reads_of: tuple[ComputedBuffer, frozenset[str]] | None = None
        self._loaded_by: dict[Node, frozenset[str]] = {}
        # Buffer name -> positions in `groups` of the groups computing or loading it:
        # the only groups where placing a reader of that buffer can score (`_may_save`).
        self._touching: dict[str, set[int]] = {}
        # Data-dependent size symbol (`nonzero`'s row count) -> position of the step
        # after which the wrapper has bound it (`symbol_definitions`).
        self.defined_at: dict[sympy.Symbol, int] = {}
        self._symbols_of: tuple[ComputedBuffer, frozenset[sympy.Symbol]] | None = None
        # Why a buffer that started a kernel joined none of the groups it was tried
        # against (keyed by each group's first buffer), and buffers that run alone by
        # kind: read by `ember explain` through the schedule's fusion notes.
        self.refusals: dict[str, dict[str, str]] = {}
        self.alone: dict[str, str] = {}
        self._roots_read: dict[str, frozenset[str]] = {}
        self._used_names: frozenset[str] | None = None

    def run(self) -> list[Group]:
        for value in (*self.program.inputs, *self.program.constants):
            layout = getattr(value, "layout", None)
            if layout is not None:
                self.sizes[value.name] = size_hint(layout.numel()) * layout.dtype.itemsize
        self.defined_at = symbol_definitions(self.program)
        for position, node in enumerate(self.program.nodes):
            self.position_of[node.name] = position
            layout = getattr(node, "layout", None)
            if layout is not None:
                self.sizes[node.name] = size_hint(layout.numel()) * layout.dtype.itemsize
            if isinstance(node, ComputedBuffer):
                merged, index = merge_loop(node, store_index(node))
                self.store_indices[node.name] = index
                self._place(merged, position)
            elif isinstance(node, ExternKernel) and node.writes_arguments:
                self.barriers.append((position, None))
            elif isinstance(node, ExternKernel) and node.is_view:
                source = next(node.reads(), None)  # a view aliases its tensor argument
                if source is not None:
                    self.alias_root[node.name] = self._root(source)
            elif not isinstance(node, (ExternKernel, MultiOutput)):  # pragma: no cover
                raise TypeError(f"cannot schedule {type(node).__name__}")
        return self.groups

    def _place(self, buffer: ComputedBuffer, position: int) -> None:
        kind = _kind(buffer)
        degenerate = isinstance(buffer.loop, Reduction) and not buffer.loop.reduction_ranges
        if kind == SCATTER or buffer.mutates is not None or degenerate:
            # Scatters and mutations take no company; so does a reduction over no
            # dimension at all, which no iteration space of a fused kernel can hold.
            # A pointwise write into an input (`target`, as its alias root) may join
            # the kernel computing what it writes, where that is safe
            # (`_join_as_write`), or else a batch of other such writes.
            target = (
                self._root(buffer.mutates)
                if kind == POINTWISE and buffer.mutates is not None and not degenerate
                else None
            )
            if target is not None and (
                self._join_as_write(buffer, target, position)
                or self._join_write_batch(buffer, target, position)
            ):
                self.barriers.append((position, frozenset({self._root(buffer.name), target})))
                return
            self._new_group(buffer, position, closed=True)
            if target is not None:
                self.groups[-1].batch = True
                self.groups[-1].writes.add(target)
            self.alone[buffer.name] = (
                "a reduction over no dimension runs alone"
                if degenerate
                else "a scatter runs alone"
                if kind == SCATTER
                else "a write into an existing buffer runs alone"
            )
            if not degenerate:
                written = {buffer.name, *([buffer.mutates] if buffer.mutates else [])}
                self.barriers.append((position, frozenset(self._root(n) for n in written)))
            return
        if buffer.name in self.matmuls:
            self._new_group(buffer, position)  # a template kernel, its epilogue to come
            return
        best: tuple[int, int, Group, Member] | None = None
        refused: dict[str, str] = {}  # first member of a group -> why not there
        reads = self._reads(buffer)
        cousins = self._cousins(buffer, reads) if kind == REDUCTION else set()
        touching = {k for name in reads for k in self._touching.get(name, ())}
        for order in sorted(touching | cousins):
            group = self.groups[order]
            cousin = order in cousins
            if not cousin and not self._may_save(group, reads):
                continue  # its score would be 0, and only a positive score is taken
            candidate = self._try(group, buffer)
            if isinstance(candidate, str):
                refused[group.members[0].buffer.name] = candidate
                continue
            member, score = candidate
            if cousin:
                score = max(score, LAUNCH_SAVED)
            if score <= 0:
                refused[group.members[0].buffer.name] = "fusing saves no memory traffic"
            elif best is None or score > best[0]:
                best = (score, -order, group, member)
        if best is None:
            self._new_group(buffer, position)
            if refused:
                self.refusals[buffer.name] = refused
            return
        _, negative_order, group, member = best
        if member.kind == REDUCTION and not group.reduction_ranges:
            self._widen(group, buffer)
            again = self._try(group, buffer)
            assert not isinstance(again, str), again  # legal by construction
            member = again[0]
        group.members.append(member)
        self.group_of[buffer.name] = group
        self._note(group, -negative_order)

    def _join_as_write(self, buffer: ComputedBuffer, target: str, position: int) -> bool:
        """Put `buffer`, a pointwise write into an existing buffer X (a batch norm's
        running mean, written back by AOTAutograd's `copy_`), in the kernel computing
        what it writes, where that cannot change a value: every load of X in that
        kernel is of the element this point writes (read before the store, in one
        program), and every other step reading X's old value runs before that
        kernel. A MobileNetV3 training forward ran 139 such writes as kernels of
        their own, one to three elements per channel each."""
        reads = self._reads(buffer)
        best: tuple[int, int, Group, Member] | None = None
        for order in sorted({k for name in reads for k in self._touching.get(name, ())}):
            group = self.groups[order]
            if target in group.writes or group.names().isdisjoint(reads):
                continue  # only the kernel of a value it stores, writing X once
            candidate = self._try(group, buffer)
            if isinstance(candidate, str):
                continue
            member, score = candidate
            better = score > 0 and (best is None or score > best[0])
            if better and self._write_is_safe(group, member, target, position):
                best = (score, order, group, member)
        if best is None:
            return False
        _, order, group, member = best
        self._add_write(group, order, member, target)
        return True

    def _add_write(self, group: Group, order: int, member: Member, target: str) -> None:
        """Make `member`, which writes into `target`, one of `group`'s (the group at
        `order` in `groups`)."""
        group.members.append(member)
        group.writes.add(target)
        self.group_of[member.buffer.name] = group
        self._note(group, order)

    def _join_write_batch(self, buffer: ComputedBuffer, target: str, position: int) -> bool:
        """Put `buffer`, a pointwise write into an existing buffer X that no kernel
        computes the value of (a batch norm's `num_batches_tracked += 1`), in an
        earlier kernel of such writes over the same space, where that cannot change a
        value (`_write_is_safe`, and X written once per kernel). The writes share no
        bytes; each saves a launch. A MobileNetV3 training forward ran 46 one-element
        kernels for its batch norms' counters, one after another."""
        for order in range(len(self.groups) - 1, -1, -1):
            group = self.groups[order]
            if not group.batch or target in group.writes:
                continue
            candidate = self._try(group, buffer, batch=True)
            if isinstance(candidate, str):
                continue
            member = candidate[0]
            if member.over_reduction or not self._write_is_safe(group, member, target, position):
                continue
            self._add_write(group, order, member, target)
            return True
        return False

    def _write_is_safe(self, group: Group, member: Member, target: str, position: int) -> bool:
        """Whether `member`, writing `target` at `member.index`, may join `group`
        (see `_join_as_write`)."""
        for m in (*group.members, member):
            for n in walk(m.body):
                if not isinstance(n, Load) or self._root(n.buffer) != target:
                    continue
                if n.mask is not None or n.indirect or sympy.expand(n.index - member.index):
                    return False
        names, used = group.names(), self._used()
        for earlier in self.program.nodes[:position]:
            if earlier.name in names or target not in self._read_roots(earlier):
                continue
            if earlier.name not in used and isinstance(earlier, ComputedBuffer):
                continue  # read by nothing: no kernel computes it
            other = self.group_of.get(earlier.name)
            runs_at = other.position if other is not None else self.position_of[earlier.name]
            if runs_at >= group.position:
                return False
        return True

    def _used(self) -> frozenset[str]:
        """What some node reads or the program returns (computed once)."""
        if self._used_names is None:
            used = set(self.program.output_names())
            for node in self.program.nodes:
                used.update(node.reads())
            self._used_names = frozenset(used)
        return self._used_names

    def _read_roots(self, node: ComputeNode) -> frozenset[str]:
        """The alias roots of what `node` reads (remembered: nodes never change)."""
        found = self._roots_read.get(node.name)
        if found is None:
            found = frozenset(self._root(n) for n in node.reads())
            self._roots_read[node.name] = found
        return found

    def _cousins(self, buffer: ComputedBuffer, reads: frozenset[str]) -> set[int]:
        """Positions of the reduction groups over `buffer`'s own iteration space that
        read what the kernel computing one of `buffer`'s inputs computes: the final
        sums of a split reduction's partials (a batch norm's backward has two per
        channel, from one partial kernel). Joining one shares no bytes but saves a
        launch of a kernel that only reads a few KB. Such a group may already hold
        pointwise members over its outputs (they run after its reductions): the
        weight and bias gradients of one batch norm, when the final sums of a second
        one reading the same gradient come (a downsampling block's two branches,
        whose input gradients then share a kernel too)."""
        loop = buffer.loop
        assert isinstance(loop, Reduction)
        found: set[int] = set()
        for name in reads:
            producer = self.group_of.get(name)
            if producer is None:
                continue
            for computed in producer.names():
                for order in self._touching.get(computed, ()):
                    group = self.groups[order]
                    if (
                        group is not producer
                        and group.ranges == loop.ranges
                        and group.reduction_ranges == loop.reduction_ranges
                        and all(
                            m.kind == REDUCTION or (m.kind == POINTWISE and not m.over_reduction)
                            for m in group.members
                        )
                        and any(m.kind == REDUCTION for m in group.members)
                    ):
                        found.add(order)
        return found

    def _reads(self, buffer: ComputedBuffer) -> frozenset[str]:
        """What `buffer` reads, remembered for the buffer being placed: `_place` tries
        it against every group, and each try asked again (a walk of its body)."""
        if self._reads_of is None or self._reads_of[0] is not buffer:
            self._reads_of = (buffer, frozenset(buffer.reads()))
        return self._reads_of[1]

    def _symbols(self, buffer: ComputedBuffer) -> frozenset[sympy.Symbol]:
        """The size symbols `buffer` uses anywhere (cached like `_reads`)."""
        if self._symbols_of is None or self._symbols_of[0] is not buffer:
            self._symbols_of = (buffer, frozenset(buffer_symbols(buffer)))
        return self._symbols_of[1]

    def _may_save(self, group: Group, reads: frozenset[str]) -> bool:
        """Whether joining `group` can score above 0 (see `_score`): the buffer reads a
        member, or (horizontal fusion) a buffer some member loads. Checking this first
        skips the placement and inlining work for the many groups that cannot win."""
        if any(m.buffer.name in reads for m in group.members):
            return True
        return self.choices.horizontal and any(
            not reads.isdisjoint(self._loaded(m.body)) for m in group.members
        )

    def _loaded(self, body: Node) -> frozenset[str]:
        """The buffers `body` loads. Bodies are immutable and hash-consed (identity is
        equality), so the answer for one body object never changes."""
        found = self._loaded_by.get(body)
        if found is None:
            found = frozenset(n.buffer for n in walk(body) if isinstance(n, Load))
            self._loaded_by[body] = found
        return found

    def _new_group(self, buffer: ComputedBuffer, position: int, *, closed: bool = False) -> None:
        loop = buffer.loop
        reduction_ranges = inner_ranges(loop)
        group = Group(position, loop.ranges, reduction_ranges, closed=closed)
        index = self.store_indices[buffer.name]
        group.members.append(Member(buffer, _kind(buffer), loop.body, index, False))
        self.groups.append(group)
        self.group_of[buffer.name] = group
        self._note(group, len(self.groups) - 1)

    def _note(self, group: Group, order: int) -> None:
        """Index `group` under every buffer it computes or loads, for `_place`. The
        index may only over-approximate (`_may_save` decides exactly), so a group is
        noted again whenever a member joins and nothing is ever removed."""
        for m in group.members:
            for name in (m.buffer.name, *self._loaded(m.body)):
                self._touching.setdefault(name, set()).add(order)

    def _widen(self, group: Group, reduction: ComputedBuffer) -> None:
        """Turn a pointwise group into the prologue of `reduction`'s kernel."""
        loop = reduction.loop
        assert isinstance(loop, Reduction)
        placement = _prologue_map(group, loop)
        assert placement is not None
        group.ranges, group.reduction_ranges = loop.ranges, loop.reduction_ranges
        for m in group.members:
            m.body = placement.body(m.body)
            m.index = placement.expr(m.index)
            m.over_reduction = True

    def _try(
        self, group: Group, buffer: ComputedBuffer, *, batch: bool = False
    ) -> tuple[Member, int] | str:
        """The member `buffer` would be in `group`, and the bytes that saves; or why it
        cannot join (kept in `refusals` for the buffers that start a kernel). `batch`:
        a write joining a batch of writes (`_join_write_batch`), the one company a
        closed group of them takes."""
        if group.closed and not (batch and group.batch):
            return "that kernel takes no company (a scatter or a write into an input)"
        if len(group.members) >= self.choices.max_members:
            return f"that kernel is full ({self.choices.max_members} members)"
        if group.members[0].buffer.layout.device != buffer.layout.device:
            return "they run on different devices"
        kind = _kind(buffer)
        if group.writes and any(self._root(n) in group.writes for n in self._reads(buffer)):
            return "it reads what that kernel writes in place"
        matmul = group.members[0].buffer.name in self.matmuls
        if matmul and kind != POINTWISE:
            return "a matmul kernel takes only pointwise epilogues"
        if matmul and group.names().isdisjoint(self._reads(buffer)):
            return "a matmul kernel takes only epilogues of what it computes"
        if kind == SCAN or any(m.kind == SCAN for m in group.members):
            return self._try_scan_sibling(group, buffer)
        if kind == SORT or any(m.kind == SORT for m in group.members):
            return self._try_sort_sibling(group, buffer)
        ranges, reduction_ranges = group.ranges, group.reduction_ranges
        loop = buffer.loop
        widened: Placement | None = None
        if kind == REDUCTION and not reduction_ranges:
            assert isinstance(loop, Reduction)
            widened = _prologue_map(group, loop)
            if widened is None:
                return "the reduction does not read that kernel's loop point by point"
            ranges, reduction_ranges = loop.ranges, loop.reduction_ranges
        placed = _var_map(buffer, ranges, reduction_ranges)
        if placed is None:
            return f"iteration spaces differ ({_space(buffer)} against {_space(group)})"
        mapping, over_reduction = placed
        if matmul and over_reduction:
            return "it runs over the matmul's inner dimension"
        blocked = self._dependencies_block(group, buffer)
        if blocked is not None:
            return blocked
        members = self._members_as_placed(group, widened)
        body = replace_index(loop.body, mapping) if mapping else loop.body
        inlined = self._inline(body, members, over_reduction or kind == REDUCTION)
        if inlined is None:
            return (
                "it reads a value of that kernel at another point (a shifted, masked or "
                "indirect load, or per inner point from an outer loop), or inlining it "
                f"would copy more than {self.choices.max_inline_ops} ops"
            )
        index = sympy.expand(self.store_indices[buffer.name].xreplace(mapping))
        member = Member(buffer, kind, inlined, index, over_reduction)
        return member, self._score(group, buffer, member.body)

    def _try_scan_sibling(self, group: Group, buffer: ComputedBuffer) -> tuple[Member, int] | str:
        """`buffer` as one more scan of a group of scans: the same outer x inner space,
        reading nothing the group computes (see the module docstring); or why not."""
        loop = buffer.loop
        scans = all(m.kind == SCAN for m in group.members)
        if not (isinstance(loop, Scan) and scans):
            return "a scan kernel holds scans only"
        if not _same_space(group, loop):
            return f"iteration spaces differ ({_space(buffer)} against {_space(group)})"
        if group.names() & self._reads(buffer):
            return "it scans what that scan kernel computes"
        blocked = self._dependencies_block(group, buffer)
        if blocked is not None:
            return blocked
        member = Member(buffer, SCAN, loop.body, self.store_indices[buffer.name], False)
        return member, self._score(group, buffer, loop.body)

    def _try_sort_sibling(self, group: Group, buffer: ComputedBuffer) -> tuple[Member, int] | str:
        """`buffer` as one more sort of a group of sorts of the same row: the same body
        over the same space, in the same direction, keeping as many; or why not."""
        loop = buffer.loop
        first = group.members[0].buffer.loop
        if not (isinstance(loop, Sort) and isinstance(first, Sort)):
            return "a sort kernel holds sorts of one row only"
        same = (loop.ranges, loop.length, loop.count, loop.axis, loop.descending, loop.body)
        if same != (
            first.ranges,
            first.length,
            first.count,
            first.axis,
            first.descending,
            first.body,
        ):
            return "it sorts another row, or in another order"
        if group.names() & self._reads(buffer):
            return "it sorts what that sort kernel computes"
        blocked = self._dependencies_block(group, buffer)
        if blocked is not None:
            return blocked
        member = Member(buffer, SORT, loop.body, self.store_indices[buffer.name], False)
        return member, self._score(group, buffer, loop.body)

    def _members_as_placed(
        self,
        group: Group,
        placement: Placement | None,
    ) -> dict[str, Member]:
        if placement is None:
            return {m.buffer.name: m for m in group.members}
        return {
            m.buffer.name: Member(
                m.buffer, m.kind, placement.body(m.body), placement.expr(m.index), True
            )
            for m in group.members
        }

    def _inline(self, body: Node, members: dict[str, Member], sees_inner: bool) -> Node | None:
        """`body` with loads of the group's pointwise members replaced by their bodies;
        None when some load of a member does not read the element of the same point."""
        failed = False

        def rewrite(node: Node) -> Node:
            nonlocal failed
            if not isinstance(node, Load) or node.buffer not in members:
                return node
            member = members[node.buffer]
            if node.mask is not None or node.indirect or not _reads_own_point(node, member):
                failed = True
                return node
            if member.kind == REDUCTION:
                return node  # the kernel-local value of that reduction
            if member.over_reduction and not sees_inner:
                failed = True  # an outer-only reader cannot see a value per inner point
                return node
            if body_cost(member.body) > self.choices.max_inline_ops:
                failed = True
                return node
            return member.body

        result = map_dag(body, rewrite)
        if failed:
            return None
        if result is not body and body_cost(result) > body_cost(body) + self.choices.max_inline_ops:
            return None  # chains of inlined producers would be recomputed at every stage
        return result

    def _root(self, name: str) -> str:
        return self.alias_root.get(name, name)

    def _dependencies_block(self, group: Group, buffer: ComputedBuffer) -> str | None:
        """Why `buffer` cannot move up to `group`'s place, or None when it can.

        Joining `group` moves `buffer` back to the group's place, before any barrier
        in between: allowed only when that barrier writes nothing it reads (a bias
        gradient's cast may move back across an embedding gradient's scatter)."""
        if self.defined_at and any(
            self.defined_at.get(symbol, -1) > group.position for symbol in self._symbols(buffer)
        ):
            return "it would run before the step that computes one of its sizes"
        read_roots = {self._root(name) for name in self._reads(buffer)}
        for step, written in self.barriers:
            if step > group.position and (written is None or written & read_roots):
                return f"a write between them ({self.program.nodes[step].name}) changes its input"
        members = group.names()
        for name in self._reads(buffer):
            if name in members:
                continue
            producer_group = self.group_of.get(name)
            if producer_group is not None and producer_group is not group:
                if producer_group.position >= group.position:
                    return f"it reads {name}, computed by a kernel that runs after that one"
                continue
            position = self.position_of.get(name)
            if position is not None and position > group.position:
                # an extern (or its output) computed after the group starts
                return f"it reads {name}, made by an ATen call between them"
        return None

    def _score(self, group: Group, buffer: ComputedBuffer, placed: Node) -> int:
        """Bytes kept out of memory: a producer's write and read (vertical), or one
        read of an input the group already loads at the same index (horizontal). An
        input the group reads at other indices saves nothing: a row reduction and a
        column reduction of one square matrix share the buffer but no cache line, and
        fusing them makes one of them walk the matrix across its rows."""
        members = group.names()
        in_group = {
            (n.buffer, n.index) for m in group.members for n in walk(m.body) if isinstance(n, Load)
        }
        here = {(n.buffer, n.index) for n in walk(placed) if isinstance(n, Load)}
        shared = {name for name, index in here & in_group}
        for name, index in here - in_group:
            if name not in shared and any(
                other == name and _near(index, at) for other, at in in_group
            ):
                shared.add(name)
        saved = 0
        for name in self._reads(buffer):
            if name in members:
                saved += 2 * self.sizes.get(name, 0)
            elif name in shared and self.choices.horizontal:
                saved += self.sizes.get(name, 0)
        return saved


# The score of joining a cousin reduction's kernel (`Fuser._cousins`): less than any
# byte saved, so a group that saves memory traffic is always preferred.
LAUNCH_SAVED = 1
# Loads of one buffer at most this many elements apart share cache lines (`_score`).
NEAR_ELEMENTS = 8


def _near(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether indices `a` and `b` differ by a small constant at every point."""
    delta = sympy.expand(a - b)
    return isinstance(delta, sympy.Integer) and abs(int(delta)) <= NEAR_ELEMENTS


def inner_ranges(
    loop: Pointwise | Reduction | Scan | Sort | Scatter,
) -> tuple[sympy.Expr, ...]:
    """The inner (`r`) dimensions of a loop's kernel: reduced, scanned in order, or
    sorted."""
    if isinstance(loop, Reduction):
        return loop.reduction_ranges
    if isinstance(loop, (Scan, Sort)):
        return (loop.length,)
    return ()


def _same_space(group: Group, loop: Scan) -> bool:
    """A scan over `group`'s space whose variables mean the same points: the scanned
    dimension is at the same place among the same outer dimensions."""
    first = group.members[0].buffer.loop
    return (
        isinstance(first, Scan)
        and group.ranges == loop.ranges
        and group.reduction_ranges == (loop.length,)
        and first.axis == loop.axis
    )


def _space(where: ComputedBuffer | Group) -> str:
    """An iteration space as text: `[outer]` or `[outer] over [inner]`."""
    if isinstance(where, Group):
        ranges, inner = where.ranges, where.reduction_ranges
    else:
        loop = where.loop
        ranges = loop.ranges
        inner = inner_ranges(loop)
    text = "[" + ", ".join(map(str, ranges)) + "]"
    return text + (" over [" + ", ".join(map(str, inner)) + "]" if inner else "")


def symbol_definitions(program: Program) -> dict[sympy.Symbol, int]:
    """Each size symbol that no input carries (an unbacked one: a data-dependent size)
    -> the position of the node that binds it: the first extern call or multi-output
    pick whose result has it as a whole dimension size (the wrapper reads it from that
    result's `size(d)`), or the call that returns it (`sym_size`, `item`). Nothing
    that uses the symbol may run earlier."""
    from_inputs = program.size_symbols()
    defined: dict[sympy.Symbol, int] = {}
    for position, node in enumerate(program.nodes):
        found: list[sympy.Basic] = []
        if isinstance(node, ExternKernel):
            if node.symbol is not None:
                found.append(node.symbol)
            if not node.multi and node.outputs and node.outputs[0] is not None:
                found += node.outputs[0].size
        elif isinstance(node, MultiOutput) and node.layout is not None:
            found += node.layout.size
        for symbol in found:
            if isinstance(symbol, sympy.Symbol) and symbol not in from_inputs:
                defined.setdefault(symbol, position)
    return defined


def buffer_symbols(buffer: ComputedBuffer) -> set[sympy.Symbol]:
    """The size symbols a computed buffer's loop, body and layout mention."""
    loop = buffer.loop
    exprs: list[sympy.Expr] = [*loop.ranges, *buffer.layout.size, *buffer.layout.stride]
    exprs += inner_ranges(loop)
    if isinstance(loop, Scatter):
        exprs.append(loop.index)
    exprs += body_exprs(loop_bodies(loop))
    symbols: set[sympy.Symbol] = set()
    for expr in exprs:
        symbols |= sympy.sympify(expr).free_symbols
    return symbols


def _reads_own_point(load: Load, member: Member) -> bool:
    """The load reads the element `member` computes at the current point (for a
    welford reduction: its mean or its M2, one stride apart)."""
    delta = sympy.expand(load.index - member.index)
    if delta == 0:
        return True
    loop = member.buffer.loop
    return (
        isinstance(loop, Reduction)
        and loop.kind == "welford"
        and sympy.expand(delta - member.buffer.layout.stride[-1]) == 0
    )
