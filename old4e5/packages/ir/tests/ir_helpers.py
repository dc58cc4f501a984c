"""Shared test helpers of the IR layer: trace a function at the ATen level the way
the stack does, lower it with loops on, verify, run it through the interpreter and
compare with eager."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, Program, lower_graph, run_program, verify

Mode = Literal["real", "fake", "symbolic"]


def trace(fn: Callable[..., Any], *args: Any, mode: Mode = "real") -> torch.fx.GraphModule:
    table: Any = ember_decompositions()
    tracer = make_fx(torch.func.functionalize(fn), decomposition_table=table, tracing_mode=mode)
    return tracer(*args)


def lower(fn: Callable[..., Any], *args: Any, mode: Mode = "real", **options: Any) -> Program:
    options.setdefault("loops", True)
    options.setdefault("allow_fallback", False)
    program = lower_graph(trace(fn, *args, mode=mode), options=LoweringOptions(**options))
    verify(program)
    return program


def check(
    fn: Callable[..., Any], *args: Any, rtol: float = 1e-5, atol: float = 1e-5, **options: Any
) -> Program:
    """Lower `fn` (loops on, fallbacks off), run it, and compare with eager."""
    program = lower(fn, *args, **options)
    expected = flatten(fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]))
    actual = flatten(run_program(program, list(args), seed=0))
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        if isinstance(e, torch.Tensor):
            assert a.dtype == e.dtype, (a.dtype, e.dtype)
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
        else:
            assert a == e
    return program


def flatten(value: Any) -> list[Any]:
    """Leaves of nested outputs (namedtuples such as torch.return_types included)."""
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in flatten(item)]
    return [value]


def computed(program: Program) -> list[Any]:
    from ember.ir import ComputedBuffer

    return [n for n in program.nodes if isinstance(n, ComputedBuffer)]


__all__ = ["check", "computed", "flatten", "lower", "trace"]
