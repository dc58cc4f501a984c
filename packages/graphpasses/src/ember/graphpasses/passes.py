"""What a pass is: a function from a graph module to (graph module, changed).

Passes are plain callables so that they compose without a framework. `named_pass`
attaches the metadata the pass manager reports on: a name and what the pass promises
to preserve (for example that it adds no mutation and no ops outside core ATen).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch.fx


@dataclass(frozen=True)
class PassResult:
    """A pass's output: the (possibly new) graph module and whether anything changed."""

    graph_module: torch.fx.GraphModule
    changed: bool


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


# What a pass may promise; the manager's checking mode verifies the ones it can.
PRESERVES_NO_MUTATION = "no-mutation"  # adds no mutating op
PRESERVES_CORE_ATEN = "core-aten"  # adds no op outside the set the graph already used
PRESERVES_VALUES = "values"  # outputs are unchanged on any input


def named_pass(
    name: str, preserves: tuple[str, ...] = ()
) -> Callable[[Callable[[torch.fx.GraphModule], PassResult]], GraphPass]:
    """Decorate a function `gm -> PassResult` into a `GraphPass` with a name."""

    def wrap(fn: Callable[[torch.fx.GraphModule], PassResult]) -> GraphPass:
        return _NamedPass(name, frozenset(preserves), fn)

    return wrap
