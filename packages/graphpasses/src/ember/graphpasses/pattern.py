"""Declarative patterns: a search function and a replacement function in plain torch.

The search function is traced with `make_fx` and ember's decomposition table, so the
pattern graph is spelled exactly like the graphs AOTAutograd and torch.export hand us,
then canonicalised like them (views normalised, no-ops and layout-only clones dropped).
Float scalars the pattern should bind (an attention scale, say) are declared by name
in `scalars`; the search function receives a distinctive sentinel value for each, and
every literal equal to a sentinel in the traced graph becomes a scalar wildcard.

The replacement function is not traced ahead of time: at rewrite time it is called with
FX proxies for the bound tensors (appending straight into the target graph) and the
bound scalars as plain Python numbers, so it may compute with them (`1.0 / scale`). It
should call `torch.ops.aten.<op>.<overload>` directly: that is what lands in the graph.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses.decompositions import aot_decompositions
from ember.graphpasses.graph_edit import output_node
from ember.graphpasses.noop_removal import remove_noops
from ember.graphpasses.view_normalisation import normalise_views

if TYPE_CHECKING:
    from ember.graphpasses.matcher import Match

aten = torch.ops.aten


@dataclass(frozen=True)
class ScalarWildcard:
    """A literal position in a pattern graph that binds a scalar by name."""

    name: str


def _sentinel(index: int) -> float:
    return 1.234567891011 + 0.1 * index


@dataclass(eq=False)
class Pattern:
    """One rewrite: where `search` computes something, compute `replace` instead.

    `inputs` names the search function's tensor parameters, in order; `example_inputs`
    builds tensors to trace it with (any sizes: sizes are not part of the match);
    `scalars` names its trailing float parameters; `check` may veto a match.

    `requires` names ops every match contains: in a graph without one of them the
    pattern cannot match, so it is not even traced there. Tracing the search
    functions was 0.4 s of a small graph's cold compile on the H100 machine, most of
    it for attention patterns in graphs without a batched matmul. The traced graph
    is checked to contain them, so a wrong declaration fails loudly, not silently.
    """

    name: str
    search: Callable[..., torch.Tensor]
    replace: Callable[..., Any]
    inputs: tuple[str, ...]
    example_inputs: Callable[[], Sequence[torch.Tensor]]
    scalars: tuple[str, ...] = ()
    check: Callable[[Match], bool] | None = None
    description: str = ""
    requires: frozenset[torch._ops.OpOverload] = frozenset()
    _graph: torch.fx.GraphModule | None = field(default=None, repr=False)
    # What tracing `search` again gives for inputs of static sizes, by the inputs'
    # metadata (see ember.graphpasses.rewrite.sizes_agree).
    _retraced: dict[Any, Any] = field(default_factory=dict, repr=False)

    @property
    def graph(self) -> torch.fx.GraphModule:
        """The canonical search graph (traced once, on first use)."""
        if self._graph is None:
            sentinels = [_sentinel(i) for i in range(len(self.scalars))]
            gm = trace_search(self.search, list(self.example_inputs()), sentinels)
            _mark_scalars(gm, dict(zip(sentinels, self.scalars, strict=True)), self.name)
            placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
            if len(placeholders) != len(self.inputs):
                raise ValueError(
                    f"pattern {self.name!r}: search has {len(placeholders)} tensor inputs "
                    f"but {len(self.inputs)} names were given"
                )
            for node, input_name in zip(placeholders, self.inputs, strict=True):
                node.target = input_name
            missing = self.requires - {n.target for n in gm.graph.nodes}
            if missing:
                raise ValueError(
                    f"pattern {self.name!r} requires {sorted(map(str, missing))}, "
                    "which its traced search graph does not contain"
                )
            self._graph = gm
        return self._graph

    @property
    def anchor(self) -> torch.fx.Node:
        """The pattern node whose value the pattern produces (matching starts there)."""
        result = output_node(self.graph).args[0]
        if isinstance(result, list | tuple):
            if len(result) != 1:
                raise ValueError(f"pattern {self.name!r}: search must return one tensor")
            result = result[0]
        assert isinstance(result, torch.fx.Node)
        return result

    @property
    def placeholders(self) -> list[torch.fx.Node]:
        return [n for n in self.graph.graph.nodes if n.op == "placeholder"]


def trace_search(
    fn: Callable[..., torch.Tensor], tensors: Sequence[Any], scalars: Sequence[float]
) -> torch.fx.GraphModule:
    """Trace `fn(*tensors, *scalars)` the way ember's graphs are traced, canonicalised.

    `tensors` may be real tensors or fake tensors of an active fake mode.
    """

    def with_scalars(*args: torch.Tensor) -> torch.Tensor:
        return fn(*args, *scalars)

    gm = make_fx(
        with_scalars,
        decomposition_table=_tracing_table(),
        tracing_mode="fake" if not _any_fake(tensors) else "real",
    )(*tensors)
    canonicalise(gm)
    return gm


@functools.cache
def _tracing_table() -> Mapping[torch._ops.OpOverload, Callable[..., Any]]:
    """Ember's table, built once: patterns are traced many times per process."""
    return {
        op: fn for op, fn in aot_decompositions().items() if isinstance(op, torch._ops.OpOverload)
    }


def _any_fake(values: Sequence[Any]) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return any(isinstance(v, FakeTensor) for v in values)


def canonicalise(gm: torch.fx.GraphModule) -> None:
    """Bring a graph to the form patterns are matched in (used on both sides)."""
    normalise_views(gm)
    remove_noops(gm)
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.clone.default:
            source = node.args[0]
            assert isinstance(source, torch.fx.Node)
            node.replace_all_uses_with(source)
            graph.erase_node(node)
    graph.eliminate_dead_code()
    gm.recompile()


def _mark_scalars(gm: torch.fx.GraphModule, names: dict[float, str], pattern: str) -> None:
    found: set[str] = set()

    def mark(value: Any) -> Any:
        if isinstance(value, float) and value in names:
            found.add(names[value])
            return ScalarWildcard(names[value])
        if isinstance(value, list | tuple):
            return type(value)(mark(v) for v in value)
        return value

    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.args = tuple(mark(a) for a in node.args)
            node.kwargs = {k: mark(v) for k, v in node.kwargs.items()}
    missing = set(names.values()) - found
    if missing:
        raise ValueError(
            f"pattern {pattern!r}: scalar(s) {sorted(missing)} do not appear as literals in "
            "the traced search graph; use them directly as op arguments (x * scale)"
        )
