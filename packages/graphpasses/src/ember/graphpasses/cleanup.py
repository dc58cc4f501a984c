"""Cleanup passes that keep the graph's meaning and make it smaller."""

from __future__ import annotations

import torch.fx

from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_VALUES,
    PassResult,
    named_pass,
)


@named_pass("dead_code_elimination", (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES))
def eliminate_dead_code(gm: torch.fx.GraphModule) -> PassResult:
    """Remove nodes whose results nobody uses.

    Side-effecting nodes (mutating ops, random ops with state, asserts) are kept:
    torch.fx's `Node.is_impure` knows them, and placeholders are never removed because
    they are the graph's calling convention.
    """
    changed = gm.graph.eliminate_dead_code()
    if changed:
        gm.recompile()
    return PassResult(gm, changed)
