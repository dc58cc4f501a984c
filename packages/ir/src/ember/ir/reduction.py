"""Lowerings of reductions: sum, prod, mean, amax/amin, max/min (values and indices),
argmax/argmin, any/all, var/var_mean (one Welford pass) and softmax/log_softmax.
Cumulative ops (cumsum, cummax, ...) are scans: ember.ir.scan.

A reduction's result is always stored (a `ComputedBuffer` holding a `Reduction`); its
input is not: the producer's body is inlined into the reduction body, so `sum(exp(x))`
reads x once. Floating-point sums and products of bfloat16/float16 accumulate in
float32 as eager does; integer sums in int64. Reducing over no dimensions (`dim=[]`)
reduces over all of them, as ATen does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx

from ember.ir.expr import IndexExpr, Node, Where
from ember.ir.layout import Layout
from ember.ir.loops import Reduction, reduction_dtype
from ember.ir.lowering import GraphLowering, NotLowerable, register_lowering
from ember.ir.pointwise import op
from ember.ir.symbolic import index_var, product
from ember.ir.tensor import Index, LazyTensor, broadcast_loader, cast, const
from ember.ir.views import norm_dim, reshape_map, view_of

aten = torch.ops.aten


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype eager accumulates `dtype` in."""
    if dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    if not dtype.is_floating_point and not dtype.is_complex:
        return torch.int64
    return dtype


def dims_of(arg: Any, ndim: int) -> list[int]:
    """Reduction dims from an ATen `dim` argument (None or [] mean all)."""
    if arg is None:
        return list(range(ndim))
    dims = [arg] if isinstance(arg, int) else list(arg)
    if not dims:
        return list(range(ndim))
    return sorted({norm_dim(int(d), max(ndim, 1)) for d in dims if ndim > 0})


def reduce(
    lowering: GraphLowering, source: LazyTensor, dims: Sequence[int], kind: str, dtype: torch.dtype
) -> LazyTensor:
    """Store `kind`-reduction of `source` over `dims` (body cast to `dtype`); the
    result has the kept dimensions (plus a trailing 2 for welford)."""
    if not dims:
        return _reduce_nothing(source, kind, dtype)
    kept = [d for d in range(source.ndim) if d not in dims]
    ranges = tuple(source.size[d] for d in kept)
    reduced = tuple(source.size[d] for d in dims)
    index: list[sympy.Expr] = [sympy.Integer(0)] * source.ndim
    for position, d in enumerate(kept):
        index[d] = index_var("i", position)
    for position, d in enumerate(dims):
        index[d] = index_var("r", position)
    body = cast(source.loader(index), dtype)
    size = (*ranges, sympy.Integer(2)) if kind == "welford" else ranges
    layout = Layout.contiguous(source.device, reduction_dtype(kind, dtype), size)
    ref = lowering.store(Reduction(ranges, reduced, kind, body), layout)
    return lowering.tensor(ref)


def _reduce_nothing(source: LazyTensor, kind: str, dtype: torch.dtype) -> LazyTensor:
    """A reduction over no dimension (of a 0-dim tensor) as the pointwise value it is:
    each result combines exactly one element. No `Reduction` is built: the codegens
    run one with empty reduction ranges as a pointwise store of its body, which is
    right for sum/max/any but not for argmax (index 0) or welford (M2 = 0)."""
    load = source.loader
    if kind in ("argmax", "argmin"):
        zero = const(0, torch.int64)
        return LazyTensor(source.device, torch.int64, source.size, lambda index: zero)
    if kind != "welford":
        return LazyTensor(
            source.device, reduction_dtype(kind, dtype), source.size,
            lambda index: cast(load(index), dtype),
        )  # fmt: skip

    def stats(index: Index) -> Node:  # [..., 0] = mean = the element, [..., 1] = M2 = 0
        *inner, field = index
        value, zero = cast(load(inner), dtype), const(0, dtype)
        if isinstance(field, sympy.Integer):
            return value if field == 0 else zero
        return Where(op("eq", IndexExpr(field), const(0, torch.int64)), value, zero)

    return LazyTensor(source.device, dtype, (*source.size, sympy.Integer(2)), stats)


def keep_dims(value: LazyTensor, dims: Sequence[int], ndim: int, keepdim: bool) -> LazyTensor:
    """Re-insert the reduced dims as size 1 when keepdim is set."""
    if not keepdim:
        return value
    size = list(value.size)
    for d in dims:
        size.insert(d, sympy.Integer(1))
    load = value.loader

    def loader(index: Index) -> Node:
        return load([i for d, i in enumerate(index) if d not in dims])

    return LazyTensor(value.device, value.dtype, tuple(size), loader)


def expand_back(value: LazyTensor, dims: Sequence[int]) -> Any:
    """A loader reading a reduced value at the full (unreduced) index."""
    load = value.loader
    return lambda index: load([i for d, i in enumerate(index) if d not in dims])


def finish(node: torch.fx.Node, value: LazyTensor, lowering: GraphLowering) -> LazyTensor:
    """`value` cast to the node's dtype."""
    val = lowering.out_val(node)
    load = value.loader
    return LazyTensor(
        value.device, val.dtype, value.size, lambda index: cast(load(index), val.dtype)
    )


def _simple(kind: str) -> Any:
    def lower(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
        a = lowering.args(node)
        source = lowering.tensor(a["self"])
        dims = dims_of(a.get("dim"), source.ndim)
        val = lowering.out_val(node)
        if kind in ("sum", "prod"):
            dtype = acc_dtype(val.dtype)
        elif kind in ("any", "all"):
            dtype = torch.bool
        else:
            dtype = source.dtype
        result = reduce(lowering, source, dims, kind, dtype)
        return finish(node, keep_dims(result, dims, source.ndim, bool(a.get("keepdim"))), lowering)

    return lower


register_lowering(aten.sum.dim_IntList, aten.sum.default)(_simple("sum"))
register_lowering(aten.prod.dim_int, aten.prod.default)(_simple("prod"))
register_lowering(aten.amax.default, aten.max.default)(_simple("max"))
register_lowering(aten.amin.default, aten.min.default)(_simple("min"))
register_lowering(aten.any.dim, aten.any.dims, aten.any.default)(_simple("any"))
register_lowering(aten.all.dim, aten.all.dims, aten.all.default)(_simple("all"))
register_lowering(aten.argmax.default)(_simple("argmax"))
register_lowering(aten.argmin.default)(_simple("argmin"))


@register_lowering(aten.max.dim, aten.min.dim)
def lower_max_dim(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, LazyTensor]:
    a = lowering.args(node)
    source = lowering.tensor(a["self"])
    dims = dims_of(a["dim"], source.ndim)
    keepdim = bool(a["keepdim"])
    kind = "max" if node.target is aten.max.dim else "min"
    values = reduce(lowering, source, dims, kind, source.dtype)
    indices = reduce(lowering, source, dims, "arg" + kind, source.dtype)
    return keep_dims(values, dims, source.ndim, keepdim), keep_dims(
        indices, dims, source.ndim, keepdim
    )


@register_lowering(aten.mean.dim, aten.mean.default)
def lower_mean(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    a = lowering.args(node)
    source = lowering.tensor(a["self"])
    dims = dims_of(a.get("dim"), source.ndim)
    val = lowering.out_val(node)
    dtype = acc_dtype(val.dtype)
    total = reduce(lowering, source, dims, "sum", dtype)
    count = product(source.size[d] for d in dims)
    load = total.loader
    mean = LazyTensor(
        total.device,
        dtype,
        total.size,
        lambda index: op("truediv", load(index), cast(IndexExpr(count), dtype)),
    )
    return finish(node, keep_dims(mean, dims, source.ndim, bool(a.get("keepdim"))), lowering)


def welford(
    lowering: GraphLowering, source: LazyTensor, dims: Sequence[int]
) -> tuple[LazyTensor, LazyTensor, sympy.Expr]:
    """(mean, M2, count) over `dims` from one Welford reduction."""
    dtype = acc_dtype(source.dtype)
    stats = reduce(lowering, source, dims, "welford", dtype)
    load = stats.loader
    size = stats.size[:-1]
    mean = LazyTensor(stats.device, dtype, size, lambda index: load([*index, sympy.Integer(0)]))
    m2 = LazyTensor(stats.device, dtype, size, lambda index: load([*index, sympy.Integer(1)]))
    return mean, m2, product(source.size[d] for d in dims)


@register_lowering(aten.var.correction, aten.var_mean.correction)
def lower_var(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    a = lowering.args(node)
    source = lowering.tensor(a["self"])
    if not source.dtype.is_floating_point:
        raise NotLowerable("variance of an integer tensor")
    dims = dims_of(a["dim"], source.ndim)
    correction = a["correction"]
    correction = 1 if correction is None else correction
    mean, m2, count = welford(lowering, source, dims)
    load_m2 = m2.loader
    divisor = sympy.Max(count - sympy.sympify(correction), 0)

    def var_loader(index: Index) -> Node:
        m = load_m2(index)
        return op(
            "truediv",
            m,
            cast(
                IndexExpr(divisor) if divisor.free_symbols else const(float(divisor), m.dtype),
                m.dtype,
            ),
        )

    var = LazyTensor(m2.device, m2.dtype, m2.size, var_loader)
    keepdim = bool(a["keepdim"])
    vals = node.meta["val"]
    if node.target is aten.var.correction:
        return finish(node, keep_dims(var, dims, source.ndim, keepdim), lowering)
    results = (
        keep_dims(var, dims, source.ndim, keepdim),
        keep_dims(mean, dims, source.ndim, keepdim),
    )
    return tuple(_cast(r, v.dtype) for r, v in zip(results, vals, strict=True))


def _cast(value: LazyTensor, dtype: torch.dtype) -> LazyTensor:
    load = value.loader
    return LazyTensor(value.device, dtype, value.size, lambda index: cast(load(index), dtype))


@register_lowering(aten._softmax.default, aten._log_softmax.default)
def lower_softmax(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    """softmax(x) = exp(x - max) / sum(exp(x - max)): two reductions, the exp inlined."""
    source = lowering.tensor(node.args[0])
    dims = dims_of(node.args[1], source.ndim)
    dtype = acc_dtype(source.dtype) if source.dtype.is_floating_point else torch.float32
    top = expand_back(reduce(lowering, source, dims, "max", dtype), dims)
    load = source.loader

    def shifted(index: Index) -> Node:
        return op("sub", cast(load(index), dtype), top(index))

    exp = LazyTensor(source.device, dtype, source.size, lambda index: op("exp", shifted(index)))
    total = expand_back(reduce(lowering, exp, dims, "sum", dtype), dims)
    val = lowering.out_val(node)
    if node.target is aten._softmax.default:
        return LazyTensor(
            val.device, val.dtype, source.size,
            lambda index: cast(op("truediv", op("exp", shifted(index)), total(index)), val.dtype),
        )  # fmt: skip
    return LazyTensor(
        val.device, val.dtype, source.size,
        lambda index: cast(op("sub", shifted(index), op("log", total(index))), val.dtype),
    )  # fmt: skip


@register_lowering(aten._trilinear.default)
def lower_trilinear(lowering: GraphLowering, node: torch.fx.Node) -> LazyTensor:
    """`_trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim)` (what `bilinear`
    becomes): each input gets size-1 dims at its `expand` positions, the three are
    multiplied, broadcast together, and summed over `sumdim`. One reduction over a
    pointwise product; eager's bmm-based kernel computes the same sums."""
    a = lowering.args(node)
    inputs = [lowering.tensor(a[k]) for k in ("i1", "i2", "i3")]
    expands = [[int(d) for d in a[k]] for k in ("expand1", "expand2", "expand3")]
    ndim = inputs[0].ndim + len(expands[0])
    spread: list[LazyTensor] = []
    for value, added in zip(inputs, expands, strict=True):
        if value.ndim + len(added) != ndim:
            raise NotLowerable("_trilinear inputs of different ranks")
        kept = [d for d in range(ndim) if d not in added]
        size = [sympy.Integer(1)] * ndim
        for d, s in zip(kept, value.size, strict=True):
            size[d] = s
        spread.append(view_of(value, size, _pick(kept)))
    full: list[sympy.Expr] = []
    for d in range(ndim):
        sizes = [t.size[d] for t in spread if t.size[d] != 1]
        full.append(sizes[0] if sizes else sympy.Integer(1))
    dtype = acc_dtype(inputs[0].dtype)
    loads = [broadcast_loader(t, tuple(full)) for t in spread]

    def triple(index: Index) -> Node:
        x, y, z = (cast(load(index), dtype) for load in loads)
        return op("mul", op("mul", x, y), z)

    source = LazyTensor(inputs[0].device, dtype, tuple(full), triple)
    summed = reduce(lowering, source, sorted({int(d) for d in a["sumdim"]}), "sum", dtype)
    out = lowering.out_size(node)
    val = lowering.out_val(node)
    shaped = view_of(summed, out, reshape_map(summed.size, out))
    load = shaped.loader
    return LazyTensor(val.device, val.dtype, out, lambda index: cast(load(index), val.dtype))


def _pick(dims: Sequence[int]) -> Any:
    """An index map keeping the coordinates of `dims` (dropping the added size-1 dims)."""
    return lambda index: [index[d] for d in dims]
