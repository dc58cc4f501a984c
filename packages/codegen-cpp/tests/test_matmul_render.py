"""Matmul kernels in rendered C++ (no compiler here): a float32 `addmm` and the SiLU
after it become one kernel that computes each block's product with
`ember::gemm_block` and runs the bias and activation over the block; operands are
addressed by their strides (a transposed weight reads with stride 1 along K), the
gemm helpers come with the unit only where a kernel needs them, and other dtypes
are left to ATen by the CPU choices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.cpp import CPP_CHOICES, PRELUDE, render_kernels
from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, lower_graph
from ember.scheduler import FusedKernel, schedule_program

CHOICES = replace(CPP_CHOICES, matmul_epilogues=True)  # as the runtime asks for them


def kernels_of(fn: Callable[..., Any], *args: Any) -> list[FusedKernel]:
    gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    return list(schedule_program(program, CHOICES).kernels)


def linear_silu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(torch.addmm(b, x, w.t()))


def test_a_linear_and_its_activation_are_one_matmul_kernel() -> None:
    kernels = kernels_of(linear_silu, torch.randn(64, 256), torch.randn(512, 256), torch.randn(512))
    assert len(kernels) == 1 and kernels[0].matmul is not None
    source = render_kernels(kernels).source
    assert "ember::GemmBlocks blocks(batch, M, N, K, omp_get_max_threads());" in source
    # x row-major (stride 256 along M, 1 along K); w^T read with stride 1 along K
    assert ", 256, 1, " in source and ", 1, 256, scratch);" in source
    body = source.split('extern "C" void ember_set_sgemm')[1]
    assert "ember::sigmoid(" in body and "row[i1 - n0]" in body
    assert "ember_set_sgemm" in source and source.startswith(PRELUDE)


def test_units_without_matmuls_carry_no_gemm_helpers() -> None:
    kernels = kernels_of(lambda x: x.exp() + 1, torch.randn(64, 64))
    source = render_kernels(kernels).source
    assert kernels and "gemm_block" not in source and "ember_set_sgemm" not in source


def test_other_dtypes_and_bare_products_stay_aten_calls() -> None:
    half = kernels_of(
        linear_silu,
        torch.randn(8, 16, dtype=torch.bfloat16),
        torch.randn(32, 16, dtype=torch.bfloat16),
        torch.randn(32, dtype=torch.bfloat16),
    )
    assert all(k.matmul is None for k in half)
    assert kernels_of(lambda a, b: a @ b, torch.randn(8, 16), torch.randn(16, 32)) == []


def test_a_batched_product_indexes_each_matrix() -> None:
    kernels = kernels_of(
        lambda a, b: torch.relu(a @ b), torch.randn(3, 8, 16), torch.randn(3, 16, 4)
    )
    (kernel,) = [k for k in kernels if k.matmul is not None]
    source = render_kernels([kernel]).source
    assert "const int64_t batch = 3;" in source and "128*i0" in source
