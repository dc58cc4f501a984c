"""Tensor-metadata guards in front of chosen custom operators.

A custom operator's kernel is opaque to ember and to torch.export: it may only work for
the dtype, device and layout it was traced with. Inserting
`aten._assert_tensor_metadata(x, dtype=..., device=..., layout=...)` before the call
turns a silent wrong result (or a crash deep inside the kernel) into a clear error
when the exported program is run with other inputs. Sizes are not guarded: they may be
symbolic, and the program's own shape guards cover them. Guards carry the custom op
node's provenance (stack trace, module stack), so an error points at the user's code.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.fx

from ember.graphpasses.fake import copy_debug_meta
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    GraphPass,
    PassResult,
    named_pass,
)

aten = torch.ops.aten
OpSelector = torch._ops.OpOverload | torch._ops.OpOverloadPacket | str


def _selects(selectors: list[OpSelector], target: object) -> bool:
    if not isinstance(target, torch._ops.OpOverload):
        return False
    for selector in selectors:
        if isinstance(selector, str):
            if selector in (target._schema.name, f"{target._schema.name}.{target._overloadname}"):
                return True
        elif selector is target or selector is target.overloadpacket:
            return True
    return False


def _guard_kwargs(value: torch.Tensor) -> dict[str, torch.fx.node.Argument]:
    return {"dtype": value.dtype, "device": value.device, "layout": value.layout}


def _already_guarded(arg: torch.fx.Node, kwargs: dict[str, torch.fx.node.Argument]) -> bool:
    return any(
        user.target is aten._assert_tensor_metadata.default and dict(user.kwargs) == kwargs
        for user in arg.users
    )


def insert_custom_op_guards(ops: Iterable[OpSelector]) -> GraphPass:
    """A pass guarding the tensor inputs of calls to `ops` (overloads, packets or names
    like "mylib::op") with `aten._assert_tensor_metadata`."""
    selectors = list(ops)

    @named_pass(
        "custom_op_guards",
        (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS),
    )
    def custom_op_guards(gm: torch.fx.GraphModule) -> PassResult:
        inserted = 0
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or not _selects(selectors, node.target):
                continue
            for arg in node.all_input_nodes:
                value = arg.meta.get("val")
                if not isinstance(value, torch.Tensor):
                    continue
                kwargs = _guard_kwargs(value)
                if _already_guarded(arg, kwargs):
                    continue
                with gm.graph.inserting_before(node):
                    guard = gm.graph.call_function(
                        aten._assert_tensor_metadata.default, (arg,), kwargs
                    )
                copy_debug_meta(node, guard)
                guard.meta["val"] = None
                inserted += 1
        if inserted:
            gm.recompile()
        return PassResult(gm, inserted > 0, {"guards": inserted})

    return custom_op_guards
