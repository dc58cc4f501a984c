"""Golden sources: the rendered text of representative kernels is the contract.

Run with EMBER_UPDATE_GOLDEN=1 to rewrite the files under golden/ after an intended
change, then review the diff.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from triton_cases import fused_kernels, randn

from ember.codegen.triton import render_kernel
from ember.scheduler import FusedKernel

GOLDEN = Path(__file__).parent / "golden"


def _softmax() -> FusedKernel:
    return fused_kernels(lambda x: torch.softmax(x, -1), randn(64, 100))[0]


def _layer_norm_stats() -> FusedKernel:
    return fused_kernels(
        lambda x: torch.var_mean(x, -1, correction=0), randn(32, 4096, dtype=torch.bfloat16)
    )[0]


CASES: dict[str, Callable[[], str]] = {
    "pointwise_gelu": lambda: (
        render_kernel(
            fused_kernels(lambda x: torch.nn.functional.gelu(x), randn(1000, dtype=torch.bfloat16))[
                0
            ]
        ).source
    ),
    "transpose_2d": lambda: (
        render_kernel(fused_kernels(lambda x: x.t().contiguous() * 2, randn(128, 96))[0]).source
    ),
    "softmax_persistent": lambda: render_kernel(_softmax()).source,
    "softmax_looped": lambda: render_kernel(_softmax(), reduction="looped").source,
    "welford_bf16": lambda: render_kernel(_layer_norm_stats()).source,
    "column_sum": lambda: (
        render_kernel(fused_kernels(lambda x: x.sum(0), randn(5000, 64))[0]).source
    ),
    "embedding_debug": lambda: (
        render_kernel(
            fused_kernels(
                lambda t, i: torch.nn.functional.embedding(i, t),
                randn(10, 16),
                torch.tensor([1, 2]),
            )[0],
            debug=True,
        ).source
    ),
    "index_add_scatter": lambda: (
        render_kernel(
            fused_kernels(
                lambda x, i, v: x.index_add(0, i, v),
                randn(10, 8),
                torch.tensor([1, 1]),
                randn(2, 8),
            )[-1]
        ).source
    ),
    "dropout_random": lambda: (
        render_kernel(
            fused_kernels(lambda x: torch.ops.aten.native_dropout(x, 0.1, True)[0], randn(64))[0]
        ).source
    ),
    "dynamic_softmax": lambda: (
        render_kernel(
            fused_kernels(lambda x: torch.softmax(x, -1), randn(6, 20), dynamic=True)[0]
        ).source
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_source(name: str) -> None:
    source = CASES[name]()
    path = GOLDEN / f"{name}.py.txt"
    if os.environ.get("EMBER_UPDATE_GOLDEN") == "1":
        path.write_text(source)
    assert path.exists(), f"no golden file {path.name}: run with EMBER_UPDATE_GOLDEN=1"
    assert source == path.read_text()
