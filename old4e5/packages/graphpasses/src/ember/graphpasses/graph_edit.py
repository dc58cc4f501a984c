"""Small graph edits shared by the passes, with the aliasing rules they must respect.

Forwarding a node's users to another node (`x.view(same_shape)` -> `x`) is the most
common edit. It is only invisible to the caller when it does not change what the graph
returns: AOTAutograd and torch.export record, at trace time, which outputs alias which
inputs and which outputs are distinct tensors. Returning an input where a fresh tensor
(or a view) was returned, or one tensor in two output slots, would break that contract,
so `can_forward` refuses those cases.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.utils import _pytree as pytree


def output_node(gm: torch.fx.GraphModule) -> torch.fx.Node:
    node: torch.fx.Node
    for node in reversed(gm.graph.nodes):
        if node.op == "output":
            return node
    raise ValueError("graph has no output node")


def returned_nodes(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """Nodes that appear directly among the graph's outputs."""
    out = output_node(gm)
    return {a for a in pytree.tree_leaves(out.args) if isinstance(a, torch.fx.Node)}


def can_forward(
    node: torch.fx.Node, replacement: torch.fx.Node, returned: set[torch.fx.Node]
) -> bool:
    """May `node`'s users use `replacement` instead without changing output aliasing?"""
    if node not in returned:
        return True
    return replacement.op != "placeholder" and replacement not in returned


def forward_uses(node: torch.fx.Node, replacement: torch.fx.Node) -> None:
    """Point every user of `node` at `replacement` and drop `node` if it became dead."""
    node.replace_all_uses_with(replacement)
    if not node.users:
        node.graph.erase_node(node)


def erase_if_dead(nodes: list[torch.fx.Node]) -> None:
    """Erase the given nodes that have no users left, users before producers."""
    for node in reversed(nodes):
        if not getattr(node, "_erased", False) and not node.users and node.op == "call_function":
            node.graph.erase_node(node)


def tensor_value(node: object) -> torch.Tensor | None:
    """The node's fake (or real) tensor value from `meta['val']`, if it has one."""
    if isinstance(node, torch.fx.Node):
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor):
            return value
    return None
