"""Rendering of scan kernels: one ordered walk along the scanned dimension per outer
point (row shape) or per block of 64 contiguous outer points (column shape), the
fold of each kind, and parallel loops over the outer points."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ember.codegen.cpp import CppRenderError, render_kernel
from ember.graphpasses import ember_decompositions
from ember.ir import LoweringOptions, lower_graph
from ember.scheduler import FusedKernel, schedule_program


def _kernel(fn: object, *args: torch.Tensor, symbolic: bool = False) -> FusedKernel:
    mode = "symbolic" if symbolic else "real"
    gm = make_fx(fn, decomposition_table=ember_decompositions(), tracing_mode=mode)(*args)
    (kernel,) = schedule_program(lower_graph(gm, options=LoweringOptions(loops=True))).kernels
    return kernel


def test_row_scan_walks_each_row_once_in_parallel_over_rows() -> None:
    text, _ = render_kernel(_kernel(lambda x: x.cumsum(1), torch.randn(64, 4096)))
    assert "#pragma omp parallel for\n" in text
    assert text.count("for (int64_t r0 = 0; r0 < 4096; ++r0)") == 1
    assert "double s_buf0;" in text  # float32 carried in float64, as eager on the CPU
    assert "s_buf0 = s_buf0 + t1;" in text
    assert "out_buf0[4096*i0 + r0] = static_cast<float>(s_buf0);" in text
    assert "omp simd" not in text


def test_one_dimensional_scan_is_one_sequential_walk() -> None:
    text, _ = render_kernel(_kernel(lambda x: x.cumsum(0), torch.randn(1 << 20)))
    assert "omp parallel" not in text
    assert "for (int64_t r0 = 0; r0 < 1048576; ++r0)" in text


def test_column_scan_runs_64_outer_points_as_simd_lanes() -> None:
    text, _ = render_kernel(_kernel(lambda x: torch.cummax(x, 0), torch.randn(100, 640)))
    assert "const int64_t ember_blocks = (640 + 64 - 1) / 64;" in text
    assert "float s_buf0[64];" in text and "int64_t k_buf1[64];" in text
    assert "#pragma omp simd" in text and "const int64_t i0 = ib + l;" in text
    assert "ember::scan_take_max(t0, s_buf1[l])" in text
    assert "out_buf1[i0 + 640*r0] = k_buf1[l];" in text


@pytest.mark.parametrize(
    ("fn", "fragment"),
    [
        (lambda x: x.cumprod(1), "s_buf0 = s_buf0 * t1;"),
        (lambda x: torch.logcumsumexp(x, 1), "s_buf0 = ember::log_add_exp(t1, s_buf0);"),
        (lambda x: torch.cummin(x, 1).indices, "ember::scan_take_min(t0, s_buf1)"),
        (lambda x: (x > 0).cumsum(1), "int64_t s_buf0;"),
        (lambda x: x.to(torch.bfloat16).cumsum(1), "ember::float_to_bf16(s_buf0)"),
    ],
)
def test_each_kind_folds_as_its_rule_says(fn: object, fragment: str) -> None:
    text, _ = render_kernel(_kernel(fn, torch.randn(8, 40)))
    assert fragment in text


def test_symbolic_sizes_are_kernel_arguments() -> None:
    kernel = _kernel(lambda x: x.cumsum(1), torch.randn(8, 40), symbolic=True)
    text, info = render_kernel(kernel)
    sizes = [a.name for a in info.arguments if a.kind == "size"]
    assert len(sizes) >= 2 and all(name in text for name in sizes)
    assert f"r0 < {sizes[-1]}" in text or any(f"r0 < {name}" in text for name in sizes)
    assert "if(" in text  # parallel only when there is enough work, decided at run time


def test_unknown_scan_kind_is_named() -> None:
    kernel = _kernel(lambda x: x.cumsum(1), torch.randn(8, 40))
    bad = replace(kernel, members=(replace(kernel.members[0], scan="median"),))
    with pytest.raises(CppRenderError, match="scan 'median'"):
        render_kernel(bad)
