from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, Program, lower_graph, verify
from ember.scheduler import Schedule, schedule_program


def lower_fn(fn: Callable[..., Any], *args: torch.Tensor, symbolic: bool = False) -> Program:
    gm = make_fx(
        fn,
        decomposition_table=ember_decompositions(),
        tracing_mode="symbolic" if symbolic else "real",
    )(*args)
    program = lower_graph(
        gm, name=getattr(fn, "__name__", "graph"), options=LoweringOptions(loops=True)
    )
    verify(program)
    return program


def schedule_fn(fn: Callable[..., Any], *args: torch.Tensor, symbolic: bool = False) -> Schedule:
    return schedule_program(lower_fn(fn, *args, symbolic=symbolic))


@pytest.fixture
def lower() -> Callable[..., Program]:
    """Trace with make_fx and ember's decompositions, lower with loop nodes, verify."""
    return lower_fn


@pytest.fixture
def schedule() -> Callable[..., Schedule]:
    """`lower`, then schedule."""
    return schedule_fn


@pytest.fixture(autouse=True)
def seeded() -> None:
    torch.manual_seed(0)
