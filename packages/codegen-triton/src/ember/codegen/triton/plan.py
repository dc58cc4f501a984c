"""How a fused kernel maps onto Triton blocks: the tiling, the index width, the
candidate launch configs and the grid.

Kinds of kernel:

- `pointwise`: one block axis `x` over the flattened outer space.
- `pointwise_2d`: two axes when the stores are contiguous along one loop variable and
  some load along another (a transpose). The block is [YBLOCK, XBLOCK], `x` over the
  store's contiguous variable, `y` over the others with the load's contiguous variable
  innermost, so both sides are coalesced (Triton converts the layout in between).
- `persistent_reduction`: block [XBLOCK, RBLOCK] with RBLOCK covering the whole
  (static) row, so multi-stage kernels (softmax: max, sum, divide) read each input
  once and keep the row in registers. When the loads are contiguous across outputs (a
  short column, e.g. the final step of a split column sum) the configs tile 32 to 128
  outputs per block, so each row of the block is whole cache lines.
- `looped_reduction`: block [XBLOCK, RBLOCK] with a loop over the row per stage.
  XBLOCK > 1 with a short RBLOCK when loads are contiguous along the outer variables
  (a column sum, or the partial step of a split one: [outputs x rows] tiles, the
  first COLUMN_XBLOCK outputs wide), XBLOCK = 1 with a long RBLOCK when along the row.
- `scatter`: a pointwise kernel whose store index depends on data.
- `persistent_scan`: block [XBLOCK, RBLOCK] with RBLOCK covering the whole (static,
  at most PERSISTENT_SCAN_MAX) scanned row: one `tl.associative_scan` per member.
- `looped_scan`: block [XBLOCK, RBLOCK], one loop along the row that carries each
  member's running value from block to block. XBLOCK > 1 with a short RBLOCK when the
  loads are contiguous along the outer variables (a cumsum over dim 0).
- `lookback_scan`: one pass over a few long rows (`lookback_applies`): block
  [1, RBLOCK], one program per tile of RBLOCK elements of a row, each carried in
  from the tiles before it by decoupled look-back (ember.codegen.triton.lookback).
  The grid counts the tiles of every row.
- `sort`: block [XBLOCK, RBLOCK] with RBLOCK the whole (static, at most
  MAX_SORT_LENGTH) sorted row padded to a power of two: one bitonic sort of (value,
  position) pairs per row. Longer or symbolic rows are never sorted here: lowering
  keeps them ATen calls (`sort_limits`).

Every grid is one-dimensional (CUDA limits the y and z axes to 65535 blocks): the
program id is split into the axes' block numbers inside the kernel.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sympy
import torch
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from ember.codegen.triton.printer import IndexPrinter, coefficient, upper_bound
from ember.ir.expr import IndexExpr, Load, Rand, walk
from ember.ir.scan import FEW_ROWS, LONG_SCAN
from ember.ir.symbolic import SIZE_HINT, index_var, size_hint
from ember.scheduler import FusedKernel

POINTWISE = "pointwise"
POINTWISE_2D = "pointwise_2d"
PERSISTENT = "persistent_reduction"
LOOPED = "looped_reduction"
SCATTER = "scatter"
PERSISTENT_SCAN = "persistent_scan"
LOOPED_SCAN = "looped_scan"
LOOKBACK_SCAN = "lookback_scan"
SCANS = (PERSISTENT_SCAN, LOOPED_SCAN, LOOKBACK_SCAN)
SORT = "sort"

# Rows up to this many elements stay in registers (persistent reductions).
PERSISTENT_MAX_RBLOCK = 8192
# Scanned rows up to this many elements are scanned in registers at once (wider
# scans spill: a scan keeps every partial value of the block live).
PERSISTENT_SCAN_MAX = 1024
# The longest row a sort kernel sorts: the bitonic network keeps the row's values and
# positions in registers, and its log2(n)^2 / 2 steps grow past what pays beyond this.
MAX_SORT_LENGTH = 1024
# Below this extent a dimension is too short for a 2-D tile to pay.
MIN_TILE_EXTENT = 16
# Outputs per program of the first column-reduction config (what the scheduler's
# split-reduction choice counts as one program: TRITON_CHOICES).
COLUMN_XBLOCK = 64
# Pointwise kernels over at least this many elements also try more elements per thread.
LARGE_POINTWISE = 1 << 20
# Kernels moving fewer bytes than this are not tuned; larger ones are timed with at
# most MAX_TUNED configs (candidate_configs says why).
SMALL_TRAFFIC = 4 << 20
MAX_TUNED = 3


@dataclass(frozen=True)
class Axis:
    """One block axis: `name` ('x', 'y' or 'r'), its block-size parameter, and the
    loop variables it flattens (outermost first) with their ranges."""

    name: str
    variables: tuple[sympy.Symbol, ...]
    ranges: tuple[sympy.Expr, ...]

    @property
    def block(self) -> str:
        return f"{self.name.upper()}BLOCK"

    @property
    def numel(self) -> sympy.Expr:
        return sympy.expand(sympy.Mul(*self.ranges)) if self.ranges else sympy.Integer(1)


@dataclass(frozen=True)
class LaunchConfig:
    """Block sizes (constexpr arguments), warps and pipeline stages for one launch."""

    blocks: tuple[tuple[str, int], ...]
    num_warps: int
    num_stages: int = 1

    def block(self, name: str) -> int:
        return dict(self.blocks)[name]

    def __str__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.blocks)
        return f"{sizes}, num_warps={self.num_warps}, num_stages={self.num_stages}"


@dataclass(frozen=True)
class GridSpec:
    """A one-dimensional grid: the product over `axes` of cdiv(numel, block)."""

    axes: tuple[tuple[sympy.Expr, str], ...]  # (numel over size symbols, block name)

    def __call__(self, config: LaunchConfig, sizes: Mapping[str, int]) -> tuple[int, int, int]:
        return (self.function()(sizes, dict(config.blocks)), 1, 1)

    def function(self) -> Callable[[Mapping[str, int], Mapping[str, int]], int]:
        """The grid as a plain Python function of (sizes by name, blocks by name),
        compiled once: it runs on every launch."""
        return _grid_function(self.axes)

    def python(self) -> str:
        """The block count as a Python expression over `sizes[...]` and `blocks[...]`."""
        parts = []
        for numel, block in self.axes:
            names = {s: f"sizes[{s.name!r}]" for s in numel.free_symbols}
            text = IndexPrinter(names)(numel)
            parts.append(f"(-(-{text} // blocks[{block!r}]))")
        return " * ".join(parts) or "1"

    def describe(self) -> str:
        return " * ".join(f"cdiv({numel}, {block})" for numel, block in self.axes) or "1"


# One per distinct grid (each new static shape makes one): the most recent 4096 are
# kept, a dropped one is compiled again from its text.
@functools.lru_cache(maxsize=4096)
def _grid_function(
    axes: tuple[tuple[sympy.Expr, str], ...],
) -> Callable[[Mapping[str, int], Mapping[str, int]], int]:
    function: Callable[[Mapping[str, int], Mapping[str, int]], int] = eval(
        f"lambda sizes, blocks: {GridSpec(axes).python()}"  # our own text
    )
    return function


@dataclass(frozen=True)
class KernelPlan:
    kind: str
    axes: tuple[Axis, ...]  # in block-shape order
    index_type: str  # 'tl.int32' or 'tl.int64'
    rblock: int | None = None  # the fixed RBLOCK of a persistent reduction

    def axis(self, name: str) -> Axis | None:
        for a in self.axes:
            if a.name == name:
                return a
        return None

    @property
    def grid(self) -> GridSpec:
        tiled = self.kind == LOOKBACK_SCAN  # a program per tile of the row too
        return GridSpec(tuple((a.numel, a.block) for a in self.axes if tiled or a.name != "r"))


def _static(expr: sympy.Expr) -> int | None:
    return int(expr) if isinstance(expr, sympy.Integer) else None


def _accesses(kernel: FusedKernel) -> tuple[list[sympy.Expr], list[sympy.Expr]]:
    """(store indices, load indices) of the kernel, direct accesses only."""
    stores = [m.index for m in kernel.members if m.stored]
    loads: list[sympy.Expr] = []
    local = kernel.local_reductions
    for m in kernel.members:
        for node in walk(m.body):
            if isinstance(node, Load) and not node.indirect and node.buffer not in local:
                loads.append(node.index)
    return stores, loads


def _contiguous_var(expr: sympy.Expr, variables: tuple[sympy.Symbol, ...]) -> sympy.Symbol | None:
    for var in reversed(variables):
        if coefficient(expr, var) == 1:
            return var
    return None


def _outer_vars(kernel: FusedKernel) -> tuple[sympy.Symbol, ...]:
    return tuple(index_var("i", d) for d in range(len(kernel.ranges)))


def _reduction_vars(kernel: FusedKernel) -> tuple[sympy.Symbol, ...]:
    return tuple(index_var("r", d) for d in range(len(kernel.reduction_ranges)))


def _transpose_axes(kernel: FusedKernel) -> tuple[Axis, Axis] | None:
    variables = _outer_vars(kernel)
    if len(variables) < 2:
        return None
    stores, loads = _accesses(kernel)
    store_var = next((v for v in map(lambda e: _contiguous_var(e, variables), stores) if v), None)
    if store_var is None:
        return None
    load_var = None
    for expr in loads:
        var = _contiguous_var(expr, variables)
        if var is not None and var != store_var and coefficient(expr, store_var) != 0:
            load_var = var
            break
    if load_var is None:
        return None
    extent = dict(zip(variables, kernel.ranges, strict=True))
    for var in (store_var, load_var):
        size = _static(extent[var])
        if size is not None and size < MIN_TILE_EXTENT:
            return None
    others = [v for v in variables if v not in (store_var, load_var)] + [load_var]
    y = Axis("y", tuple(others), tuple(extent[v] for v in others))
    x = Axis("x", (store_var,), (extent[store_var],))
    return y, x


def _outer_contiguous(kernel: FusedKernel) -> bool:
    """True when the reduction's loads are contiguous along an outer variable, not
    along the row (a reduction over a leading dimension).

    A load counts as contiguous along the innermost variable of either side also when
    it is so in runs (`_steps`): the bias gradient of vit_base's fused q, k, v
    projection reads three [64, 197, 12, 64] gradients as one [12608, 2304] matrix,
    9682944*(i1 // 768) + 768*row + i1 % 64 + 64*((i1 // 64) % 12), contiguous for 768
    columns at a time. Affine tests saw no contiguous variable, so its kernels ran
    2 to 8 columns by 512 rows, every row a separate cache line: 12 launches of them
    and 12 of another sum took 2.33 ms of the training step's 18.2 (H100 machine).
    Such a load that stays put along the row (BERT's token ids, read as
    ((768*i0 + r0) // 768) % 512 by a layer norm over r0) or along the outputs (a
    layer norm's per-row mean, read by its weight gradient's column sum as
    ((... + 768*r1) // 768) % 12608) does not vote, as in the scheduler's split."""
    _, loads = _accesses(kernel)
    outer, inner = _outer_vars(kernel), _reduction_vars(kernel)
    extents = dict(zip((*outer, *inner), (*kernel.ranges, *kernel.reduction_ranges), strict=True))
    along_row = along_outer = 0
    for expr in loads:
        if not any(expr.has(r) for r in inner):
            continue
        if _contiguous_var(expr, inner) is not None:
            along_row += 1
        elif _contiguous_var(expr, outer) is not None:
            along_outer += 1
        elif _nonaffine(expr) and inner and outer:
            row_steps = _steps(expr, inner[-1], extents)
            outer_steps = _steps(expr, outer[-1], extents)
            if _mostly(row_steps, 0) or _mostly(outer_steps, 0):
                continue  # read once per row, or once for all outputs: no vote
            if _mostly(row_steps, 1):
                along_row += 1
            elif _mostly(outer_steps, 1):
                along_outer += 1
    return along_outer > along_row


_STEP_SAMPLES = 16


def _nonaffine(expr: sympy.Expr) -> bool:
    return bool(expr.has(FloorDiv) or expr.has(ModularIndexing))


def _steps(
    expr: sympy.Expr, var: sympy.Symbol, extents: Mapping[sympy.Symbol, sympy.Expr]
) -> list[int | None]:
    """How much an index (with floor divisions and remainders) moves when `var` grows
    by 1, at fixed pseudo-random points with every variable within its extent (size
    symbols at `SIZE_HINT`); None where the index cannot be evaluated here. A reshape of a
    permuted tensor moves by 1 at most points: contiguous in runs. Only config choices
    rest on this (a wrong answer costs speed, never correctness), so a sample is
    enough. The index is evaluated as a Python function of its variables: sympy
    substitutions took 0.5 s of GPT-2's training-graph rendering (this CPU)."""
    if not expr.has(var):
        return [0] * _STEP_SAMPLES
    compiled = _python_index(expr)
    if compiled is None:
        return [None] * _STEP_SAMPLES
    function, symbols = compiled
    # a loop variable's extent to draw from; None: a size symbol, fixed at SIZE_HINT (drawn,
    # it could be 0, and a divisor)
    limits = [size_hint(extents[s]) if s in extents else None for s in symbols]
    at = symbols.index(var)
    limits[at] = max(size_hint(extents[var]) - 1, 1)  # var + 1 stays in range
    pick = random.Random(0)
    found: list[int | None] = []
    for _ in range(_STEP_SAMPLES):
        point = [SIZE_HINT if n is None else pick.randrange(max(n, 1)) for n in limits]
        here = function(*point)
        point[at] += 1
        found.append(function(*point) - here)
    return found


@functools.lru_cache(maxsize=8192)
def _python_index(
    expr: sympy.Expr,
) -> tuple[Callable[..., int], list[sympy.Symbol]] | None:
    """`expr` as a Python function of its free symbols (sorted by name), through the
    index printer (its // and % are Python's floor semantics, as the grid's are); None
    for an expression it prints with Triton calls (min, max)."""
    symbols = sorted(expr.free_symbols, key=lambda s: s.name)
    names = {s: f"v{k}" for k, s in enumerate(symbols)}
    text = IndexPrinter(names)(expr)
    if "tl." in text:
        return None
    function = eval(f"lambda {', '.join(names.values())}: {text}")  # our own text
    return function, symbols


def _mostly(steps: list[int | None], value: int) -> bool:
    """At 3 of 4 sample points or more."""
    return 4 * sum(step == value for step in steps) >= 3 * len(steps)


def _index_type(kernel: FusedKernel) -> str:
    """int32 index math when every static index provably stays below 2**31."""
    extents = [*kernel.ranges, *kernel.reduction_ranges]
    if any(_static(e) is None for e in extents):
        return "tl.int64"
    maxima = {index_var("i", d): int(r) for d, r in enumerate(kernel.ranges)}
    maxima.update({index_var("r", d): int(r) for d, r in enumerate(kernel.reduction_ranges)})
    total = math.prod(int(e) for e in extents) if extents else 1
    exprs: list[sympy.Expr] = []
    for m in kernel.members:
        exprs.append(m.index)
        for node in walk(m.body):
            if isinstance(node, Load):
                exprs.append(node.index)
            elif isinstance(node, (IndexExpr, Rand)):
                exprs.append(node.expr if isinstance(node, IndexExpr) else node.index)
    bounds = [total]
    for expr in exprs:
        # terms holding an indirect value are int64 already (indices load as int64)
        direct = sum(
            (t for t in sympy.Add.make_args(sympy.expand(expr)) if not _has_indirect(t)),
            sympy.Integer(0),
        )
        bound = upper_bound(direct, maxima)
        if bound is None:
            return "tl.int64"
        bounds.append(bound)
    return "tl.int32" if max(bounds) < 2**31 - 2**20 else "tl.int64"


def _has_indirect(expr: sympy.Expr) -> bool:
    return any(s.name.startswith("ind") for s in expr.free_symbols)


def plan_kernel(kernel: FusedKernel, *, reduction: str | None = None) -> KernelPlan:
    """Choose the tiling of `kernel`. `reduction` forces 'persistent' or 'looped'."""
    index_type = _index_type(kernel)
    outer = Axis("x", _outer_vars(kernel), kernel.ranges)
    if kernel.is_scatter:
        return KernelPlan(SCATTER, (outer,), index_type)
    if not kernel.is_reduction:
        tiles = _transpose_axes(kernel)
        if tiles is not None:
            return KernelPlan(POINTWISE_2D, tiles, index_type)
        return KernelPlan(POINTWISE, (outer,), index_type)
    row = Axis("r", _reduction_vars(kernel), kernel.reduction_ranges)
    rnumel = _static(row.numel)
    rblock = 1 << max(rnumel - 1, 0).bit_length() if rnumel is not None else None
    if kernel.is_sort:
        return KernelPlan(SORT, (outer, row), index_type, rblock=rblock)
    if kernel.is_scan and lookback_applies(kernel) and reduction is None:
        return KernelPlan(LOOKBACK_SCAN, (outer, row), index_type)
    if kernel.is_scan:
        limit = 64 if _outer_contiguous(kernel) else PERSISTENT_SCAN_MAX
        if rblock is not None and rblock <= limit and reduction != "looped":
            return KernelPlan(PERSISTENT_SCAN, (outer, row), index_type, rblock=rblock)
        return KernelPlan(LOOPED_SCAN, (outer, row), index_type)
    limit = 256 if _outer_contiguous(kernel) else PERSISTENT_MAX_RBLOCK
    persistent = rblock is not None and rblock <= limit
    if reduction is not None:
        if reduction == "persistent" and rblock is None:
            raise ValueError(f"kernel {kernel.name}: a persistent reduction needs a static row")
        persistent = reduction == "persistent"
    if persistent:
        return KernelPlan(PERSISTENT, (outer, row), index_type, rblock=rblock)
    return KernelPlan(LOOPED, (outer, row), index_type)


# Kinds of scan a look-back kernel carries between tiles: each combine is commutative
# and associative, and its running value fits the 32 bits packed beside a status.
LOOKBACK_KINDS = frozenset({"sum", "prod", "logsumexp"})


def lookback_applies(kernel: FusedKernel) -> bool:
    """Whether `kernel` scans in one pass with look-back: float32-carried sums,
    products or logsumexps of static rows, long and few (the rows lowering leaves whole
    for this, `ember.ir.scan.SINGLE_PASS_DEVICES`: one program a row would be serial)."""
    rows, length = _static(sympy.Mul(*kernel.ranges)), _static(sympy.Mul(*kernel.reduction_ranges))
    return (
        rows is not None
        and length is not None
        and length >= LONG_SCAN
        and rows <= FEW_ROWS
        and len(kernel.reduction_ranges) == 1
        and all(m.scan in LOOKBACK_KINDS and m.body.dtype == torch.float32 for m in kernel.members)
    )


def candidate_configs(kernel: FusedKernel, plan: KernelPlan) -> tuple[LaunchConfig, ...]:
    """The launch configs the runtime compiles and times; the first is the guess.

    Each config costs a Triton compile at a cold start (about 0.1 to 0.15 s of CPU
    time on the GPU machine, mostly under Python's interpreter lock), and timing pays
    only where the configs' run times differ by more than a launch costs. A kernel
    whose estimated traffic (`traffic_bytes`) is under SMALL_TRAFFIC (4 MiB: ~1.3 us
    at an H100's ~3 TB/s, less than the ~2-3 us between back-to-back launches) runs in
    a few microseconds whatever its config, so it gets its guess alone: a config even
    twice as slow loses ~1 us a call, and one compile saved repays 10^5 calls. Larger
    kernels get at most MAX_TUNED configs of `config_menu`: the guess, then greedily
    the menu entry farthest from those already kept (`_spread`), so the timed few
    span block sizes and warps instead of neighbouring points (pointwise: 256, 1024
    and 4096 elements per block, 4, 8 and 16 per thread, of six on the menu).
    """
    menu = config_menu(kernel, plan)
    if traffic_bytes(kernel) < SMALL_TRAFFIC:
        return menu[:1]
    return _spread(menu, MAX_TUNED)


def traffic_bytes(kernel: FusedKernel) -> int:
    """Bytes `kernel` reads and writes, estimated from its accesses: each distinct
    (buffer, index) load or store touches one element per point of the kernel
    variables its index uses (a bias read by channel counts the channels, not the
    whole loop nest). Size symbols count as `SIZE_HINT`, kernel-local values
    not at all; an index that repeats elements (i // 2) is counted in full."""
    extents = {index_var("i", d): r for d, r in enumerate(kernel.ranges)}
    extents.update({index_var("r", d): r for d, r in enumerate(kernel.reduction_ranges)})
    accesses: set[tuple[str, sympy.Expr, int]] = set()
    local = kernel.local_reductions
    for m in kernel.members:
        if m.stored or m.mutates is not None:
            copies = 2 if m.reduction == "welford" else 1  # mean and M2
            for copy in range(copies):
                accesses.add((m.name, m.index + copy, m.dtype.itemsize))
        for root in (m.body, *m.indirect):
            for node in walk(root):
                if isinstance(node, Load) and node.buffer not in local:
                    accesses.add((node.buffer, node.index, node.dtype.itemsize))
    total = 0
    for _, index, itemsize in accesses:
        used = [extents[v] for v in sympy.sympify(index).free_symbols if v in extents]
        total += itemsize * math.prod(size_hint(e) for e in used)
    return total


def _spread(menu: tuple[LaunchConfig, ...], count: int) -> tuple[LaunchConfig, ...]:
    """The first config, then up to `count - 1` more: each time the one whose
    smallest distance to those kept is largest (earlier on the menu on ties).
    Distance: the summed |log2| ratios of block sizes and warps, plus the difference
    in pipeline stages. Kept in menu order."""
    if len(menu) <= count:
        return menu

    def distance(a: LaunchConfig, b: LaunchConfig) -> float:
        blocks = dict(b.blocks)
        apart = sum(abs(math.log2(v) - math.log2(blocks.get(k, v))) for k, v in a.blocks)
        apart += abs(math.log2(a.num_warps) - math.log2(b.num_warps))
        return apart + abs(a.num_stages - b.num_stages)

    kept = [0]
    while len(kept) < count:
        rest = [i for i in range(len(menu)) if i not in kept]
        far = max(rest, key=lambda i: (min(distance(menu[i], menu[k]) for k in kept), -i))
        kept.append(far)
    return tuple(menu[i] for i in sorted(kept))


def config_menu(kernel: FusedKernel, plan: KernelPlan) -> tuple[LaunchConfig, ...]:
    """Every launch config worth considering for `kernel`; the first is the guess.
    `candidate_configs` shortens it; tests run a kernel under each entry."""
    x = plan.axis("x")
    assert x is not None
    xnumel = size_hint(x.numel)
    xcap = max(1 << max(xnumel - 1, 0).bit_length(), 1)
    found: list[LaunchConfig] = []

    def add(warps: int, stages: int = 1, **blocks: int) -> None:
        sized = tuple((k, v) for k, v in blocks.items())
        config = LaunchConfig(sized, warps, stages)
        if config not in found:
            found.append(config)

    if plan.kind in (POINTWISE, SCATTER):
        shapes = [(1024, 4), (512, 4), (2048, 8), (256, 2)]
        if plan.kind == POINTWISE and xnumel >= LARGE_POINTWISE:
            # 16 elements per thread: two 16-byte loads in flight per input in bf16
            shapes += [(2048, 4), (4096, 8)]
        for block, warps in shapes:
            size = max(min(block, xcap), 16)
            add(max(1, min(warps, size // 128)), XBLOCK=size)
    elif plan.kind == POINTWISE_2D:
        y = plan.axis("y")
        assert y is not None
        ycap = max(1 << max(size_hint(y.numel) - 1, 0).bit_length(), 1)
        for yb, xb, warps in ((64, 64, 4), (32, 128, 4), (128, 32, 4), (64, 128, 8)):
            add(warps, YBLOCK=min(yb, ycap), XBLOCK=min(xb, xcap))
    elif plan.kind == PERSISTENT and _outer_contiguous(kernel):
        # [outputs x rows] tiles again (a short column, e.g. the final step of a split
        # column sum): wide enough along the outputs for whole 128-byte lines per row
        rblock = plan.rblock
        assert rblock is not None
        for xb in (COLUMN_XBLOCK, 32, 2 * COLUMN_XBLOCK):
            xb = max(1, min(xb, xcap))
            elements = xb * rblock
            if elements > 16384:
                continue
            warps = 16 if elements >= 8192 else 8 if elements >= 2048 else 4
            add(warps, XBLOCK=xb, RBLOCK=rblock)
        if not found:
            add(16, XBLOCK=max(1, min(16384 // rblock, xcap)), RBLOCK=rblock)
    elif plan.kind == PERSISTENT:
        rblock = plan.rblock
        assert rblock is not None
        budget = 8192 if rblock >= 1024 else 4096
        xblocks = [1, 2, 4] if rblock >= 1024 else [budget // rblock // 4, budget // rblock, 8]
        for xb in xblocks:
            xb = max(1, min(xb, xcap, budget // rblock))
            elements = xb * rblock
            warps = (
                16 if elements >= 8192 else 8 if elements >= 2048 else 4 if elements >= 256 else 2
            )
            add(warps, XBLOCK=xb, RBLOCK=rblock)
            if warps == 8 and elements >= 4096:
                add(16, XBLOCK=xb, RBLOCK=rblock)
    elif plan.kind == PERSISTENT_SCAN:
        rblock = plan.rblock
        assert rblock is not None
        for budget in (1024, 4096):
            xb = max(1, min(budget // rblock, xcap))
            add(4 if xb * rblock <= 2048 else 8, XBLOCK=xb, RBLOCK=rblock)
    elif plan.kind == SORT:
        rblock = plan.rblock or 1
        for budget in (1024, 2048):
            xb = max(1, min(budget // rblock, xcap))
            add(4 if xb * rblock <= 1024 else 8, XBLOCK=xb, RBLOCK=rblock)
    elif plan.kind == LOOKBACK_SCAN:
        # tiles of 2048 to 8192 elements: 256 to 1024 tiles of 1M elements, about
        # CUB's tile for one program of 4 to 16 warps (16 elements a thread)
        for rb, warps in ((4096, 8), (2048, 4), (8192, 16)):
            add(warps, 1, XBLOCK=1, RBLOCK=rb)
    elif plan.kind == LOOPED_SCAN and _outer_contiguous(kernel):
        for xb, rb, warps in ((COLUMN_XBLOCK, 16, 4), (32, 32, 4), (128, 8, 4)):
            add(warps, 1, XBLOCK=min(xb, xcap), RBLOCK=rb)
    elif plan.kind == LOOPED_SCAN:
        for xb, rb, warps in ((1, 1024, 4), (1, 2048, 8), (2, 512, 4)):
            add(warps, 1, XBLOCK=min(xb, xcap), RBLOCK=rb)
    elif _outer_contiguous(kernel):
        # [outputs x rows] tiles, loads contiguous along the outputs; narrow column
        # blocks keep enough programs busy when there are few columns (the scheduler
        # splits long columns so that COLUMN_XBLOCK-wide tiles fill the GPU)
        for xb, rb, warps in ((COLUMN_XBLOCK, 32, 4), (32, 64, 4), (16, 128, 4), (8, 256, 8)):
            add(warps, 1, XBLOCK=min(xb, xcap), RBLOCK=rb)
        if xnumel >= 64 * COLUMN_XBLOCK:
            # many programs already: a wider tile, 256 bytes of bf16 per row
            add(8, 1, XBLOCK=min(2 * COLUMN_XBLOCK, xcap), RBLOCK=32)
    else:
        for xb, rb, warps in ((1, 2048, 8), (1, 1024, 4), (1, 4096, 8), (4, 256, 4)):
            add(warps, 1, XBLOCK=min(xb, xcap), RBLOCK=rb)
    return tuple(found)
