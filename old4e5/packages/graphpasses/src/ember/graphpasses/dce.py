"""Dead code elimination that keeps every node with an effect.

A node goes when nobody reads its result and it has no effect of its own
(`ember.graphpasses.effects.has_side_effects`): mutating ops (copy_ epilogues of
AOTAutograd), random ops (dropping one would shift every later random number),
asserts and higher-order ops stay. Unused `get_attr` nodes go too.
"""

from __future__ import annotations

import torch.fx

from ember.graphpasses.effects import has_side_effects
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    PassResult,
    named_pass,
)


def remove_dead_nodes(graph: torch.fx.Graph) -> int:
    """Erase dead, effect-free nodes (users first); return how many went."""
    removed = 0
    for node in reversed(list(graph.nodes)):
        if node.users or has_side_effects(node):
            continue
        graph.erase_node(node)
        removed += 1
    return removed


@named_pass(
    "dead_code_elimination",
    (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS),
)
def eliminate_dead_code(gm: torch.fx.GraphModule) -> PassResult:
    """Remove nodes whose results nobody uses and that have no side effects."""
    removed = remove_dead_nodes(gm.graph)
    if removed:
        gm.recompile()
    return PassResult(gm, removed > 0, {"removed": removed})
