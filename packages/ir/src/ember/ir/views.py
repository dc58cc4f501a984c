"""Views as index rewrites: view/reshape, permute, expand, slice, select, squeeze,
unsqueeze, as_strided, unfold, diagonal, flip, repeat, split/unbind.

A view never copies: its loader maps the view's index to the source's index and calls
the source's loader, so a chain of views (and the pointwise ops around it) becomes one
load with one composed index expression. Reshape keeps indices affine wherever the
sizes allow: it pairs groups of source and result dimensions with equal products and
only uses floor division and modulo inside a group that really splits or merges.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv, ModularIndexing, PythonMod

from ember.ir.expr import Load
from ember.ir.layout import contiguous_strides
from ember.ir.lowering import GraphLowering, NotLowerable, int_arg, list_arg, register_lowering
from ember.ir.symbolic import as_expr, known_true, product, simplify_index
from ember.ir.tensor import Index, LazyTensor

aten = torch.ops.aten
IndexMap = Callable[[Index], list[sympy.Expr]]


def view_of(source: LazyTensor, size: Sequence[sympy.Expr], index_map: IndexMap) -> LazyTensor:
    """A LazyTensor reading `source` at `index_map(index)`."""
    load = source.loader
    return LazyTensor(
        source.device,
        source.dtype,
        tuple(size),
        lambda index: load(index_map(index)),
        view_source=source,
        view_map=index_map,
    )


def norm_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim


def _ratio(small: sympy.Expr, big: sympy.Expr) -> bool:
    """True when `big` is provably a whole multiple of `small` (and differs from it)."""
    if isinstance(small, sympy.Integer) and isinstance(big, sympy.Integer):
        return int(small) < int(big) and int(big) % int(small) == 0
    quotient = sympy.cancel(big / small)
    return bool(sympy.fraction(quotient)[1] == 1) and quotient != 1


def reshape_map(in_size: Sequence[sympy.Expr], out_size: Sequence[sympy.Expr]) -> IndexMap:
    """Index map of a reshape from `in_size` to `out_size` (same number of elements)."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    ok = True
    while ok and (i < len(in_size) or j < len(out_size)):
        if i < len(in_size) and in_size[i] == 1:
            groups.append(([i], []))
            i += 1
        elif j < len(out_size) and out_size[j] == 1:
            groups.append(([], [j]))
            j += 1
        elif i == len(in_size) or j == len(out_size):
            ok = False
        else:
            dims_in, dims_out = [i], [j]
            p_in, p_out = in_size[i], out_size[j]
            i, j = i + 1, j + 1
            while ok and p_in != p_out:
                if _ratio(p_in, p_out) and i < len(in_size):
                    p_in, dims_in = p_in * in_size[i], [*dims_in, i]
                    i += 1
                elif _ratio(p_out, p_in) and j < len(out_size):
                    p_out, dims_out = p_out * out_size[j], [*dims_out, j]
                    j += 1
                else:
                    ok = False
            groups.append((dims_in, dims_out))
    if not ok:
        groups = [(list(range(len(in_size))), list(range(len(out_size))))]

    def index_map(index: Index) -> list[sympy.Expr]:
        result: list[sympy.Expr] = [sympy.Integer(0)] * len(in_size)
        for dims_in, dims_out in groups:
            if not dims_in:
                continue
            sizes_out = [out_size[d] for d in dims_out]
            linear: sympy.Expr = sympy.Integer(0)
            for d, stride in zip(dims_out, contiguous_strides(tuple(sizes_out)), strict=True):
                linear = linear + index[d] * stride
            if len(dims_in) == 1:
                result[dims_in[0]] = linear
                continue
            strides_in = contiguous_strides(tuple(in_size[d] for d in dims_in))
            for k, (d, stride) in enumerate(zip(dims_in, strides_in, strict=True)):
                if k == 0:
                    result[d] = FloorDiv(linear, stride)
                else:
                    result[d] = ModularIndexing(linear, stride, in_size[d])
        return result

    return index_map


@register_lowering(
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
    aten._reshape_alias.default,
)  # fmt: skip
def lower_view(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    size = lowering.out_size(node)
    if lowering.out_val(node).dtype != source.dtype:
        raise NotLowerable("view as another dtype")
    return view_of(source, size, reshape_map(source.size, size))


@register_lowering(aten.permute.default, aten.permute_copy.default)
def lower_permute(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    dims = [norm_dim(int(d), source.ndim) for d in list_arg(node.args[1])]

    def index_map(index: Index) -> list[sympy.Expr]:
        result: list[sympy.Expr] = [sympy.Integer(0)] * len(dims)
        for position, d in enumerate(dims):
            result[d] = index[position]
        return result

    return view_of(source, lowering.out_size(node), index_map)


@register_lowering(aten.transpose.int, aten.t.default)
def lower_transpose(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    if source.ndim < 2:
        return view_of(source, source.size, list)
    a = norm_dim(int_arg(node.args[1]), source.ndim) if len(node.args) > 1 else 0
    b = norm_dim(int_arg(node.args[2]), source.ndim) if len(node.args) > 2 else 1

    def index_map(index: Index) -> list[sympy.Expr]:
        result = list(index)
        result[a], result[b] = index[b], index[a]
        return result

    return view_of(source, lowering.out_size(node), index_map)


@register_lowering(aten.expand.default, aten.expand_copy.default, aten.expand_as.default)
def lower_expand(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    from ember.ir.tensor import broadcast_loader

    source = lowering.tensor(node.args[0])
    size = lowering.out_size(node)
    return LazyTensor(source.device, source.dtype, size, broadcast_loader(source, size))


@register_lowering(aten.slice.Tensor, aten.slice_copy.Tensor, aten.narrow_copy.default)
def lower_slice(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    a = lowering.args(node)
    dim = norm_dim(int(a["dim"]), source.ndim)
    extent = dim_extent(node.args[0], dim)
    if node.target is aten.narrow_copy.default:
        start, step = slice_start(size_value(a["start"]), extent), sympy.Integer(1)
    else:
        start = slice_start(size_value(a["start"]), extent)
        step = size_expr(lowering, a["step"])

    def index_map(index: Index) -> list[sympy.Expr]:
        result = list(index)
        result[dim] = start + index[dim] * step
        return result

    return view_of(source, lowering.out_size(node), index_map)


def size_expr(lowering: GraphLowering, arg: Any) -> sympy.Expr:
    """A size argument (an int, or a node computing a SymInt) as a sympy expression."""
    if isinstance(arg, torch.fx.Node):
        value = lowering.env[arg]
        if not isinstance(value, sympy.Expr):
            raise NotLowerable("a tensor where a size is expected")
        return value
    return as_expr(arg)


def size_value(arg: Any) -> int | torch.SymInt | None:
    """An FX size argument (an int, None, or a node computing a SymInt) as torch holds
    it: a SymInt keeps its ShapeEnv, which knows the ranges and guards that decide its
    sign, where the plain sympy expression does not."""
    if arg is None or isinstance(arg, (int, torch.SymInt)):
        return arg
    if isinstance(arg, torch.fx.Node):
        val = arg.meta.get("val")
        if isinstance(val, (int, torch.SymInt)):
            return val
    raise NotLowerable(f"a size argument that is not an integer: {arg}")


def dim_extent(arg: Any, dim: int) -> int | torch.SymInt:
    """The size of dimension `dim` of a tensor argument, from its FX metadata."""
    val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor):
        raise NotLowerable("a tensor argument without metadata")
    return val.shape[dim]


def slice_start(start: int | torch.SymInt | None, size: int | torch.SymInt) -> sympy.Expr:
    """Python's normalisation of a slice start: a negative start counts from the end,
    then the start is clamped into [0, size].

    A symbolic start (`x[:, -k:]` with `k` dynamic, and the slice_scatter of its
    backward) takes the branch the ShapeEnv proves: tracing ran torch's own slice, which
    guarded on the sign, so the branch holds for every input the graph accepts. A start
    whose sign is not proven (an unbacked value) cannot be lowered to one index."""
    if start is None:
        return sympy.Integer(0)
    if known_true(start >= 0):
        if isinstance(start, int) and isinstance(size, int):
            return sympy.Integer(min(start, size))
        # Past the end the result is empty and never read: no clamp is needed.
        return as_expr(start)
    if known_true(start < 0):
        shifted = start + size
        if known_true(shifted >= 0):
            return as_expr(shifted)
        if isinstance(shifted, int):
            return sympy.Integer(0)
        return sympy.Max(as_expr(shifted), 0)
    raise NotLowerable(f"slice start {start} whose sign the shapes do not decide")


def select_index(index: int | torch.SymInt, size: int | torch.SymInt) -> sympy.Expr:
    """A select's index in [0, size): a negative index counts from the end. A symbolic
    index takes the sign the ShapeEnv proves; one of unknown sign (`x[:, i.item()]`)
    is its Python modulo by the size, the same map on the valid range [-size, size)."""
    if known_true(index >= 0):
        return as_expr(index)
    if known_true(index < 0):
        return as_expr(index + size)
    return PythonMod(as_expr(index), as_expr(size))


@register_lowering(aten.select.int, aten.select_copy.int)
def lower_select(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    dim = norm_dim(int_arg(node.args[1]), source.ndim)
    position = size_value(node.args[2])
    if position is None:
        raise NotLowerable("select without an index")
    index_value = select_index(position, dim_extent(node.args[0], dim))

    def index_map(index: Index) -> list[sympy.Expr]:
        return [*index[:dim], index_value, *index[dim:]]

    return view_of(source, lowering.out_size(node), index_map)


@register_lowering(
    aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
    aten.squeeze_copy.dims, aten.unsqueeze_copy.default,
)  # fmt: skip
def lower_squeeze(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    """squeeze and unsqueeze only add or drop size-1 dimensions: a reshape."""
    source = lowering.tensor(node.args[0])
    size = lowering.out_size(node)
    return view_of(source, size, reshape_map(source.size, size))


@register_lowering(aten.as_strided.default, aten.as_strided_copy.default)
def lower_as_strided(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    """as_strided addresses the storage of its input's base: read a stored buffer."""
    a = lowering.args(node)
    source_val = a["self"].meta["val"]
    value = lowering.env[a["self"]]
    ref = lowering.realize(value)
    layout = lowering.layouts[lowering.current(ref).name]
    if ref != value and not (source_val.is_contiguous() and source_val.storage_offset() == 0):
        raise NotLowerable("as_strided of a view that is not stored")
    size = tuple(size_expr(lowering, s) for s in a["size"])
    stride = tuple(size_expr(lowering, s) for s in a["stride"])
    offset = (
        size_expr(lowering, a["storage_offset"])
        if a["storage_offset"] is not None
        else layout.offset
    )
    name = lowering.current(ref).name

    def load(index: Index) -> Load:
        linear = offset + sum((i * s for i, s in zip(index, stride, strict=True)), sympy.Integer(0))
        return Load(name, simplify_index(linear), layout.dtype)

    return LazyTensor(layout.device, layout.dtype, size, load)


@register_lowering(aten.unfold.default, aten.unfold_copy.default)
def lower_unfold(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    dim = norm_dim(int_arg(node.args[1]), max(source.ndim, 1))
    step = int_arg(node.args[3])

    def index_map(index: Index) -> list[sympy.Expr]:
        if source.ndim == 0:
            return []
        result = list(index[:-1])
        result[dim] = index[dim] * step + index[-1]
        return result

    return view_of(source, lowering.out_size(node), index_map)


@register_lowering(aten.diagonal.default, aten.diagonal_copy.default)
def lower_diagonal(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    a = lowering.args(node)
    offset = int(a["offset"])
    d1, d2 = norm_dim(int(a["dim1"]), source.ndim), norm_dim(int(a["dim2"]), source.ndim)
    rest = [d for d in range(source.ndim) if d not in (d1, d2)]

    def index_map(index: Index) -> list[sympy.Expr]:
        result: list[sympy.Expr] = [sympy.Integer(0)] * source.ndim
        for position, d in enumerate(rest):
            result[d] = index[position]
        result[d1] = index[-1] + max(-offset, 0)
        result[d2] = index[-1] + max(offset, 0)
        return result

    return view_of(source, lowering.out_size(node), index_map)


@register_lowering(aten.flip.default)
def lower_flip(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    dims = {norm_dim(int(d), source.ndim) for d in list_arg(node.args[1])}

    def index_map(index: Index) -> list[sympy.Expr]:
        return [source.size[d] - 1 - i if d in dims else i for d, i in enumerate(index)]

    return view_of(source, source.size, index_map)


@register_lowering(aten.repeat.default)
def lower_repeat(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    source = lowering.tensor(node.args[0])
    size = lowering.out_size(node)
    lead = len(size) - source.ndim

    def index_map(index: Index) -> list[sympy.Expr]:
        result: list[sympy.Expr] = []
        for d, s in enumerate(source.size):
            i = index[lead + d]
            result.append(i if s == size[lead + d] else ModularIndexing(i, 1, s))
        return result

    return view_of(source, size, index_map)


@register_lowering(
    aten.split_with_sizes.default, aten.split.Tensor, aten.split_with_sizes_copy.default
)
def lower_split(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, ...]:
    source = lowering.tensor(node.args[0])
    dim = norm_dim(int_arg(node.args[2]) if len(node.args) > 2 else 0, source.ndim)
    parts: list[LazyTensor] = []
    start: sympy.Expr = sympy.Integer(0)
    for val in node.meta["val"]:
        size = tuple(as_expr(s) for s in val.shape)

        def index_map(index: Index, offset: sympy.Expr = start) -> list[sympy.Expr]:
            result = list(index)
            result[dim] = index[dim] + offset
            return result

        parts.append(view_of(source, size, index_map))
        start = start + size[dim]
    return tuple(parts)


@register_lowering(aten.unbind.int, aten.unbind_copy.int)
def lower_unbind(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, ...]:
    source = lowering.tensor(node.args[0])
    dim = norm_dim(int_arg(node.args[1]) if len(node.args) > 1 else 0, source.ndim)
    count = source.size[dim]
    if not isinstance(count, sympy.Integer):
        raise NotLowerable("unbind along a symbolic dimension")
    size = source.size[:dim] + source.size[dim + 1 :]

    def pick(k: int) -> IndexMap:
        return lambda index: [*index[:dim], sympy.Integer(k), *index[dim:]]

    return tuple(view_of(source, size, pick(k)) for k in range(int(count)))


def numel(size: Sequence[sympy.Expr]) -> sympy.Expr:
    return product(size)
