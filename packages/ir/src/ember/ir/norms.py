"""Lowerings of the normalisations: layer norm, group norm and batch norm.

Each computes its statistics with one Welford reduction (mean and M2 in one pass over
the input) and normalises in a pointwise body that the scheduler can fuse with the
reduction's consumers. Low-precision inputs are normalised in float32, as eager does.
Batch norm in training mode also updates the running statistics in place when it is
given them (the non-functional `native_batch_norm` does that in eager too).

Batch norm's backward (`native_batch_norm_backward`) is lowered here too, whole: two
per-channel sums in one pass over the gradient and the input, and one pointwise pass
for the input's gradient. Kept whole through the decomposition table, AOTAutograd
traces it as one node instead of the twenty-odd of torch's decomposition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy
import torch
import torch.fx

from ember.ir.expr import IndexExpr, Node
from ember.ir.lowering import GraphLowering, NotLowerable, arg_val, register_lowering
from ember.ir.pointwise import c, op
from ember.ir.reduction import acc_dtype, reduce, welford
from ember.ir.symbolic import as_expr
from ember.ir.tensor import Index, LazyTensor, Loader, cast, const
from ember.ir.views import reshape_map, view_of

aten = torch.ops.aten


def _rstd(m2: Node, count: sympy.Expr, eps: float) -> Node:
    var = op("truediv", m2, cast(IndexExpr(count), m2.dtype))
    return op("rsqrt", op("add", var, c(eps, var)))


def _optional(lowering: GraphLowering, arg: Any) -> LazyTensor | None:
    return None if arg is None else lowering.tensor(arg)


def _affine(x: Node, weight: Node | None, bias: Node | None) -> Node:
    if weight is not None:
        x = op("mul", x, cast(weight, x.dtype))
    if bias is not None:
        x = op("add", x, cast(bias, x.dtype))
    return x


def _typed(
    value: LazyTensor, dtype: torch.dtype, size: Sequence[sympy.Expr] | None = None
) -> LazyTensor:
    load = value.loader
    target = tuple(size) if size is not None else value.size
    reshape = reshape_map(value.size, target) if size is not None else None

    def loader(index: Index) -> Node:
        return cast(load(reshape(index) if reshape else index), dtype)

    return LazyTensor(value.device, dtype, target, loader)


@register_lowering(aten.native_layer_norm.default)
def lower_layer_norm(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, ...]:
    a = lowering.args(node)
    x = lowering.tensor(a["input"])
    axis = x.ndim - len(a["normalized_shape"])
    dims = list(range(axis, x.ndim))
    weight, bias = _optional(lowering, a["weight"]), _optional(lowering, a["bias"])
    eps = float(a["eps"])
    mean, m2, count = welford(lowering, x, dims)
    dtype = mean.dtype

    def out(index: Index) -> Node:
        outer = index[:axis]
        xs = cast(x.loader(index), dtype)
        normed = op("mul", op("sub", xs, mean.loader(outer)), _rstd(m2.loader(outer), count, eps))
        inner = index[axis:]
        w = weight.loader(inner) if weight is not None else None
        b = bias.loader(inner) if bias is not None else None
        return cast(_affine(normed, w, b), x.dtype)

    rstd = LazyTensor(x.device, dtype, mean.size, lambda i: _rstd(m2.loader(i), count, eps))
    vals = node.meta["val"]
    stat_size = tuple(as_expr(s) for s in vals[1].shape)
    return (
        LazyTensor(x.device, x.dtype, x.size, out),
        _typed(mean, vals[1].dtype, stat_size),
        _typed(rstd, vals[2].dtype, stat_size),
    )


@register_lowering(aten.native_group_norm.default)
def lower_group_norm(lowering: GraphLowering, node: torch.fx.Node) -> tuple[LazyTensor, ...]:
    a = lowering.args(node)
    x = lowering.tensor(a["input"])
    n, ch, groups = as_expr(a["N"]), as_expr(a["C"]), int(a["group"])
    per_group = sympy.sympify(ch / groups)
    rest = sympy.sympify(as_expr(a["HxW"]) * per_group)
    grouped = view_of(
        x, (n, sympy.Integer(groups), rest), reshape_map(x.size, (n, sympy.Integer(groups), rest))
    )
    mean, m2, count = welford(lowering, grouped, [2])
    weight, bias = _optional(lowering, a["weight"]), _optional(lowering, a["bias"])
    eps = float(a["eps"])
    dtype = mean.dtype
    from torch.utils._sympy.functions import FloorDiv

    def out(index: Index) -> Node:
        group_index = [index[0], FloorDiv(index[1], per_group)]
        xs = cast(x.loader(index), dtype)
        normed = op(
            "mul",
            op("sub", xs, mean.loader(group_index)),
            _rstd(m2.loader(group_index), count, eps),
        )
        w = weight.loader([index[1]]) if weight is not None else None
        b = bias.loader([index[1]]) if bias is not None else None
        return cast(_affine(normed, w, b), x.dtype)

    rstd = LazyTensor(x.device, dtype, mean.size, lambda i: _rstd(m2.loader(i), count, eps))
    vals = node.meta["val"]
    return (
        LazyTensor(x.device, x.dtype, x.size, out),
        _typed(mean, vals[1].dtype),
        _typed(rstd, vals[2].dtype),
    )


@register_lowering(
    aten.native_batch_norm.default,
    aten._native_batch_norm_legit_functional.default,
    aten._native_batch_norm_legit_no_training.default,
    aten._native_batch_norm_legit.default,
    aten._batch_norm_with_update_functional.default,
)
def lower_batch_norm(lowering: GraphLowering, node: torch.fx.Node) -> tuple[Any, ...]:
    a = lowering.args(node)
    x = lowering.tensor(a["input"])
    with_update = node.target is aten._batch_norm_with_update_functional.default
    training = with_update or bool(a.get("training", False))
    if x.ndim < 2:
        raise NotLowerable("batch norm of a tensor without a channel dimension")
    weight, bias = _optional(lowering, a["weight"]), _optional(lowering, a["bias"])
    running_mean, running_var = (
        _optional(lowering, a.get("running_mean")),
        _optional(lowering, a.get("running_var")),
    )
    eps, momentum = float(a["eps"]), float(a["momentum"])
    dtype = acc_dtype(x.dtype)
    vals = node.meta["val"]
    updates: list[LazyTensor] = []
    if training:
        mean, m2, count = welford(lowering, x, [0, *range(2, x.ndim)])
        mean_at: Loader = mean.loader

        def welford_rstd(i: Index) -> Node:
            return _rstd(m2.loader(i), count, eps)

        rstd_at: Loader = welford_rstd

        if running_mean is not None and running_var is not None:
            updates = _running_updates(mean, m2, count, running_mean, running_var, momentum)
    else:
        if running_mean is None or running_var is None:
            raise NotLowerable("batch norm in eval mode without running statistics")
        mean_at, rstd_at = _running_statistics(running_mean, running_var, eps, dtype)

    def out(index: Index) -> Node:
        channel = [index[1]]
        xs = cast(x.loader(index), dtype)
        normed = op("mul", op("sub", xs, mean_at(channel)), rstd_at(channel))
        w = weight.loader(channel) if weight is not None else None
        b = bias.loader(channel) if bias is not None else None
        return cast(_affine(normed, w, b), x.dtype)

    result: list[Any] = [LazyTensor(x.device, x.dtype, x.size, out)]
    for val, at in zip(vals[1:3], (mean_at, rstd_at), strict=True):
        size = tuple(as_expr(s) for s in val.shape)
        result.append(LazyTensor(x.device, val.dtype, size, _stat_loader(at, val.dtype, training)))
    if with_update:  # (out, mean, rstd, reserve, new running mean, new running var)
        if not updates:
            raise NotLowerable("batch norm with update but without running statistics")
        reserve = vals[3]
        empty = LazyTensor(
            x.device,
            reserve.dtype,
            tuple(as_expr(s) for s in reserve.shape),
            _stat_loader(mean_at, reserve.dtype, False),
        )
        return (*result, empty, *updates)
    if node.target is aten._native_batch_norm_legit_functional.default:
        if not updates:
            raise NotLowerable("functional batch norm without running statistics")
        return (*result, *updates)
    if updates:
        lowering.mutate(a["running_mean"], updates[0])
        lowering.mutate(a["running_var"], updates[1])
    return tuple(result)


def _running_statistics(
    running_mean: LazyTensor, running_var: LazyTensor, eps: float, dtype: torch.dtype
) -> tuple[Loader, Loader]:
    """Per-channel loaders of an eval-mode batch norm's mean and 1/sqrt(var + eps), from
    its running statistics, in `dtype` (the forward and the backward read them alike)."""

    def rstd_at(c: Index) -> Node:
        return op("rsqrt", op("add", cast(running_var.loader(c), dtype), const(eps, dtype)))

    return _cast_to(running_mean, dtype), rstd_at


def _cast_to(value: LazyTensor, dtype: torch.dtype) -> Loader:
    """A loader of `value` cast to `dtype`."""

    def at(c: Index) -> Node:
        return cast(value.loader(c), dtype)

    return at


def _stat_loader(at: Loader, dtype: torch.dtype, training: bool) -> Loader:
    """Saved batch statistics (training), or the empty placeholders eval mode returns."""
    if training:
        return lambda i: cast(at(i), dtype)
    zero = const(0, dtype)
    return lambda i: zero


def _running_updates(
    mean: LazyTensor,
    m2: LazyTensor,
    count: sympy.Expr,
    rm: LazyTensor,
    rv: LazyTensor,
    momentum: float,
) -> list[LazyTensor]:
    """running = (1 - momentum) * running + momentum * batch (unbiased variance)."""

    def blend(running: LazyTensor, batch: Any) -> LazyTensor:
        def load(index: Index) -> Node:
            old = running.loader(index)
            new = cast(batch(index), old.dtype)
            return op("add", op("mul", old, c(1 - momentum, old)), op("mul", new, c(momentum, old)))

        return LazyTensor(running.device, running.dtype, running.size, load)

    def unbiased(index: Index) -> Node:
        m = m2.loader(index)
        return op("truediv", m, cast(IndexExpr(sympy.Max(count - 1, 1)), m.dtype))

    return [blend(rm, mean.loader), blend(rv, unbiased)]


@register_lowering(aten.native_batch_norm_backward.default)
def lower_batch_norm_backward(
    lowering: GraphLowering, node: torch.fx.Node
) -> tuple[LazyTensor | None, ...]:
    """Gradients of batch norm's input, weight and bias (None where `output_mask` does
    not ask for one, as eager returns). Per channel c, over the N * spatial elements of
    the channel, with `mean` and `invstd` the saved batch statistics (training) or
    those of the running statistics (eval):

        sum_dy = sum(dy),  dot = sum(dy * (x - mean))
        grad_weight = dot * invstd,  grad_bias = sum_dy
        grad_input  = (dy - (x - mean) * dot * invstd^2 / n - sum_dy / n) * invstd * w
                      (eval: dy * invstd * w)

    Everything is computed in float32 for the half types (as eager's kernels do) and
    rounded once to the output's dtype."""
    a = lowering.args(node)
    x, dy = lowering.tensor(a["input"]), lowering.tensor(a["grad_out"])
    if x.ndim < 2:
        raise NotLowerable("batch norm backward of a tensor without a channel dimension")
    train, eps = bool(a["train"]), float(a["eps"])
    mask = [bool(m) for m in a["output_mask"]]
    weight = _optional(lowering, a["weight"])
    if weight is None and (mask[1] or mask[2]) and x.dtype != torch.float32:
        # eager gives these the dtype of the saved statistics, the meta kernel the input's
        raise NotLowerable("weight and bias gradients asked for without a weight")
    dtype = acc_dtype(x.dtype)
    if train:
        saved_mean, saved_invstd = (
            _optional(lowering, a["save_mean"]),
            _optional(lowering, a["save_invstd"]),
        )
        if saved_mean is None or saved_invstd is None:
            raise NotLowerable("batch norm backward in training without saved statistics")
        mean_at, invstd_at = _cast_to(saved_mean, dtype), _cast_to(saved_invstd, dtype)
    else:
        running_mean = _optional(lowering, a["running_mean"])
        running_var = _optional(lowering, a["running_var"])
        if running_mean is None or running_var is None:
            raise NotLowerable("batch norm backward in eval mode without running statistics")
        mean_at, invstd_at = _running_statistics(running_mean, running_var, eps, dtype)

    vals = node.meta["val"]
    dims = [0, *range(2, x.ndim)]
    count = cast(IndexExpr(sympy.Mul(*(x.size[d] for d in dims))), dtype)
    # the gradient, read by both sums and the input's gradient; the input, by the dot
    # product and (training) the input's gradient: stored or recomputed by each reader
    # as a node's result with that many users would be
    need_dot = mask[1] or (mask[0] and train)
    need_sum = mask[2] or (mask[0] and train)
    readers_dy = int(need_sum) + int(need_dot) + int(mask[0])
    grad = lowering.read_by(_typed(dy, dtype), readers_dy, arg_val(a.get("grad_out")))
    readers_x = int(need_dot) + int(mask[0] and train)
    xs = lowering.read_by(_typed(x, dtype), readers_x, arg_val(a.get("input")))

    def centred(index: Index) -> Node:
        return op("sub", xs.loader(index), mean_at([index[1]]))

    sum_dy = dot = None
    if need_sum:
        sum_dy = reduce(lowering, grad, dims, "sum", dtype)
    if need_dot:
        product = LazyTensor(
            x.device, dtype, x.size, lambda i: op("mul", grad.loader(i), centred(i))
        )
        dot = reduce(lowering, product, dims, "sum", dtype)

    def grad_input(index: Index) -> Node:
        channel = [index[1]]
        invstd = invstd_at(channel)
        scale = invstd if weight is None else op("mul", invstd, cast(weight.loader(channel), dtype))
        dyi = grad.loader(index)
        if train:
            assert sum_dy is not None and dot is not None
            proj = op(
                "mul",
                op("truediv", op("mul", dot.loader(channel), op("mul", invstd, invstd)), count),
                centred(index),
            )
            mean_dy = op("truediv", sum_dy.loader(channel), count)
            dyi = op("sub", op("sub", dyi, proj), mean_dy)
        return cast(op("mul", dyi, scale), vals[0].dtype)

    results: list[LazyTensor | None] = [None, None, None]
    if mask[0]:
        results[0] = LazyTensor(x.device, vals[0].dtype, x.size, grad_input)
    if mask[1]:
        assert dot is not None
        d = dot
        results[1] = LazyTensor(
            x.device,
            vals[1].dtype,
            d.size,
            lambda c: cast(op("mul", d.loader(c), invstd_at(c)), vals[1].dtype),
        )
    if mask[2]:
        assert sum_dy is not None
        results[2] = _typed(sum_dy, vals[2].dtype)
    return tuple(results)
