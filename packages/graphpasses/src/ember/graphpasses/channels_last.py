"""Run the 2-D convolutions of CUDA graphs channels-last, end to end.

cuDNN's tensor-core convolutions work on channels-last (NHWC) data; given NCHW
tensors, they transpose around each call, or take slower kernels. Eager PyTorch keeps
whatever layout it is given, so users convert models by hand (`model.to(memory_format=
torch.channels_last)`). This pass does it for them: it converts the input of each
convolution that is not channels-last yet, and re-infers every node's fake value, so
the layout flows through the graph the way eager would carry it (pointwise ops, batch
norm and pooling keep channels-last, and later convolutions receive it without a
conversion). The lowering stores channels-last values channels-last
(`ember.ir.lowering`: `LazyTensor.stride_hint`), so the fused kernels between the
convolutions read and write NHWC too.

The graph's outputs must keep the strides they promise. An output whose layout
changes gets a copy back (a contiguous clone), and the pass gives up, restoring the
graph, when more than `max_copies` outputs would need one: a training forward returns
its saved activations, and copying each of them back would cost more than it saves
(that case needs the backward graph to agree on the layout, which is future work).
Weights stay as they are: ATen's convolution converts a weight to the input's
layout itself. Only static and symbolic 4-D convolutions on the given device types
(CUDA by default) in floating point are considered.

On the device types given as `by_convolution` (the CPU's), each convolution gets the
layout its own shapes favour (`favours_channels_last`): oneDNN's channels-last
convolution reorders the weight at every call, which pays where the activations
outweigh the weight and costs up to ten times the NCHW call where the weight is the
larger. A convolution that favours NCHW but would receive channels-last data from an
earlier one gets it converted back first.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ember.graphpasses.fake import (
    copy_debug_meta,
    fake_mode_of,
    infer_value,
    same_shape,
    same_strides,
    sizes_equal,
)
from ember.graphpasses.graph_edit import tensor_value
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    GraphPass,
    PassResult,
    named_pass,
)

aten = torch.ops.aten
PASS = "channels_last_convolutions"


def channels_last_convolutions(
    devices: Sequence[str] = ("cuda",), max_copies: int = 1, by_convolution: Sequence[str] = ()
) -> GraphPass:
    """The pass, for every convolution on the `devices` types and for the
    convolutions that favour it (`favours_channels_last`) on the `by_convolution`
    types."""
    return _layout_pass(tuple(devices), _CopyRule(max_copies, None), tuple(by_convolution))


def favours_channels_last(conv: torch.fx.Node) -> bool:
    """Whether a CPU convolution runs faster on channels-last input: where its
    weight has no more elements than its input. One thread, 2-core AMD EPYC,
    channels-last input against NCHW (2026-11-25): 1.06-1.38x faster for weight/input
    element ratios 0.07-2.0 (cnn_block's 3x3 convolution, ResNet-18's stem and first
    stage and 1x1 downsamples at batch 2, 64x64), 0.93x at 9, 0.56x at 144, 0.10x at
    576 (ResNet-18's last 3x3 convolution: 9.6 ms against 0.95)."""
    source, weight = conv.args[0], conv.args[1]
    x = tensor_value(source) if isinstance(source, torch.fx.Node) else None
    w = tensor_value(weight) if isinstance(weight, torch.fx.Node) else None
    if x is None or w is None:
        return False
    return _numel(w) <= _numel(x)


def channels_last_training(
    devices: Sequence[str] = ("cuda",),
    max_copy_fraction: float = 0.25,
    by_convolution: Sequence[str] = (),
) -> GraphPass:
    """The pass for AOTAutograd's joint forward + backward graph, run before the
    partitioner splits it. The forward's activations then go to the backward
    channels-last (the partitioner copies each node's value, strides included, into
    both graphs), and each `convolution_backward` of a converted convolution reads the
    converted input too. The joint graph returns the parameters' gradients, which
    follow the activations' layout: a convolution weight's gradient comes back
    channels-last. Those outputs are copied back to their promised strides, which
    pays while they are small: the copies may move at most `max_copy_fraction` of the
    bytes the convolutions read, else the graph is left as it was. Unlike inference,
    a large 4-D output gets no free copy: its gradient then arrives NCHW and every
    backward convolution mixes layouts. The ResNet basic block (output as large as
    its activations) trained in 3.39 ms channels-last against 2.75 ms NCHW (H100).
    `by_convolution` as for `channels_last_convolutions`."""
    return _layout_pass(tuple(devices), _CopyRule(None, max_copy_fraction), tuple(by_convolution))


def _layout_pass(
    devices: tuple[str, ...], rule: _CopyRule, by_convolution: tuple[str, ...]
) -> GraphPass:
    @named_pass(PASS, (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_RANDOMNESS))
    def run(gm: torch.fx.GraphModule) -> PassResult:
        converted = _convert(gm, devices, rule, by_convolution)
        if converted:
            gm.graph.lint()
            gm.recompile()
        return PassResult(gm, converted > 0, {"converted": converted})

    return run


class _CopyRule:
    """How many outputs may be copied back to their promised strides: at most `count`
    of them, or as many as fit in `fraction` of the bytes the convolutions read."""

    def __init__(self, count: int | None, fraction: float | None) -> None:
        self.count, self.fraction = count, fraction

    def allows(self, copies: list[torch.Tensor], read: list[torch.Tensor]) -> bool:
        if self.count is not None and len(copies) > self.count:
            return False
        if self.fraction is not None:
            moved = sum(_bytes(t) for t in copies)
            return moved <= self.fraction * sum(_bytes(t) for t in read)
        return True


def _bytes(value: torch.Tensor) -> int:
    """Bytes of `value`; a symbolic size counts at its hint (the traced example's)."""
    return _numel(value) * value.element_size()


def _numel(value: torch.Tensor) -> int:
    numel = value.numel()
    if not isinstance(numel, int):
        hint = getattr(getattr(numel, "node", None), "hint", None)
        numel = int(hint) if hint is not None else 1 << 40  # unknown: as if huge
    return int(numel)


def _is_channels_last(value: torch.Tensor | None) -> bool:
    return (
        value is not None
        and value.dim() == 4
        and value.is_contiguous(memory_format=torch.channels_last)
    )


def _candidate(node: torch.fx.Node, devices: tuple[str, ...]) -> bool:
    """A 4-D floating-point convolution on `devices`, not transposed."""
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    source = node.args[0]
    value = tensor_value(source) if isinstance(source, torch.fx.Node) else None
    transposed = len(node.args) > 6 and bool(node.args[6])
    return (
        value is not None
        and value.dim() == 4
        and value.device.type in devices
        and value.dtype.is_floating_point
        and not transposed
    )


def _wanted(
    node: torch.fx.Node, devices: tuple[str, ...], by_convolution: tuple[str, ...]
) -> torch.memory_format | None:
    """The layout to give convolution `node`'s input (None: leave it as it is)."""
    if _candidate(node, devices):
        return torch.channels_last
    if _candidate(node, by_convolution):
        return torch.channels_last if favours_channels_last(node) else torch.contiguous_format
    return None


def _inferable(gm: torch.fx.GraphModule) -> bool:
    """Every call is an ATen op or a getitem: each can be re-run on fake values."""
    return all(
        node.op != "call_function"
        or isinstance(node.target, torch._ops.OpOverload)
        or node.target is operator.getitem
        for node in gm.graph.nodes
    )


def _convert(
    gm: torch.fx.GraphModule,
    devices: tuple[str, ...],
    rule: _CopyRule,
    by_convolution: tuple[str, ...] = (),
) -> int:
    mode = fake_mode_of(gm)
    wanted = {n: w for n in gm.graph.nodes if (w := _wanted(n, devices, by_convolution))}
    # inputs already channels-last are left as they are (the model's own layout); the
    # conversions back to NCHW, before convolutions that favour it, are dropped below
    # where no conversion to channels-last reaches them
    targets = [n for n in wanted if not _is_channels_last(tensor_value(n.args[0]))]
    convolutions = [n for n in targets if wanted[n] is torch.channels_last]
    if mode is None or not convolutions or not _inferable(gm):
        return 0
    graph = gm.graph
    saved = {node: node.meta.get("val") for node in graph.nodes}
    (output,) = [n for n in graph.nodes if n.op == "output"]
    promised = [(arg, tensor_value(arg)) for arg in pytree.tree_leaves(output.args)]
    made: list[torch.fx.Node] = []
    for conv in targets:
        source = conv.args[0]
        assert isinstance(source, torch.fx.Node)
        with graph.inserting_before(conv):
            clone = graph.call_function(
                aten.clone.default, (source,), {"memory_format": wanted[conv]}
            )
        copy_debug_meta(conv, clone)
        gradients = [user for user in source.users if _gradient_of(user, conv)]
        conv.replace_input_with(source, clone)
        for gradient in gradients:  # the convolution's backward, in a joint graph
            gradient.replace_input_with(source, clone)
        made.append(clone)
    try:
        _reinfer(gm, mode, made, saved)
    except Exception:
        _undo(gm, made, saved)
        return 0
    # A conversion whose input has its layout by now (a later convolution's input,
    # carried over from an earlier one, or never converted) copies nothing useful:
    # drop it.
    for clone in list(made):
        source = clone.args[0]
        value = tensor_value(source) if isinstance(source, torch.fx.Node) else None
        to_nhwc = clone.kwargs["memory_format"] is torch.channels_last
        # (back to NCHW: dropped where the source is NCHW already or kept the strides
        # it came with; not where it is merely not channels-last: a strided slice of
        # converted data is neither, and its convolution's output would not have the
        # strides inferred for it)
        original = saved.get(source) if isinstance(source, torch.fx.Node) else None
        unchanged = isinstance(original, torch.Tensor) and (
            value is not None and value.stride() == original.stride()
        )
        if value is not None and (
            _is_channels_last(value) if to_nhwc else value.is_contiguous() or unchanged
        ):
            clone.replace_all_uses_with(source)  # type: ignore[arg-type]  # a Node
            graph.erase_node(clone)
            made.remove(clone)
    inputs = [v for c in convolutions if (v := tensor_value(c.args[0])) is not None]
    if not any(c.kwargs["memory_format"] is torch.channels_last for c in made):
        _undo(gm, made, saved)
        return 0
    changed = [
        (arg, old)
        for arg, old in promised
        if isinstance(arg, torch.fx.Node)
        and old is not None
        and (value := tensor_value(arg)) is not None
        and value.stride() != old.stride()
    ]
    if not rule.allows([old for _, old in changed], inputs) or any(
        not old.is_contiguous() for _, old in changed
    ):
        _undo(gm, made, saved)
        return 0
    backs: list[torch.fx.Node] = []
    try:
        for arg, _ in changed:
            with graph.inserting_before(output):
                back = graph.call_function(
                    aten.clone.default, (arg,), {"memory_format": torch.contiguous_format}
                )
            backs.append(back)
            copy_debug_meta(arg, back)
            infer_value(back, mode, PASS)
            output.replace_input_with(arg, back)
    except Exception:  # leave the graph as it came
        for back in backs:
            output.replace_input_with(back, back.args[0])
            graph.erase_node(back)
        _undo(gm, made, saved)
        return 0
    return len(made)


def _gradient_of(node: torch.fx.Node, conv: torch.fx.Node) -> bool:
    """`node` is the convolution_backward of `conv` (same input, weight and settings)."""
    return (
        node.op == "call_function"
        and node.target is aten.convolution_backward.default
        and node.args[1] is conv.args[0]
        and node.args[2] is conv.args[1]
        and tuple(node.args[4:10]) == tuple(conv.args[3:9])
    )


def _reinfer(
    gm: torch.fx.GraphModule,
    mode: Any,
    made: list[torch.fx.Node],
    saved: dict[torch.fx.Node, Any],
) -> None:
    """Infer again the value of each node whose inputs' layouts the conversions in
    `made` change; every other node keeps its value (`saved`, the values from before
    the conversions), which inferring would only have made anew with the same sizes
    and strides: an ATen op's output metadata is a function of its inputs' metadata
    and its other arguments.

    A conversion counts as a change only where its value differs from what its
    convolution read before (its source's saved value): a conversion back to NCHW of
    NCHW data changes nothing downstream. So do values that come out the same after
    all (a batch norm's per-channel statistics, a convolution's weight gradient of
    channels-last data, converted back by the pass). On ResNet-18's training graph
    on the CPU this infers 91 of the 696 nodes the conversions reach: fake
    execution of the others (a batch norm backward alone takes about 3 ms) cost
    about 0.11 s of every compile, warm processes whose graphs all come from the
    compile cache included."""
    made_from = {c: s for c in made if isinstance(s := c.args[0], torch.fx.Node)}
    changed: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node not in made_from and not any(a in changed for a in node.all_input_nodes):
            continue
        infer_value(node, mode, PASS)
        before = saved.get(made_from.get(node, node))
        if not _same_metadata(node.meta.get("val"), before):
            changed.add(node)


def _same_metadata(a: Any, b: Any) -> bool:
    """Whether two values (tensors, symbolic or plain scalars, or structures of them)
    agree in everything a later op's output metadata can depend on: structure,
    dtype, device, sizes, strides, storage offset and requires_grad. Symbolic sizes
    compare without adding guards; anything unknown counts as different."""
    leaves_a, spec_a = pytree.tree_flatten(a)
    leaves_b, spec_b = pytree.tree_flatten(b)
    if spec_a != spec_b:
        return False
    for x, y in zip(leaves_a, leaves_b, strict=True):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (
                isinstance(x, torch.Tensor)
                and isinstance(y, torch.Tensor)
                and x.dtype == y.dtype
                and x.device == y.device
                and x.requires_grad == y.requires_grad
                and x.layout == y.layout
                and same_shape(x, y)
                and same_strides(x, y)
                and sizes_equal([x.storage_offset()], [y.storage_offset()])
            ):
                return False
        elif isinstance(x, int | float | bool | None) and isinstance(y, int | float | bool | None):
            if type(x) is not type(y) or x != y:
                return False
        elif x is not y and not sizes_equal([x], [y]):
            return False
    return True


def _undo(
    gm: torch.fx.GraphModule, made: list[torch.fx.Node], saved: dict[torch.fx.Node, Any]
) -> None:
    for clone in made:
        clone.replace_all_uses_with(clone.args[0])  # type: ignore[arg-type]  # a Node
        gm.graph.erase_node(clone)
    for node, value in saved.items():
        if value is not None:
            node.meta["val"] = value


__all__ = ["channels_last_convolutions", "channels_last_training"]
