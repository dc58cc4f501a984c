"""Checking mode: verify what each pass promised, on the graph and on sample inputs.

Each pass declares what it preserves (`passes.PRESERVES_*`). With checking on, the pass
manager snapshots the graph before a pass and, after it, checks the promises it can
check statically (no new mutating op, no new op outside what the IR lowers, the same
random ops in the same order) and, given sample inputs, runs the graph and compares
every output and every input (inputs may be mutated in place by copy_ epilogues)
against the values from before the first pass. Random ops see the same seed on every
run, so a pass that keeps them in order reproduces the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from ember.graphpasses.effects import is_mutating, is_random
from ember.graphpasses.errors import GraphPassError
from ember.graphpasses.graph_edit import output_node
from ember.graphpasses.passes import (
    PRESERVES_CORE_ATEN,
    PRESERVES_NO_MUTATION,
    PRESERVES_RANDOMNESS,
    PRESERVES_VALUES,
    GraphPass,
)
from ember.graphpasses.remaining_ops import REMAINING_OPS

_SEED = 1234


@dataclass(frozen=True)
class GraphSnapshot:
    """What the static checks compare: node identities, op targets, random ops."""

    nodes: frozenset[torch.fx.Node]
    targets: frozenset[str]
    random_ops: tuple[str, ...]

    @staticmethod
    def of(gm: torch.fx.GraphModule) -> GraphSnapshot:
        nodes = list(gm.graph.nodes)
        return GraphSnapshot(
            frozenset(nodes),
            frozenset(str(n.target) for n in nodes if n.op == "call_function"),
            tuple(str(n.target) for n in nodes if is_random(n)),
        )


def check_declared_preserves(
    graph_pass: GraphPass, before: GraphSnapshot, gm: torch.fx.GraphModule
) -> None:
    """Raise if the pass broke a static promise it declared."""
    promises = graph_pass.preserves
    new_nodes = [n for n in gm.graph.nodes if n not in before.nodes]
    if PRESERVES_NO_MUTATION in promises:
        for node in new_nodes:
            if is_mutating(node):
                raise GraphPassError(
                    graph_pass.name, "declared no-mutation but added a mutating op", node
                )
    if PRESERVES_CORE_ATEN in promises:
        for node in new_nodes:
            name = str(node.target)
            if (
                isinstance(node.target, torch._ops.OpOverload)
                and name not in before.targets
                and name not in REMAINING_OPS
            ):
                raise GraphPassError(
                    graph_pass.name,
                    "declared core-aten but added an op the IR does not lower "
                    "(not in ember.graphpasses.remaining_ops.REMAINING_OPS)",
                    node,
                )
    if PRESERVES_RANDOMNESS in promises:
        after = GraphSnapshot.of(gm).random_ops
        if after != before.random_ops:
            raise GraphPassError(
                graph_pass.name,
                f"declared randomness but the random ops changed: {list(before.random_ops)} "
                f"-> {list(after)}",
            )


def _clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    return [
        x.detach().clone(memory_format=torch.preserve_format) if isinstance(x, torch.Tensor) else x
        for x in inputs
    ]


class ValueChecker:
    """Runs a graph on fixed sample inputs and compares with the first run."""

    def __init__(self, sample_inputs: Sequence[Any], *, rtol: float = 1e-4, atol: float = 1e-5):
        self.sample_inputs = list(sample_inputs)
        self.rtol = rtol
        self.atol = atol
        self._expected: list[Any] | None = None

    def _run(self, gm: torch.fx.GraphModule) -> list[Any]:
        inputs = _clone_inputs(self.sample_inputs)
        torch.manual_seed(_SEED)
        with torch.no_grad():
            outputs = gm(*inputs)
        return [*pytree.tree_leaves(outputs), *inputs]

    def record(self, gm: torch.fx.GraphModule) -> None:
        """Run the unchanged graph: its results are what every later graph must give."""
        self._expected = self._run(gm)

    def verify(self, pass_name: str, gm: torch.fx.GraphModule) -> None:
        if self._expected is None:
            self.record(gm)
            return
        try:
            actual = self._run(gm)
        except Exception as exc:
            raise GraphPassError(
                pass_name, f"the graph no longer runs on the sample inputs: {exc}"
            ) from exc
        if len(actual) != len(self._expected):
            raise GraphPassError(
                pass_name, f"graph returns {len(actual)} values, expected {len(self._expected)}"
            )
        returned = pytree.tree_leaves(output_node(gm).args)
        for index, (want, got) in enumerate(zip(self._expected, actual, strict=True)):
            problem = self._difference(want, got)
            if problem is None:
                continue
            where = f"output {index}" if index < len(returned) else "a mutated input"
            node = returned[index] if index < len(returned) else None
            raise GraphPassError(
                pass_name,
                f"changed the graph's values ({where}): {problem}",
                node if isinstance(node, torch.fx.Node) else None,
            )

    def _difference(self, want: Any, got: Any) -> str | None:
        if not isinstance(want, torch.Tensor):
            return None if want == got else f"{got!r} != {want!r}"
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor, got {type(got).__name__}"
        if want.shape != got.shape or want.dtype != got.dtype:
            return f"{got.dtype}{list(got.shape)} != {want.dtype}{list(want.shape)}"
        if want.is_floating_point() or want.is_complex():
            if torch.allclose(want, got, rtol=self.rtol, atol=self.atol, equal_nan=True):
                return None
            diff = (want - got).abs().nan_to_num().max().item()
            return f"max abs difference {diff:.3g} (rtol={self.rtol}, atol={self.atol})"
        return None if torch.equal(want, got) else "integer/bool values differ"


def checks_values(graph_pass: GraphPass) -> bool:
    return PRESERVES_VALUES in graph_pass.preserves
