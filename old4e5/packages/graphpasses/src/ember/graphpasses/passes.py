"""What a pass is: a function from a graph module to (graph module, changed).

Passes are plain callables so that they compose without a framework. `named_pass`
attaches the metadata the pass manager reports on: a name and what the pass promises
to preserve (for example that it adds no mutation and no ops outside core ATen).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch.fx


@dataclass(frozen=True)
class PassResult:
    """A pass's output: the (possibly new) graph module and whether anything changed.

    `stats` holds counters the pass wants reported (nodes removed, patterns fired by
    name, ...); the pass manager copies them into the pass's `PassRecord`.
    """

    graph_module: torch.fx.GraphModule
    changed: bool
    stats: dict[str, int] = field(default_factory=dict)


class GraphPass(Protocol):
    """A graph pass. `name` and `preserves` are read by the pass manager."""

    @property
    def name(self) -> str: ...

    @property
    def preserves(self) -> frozenset[str]: ...

    def __call__(self, gm: torch.fx.GraphModule) -> PassResult: ...


@dataclass(frozen=True)
class _NamedPass:
    name: str
    preserves: frozenset[str]
    fn: Callable[[torch.fx.GraphModule], PassResult]

    def __call__(self, gm: torch.fx.GraphModule) -> PassResult:
        return self.fn(gm)


# What a pass may promise; the manager's checking mode verifies each of them.
PRESERVES_NO_MUTATION = "no-mutation"  # adds no mutating op
PRESERVES_CORE_ATEN = "core-aten"  # adds only ops the graph used or ember's IR lowers
PRESERVES_VALUES = "values"  # outputs (and mutated inputs) are unchanged on any input
PRESERVES_RANDOMNESS = "randomness"  # keeps every random op, in order
ALL_PRESERVES = frozenset(
    {PRESERVES_NO_MUTATION, PRESERVES_CORE_ATEN, PRESERVES_VALUES, PRESERVES_RANDOMNESS}
)


def named_pass(
    name: str, preserves: tuple[str, ...] = ()
) -> Callable[[Callable[[torch.fx.GraphModule], PassResult]], GraphPass]:
    """Decorate a function `gm -> PassResult` into a `GraphPass` with a name."""

    unknown = set(preserves) - ALL_PRESERVES
    if unknown:
        raise ValueError(f"pass {name!r} declares unknown preserves {sorted(unknown)}")

    def wrap(fn: Callable[[torch.fx.GraphModule], PassResult]) -> GraphPass:
        return _NamedPass(name, frozenset(preserves), fn)

    return wrap
