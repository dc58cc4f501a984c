"""Matching one pattern graph against a target graph, from an anchor node backwards.

A pattern node matches a graph node with the same op target whose arguments match in
turn: nodes recursively, placeholders by binding (the same placeholder must bind the
same node everywhere), scalar wildcards by binding a number, other literals by value
(floats to a relative 1e-6, so `math.sqrt(2 / math.pi)` spelled differently still
matches). Arguments are compared per schema argument with defaults filled in, so
`sum(x, [1])` and `sum(x, [1], False)` are the same call. Two relaxations keep
patterns independent of sizes and layouts:
- size arguments of view/expand ops are not compared (a pattern traced at one size
  matches every size; the rewrite pass re-checks sizes on the bound inputs);
- `clone` nodes in the target that the pattern does not have are looked through: they
  only change memory layout (matmul's decomposition inserts them for transposed inputs).
Commutative ops (add, mul) match in either argument order.
A match is only usable if every matched node other than the anchor is read only from
inside the match, and none has side effects; `match_pattern` checks both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ember.graphpasses.effects import has_side_effects
from ember.graphpasses.pattern import Pattern, ScalarWildcard

aten = torch.ops.aten

_SIZE_ARGUMENTS: dict[object, str] = {
    aten.view.default: "size",
    aten._unsafe_view.default: "size",
    aten.reshape.default: "shape",
    aten.expand.default: "size",
}
_COMMUTATIVE: set[object] = {aten.add.Tensor, aten.mul.Tensor}
_MISSING = object()


@dataclass
class Match:
    """A successful match: which graph nodes the pattern's nodes and inputs bound to."""

    pattern: Pattern
    anchor: torch.fx.Node
    nodes: dict[torch.fx.Node, torch.fx.Node] = field(default_factory=dict)
    inputs: dict[str, torch.fx.Node] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)
    looked_through: list[torch.fx.Node] = field(default_factory=list)

    def value(self, name: str) -> torch.Tensor:
        """The fake value of a bound tensor input."""
        value = self.inputs[name].meta.get("val")
        assert isinstance(value, torch.Tensor), f"input {name} has no tensor value"
        return value

    @property
    def graph_nodes(self) -> list[torch.fx.Node]:
        return [*self.nodes.values(), *self.looked_through]

    def snapshot(self) -> tuple[Any, ...]:
        return (dict(self.nodes), dict(self.inputs), dict(self.scalars), list(self.looked_through))

    def restore(self, saved: tuple[Any, ...]) -> None:
        self.nodes, self.inputs, self.scalars, self.looked_through = (
            dict(saved[0]),
            dict(saved[1]),
            dict(saved[2]),
            list(saved[3]),
        )


def normalized_arguments(node: torch.fx.Node) -> list[tuple[str, Any]]:
    """(name, value) for every schema argument, defaults filled in."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return [(str(i), a) for i, a in enumerate(node.args)] + sorted(node.kwargs.items())
    result: list[tuple[str, Any]] = []
    value: Any
    for index, argument in enumerate(target._schema.arguments):
        if not argument.kwarg_only and index < len(node.args):
            value = node.args[index]
        elif argument.name in node.kwargs:
            value = node.kwargs[argument.name]
        elif argument.has_default_value():
            value = argument.default_value
        else:
            value = _MISSING
        result.append((argument.name, value))
    return result


def _look_through(node: Any, match: Match, record: bool) -> Any:
    while (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target is aten.clone.default
    ):
        if record:
            match.looked_through.append(node)
        node = node.args[0]
    return node


def _match_value(pattern: Any, value: Any, match: Match) -> bool:
    if isinstance(pattern, torch.fx.Node):
        return isinstance(value, torch.fx.Node) and _match_node(pattern, value, match)
    if isinstance(pattern, ScalarWildcard):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        bound = match.scalars.setdefault(pattern.name, float(value))
        return bound == float(value)
    if isinstance(pattern, list | tuple):
        return (
            isinstance(value, list | tuple)
            and len(pattern) == len(value)
            and all(_match_value(p, v, match) for p, v in zip(pattern, value, strict=True))
        )
    if isinstance(pattern, float) and isinstance(value, float):
        return math.isclose(pattern, value, rel_tol=1e-6, abs_tol=1e-12)
    if type(pattern) is not type(value):
        return isinstance(pattern, int | float) and pattern == value and not isinstance(value, bool)
    return bool(pattern == value)


def _match_arguments(pattern: torch.fx.Node, node: torch.fx.Node, match: Match) -> bool:
    ignored = _SIZE_ARGUMENTS.get(pattern.target)
    p_args = normalized_arguments(pattern)
    g_args = normalized_arguments(node)
    if len(p_args) != len(g_args):
        return False
    for (name, p), (_, g) in zip(p_args, g_args, strict=True):
        if name == ignored:
            continue
        if not _match_value(p, g, match):
            return False
    return True


def _match_node(pattern: torch.fx.Node, node: torch.fx.Node, match: Match) -> bool:
    if pattern.op == "placeholder":
        node = _look_through(node, match, record=False)
        bound = match.inputs.setdefault(str(pattern.target), node)
        return bound is node
    if pattern.target is not aten.clone.default:
        node = _look_through(node, match, record=True)
    if pattern in match.nodes:
        return match.nodes[pattern] is node
    if node.op != "call_function" or node.target != pattern.target:
        return False
    if node in match.nodes.values():
        return False
    match.nodes[pattern] = node
    saved = match.snapshot()
    if _match_arguments(pattern, node, match):
        return True
    if pattern.target in _COMMUTATIVE and len(pattern.args) >= 2:
        match.restore(saved)
        swapped = pattern.args[1], pattern.args[0]
        if _match_value(swapped[0], node.args[0], match) and _match_value(
            swapped[1], node.args[1], match
        ):
            return _same_kwargs(pattern, node)
    return False


def _same_kwargs(pattern: torch.fx.Node, node: torch.fx.Node) -> bool:
    p = dict(normalized_arguments(pattern)[2:])
    g = dict(normalized_arguments(node)[2:])
    return p == g


def match_pattern(pattern: Pattern, anchor: torch.fx.Node) -> Match | None:
    """Match `pattern` with its output at `anchor`; None if it does not match there."""
    match = Match(pattern, anchor)
    if not _match_node(pattern.anchor, anchor, match):
        return None
    inside = set(match.graph_nodes)
    for node in inside:
        if has_side_effects(node):
            return None
        if node is not anchor and any(user not in inside for user in node.users):
            return None
    placeholder_names = {str(p.target) for p in pattern.placeholders}
    if set(match.inputs) != placeholder_names:
        return None
    return match
