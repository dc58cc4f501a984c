"""Common subexpression elimination that respects mutation, randomness and aliasing.

Two nodes merge when they call the same op on the same arguments and nothing can tell
them apart afterwards:
- only pure nodes merge (never random ops: two `rand` calls are two draws, never
  mutating or effectful ops);
- each tensor argument's storage carries a version that every write to it bumps (via
  the fake values' storages), so `x.sum(); x.add_(1); x.sum()` keeps both sums;
- a node whose own storage is ever written, or that is returned by the graph or shares
  its storage with an output, keeps its identity: merging would make one in-place
  update (or one caller's) visible through the other name;
- a node that introduces a data-dependent size symbol (`unbacked_bindings`) keeps it:
  later nodes' fake values are written in terms of that symbol.
Graphs without fake values that contain mutation are left alone (no storages to track).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.fx

from ember.graphpasses.effects import (
    is_mutating,
    is_pure,
    mutated_storages,
    storage_key,
    written_args,
)
from ember.graphpasses.graph_edit import returned_nodes
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    PassResult,
    named_pass,
)


class _Unhashable(Exception):
    pass


def _freeze(value: Any, rep: dict[torch.fx.Node, torch.fx.Node]) -> Any:
    """A hashable key for an argument; floats keep their sign and type (0.0 vs -0.0 vs 0)."""
    if isinstance(value, torch.fx.Node):
        return ("node", rep.get(value, value))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_freeze(v, rep) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _freeze(v, rep)) for k, v in value.items())))
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, bool | int | str | type(None)):
        return (type(value).__name__, value)
    if isinstance(value, torch.dtype | torch.device | torch.layout | torch.memory_format):
        return (type(value).__name__, str(value))
    if isinstance(value, slice):
        return ("slice", _freeze((value.start, value.stop, value.step), rep))
    raise _Unhashable


def _tensor_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    return [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]


@named_pass(
    "common_subexpression_elimination",
    (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS),
)
def eliminate_common_subexpressions(gm: torch.fx.GraphModule) -> PassResult:
    """Merge repeated pure computations into their first occurrence."""
    return merge_common_subexpressions(gm)


def merge_common_subexpressions(
    gm: torch.fx.GraphModule, group: Callable[[torch.fx.Node], Hashable] | None = None
) -> PassResult:
    """The pass, where nodes merge only within the same `group(node)`: a joint forward
    + backward graph groups by whether the backward needs the node, so that a value
    only the forward uses never merges into one the backward needs (the partitioner
    would then save it for the backward)."""
    nodes = list(gm.graph.nodes)
    has_mutation = any(is_mutating(n) for n in nodes)
    have_values = any(isinstance(n.meta.get("val"), torch.Tensor) for n in nodes)
    if has_mutation and not have_values:
        return PassResult(gm, False, {"merged": 0})

    written = mutated_storages(nodes)
    returned = returned_nodes(gm)
    # storages the graph's outputs live in: a node in one (an output's base, or a
    # view of it) is kept apart, or two outputs would share memory (two parameters'
    # gradients as views of one tensor, which accumulating gradients then doubles)
    output_storages = {storage_key(n.meta.get("val")) for n in returned} - {None}
    version: dict[object, int] = {}
    rep: dict[torch.fx.Node, torch.fx.Node] = {}
    seen: dict[Any, torch.fx.Node] = {}
    merged = 0
    for node in nodes:
        if is_mutating(node):
            for target in written_args(node):
                key = storage_key(target.meta.get("val"))
                version[key] = version.get(key, 0) + 1
            continue
        if not is_pure(node) or node in returned or node.meta.get("unbacked_bindings"):
            # a node binding a data-dependent size (`.item()`, `nonzero`) keeps its own
            # symbol: later nodes' fake values are written in terms of it
            continue
        own = storage_key(node.meta.get("val"))
        if own is not None and (own in written or own in output_storages):
            continue
        try:
            key = (
                group(node) if group is not None else None,
                node.target,
                _freeze(node.args, rep),
                _freeze(node.kwargs, rep),
                tuple(version.get(storage_key(a.meta.get("val")), 0) for a in _tensor_args(node)),
            )
            first = seen.get(key)
        except (_Unhashable, TypeError):
            continue
        if first is None:
            seen[key] = node
            continue
        node.replace_all_uses_with(first)
        rep[node] = first
        gm.graph.erase_node(node)
        merged += 1
    if merged:
        gm.recompile()
    return PassResult(gm, merged > 0, {"merged": merged})
