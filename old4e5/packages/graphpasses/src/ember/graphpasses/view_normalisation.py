"""View normalisation: one spelling for each view, so later passes match one form.

- `aten._unsafe_view` (what matmul's decomposition emits) becomes `aten.view`: in an
  ATen graph after AOTAutograd they mean the same; only autograd treated them apart.
- `aten.reshape` becomes `aten.view` where the input is contiguous (then reshape is a
  view; elsewhere it may copy, and stays).
- a view of a view of a contiguous tensor becomes one view of that tensor;
- (`compose_permutes`, a separate pass) a permute of a permute becomes one permute
  with the composed order; it needs fake values to give the new node `meta['val']`.
"""

from __future__ import annotations

import torch
import torch.fx

from ember.graphpasses.fake import copy_debug_meta, fake_mode_of, infer_value
from ember.graphpasses.graph_edit import can_forward, returned_nodes, tensor_value
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    PassResult,
    named_pass,
)

aten = torch.ops.aten
PASS_NAME = "view_normalisation"


def _dim(value: object) -> int:
    assert isinstance(value, int), f"permute dims must be ints, got {value!r}"
    return value


def _contiguous(node: object) -> bool:
    value = tensor_value(node)
    if value is None:
        return False
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    try:
        return bool(guard_or_false(value.is_contiguous()))
    except Exception:  # data-dependent strides: treat as not provably contiguous
        return False


@named_pass(
    PASS_NAME,
    (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS),
)
def normalise_views(gm: torch.fx.GraphModule) -> PassResult:
    """Rewrite `_unsafe_view`/`reshape` into `view` and collapse view chains."""
    stats = {"unsafe_view": 0, "reshape": 0, "view_chain": 0}
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is aten._unsafe_view.default:
            node.target = aten.view.default
            stats["unsafe_view"] += 1
        elif node.target is aten.reshape.default and _contiguous(node.args[0]):
            node.target = aten.view.default
            stats["reshape"] += 1
        inner = node.args[0] if node.args else None
        if (
            node.target is aten.view.default
            and isinstance(inner, torch.fx.Node)
            and inner.op == "call_function"
            and inner.target is aten.view.default
            and _contiguous(inner.args[0])
        ):
            node.args = (inner.args[0], *node.args[1:])
            stats["view_chain"] += 1
            if not inner.users:
                graph.erase_node(inner)
    changed = any(stats.values())
    if changed:
        gm.recompile()
    return PassResult(gm, changed, stats)


@named_pass(
    "permute_composition",
    (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS),
)
def compose_permutes(gm: torch.fx.GraphModule) -> PassResult:
    """Replace a permute of a permute by one permute (or by nothing, for the identity).

    Runs after the pattern rewrite in the default pipeline: patterns spell `k^T` as a
    permute of whatever `k` is, and composing first would hide it.
    """
    mode = fake_mode_of(gm)
    if mode is None:
        return PassResult(gm, False, {"composed": 0})
    graph = gm.graph
    returned = returned_nodes(gm)
    composed = 0
    for node in list(graph.nodes):
        inner = node.args[0] if node.op == "call_function" and node.args else None
        if (
            node.target is not aten.permute.default
            or not isinstance(inner, torch.fx.Node)
            or inner.target is not aten.permute.default
        ):
            continue
        outer_dims, inner_dims = node.args[1], inner.args[1]
        assert isinstance(outer_dims, list | tuple) and isinstance(inner_dims, list | tuple)
        rank = len(inner_dims)
        order = [_dim(inner_dims[_dim(d) % rank]) % rank for d in outer_dims]
        source = inner.args[0]
        assert isinstance(source, torch.fx.Node)
        if order == list(range(rank)):
            if not can_forward(node, source, returned):
                continue
            node.replace_all_uses_with(source)
        else:
            with graph.inserting_before(node):
                merged = graph.call_function(aten.permute.default, (source, order))
            copy_debug_meta(node, merged)
            infer_value(merged, mode, "permute_composition")
            node.replace_all_uses_with(merged)
        graph.erase_node(node)
        if not inner.users:
            graph.erase_node(inner)
        composed += 1
    if composed:
        gm.recompile()
    return PassResult(gm, composed > 0, {"composed": composed})
