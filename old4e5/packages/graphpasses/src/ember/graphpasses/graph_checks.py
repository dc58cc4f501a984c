"""Checks on a graph's shape: is it an ATen-level graph, is it well formed?

The pass manager runs `check_aten_level` on its input, so a Torch-level graph (from
Dynamo or `symbolic_trace`) or a node whose target ember cannot interpret is rejected
with the node's name before any pass sees it, and `check_well_formed` after each pass,
so a pass that breaks the graph is named at once instead of surfacing as a strange
error in lowering.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.fx

from ember.graphpasses.errors import GraphPassError

# Python-level functions that legitimately appear in ATen graphs: tuple indexing and
# the scalar arithmetic on SymInts/SymFloats that dynamic shapes produce.
_SCALAR_FUNCTIONS: frozenset[object] = frozenset(
    {
        operator.getitem,
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.floordiv,
        operator.mod,
        operator.pow,
        operator.neg,
        operator.pos,
        operator.abs,
        operator.eq,
        operator.ne,
        operator.lt,
        operator.le,
        operator.gt,
        operator.ge,
        operator.and_,
        operator.or_,
        operator.not_,
        math.ceil,
        math.floor,
        math.sqrt,
        torch.sym_float,
        torch.sym_int,
        torch.sym_max,
        torch.sym_min,
        torch.sym_not,
        torch.sym_ite,
        torch._assert,
    }
    | ({getattr(torch, "_sym_sqrt")} if hasattr(torch, "_sym_sqrt") else set())  # noqa: B009  # only some versions have it
)


def is_aten_level_target(target: Any) -> bool:
    """May a call_function node with this target appear in an ATen-level graph?"""
    if isinstance(target, torch._ops.OpOverload | torch._ops.HigherOrderOperator):
        return True
    return target in _SCALAR_FUNCTIONS


def check_aten_level(gm: torch.fx.GraphModule, stage: str = "input check") -> None:
    """Raise a `GraphPassError` naming the first node that is not at the ATen level."""
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        if node.op in ("call_module", "call_method"):
            raise GraphPassError(
                stage,
                f"{node.op} nodes belong to Torch-level graphs; trace the module to ATen "
                "first (torch.export(...).run_decompositions() or AOTAutograd/make_fx)",
                node,
            )
        target = node.target
        if isinstance(target, torch._ops.OpOverloadPacket):
            raise GraphPassError(
                stage,
                f"target {target} is an overload packet, not an overload; ATen graphs "
                f"name one overload, e.g. {target}.default",
                node,
            )
        if not is_aten_level_target(target):
            name = getattr(target, "__qualname__", None) or repr(target)
            module = getattr(target, "__module__", None) or "?"
            raise GraphPassError(
                stage,
                f"unknown target {module}.{name}: expected an ATen/custom op overload "
                "(torch.ops.<ns>.<op>.<overload>) or SymInt arithmetic",
                node,
            )


def check_well_formed(pass_name: str, gm: torch.fx.GraphModule) -> None:
    """FX's structural lint plus ember's rules: one output, args defined before use."""
    try:
        gm.graph.lint()
    except Exception as exc:
        node = _node_named_in(gm, str(exc))
        raise GraphPassError(pass_name, f"left a malformed graph: {exc}", node) from exc
    outputs = [n for n in gm.graph.nodes if n.op == "output"]
    if len(outputs) != 1:
        raise GraphPassError(pass_name, f"graph has {len(outputs)} output nodes, expected 1")
    for node in gm.graph.nodes:
        if node.op == "get_attr" and not _has_attr(gm, str(node.target)):
            raise GraphPassError(
                pass_name, f"get_attr refers to missing attribute {node.target!r}", node
            )


def check_values_present(
    pass_name: str, gm: torch.fx.GraphModule, before: set[torch.fx.Node]
) -> None:
    """Nodes a pass created must carry `meta['val']` when the graph's other nodes do."""
    for node in gm.graph.nodes:
        if node in before or node.op in ("output",) or "val" in node.meta:
            continue
        if node.op == "call_function" and _returns_nothing(node):
            continue
        raise GraphPassError(
            pass_name,
            "created a node without meta['val']; the IR lowering needs it (run the op "
            "on fake inputs under the graph's fake mode, see ember.graphpasses.fake)",
            node,
        )


def _returns_nothing(node: torch.fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and len(target._schema.returns) == 0


def _has_attr(gm: torch.fx.GraphModule, qualified: str) -> bool:
    owner: Any = gm
    for part in qualified.split("."):
        if not hasattr(owner, part):
            return False
        owner = getattr(owner, part)
    return True


def _node_named_in(gm: torch.fx.GraphModule, message: str) -> torch.fx.Node | None:
    node: torch.fx.Node
    for node in gm.graph.nodes:
        if f"{node.name}" in message.split() or f"'{node.name}'" in message:
            return node
    return None
