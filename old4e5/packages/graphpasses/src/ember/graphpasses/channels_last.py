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
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ember.graphpasses.fake import copy_debug_meta, fake_mode_of, infer_value
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
    devices: Sequence[str] = ("cuda",), max_copies: int = 1
) -> GraphPass:
    """The pass, for convolutions on the given device types."""

    @named_pass(PASS, (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_RANDOMNESS))
    def run(gm: torch.fx.GraphModule) -> PassResult:
        converted = _convert(gm, tuple(devices), max_copies)
        if converted:
            gm.graph.lint()
            gm.recompile()
        return PassResult(gm, converted > 0, {"converted": converted})

    return run


def _is_channels_last(value: torch.Tensor) -> bool:
    return value.dim() == 4 and value.is_contiguous(memory_format=torch.channels_last)


def _candidate(node: torch.fx.Node, devices: tuple[str, ...]) -> bool:
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
        and not _is_channels_last(value)
    )


def _inferable(gm: torch.fx.GraphModule) -> bool:
    """Every call is an ATen op or a getitem: each can be re-run on fake values."""
    return all(
        node.op != "call_function"
        or isinstance(node.target, torch._ops.OpOverload)
        or node.target is operator.getitem
        for node in gm.graph.nodes
    )


def _convert(gm: torch.fx.GraphModule, devices: tuple[str, ...], max_copies: int) -> int:
    mode = fake_mode_of(gm)
    convolutions = [n for n in gm.graph.nodes if _candidate(n, devices)]
    if mode is None or not convolutions or not _inferable(gm):
        return 0
    graph = gm.graph
    saved = {node: node.meta.get("val") for node in graph.nodes}
    (output,) = [n for n in graph.nodes if n.op == "output"]
    promised = [(arg, tensor_value(arg)) for arg in pytree.tree_leaves(output.args)]
    made: list[torch.fx.Node] = []
    for conv in convolutions:
        source = conv.args[0]
        assert isinstance(source, torch.fx.Node)
        with graph.inserting_before(conv):
            clone = graph.call_function(
                aten.clone.default, (source,), {"memory_format": torch.channels_last}
            )
        copy_debug_meta(conv, clone)
        conv.replace_input_with(source, clone)
        made.append(clone)
    try:
        _reinfer(gm, mode)
    except Exception:
        _undo(gm, made, saved)
        return 0
    # A conversion whose input is channels-last by now (a later convolution's input,
    # carried over from an earlier one) copies nothing useful: drop it.
    for clone in list(made):
        source = clone.args[0]
        value = tensor_value(source) if isinstance(source, torch.fx.Node) else None
        if value is not None and _is_channels_last(value):
            clone.replace_all_uses_with(source)  # type: ignore[arg-type]  # a Node
            graph.erase_node(clone)
            made.remove(clone)
    changed = [
        (arg, old)
        for arg, old in promised
        if isinstance(arg, torch.fx.Node)
        and old is not None
        and (value := tensor_value(arg)) is not None
        and value.stride() != old.stride()
    ]
    if not made or len(changed) > max_copies or any(not old.is_contiguous() for _, old in changed):
        _undo(gm, made, saved)
        return 0
    for arg, _ in changed:
        with graph.inserting_before(output):
            back = graph.call_function(
                aten.clone.default, (arg,), {"memory_format": torch.contiguous_format}
            )
        copy_debug_meta(arg, back)
        infer_value(back, mode, PASS)
        output.replace_input_with(arg, back)
    return len(made)


def _reinfer(gm: torch.fx.GraphModule, mode: Any) -> None:
    for node in gm.graph.nodes:
        if node.op == "call_function":
            infer_value(node, mode, PASS)


def _undo(
    gm: torch.fx.GraphModule, made: list[torch.fx.Node], saved: dict[torch.fx.Node, Any]
) -> None:
    for clone in made:
        clone.replace_all_uses_with(clone.args[0])  # type: ignore[arg-type]  # a Node
        gm.graph.erase_node(clone)
    for node, value in saved.items():
        if value is not None:
            node.meta["val"] = value


__all__ = ["channels_last_convolutions"]
