"""Shared helpers: real fused kernels from small PyTorch functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, lower_graph
from ember.scheduler import FusedKernel, schedule_program


def fused_kernels(fn: Callable[..., Any], *args: Any, dynamic: bool = False) -> list[FusedKernel]:
    """The scheduler's kernels for `fn` traced on `args`."""
    mode = "symbolic" if dynamic else "real"
    gm = make_fx(fn, decomposition_table=ember_decompositions(), tracing_mode=mode)(*args)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    return schedule_program(program).kernels


def randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape).to(dtype)
