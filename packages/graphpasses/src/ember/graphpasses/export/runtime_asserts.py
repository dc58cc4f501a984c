"""Removing runtime assertion nodes, when the caller asks for it.

torch.export puts checks in the graph (`_assert_scalar` for `torch._check` and
data-dependent sizes, `sym_constrain_range*` for unbacked sizes, `_assert_async`),
and ember's own guards are `_assert_tensor_metadata`. They cost a host sync or a
launch each; a deployment that has validated its inputs may drop them. DCE keeps them
(they have effects), so this pass is the only way out. The conditions they tested
become dead and go with them.

`only` narrows the pass to the assertions it accepts: an ahead-of-time package
(ember.runtime.aot) checks the conditions over its input sizes itself, before the
call, and keeps the data-dependent ones in the graph.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx

from ember.graphpasses.dce import remove_dead_nodes
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

RUNTIME_ASSERTIONS: frozenset[object] = frozenset(
    {
        aten._assert_scalar.default,
        aten._assert_async.default,
        aten._assert_async.msg,
        aten.sym_constrain_range.default,
        aten.sym_constrain_range_for_size.default,
        torch._assert,
    }
)


def remove_runtime_assertions(
    *,
    include_metadata_guards: bool = False,
    only: Callable[[torch.fx.Node], bool] | None = None,
) -> GraphPass:
    """A pass erasing runtime assertions (and `_assert_tensor_metadata` guards if
    asked); with `only`, just the assertion nodes for which it returns True."""
    targets = set(RUNTIME_ASSERTIONS)
    if include_metadata_guards:
        targets.add(aten._assert_tensor_metadata.default)

    @named_pass(
        "remove_runtime_assertions",
        (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS),
    )
    def remove_assertions(gm: torch.fx.GraphModule) -> PassResult:
        removed = 0
        for node in reversed(list(gm.graph.nodes)):
            if (
                node.op == "call_function"
                and node.target in targets
                and not node.users
                and (only is None or only(node))
            ):
                gm.graph.erase_node(node)
                removed += 1
        if removed:
            remove_dead_nodes(gm.graph)
            gm.recompile()
        return PassResult(gm, removed > 0, {"removed": removed})

    return remove_assertions
