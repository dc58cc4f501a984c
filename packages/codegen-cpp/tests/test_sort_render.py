"""Rendering of sort kernels: one sort per row shared by a sort's values and indices,
scratch arrays per thread, parallel rows, the direction and the kept count."""

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


def test_rows_sort_in_parallel_with_scratch_arrays_per_thread() -> None:
    text, _ = render_kernel(_kernel(lambda x: torch.sort(x, 1), torch.randn(64, 4096)))
    assert "#pragma omp parallel\n" in text and "#pragma omp for\n" in text
    # allocated once per thread, inside the parallel region, before the loop over rows
    new = text.index("float* ember_values0 = new float[4096 > 0 ? 4096 : 1];")
    assert text.index("#pragma omp parallel") < new < text.index("#pragma omp for")
    assert text.count("ember::sort_row<false>(ember_values0, ember_order0, 4096, 4096);") == 1
    assert "out_buf0[4096*i0 + r0] = ember_values0[ember_at];" in text
    assert "out_buf1[4096*i0 + r0] = ember_at;" in text
    assert text.count("delete[]") == 2


def test_topk_keeps_k_and_sorts_descending() -> None:
    text, _ = render_kernel(_kernel(lambda x: torch.topk(x, 5, 0), torch.randn(1000, 3)))
    assert "ember::sort_row<true>(ember_values0, ember_order0, 1000, 5);" in text
    assert "for (int64_t r0 = 0; r0 < 5; ++r0)" in text
    assert "omp parallel" not in text  # 3 rows of 1000: not worth threads


def test_argsort_stores_positions_only_and_bool_sorts_as_bytes() -> None:
    text, _ = render_kernel(_kernel(lambda x: torch.argsort(x > 0, dim=1), torch.randn(8, 40)))
    assert "uint8_t* ember_values0" in text
    assert "ember_values0[ember_at]" not in text and "= ember_at;" in text


def test_symbolic_lengths_are_kernel_arguments() -> None:
    kernel = _kernel(lambda x: torch.sort(x, 1), torch.randn(8, 40), symbolic=True)
    text, info = render_kernel(kernel)
    sizes = [a.name for a in info.arguments if a.kind == "size"]
    assert any(f"new float[{name} > 0 ? {name} : 1]" in text for name in sizes)
    assert " if(" in text  # parallel only when there is enough work, decided at run time


def test_a_sort_kernel_with_another_member_is_refused() -> None:
    kernel = _kernel(lambda x: torch.sort(x, 1), torch.randn(8, 40))
    values, indices = kernel.members
    bad = replace(kernel, members=(values, replace(indices, kind="pointwise")))
    with pytest.raises(CppRenderError, match="sorts only"):
        render_kernel(bad)
