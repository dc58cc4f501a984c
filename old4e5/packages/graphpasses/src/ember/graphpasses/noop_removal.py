"""No-op removal: nodes whose result equals one of their inputs.

Removed (their users read the input instead): a view, reshape or expand to the input's
own shape; a permute by the identity; a slice over a whole dimension; `x * 1`, `x / 1`,
`x + 0`, `x - 0` when the result has x's dtype and shape; a cast (`_to_copy`,
`prims.convert_element_type`) to x's own dtype, device and layout; `alias`; and a clone
that keeps x's layout. Copies (clone, casts, arithmetic) are only dropped when neither
the copy nor its source is ever written, since then nobody can observe that they share
memory. Nothing is forwarded when that would change which outputs alias inputs or each
other (`graph_edit.can_forward`). Nodes without fake values are left alone where the
decision needs a shape or dtype.
"""

from __future__ import annotations

import torch
import torch.fx

from ember.graphpasses.effects import mutated_storages, storage_key
from ember.graphpasses.fake import same_shape, same_strides
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
prims = torch.ops.prims

_SHAPE_OPS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default}
_IDENTITY_SCALAR = {
    aten.mul.Tensor: 1,
    aten.mul.Scalar: 1,
    aten.div.Tensor: 1,
    aten.div.Scalar: 1,
    aten.add.Tensor: 0,
    aten.add.Scalar: 0,
    aten.sub.Tensor: 0,
    aten.sub.Scalar: 0,
}


def _is_view_noop(node: torch.fx.Node, x: torch.Tensor, out: torch.Tensor) -> bool:
    target = node.target
    if target in _SHAPE_OPS or target is aten.expand.default:
        return same_shape(x, out)
    if target is aten.permute.default:
        dims = node.args[1]
        rank = max(x.dim(), 1)
        if not isinstance(dims, list | tuple) or not all(isinstance(d, int) for d in dims):
            return False
        return [d % rank for d in dims] == list(range(x.dim()))  # type: ignore[operator]  # ints, checked above
    if target is aten.alias.default:
        return True
    if target is aten.slice.Tensor:
        args = [*node.args, None, None, None, None][:5]
        start, step = args[2], args[4]
        return start in (None, 0) and step in (None, 1) and same_shape(x, out)
    return False


def _is_copy_noop(node: torch.fx.Node, x: torch.Tensor, out: torch.Tensor) -> bool:
    """A node that makes a copy equal to x (same dtype, shape, device, layout)."""
    if out.dtype != x.dtype or out.device != x.device or not same_shape(x, out):
        return False
    target = node.target
    if target is aten.clone.default:
        return same_strides(x, out)
    if target is aten._to_copy.default or target is prims.convert_element_type.default:
        return out.layout == x.layout and same_strides(x, out)
    identity = _IDENTITY_SCALAR.get(target)  # type: ignore[call-overload]  # keyed by overloads
    if identity is None or len(node.args) < 2:
        return False
    other = node.args[1]
    alpha = node.kwargs.get("alpha", 1)
    return bool(
        isinstance(other, int | float)
        and not isinstance(other, bool)
        and other == identity
        and alpha == 1
    )


@named_pass(
    "noop_removal",
    (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS),
)
def remove_noops(gm: torch.fx.GraphModule) -> PassResult:
    """Forward the users of no-op nodes to their inputs and drop the no-ops."""
    written = mutated_storages(gm.graph.nodes)
    returned = returned_nodes(gm)
    removed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not node.args:
            continue
        source = node.args[0]
        x, out = tensor_value(source), tensor_value(node)
        if not isinstance(source, torch.fx.Node) or x is None or out is None:
            continue
        if _is_view_noop(node, x, out):
            pass
        elif _is_copy_noop(node, x, out):
            if storage_key(x) in written or storage_key(out) in written:
                continue
        else:
            continue
        if not can_forward(node, source, returned):
            continue
        node.replace_all_uses_with(source)
        gm.graph.erase_node(node)
        removed += 1
    if removed:
        gm.recompile()
    return PassResult(gm, removed > 0, {"removed": removed})
