"""The matmul template's source (ember.codegen.triton.gemm): what each product and
epilogue renders to, without running it (the runtime's interpreter tests run it)."""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.triton import TRITON_CHOICES, TritonKernel, render_kernel
from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, lower_graph
from ember.scheduler import schedule_program

TEMPLATES = dataclasses.replace(TRITON_CHOICES, matmul_epilogues=True)


def _render(fn: Callable[..., Any], *args: torch.Tensor, **choices: Any) -> TritonKernel:
    gm = make_fx(fn, decomposition_table=ember_decompositions())(*args)
    program = lower_graph(gm, options=LoweringOptions(loops=True))
    (kernel,) = schedule_program(program, dataclasses.replace(TEMPLATES, **choices)).kernels
    assert kernel.matmul is not None
    rendered = render_kernel(kernel)
    ast.parse(rendered.source)
    return rendered


def _linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> Any:
    return F.gelu(F.linear(x, w, b))


def _args(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(t.to(dtype) for t in (torch.randn(37, 53), torch.randn(29, 53), torch.randn(29)))


def test_float32_products_are_exact_unless_tf32_is_allowed() -> None:
    exact = _render(_linear_gelu, *_args(torch.float32))
    assert exact.kind == "gemm"
    assert 'input_precision="ieee"' in exact.source
    tf32 = _render(_linear_gelu, *_args(torch.float32), matmul_tf32=True)
    assert 'input_precision="tf32"' in tf32.source


def test_bfloat16_accumulates_in_float32_and_rounds_the_result_once() -> None:
    source = _render(_linear_gelu, *_args(torch.bfloat16)).source
    assert "acc = tl.zeros([YBLOCK, XBLOCK], dtype=tl.float32)" in source
    assert "input_precision" not in source  # bf16 blocks go to the tensor cores as they are
    assert "acc = tl.dot(a, b, acc)" in source
    # the bias is added to the float32 accumulator, the sum rounded to bf16 once
    assert source.count("tl.bfloat16") >= 1
    assert "tl.load(a0_ptr + (i1), xmask" in source


def test_grouped_tiles_ragged_masks_and_the_weight_read_through_its_strides() -> None:
    source = _render(_linear_gelu, *_args(torch.float32)).source
    assert "rows = tl.minimum(ytiles - first, 8)" in source
    assert "rmask = (start + rbase) < rnumel" in source  # K = 53: ragged
    # M = 37 and N = 29 overhang their tiles: the operands read wrapped rows/columns,
    # so the K loop masks its loads along K alone
    assert "arow = yindex % ynumel" in source and "bcol = xindex % xnumel" in source
    assert "a = tl.load(a_ptrs, mask=rmask[None, :], other=0.0)" in source
    assert "b = tl.load(b_ptrs, mask=rmask[:, None], other=0.0)" in source
    assert "+ rbase[:, None] * (1) + bcol * (53)" in source  # w.t(): K stride 1, N stride 53


def test_sizes_every_block_divides_load_without_masks() -> None:
    x, w, b = torch.randn(256, 128), torch.randn(512, 128), torch.randn(512)
    rendered = _render(_linear_gelu, *(t.to(torch.bfloat16) for t in (x, w, b)))
    source = rendered.source
    assert "arow = yindex\n" in source and "bcol = xindex\n" in source
    assert "a = tl.load(a_ptrs)\n" in source and "b = tl.load(b_ptrs)\n" in source
    assert "rmask" not in source
    # the stores keep their masks (the epilogue is the same for every tile)
    assert "ymask & xmask" in source


def test_few_tiles_try_smaller_tiles_first_and_large_products_hopper_tiles() -> None:
    def first(m: int, n: int) -> tuple[int, int, int, int]:
        x, w, b = torch.randn(m, 64), torch.randn(n, 64), torch.randn(n)
        config = _render(_linear_gelu, *(t.to(torch.bfloat16) for t in (x, w, b))).configs[0]
        return (
            config.block("YBLOCK"),
            config.block("XBLOCK"),
            config.block("RBLOCK"),
            (config.num_warps),
        )

    assert first(256, 512) == (64, 128, 64, 4)  # 2 x 4 tiles of 128 x 128
    assert first(2048, 1024) == (128, 128, 64, 8)  # 16 x 8 tiles: a full wave
    x, w, b = torch.randn(2048, 64), torch.randn(1024, 64), torch.randn(1024)
    configs = _render(_linear_gelu, *(t.to(torch.bfloat16) for t in (x, w, b))).configs
    assert any(c.block("XBLOCK") == 256 and c.num_warps == 8 for c in configs)
    assert all(c.num_stages >= 3 for c in configs)


def test_configs_fit_the_problem_and_the_grid_counts_tiles() -> None:
    rendered = _render(_linear_gelu, *_args(torch.bfloat16))
    assert 2 <= len(rendered.configs) <= 5
    for config in rendered.configs:
        assert config.block("YBLOCK") == 64 and config.block("XBLOCK") == 32  # 37, 29 rounded up
        assert config.block("RBLOCK") >= 16
    assert rendered.grid.describe() == "cdiv(37, YBLOCK) * cdiv(29, XBLOCK)"


def test_bmm_runs_one_batch_entry_per_program() -> None:
    a, b = torch.randn(3, 37, 53), torch.randn(3, 53, 29)
    rendered = _render(lambda a, b: torch.bmm(a, b) * 2, a, b)
    assert rendered.grid.describe() == "cdiv(3, BBLOCK) * cdiv(37, YBLOCK) * cdiv(29, XBLOCK)"
    assert all(c.block("BBLOCK") == 1 for c in rendered.configs)
    assert "bindex = pid // (ytiles * xtiles)" in rendered.source
