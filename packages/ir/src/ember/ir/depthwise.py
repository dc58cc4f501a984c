"""Lowerings of 2-d depthwise convolutions: `aten.convolution` and
`aten.convolution_backward` where every channel is convolved with its own filter
(groups == in channels == out channels, one filter per group), not transposed.

Why not leave them to the vendor libraries as every other convolution (the
"convolution" group of ember.ir.externs)? A depthwise convolution does KH * KW
multiply-adds per element it reads: it is bound by memory, not by arithmetic, so a
library kernel has nothing to win over a generated loop, and as an ATen call it costs
two things a loop does not. cuDNN 9.10 and later compiles its channels-last depthwise
kernels at run time on first use (NVIDIA/cudnn-frontend#1066): eager MobileNetV3
training took 9-17 s for its first step channels-last against about 1 s NCHW (H100,
cuDNN 9.19, bf16), and ember's cold compile of the same model spent about 15 of its
40 s there. And an ATen call is a fusion barrier: the batch norm and activation on
either side of each depthwise convolution are a kernel of their own, a full write and
read of the activations more. As loop nodes they fuse like a pooling window.

Formulations, each following the order of eager's CUDA depthwise kernels (ATen's
`conv_depthwise2d_*`) and accumulating in float32 for the half types, as they do:

- the forward is pointwise: each output element is the bias (where there is one)
  plus the window's KH * KW products, unrolled in row-major tap order, each masked
  where its tap falls in the padding (a weighted average pool: ember.ir.pooling). A
  `Reduction` over a 9-long window would leave most of a GPU block's reduction lanes
  idle, and a 3x3 window unrolled reads each input element about once;
- the input's gradient is a gather, pointwise too: input position `h` takes, for each
  tap `kh` in row-major order, the output gradient at `o = (h + pad - kh * dilation)
  / stride` where that division is exact and `o` is an output position (the
  windows that read `h`), times that tap's weight. No scatter, no atomics, and a
  deterministic sum;
- the weight's gradient is a sum `Reduction` per (channel, kh, kw) over (N, OH, OW)
  of the output gradient times the input the tap read (0 in the padding); the bias's
  a sum per channel over (N, OH, OW). These are long reductions to few outputs, which
  the scheduler splits.

Which devices lower them is the runtime's choice (`LoweringOptions.extern_depthwise`:
the device types whose depthwise convolutions stay ATen calls); every other
convolution stays an ATen call on purpose, as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx
from torch.utils._sympy.functions import FloorDiv

from ember.ir.assemble import all_of, guard, index_value
from ember.ir.expr import Node, Where
from ember.ir.loops import Reduction
from ember.ir.lowering import GraphLowering, arg_val, register_lowering
from ember.ir.pointwise import op
from ember.ir.pooling import guard_window, spatial_arg
from ember.ir.reduction import acc_dtype
from ember.ir.symbolic import index_var, loop_vars
from ember.ir.tensor import Index, LazyTensor, cast, const

aten = torch.ops.aten

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class _Axis:
    """One spatial dimension of the convolution: `size` inputs, `out` outputs."""

    kernel: int
    stride: int
    pad: int
    dilation: int
    size: sympy.Expr
    out: sympy.Expr

    def read(self, o: sympy.Expr, k: sympy.Expr, k_last: int) -> tuple[sympy.Expr, list[Node]]:
        """The input coordinate that output `o`'s tap `k` reads, and the checks that it
        lies inside the input (`k` ranges up to `k_last`: a tap, or a loop variable)."""
        offset = k * self.dilation - self.pad
        coord = o * self.stride + offset
        low = sympy.sympify(offset).subs(k, 0) if isinstance(k, sympy.Symbol) else offset
        high = (self.out - 1) * self.stride - self.pad + k_last * self.dilation
        return coord, _within(coord, low, high, self.size)

    def reader(self, x: sympy.Expr, k: int) -> tuple[sympy.Expr, list[Node]]:
        """The output position whose tap `k` reads input `x`, and the checks that it
        exists: `x + pad - k * dilation` is a multiple of the stride, and the quotient
        an output position."""
        t = x + self.pad - k * self.dilation
        if self.stride == 1:
            low = self.pad - k * self.dilation
            return t, _within(t, low, self.size - 1 + low, self.out)
        s = self.stride
        # a multiple of the stride added before the division keeps its numerator
        # nonnegative (a codegen's `//` may truncate); t is at least -k * dilation
        lift = -(-(self.kernel - 1) * self.dilation // s)
        o = FloorDiv(t + s * lift, s) - lift
        checks = [op("eq", index_value(o * s), index_value(t))]
        checks.append(op("ge", index_value(o), index_value(sympy.Integer(0))))
        checks.append(op("lt", index_value(o), index_value(self.out)))
        return o, checks


def _within(coord: sympy.Expr, low: sympy.Expr, high: sympy.Expr, size: sympy.Expr) -> list[Node]:
    """Checks of `0 <= coord < size` where `coord` ranges over [low, high] in the
    loop: each bound left out where it holds at every point (the taps away from the
    padding need no mask, and their loads none)."""
    checks: list[Node] = []
    if not sympy.sympify(low).is_nonnegative:
        checks.append(op("ge", index_value(coord), index_value(sympy.Integer(0))))
    if not sympy.sympify(high - size).is_negative:
        checks.append(op("lt", index_value(coord), index_value(size)))
    return checks


def _depthwise_reason(
    x: Any, w: Any, transposed: bool, groups: int, stride: Sequence[int]
) -> str | None:
    """Why this convolution is not one ember lowers (None: it is a 2-d depthwise
    convolution with a channel multiplier of 1)."""
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor):
        return "no example values"
    if transposed:
        return "transposed convolutions are library calls"
    if x.dim() != 4 or w.dim() != 4:
        return "only 2-d depthwise convolutions are lowered"
    channels = x.shape[1]
    if not (groups == channels == w.shape[0] and w.shape[1] == 1 and groups > 1):
        return "not a depthwise convolution (groups == in == out channels)"
    if x.dtype not in _FLOATS or w.dtype != x.dtype:
        return f"a depthwise convolution in {x.dtype} with a {w.dtype} weight"
    if not all(isinstance(s, int) for s in (*w.shape[2:], *stride)):
        return "a depthwise convolution with a symbolic window"
    return None


def _refusal(lowering: GraphLowering, a: dict[str, Any], alike: Sequence[Any]) -> str | None:
    """Why this convolution, or its backward (bound arguments `a`), stays an ATen
    call: it is not a 2-d depthwise one; a tensor of `alike` (the bias, the output
    gradient) is missing or of another dtype than the input (for a bias eager raises,
    and its meta function does not); or the device type keeps them ATen calls."""
    x, w = arg_val(a["input"]), arg_val(a["weight"])
    stride = spatial_arg(a["stride"], 2)
    reason = _depthwise_reason(x, w, bool(a["transposed"]), int(a["groups"]), stride)
    if reason is not None:
        return reason
    assert isinstance(x, torch.Tensor)
    for other in alike:
        if not isinstance(other, torch.Tensor) or other.dtype != x.dtype:
            return f"an operand of another dtype than the {x.dtype} input (the bias, the gradient)"
    if x.device.type in lowering.options.extern_depthwise:
        return f"depthwise convolutions on {x.device.type} are ATen calls here"
    return None


def _axes(
    a: dict[str, Any], kernel: Sequence[int], size: Sequence[sympy.Expr], out: Sequence[sympy.Expr]
) -> list[_Axis]:
    stride, pad = spatial_arg(a["stride"], 2), spatial_arg(a["padding"], 2)
    dilation = spatial_arg(a["dilation"], 2)
    return [
        _Axis(k, s, p, d, n, o)
        for k, s, p, d, n, o in zip(kernel, stride, pad, dilation, size, out, strict=True)
    ]


def _conv_input(lowering: GraphLowering, arg: Any, taps: int, stride: Sequence[int]) -> LazyTensor:
    """The convolved input, stored first where its producer (a batch norm and an
    activation) would otherwise be computed again for each window it falls in, by the
    rule for a value with that many readers; as pooling does (ember.ir.pooling's
    `_pool_input`), where shared values are recomputed (GPUs) only for windows that
    unroll into few taps."""
    x = lowering.tensor(arg)
    like = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
    if lowering.options.recompute_shared and taps <= 16:
        return x
    reads = math.ceil(taps / math.prod(stride))
    return lowering.tensor(lowering.read_by(x, max(reads, 1), like))


def _sum(terms: Sequence[Node], start: Node | None, dtype: torch.dtype) -> Node:
    acc = start
    for term in terms:
        acc = term if acc is None else op("add", acc, term)
    return acc if acc is not None else const(0.0, dtype)


def _masked(checks: list[Node], value: Node, dtype: torch.dtype) -> Node:
    return value if not checks else Where(all_of(checks), value, const(0.0, dtype))


@register_lowering(aten.convolution.default)
def lower_convolution(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    """A 2-d depthwise convolution as pointwise code (the module docstring); any other
    convolution stays an ATen call."""
    a = lowering.args(node)
    bias_arg = a["bias"]
    reason = _refusal(lowering, a, [arg_val(bias_arg)] if bias_arg is not None else [])
    if reason is not None:
        return lowering.intentional_extern(node, reason)
    weight = lowering.tensor(a["weight"])
    kh_count, kw_count = (int(k) for k in weight.size[2:])
    stride = spatial_arg(a["stride"], 2)
    x = _conv_input(lowering, a["input"], kh_count * kw_count, stride)
    bias = lowering.tensor(bias_arg) if bias_arg is not None else None
    out_size = lowering.out_size(node)
    ax_h, ax_w = _axes(a, [kh_count, kw_count], x.size[2:], out_size[2:])
    dtype = acc_dtype(x.dtype)

    def load(i: Index) -> Node:
        ch = i[1]
        terms: list[Node] = []
        for kh in range(kh_count):
            h, checks_h = ax_h.read(i[2], sympy.Integer(kh), kh)
            for kw in range(kw_count):
                w, checks_w = ax_w.read(i[3], sympy.Integer(kw), kw)
                checks = checks_h + checks_w
                if checks:
                    value = guard_window(x, i, [h, w], all_of(checks))
                else:
                    value = x.loader([*i[:2], h, w])
                tap = weight.loader([ch, sympy.Integer(0), sympy.Integer(kh), sympy.Integer(kw)])
                product = op("mul", cast(value, dtype), cast(tap, dtype))
                terms.append(_masked(checks, product, dtype))
        start = cast(bias.loader([ch]), dtype) if bias is not None else None
        return cast(_sum(terms, start, dtype), x.dtype)

    return LazyTensor(x.device, x.dtype, out_size, load)


@register_lowering(aten.convolution_backward.default)
def lower_convolution_backward(lowering: GraphLowering, node: torch.fx.Node) -> Any:
    """The gradients of a 2-d depthwise convolution (None where `output_mask` does not
    ask for one, as eager returns): the input's as a gather, the weight's and the
    bias's as reductions (the module docstring). Any other convolution's backward
    stays an ATen call."""
    a = lowering.args(node)
    x_arg, w_arg, g_arg = a["input"], a["weight"], a["grad_output"]
    x_val, g_val = arg_val(x_arg), arg_val(g_arg)
    reason = _refusal(lowering, a, [g_val])
    if reason is not None:
        return lowering.intentional_extern(node, reason)
    mask = [bool(m) for m in a["output_mask"]]
    vals = node.meta["val"]
    x, weight = lowering.tensor(x_arg), lowering.tensor(w_arg)
    kh_count, kw_count = (int(k) for k in weight.size[2:])
    taps = kh_count * kw_count
    grad = lowering.read_by(lowering.tensor(g_arg), sum(mask) + mask[0] * (taps - 1), g_val)
    ax_h, ax_w = _axes(a, [kh_count, kw_count], x.size[2:], grad.size[2:])
    dtype = acc_dtype(x.dtype)
    results: list[LazyTensor | None] = [None, None, None]
    if mask[0]:
        results[0] = _grad_input(x, weight, grad, ax_h, ax_w, dtype)
    if mask[1]:
        source = lowering.read_by(x, taps, x_val)
        results[1] = _grad_weight(lowering, source, grad, ax_h, ax_w, dtype, vals[1].dtype)
    if mask[2]:
        results[2] = _grad_bias(lowering, grad, dtype, vals[2].dtype)
    return tuple(results)


def _grad_input(
    x: LazyTensor,
    weight: LazyTensor,
    grad: LazyTensor,
    ax_h: _Axis,
    ax_w: _Axis,
    dtype: torch.dtype,
) -> LazyTensor:
    """The input's gradient, gathered: each input position sums, over the taps in
    row-major order, the gradient of the output that tap read it for, times the
    tap's weight (eager's CUDA kernel `conv_depthwise2d_backward_kernel` adds in
    this order)."""

    def load(i: Index) -> Node:
        ch = i[1]
        terms: list[Node] = []
        for kh in range(ax_h.kernel):
            oh, checks_h = ax_h.reader(i[2], kh)
            for kw in range(ax_w.kernel):
                ow, checks_w = ax_w.reader(i[3], kw)
                checks = checks_h + checks_w
                value = grad.loader([*i[:2], oh, ow])
                if checks:
                    value = guard(value, all_of(checks))
                tap = weight.loader([ch, sympy.Integer(0), sympy.Integer(kh), sympy.Integer(kw)])
                product = op("mul", cast(value, dtype), cast(tap, dtype))
                terms.append(_masked(checks, product, dtype))
        return cast(_sum(terms, None, dtype), x.dtype)

    return LazyTensor(x.device, x.dtype, x.size, load)


def _grad_weight(
    lowering: GraphLowering,
    x: LazyTensor,
    grad: LazyTensor,
    ax_h: _Axis,
    ax_w: _Axis,
    dtype: torch.dtype,
    out_dtype: torch.dtype,
) -> LazyTensor:
    """The weight's gradient [C, 1, KH, KW]: per channel and tap, the sum over the
    batch and the output positions of the output gradient times the input that tap
    read (0 where it read the padding)."""
    ranges = (x.size[1], sympy.Integer(1), sympy.Integer(ax_h.kernel), sympy.Integer(ax_w.kernel))
    i = loop_vars(4)
    n, oh, ow = (index_var("r", d) for d in range(3))
    h, checks_h = ax_h.read(oh, i[2], ax_h.kernel - 1)
    w, checks_w = ax_w.read(ow, i[3], ax_w.kernel - 1)
    checks = checks_h + checks_w
    value = x.loader([n, i[0], h, w])
    if checks:
        value = guard(value, all_of(checks))
    product = op("mul", cast(grad.loader([n, i[0], oh, ow]), dtype), cast(value, dtype))
    return _summed(lowering, grad, ranges, _masked(checks, product, dtype), dtype, out_dtype)


def _grad_bias(
    lowering: GraphLowering, grad: LazyTensor, dtype: torch.dtype, out_dtype: torch.dtype
) -> LazyTensor:
    """The bias's gradient: the output gradient summed per channel."""
    ranges = (grad.size[1],)
    (ch,) = loop_vars(1)
    n, oh, ow = (index_var("r", d) for d in range(3))
    body = cast(grad.loader([n, ch, oh, ow]), dtype)
    return _summed(lowering, grad, ranges, body, dtype, out_dtype)


def _summed(
    lowering: GraphLowering,
    grad: LazyTensor,
    ranges: tuple[sympy.Expr, ...],
    body: Node,
    dtype: torch.dtype,
    out_dtype: torch.dtype,
) -> LazyTensor:
    """`body` summed in `dtype` over the batch and the output positions of `grad`
    (reduction variables r0..r2) for each point of `ranges`, stored, read as
    `out_dtype`."""
    window = (grad.size[0], grad.size[2], grad.size[3])
    layout = lowering.node_layout(grad.device, dtype, ranges)
    summed = lowering.tensor(lowering.store(Reduction(ranges, window, "sum", body), layout))
    return LazyTensor(grad.device, out_dtype, ranges, lambda j: cast(summed.loader(j), out_dtype))
