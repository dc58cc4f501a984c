"""The pattern rewrite pass: find every match of a set of patterns, replace, count.

One walk over the graph from its end to its start, so bigger patterns (whose anchor is
later) see their nodes before smaller ones could take them. At each node, the patterns
anchored at that op are tried in the order given. A structural match is then checked:
- the pattern's own `check` (dtypes, ranks, what the replacement supports);
- sizes: the search function is traced again on the bound inputs' fake values and every
  matched node must have the size the search function gives it there (the matcher did
  not compare view sizes, so this is what makes `view(x, [B * H, S, D])` mean what the
  pattern meant);
- the replacement, built in place with proxies and given fake values by running it
  under the graph's fake mode, must give the anchor's shape and dtype.
Only then are the anchor's users moved to the replacement; the matched nodes left
without users are erased. The pass reports how often each pattern fired.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.proxy import GraphAppendingTracer, Proxy

from ember.graphpasses.dce import remove_dead_nodes
from ember.graphpasses.errors import GraphPassError
from ember.graphpasses.fake import (
    copy_debug_meta,
    fake_mode_of,
    has_shape,
    infer_value,
    same_shape,
)
from ember.graphpasses.matcher import Match, match_pattern
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    GraphPass,
    PassResult,
    named_pass,
)
from ember.graphpasses.pattern import Pattern, trace_search


class _RecordingTracer(GraphAppendingTracer):
    """Appends to an existing graph and remembers the nodes it created."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        super().__init__(graph)
        self.created: list[torch.fx.Node] = []

    def create_node(self, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = super().create_node(*args, **kwargs)
        self.created.append(node)
        return node


def _tensor_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.Tensor)
    ]


def sizes_agree(match: Match, mode: FakeTensorMode) -> bool:
    """Does every matched node have the size the search function gives it here?"""
    pattern = match.pattern
    values = [match.value(name) for name in pattern.inputs]
    scalars = [match.scalars[name] for name in pattern.scalars]
    expected = _retrace(pattern, values, scalars, mode)
    if expected is None:  # the search function does not even run on these inputs
        return False
    traced = _tensor_nodes(pattern.graph)
    if len(expected) != len(traced):
        return False
    for pattern_node, (target, shape) in zip(traced, expected, strict=True):
        if pattern_node.target != target:
            return False
        node = match.nodes.get(pattern_node)
        have = node.meta.get("val") if node is not None else None
        if not isinstance(have, torch.Tensor) or not has_shape(have, shape):
            return False
    return True


Retraced = list[tuple[Any, tuple[int | torch.SymInt, ...]]]


def _retrace(
    pattern: Pattern, values: list[torch.Tensor], scalars: list[Any], mode: FakeTensorMode
) -> Retraced | None:
    """(target, sizes) of each tensor node of `pattern.search` traced on `values`
    and `scalars`; None when it does not run on them.

    A model's repeated layers match a pattern again and again with the same inputs
    (12 GELUs of one size in BERT), and each trace is a `make_fx` run of tens of
    milliseconds. With static sizes the trace depends only on the inputs' metadata,
    the scalars and grad mode, so it is kept on the pattern under exactly those; a
    symbolic size is traced every time (its answer belongs to its shape environment).
    """
    key = _trace_key(values, scalars)
    if key is not None and key in pattern._retraced:
        cached: Retraced | None = pattern._retraced[key]
        return cached
    try:
        with mode:
            retraced = trace_search(pattern.search, values, scalars)
    except Exception:
        result: Retraced | None = None
    else:
        result = [(n.target, tuple(n.meta["val"].shape)) for n in _tensor_nodes(retraced)]
    static = result is None or all(type(x) is int for _, shape in result for x in shape)
    if key is not None and static:
        pattern._retraced[key] = result
    return result


def _trace_key(values: list[torch.Tensor], scalars: list[Any]) -> tuple[Any, ...] | None:
    """What a trace on fake `values` of static sizes depends on; None if any size,
    stride or offset is symbolic. Scalars by type and repr (0.0 is not -0.0)."""
    parts: list[Any] = []
    for v in values:
        layout = (*v.shape, *v.stride(), v.storage_offset())
        if not all(type(x) is int for x in layout):
            return None
        parts.append((type(v), v.dtype, v.device, layout, v.dim(), v.requires_grad))
    return (
        tuple(parts),
        tuple((type(s), repr(s)) for s in scalars),
        torch.is_grad_enabled(),
    )


def _build_replacement(
    match: Match, mode: FakeTensorMode, pass_name: str
) -> tuple[torch.fx.Node, list[torch.fx.Node]] | None:
    graph = match.anchor.graph
    pattern = match.pattern
    tracer = _RecordingTracer(graph)
    with graph.inserting_before(match.anchor):
        proxies = [Proxy(match.inputs[name], tracer) for name in pattern.inputs]
        scalars = [match.scalars[name] for name in pattern.scalars]
        result = pattern.replace(*proxies, *scalars)
    created = tracer.created
    if not isinstance(result, Proxy):
        for node in reversed(created):
            graph.erase_node(node)
        raise GraphPassError(pass_name, f"pattern {pattern.name!r}: replace must return a tensor")
    try:
        for node in created:
            copy_debug_meta(match.anchor, node)
            infer_value(node, mode, pass_name)
    except GraphPassError:
        for node in reversed(created):
            graph.erase_node(node)
        return None
    new, old = result.node.meta.get("val"), match.anchor.meta.get("val")
    if (
        not isinstance(new, torch.Tensor)
        or not isinstance(old, torch.Tensor)
        or new.dtype != old.dtype
        or not same_shape(new, old)
    ):
        for node in reversed(created):
            graph.erase_node(node)
        return None
    return result.node, created


def _erase_matched(match: Match) -> None:
    pending = [n for n in match.graph_nodes if n is not match.anchor]
    pending.append(match.anchor)
    progress = True
    while progress:
        progress = False
        for node in pending:
            if not getattr(node, "_erased", False) and not node.users:
                node.graph.erase_node(node)
                progress = True


def rewrite_patterns(patterns: Sequence[Pattern], name: str = "pattern_rewrite") -> GraphPass:
    """A pass that applies `patterns` (in priority order) everywhere they match.

    The pass's stats count the fires per pattern name. Graphs without fake values are
    left alone: the checks above need them.
    """

    @named_pass(
        name, (PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS)
    )
    def pattern_rewrite(gm: torch.fx.GraphModule) -> PassResult:
        fired = {pattern.name: 0 for pattern in patterns}
        mode = fake_mode_of(gm)
        if mode is None:
            return PassResult(gm, False, fired)
        present = {n.target for n in gm.graph.nodes if n.op == "call_function"}
        by_anchor: dict[object, list[Pattern]] = {}
        for pattern in patterns:  # in priority order
            if pattern.requires <= present:  # traced (once) only where it can match
                by_anchor.setdefault(pattern.anchor.target, []).append(pattern)
        for node in reversed(list(gm.graph.nodes)):
            if getattr(node, "_erased", False) or node.op != "call_function":
                continue
            for pattern in by_anchor.get(node.target, []):
                match = match_pattern(pattern, node)
                if match is None:
                    continue
                if pattern.check is not None and not pattern.check(match):
                    continue
                if not sizes_agree(match, mode):
                    continue
                built = _build_replacement(match, mode, name)
                if built is None:
                    continue
                node.replace_all_uses_with(built[0])
                _erase_matched(match)
                fired[pattern.name] += 1
                break
        changed = any(fired.values())
        if changed:
            remove_dead_nodes(gm.graph)
            gm.recompile()
        return PassResult(gm, changed, fired)

    return pattern_rewrite
