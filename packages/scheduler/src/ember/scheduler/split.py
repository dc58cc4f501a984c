"""Split reductions: a reduction with few outputs and long rows becomes two.

A reduction runs at most one worker (GPU program, CPU work item) per output, or per
block of neighbouring outputs: a column sum of a [32768, 4096] tensor has 4096 of
them, a few dozen GPU programs. When `DeviceChoices.reduction_chunks` says the device
wants more, this pass (run before fusion) rewrites the reduction `buf` into two IR
reductions of the same kind:

1. `buf_partial`, a new buffer of S x outputs values: chunk s of an output reduces
   the contiguous slice [s*C, (s+1)*C) of its outermost reduction dimension (of extent
   S*C; S divides it, so no chunk needs a mask) and every other reduction dimension;
2. `buf` itself (same name, layout and readers), now reducing those S values per
   output.

Both are ordinary reductions, so every codegen runs them unchanged and the fuser
treats them like any other: the partial absorbs the pointwise prologue the original
read, the final one its epilogue. The partial buffer is an intermediate the memory
plan allocates and frees like any other.

Layout of the partial buffer: when the reduction reads contiguously across outputs (a
column sum) it is [S, outputs], so the partial kernel stores and the final kernel
loads contiguous runs of outputs; when it reads along the row it is [outputs, S], so
the final kernel reduces contiguous rows of S values.

Only static sizes are split, and only kinds whose partial results combine with the
same kind (sum, prod, max, min, any, all), plus Welford. argmax/argmin would need the
index of the partial winner: they stay whole.

Welford (a batch norm's statistics: mean and M2 per channel) splits into chunks of
equal count n, whose (mean_s, M2_s) pairs Chan's merge combines:
mean = the mean of the mean_s, M2 = sum of M2_s + n * sum of (mean_s - mean)^2. The
last sum is the M2 of the mean_s themselves, so the final step is two ordinary
reductions over the S partials, a Welford of the means (`buf_means`) and a sum of the
M2_s (`buf_m2s`), and `buf` becomes the pointwise [mean, M2_s + n * M2_means] pair.
Unsplit, resnet50's training-mode batch norms ran one program per 64 channels over
all N*H*W rows: 38% of its training step's kernel time on the H100 machine.

That pair is then folded into its readers where it can be (`_fold_pairs`): a reader
loading the mean loads it from `buf_means` (the same element of the same dense
layout), one loading M2 computes `buf_m2s + n * M2_means` itself. Stored, the
[C, 2] pair was a kernel of its own that no [C] reduction or pointwise could take
in, so the per-channel epilogue of a batch norm's statistics (running stats, rstd)
ran as a fourth kernel; folded, the merge and that epilogue share one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sympy
import torch

from ember.ir import BufferRef, ComputedBuffer, ExternKernel, Layout, Load, Program, walk
from ember.ir.expr import Const, IndexExpr, Node, Op, Where, map_dag, replace_index
from ember.ir.layout import contiguous_strides
from ember.ir.loops import Pointwise, Reduction
from ember.ir.nodes import ComputeNode
from ember.ir.symbolic import index_var, product
from ember.scheduler.choices import DeviceChoices
from ember.scheduler.indexing import affine_coefficient, store_index
from ember.scheduler.iteration import merge_loop

SPLITTABLE = frozenset({"sum", "prod", "max", "min", "any", "all"})
# A Welford reduction splits only where an unsplit worker would reduce at least this
# many chunks' worth of elements (on the GPU, 32 x 256: its per-element update
# divides, so a worker covers a few billion elements a second at best, and 8192
# elements are a few microseconds, about what the three extra merge kernels cost).
# Other kinds have `DeviceChoices.split_min_work`.
WELFORD_SPLIT_CHUNKS = 32


def split_reductions(program: Program, choices: DeviceChoices) -> Program:
    """`program` with each reduction the device wants split replaced by a partial and
    a final reduction (the same program when nothing is split)."""
    taken = {n.name for n in (*program.inputs, *program.constants, *program.nodes)}
    nodes: list[ComputeNode] = []
    pairs: list[_Pair] = []
    for node in program.nodes:
        parts = _split(node, choices, taken) if isinstance(node, ComputedBuffer) else None
        if parts is None:
            nodes.append(node)
        elif isinstance(parts, _Pair):
            nodes.extend((parts.partial, parts.means, parts.m2s, parts.pair))
            pairs.append(parts)
        else:
            nodes.extend(parts)
    if len(nodes) == len(program.nodes):
        return program
    return replace(program, nodes=_fold_pairs(nodes, pairs, program.output_names()))


@dataclass(frozen=True)
class _Pair:
    """A split Welford: its chunks, the two merge reductions and the final pair."""

    partial: ComputedBuffer  # the chunks' (mean, M2) pairs
    means: ComputedBuffer  # [*outputs, 2]: the mean, and the M2 of the partial means
    m2s: ComputedBuffer  # [*outputs]: the sum of the partial M2s
    pair: ComputedBuffer  # [*outputs, 2]: the mean and M2, the original buffer's name
    count: Node  # the elements per chunk, the partial means' M2 weight


def _fold_pairs(
    nodes: list[ComputeNode], pairs: list[_Pair], outputs: set[str]
) -> list[ComputeNode]:
    """`nodes` without the pairs that fold, their readers computing what they load of
    them from the means and M2 sums. A pair stays where it is a graph output, is read
    by anything but pointwise or reduction bodies and mean views, or is loaded at a
    place whose field (mean or M2) is not fixed by the index alone. Every node's
    reads are walked once, whatever the number of pairs."""
    folding = {
        p.pair.name: p
        for p in pairs
        if p.pair.name not in outputs
        and _dense(p.pair.layout)
        and _dense(p.means.layout)
        # never false (the same outputs, and the field): element k is element k
        and product(p.pair.layout.size) == product(p.means.layout.size)
    }
    readers: dict[str, list[int]] = {}
    for position, node in enumerate(nodes):
        for name in node.reads():
            if name in folding:
                readers.setdefault(name, []).append(position)
    nodes = list(nodes)
    folded: set[str] = set()
    for name, pair in folding.items():
        rewritten = _folded_readers(nodes, readers.get(name, []), pair)
        if rewritten is not None:
            for position, node in rewritten.items():
                nodes[position] = node
            folded.add(name)
    return [n for n in nodes if n.name not in folded]


def _folded_readers(
    nodes: list[ComputeNode], positions: list[int], folded: _Pair
) -> dict[int, ComputeNode] | None:
    """The readers of `folded`'s pair (at `positions`) rewritten not to read it; None
    where one of them cannot be."""
    name, means = folded.pair.name, folded.means.name
    rewritten: dict[int, ComputeNode] = {}
    for position in positions:
        node = nodes[position]
        if isinstance(node, ExternKernel):
            view = _mean_view(node, name, means)
            if view is None:
                return None
            rewritten[position] = view
            continue
        if not isinstance(node, ComputedBuffer) or not isinstance(node.loop, Pointwise | Reduction):
            return None
        if node.mutates == name:
            return None
        body = _folded_body(node.loop.body, folded)
        if body is None:
            return None
        rewritten[position] = replace(node, loop=replace(node.loop, body=body))
    return rewritten


def _mean_view(node: ExternKernel, pair: str, means: str) -> ExternKernel | None:
    """`node` viewing the means buffer, where it is a view of the pair's means alone
    (an `as_strided` at even offsets and strides: a training forward saves the batch
    mean for its backward this way); None for any other reader."""
    if node.op is not torch.ops.aten.as_strided.default or len(node.args) != 4:
        return None
    source, _, stride, offset = node.args
    if not isinstance(source, BufferRef) or source.name != pair:
        return None
    if any(sympy.Mod(e, 2) != 0 for e in (*stride, offset)):
        return None  # it reaches an M2, which the means buffer does not hold
    return replace(node, args=(replace(source, name=means), *node.args[1:]))


def _dense(layout: Layout) -> bool:
    return layout.offset == 0 and layout.stride == contiguous_strides(layout.size)


def _folded_body(body: Node, folded: _Pair) -> Node | None:
    """`body` with each load of the pair replaced by the mean's load or the M2's
    arithmetic; None where some load's field is not a constant of its index."""
    name, dtype = folded.pair.name, folded.pair.layout.dtype
    unfoldable: list[Load] = []

    def fold(node: Node) -> Node:
        if not isinstance(node, Load) or node.buffer != name:
            return node
        field = sympy.Mod(node.index, 2)
        if node.mask is not None or node.indirect or field not in (0, 1):
            unfoldable.append(node)
            return node
        if field == 0:
            return replace(node, buffer=folded.means.name)
        spread = Op("mul", (replace(node, buffer=folded.means.name), folded.count), dtype)
        at = sympy.expand((node.index - 1) / 2)
        return Op("add", (Load(folded.m2s.name, at, dtype), spread), dtype)

    result = map_dag(body, fold)
    return None if unfoldable else result


def _is_static(exprs: tuple[sympy.Expr, ...]) -> bool:
    return all(isinstance(e, sympy.Integer) for e in exprs)


def _split(
    buffer: ComputedBuffer, choices: DeviceChoices, taken: set[str]
) -> tuple[ComputedBuffer, ...] | _Pair | None:
    loop = buffer.loop
    if (
        not isinstance(loop, Reduction)
        or (loop.kind not in SPLITTABLE and loop.kind != "welford")
        or buffer.mutates is not None
        or loop.whole
        or not loop.reduction_ranges
        or not _is_static((*loop.ranges, *loop.reduction_ranges))
    ):
        return None
    merged, _ = merge_loop(buffer, store_index(buffer), prefixes=("r",))
    assert isinstance(merged.loop, Reduction)
    loop = merged.loop
    column = _reads_across_outputs(loop)
    outputs, length = int(product(loop.ranges)), int(product(loop.reduction_ranges))
    width = max(choices.split_column_width, 1) if column else 1  # outputs per worker
    work = length * min(width, outputs)  # elements per unsplit worker
    if work < choices.split_min_work or (
        loop.kind == "welford" and work < WELFORD_SPLIT_CHUNKS * choices.split_min_chunk
    ):
        # Only a reduction whose unsplit workers each have much to do gains from it
        # (convnext's final layer norm, [64, 768], would run four kernels instead of
        # one: a Welford merge takes three). What counts is the work per worker, not
        # the total: MobileNetV3's [80] channels over 6272 rows are only half a
        # million elements, but unsplit they ran on two GPU programs, 135 us per batch
        # norm on the H100 (2026-11-24), where split they take a few.
        return None
    chunks = choices.reduction_chunks(outputs, length, int(loop.reduction_ranges[0]), column)
    if chunks < 2:
        return None
    partial = _partial(loop, chunks, column, _fresh(f"{buffer.name}_partial", taken), buffer)
    if loop.kind == "welford":
        return _final_welford(buffer, loop, chunks, column, partial, taken)
    return partial, _final(buffer, loop, chunks, column, partial)


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _partial(
    loop: Reduction, chunks: int, column: bool, name: str, buffer: ComputedBuffer
) -> ComputedBuffer:
    """The chunk reductions: outer space (S, *outputs) or (*outputs, S)."""
    count = len(loop.ranges)
    length = sympy.Integer(int(loop.reduction_ranges[0]) // chunks)
    mapping: dict[sympy.Symbol, sympy.Expr] = {}
    if column:
        chunk = index_var("i", 0)
        mapping.update({index_var("i", k): index_var("i", k + 1) for k in range(count)})
        ranges = (sympy.Integer(chunks), *loop.ranges)
    else:
        chunk = index_var("i", count)
        ranges = (*loop.ranges, sympy.Integer(chunks))
    mapping[index_var("r", 0)] = chunk * length + index_var("r", 0)
    body = replace_index(loop.body, mapping)
    partial = Reduction(ranges, (length, *loop.reduction_ranges[1:]), loop.kind, body)
    size = (*ranges, sympy.Integer(2)) if loop.kind == "welford" else ranges  # mean, M2
    layout = Layout.contiguous(buffer.layout.device, loop.dtype, size)
    return ComputedBuffer(name, layout, partial, origin=buffer.origin, origins=buffer.origins)


def _final(
    buffer: ComputedBuffer,
    loop: Reduction,
    chunks: int,
    column: bool,
    partial: ComputedBuffer,
) -> ComputedBuffer:
    """The original buffer, reducing the S partial values of each output."""
    body = Load(partial.name, _partial_index(partial, column, len(loop.ranges)), loop.dtype)
    final = Reduction(loop.ranges, (sympy.Integer(chunks),), loop.kind, body)
    return replace(buffer, loop=final)


def _partial_index(partial: ComputedBuffer, column: bool, outputs: int) -> sympy.Expr:
    """Where the final step's r0-th partial value of output (i0, i1, ...) is (the mean,
    for a Welford partial: its M2 is one element further)."""
    strides = partial.layout.stride
    if column:
        chunk, outer = strides[0], strides[1 : outputs + 1]
    else:
        chunk, outer = strides[outputs], strides[:outputs]
    variables = [index_var("r", 0), *(index_var("i", k) for k in range(outputs))]
    return _point(variables, (chunk, *outer))


def _final_welford(
    buffer: ComputedBuffer,
    loop: Reduction,
    chunks: int,
    column: bool,
    partial: ComputedBuffer,
    taken: set[str],
) -> _Pair:
    """Chan's merge of S equal-count (mean, M2) partials: a Welford over the partial
    means (their mean is the mean; their M2 times the chunk's count is the spread
    between chunks), a sum of the partial M2s, and `buffer` as the pointwise pair."""
    dtype, device = loop.dtype, buffer.layout.device
    count = product(loop.reduction_ranges) // chunks  # elements per chunk (static)
    at = _partial_index(partial, column, len(loop.ranges))
    step = partial.layout.stride[-1]  # mean -> M2
    across = (sympy.Integer(chunks),)
    means_layout = Layout.contiguous(device, dtype, (*loop.ranges, sympy.Integer(2)))
    means = ComputedBuffer(
        _fresh(f"{buffer.name}_means", taken),
        means_layout,
        Reduction(loop.ranges, across, "welford", Load(partial.name, at, dtype)),
        origin=buffer.origin,
        origins=buffer.origins,
    )
    m2s_layout = Layout.contiguous(device, dtype, loop.ranges)
    m2s = ComputedBuffer(
        _fresh(f"{buffer.name}_m2s", taken),
        m2s_layout,
        Reduction(loop.ranges, across, "sum", Load(partial.name, sympy.expand(at + step), dtype)),
        origin=buffer.origin,
        origins=buffer.origins,
    )
    outputs = [index_var("i", k) for k in range(len(loop.ranges))]
    field = index_var("i", len(loop.ranges))  # 0: mean, 1: M2
    mean_at = _point(outputs, means_layout.stride[:-1])
    m2s_at = _point(outputs, m2s_layout.stride)
    weight = Const(float(count), dtype)
    spread = Op(
        "mul",
        (Load(means.name, sympy.expand(mean_at + means_layout.stride[-1]), dtype), weight),
        dtype,
    )
    m2 = Op("add", (Load(m2s.name, m2s_at, dtype), spread), dtype)
    is_mean = Op("eq", (IndexExpr(field), Const(0, torch.int64)), torch.bool)
    pair = Where(is_mean, Load(means.name, mean_at, dtype), m2)
    final = Pointwise((*loop.ranges, sympy.Integer(2)), pair)
    return _Pair(partial, means, m2s, replace(buffer, loop=final), weight)


def _point(variables: list[sympy.Symbol], strides: tuple[sympy.Expr, ...]) -> sympy.Expr:
    return sympy.expand(sympy.Add(*(v * st for v, st in zip(variables, strides, strict=True))))


def _reads_across_outputs(loop: Reduction) -> bool:
    """True when most loads that move along the row are contiguous along an output
    dimension instead (a reduction over a leading dimension: a column sum).

    Loads that no output index reaches (the per-row mean and reciprocal deviation of a
    layer norm's weight gradient, sum over n of dy[n, c] * (x[n, c] - mean[n]) *
    rstd[n]) are the same for every output: a worker reads them once per row, so they
    do not vote. Counting them split that gradient with [outputs, S] partials, whose
    kernel then read dy and x with a stride of a whole row between neighbours."""
    outer = [index_var("i", k) for k in range(len(loop.ranges))]
    inner = [index_var("r", k) for k in range(len(loop.reduction_ranges))]
    along_row = across = 0
    for node in walk(loop.body):
        if not isinstance(node, Load) or node.indirect:
            continue
        if not any(node.index.has(r) for r in inner) or not any(node.index.has(v) for v in outer):
            continue
        if affine_coefficient(node.index, inner[-1]) == 1:
            along_row += 1
        elif any(affine_coefficient(node.index, v) == 1 for v in outer):
            across += 1
    return across > along_row
