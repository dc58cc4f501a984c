"""Rendering of sort kernels: the whole row in one block padded to a power of two, one
pair sort (`ember_sort_rows`) shared by a sort's values and indices, the kept count as
the store mask, and rows the codegen refuses."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from triton_cases import fused_kernels, randn

from ember.codegen.triton import MAX_SORT_LENGTH, UnsupportedKernelError, render_kernel
from ember.codegen.triton.plan import SORT


def _render(fn: object, *args: torch.Tensor) -> object:
    (kernel,) = fused_kernels(fn, *args)
    assert kernel.is_sort
    return render_kernel(kernel)


def test_a_row_is_one_padded_block_sorted_once_for_values_and_indices() -> None:
    rendered = _render(lambda x: torch.sort(x, 1), randn(64, 300))
    assert rendered.kind == SORT
    source = rendered.source
    assert all(c.block("RBLOCK") == 512 for c in rendered.configs)
    assert source.count("ember_sort_rows(sort_v, sort_k, rnumel, 9, False, tl.int32)") == 1
    assert "def ember_sort_partner(" in source and "def ember_sort_before(" in source
    stores = [line for line in source.splitlines() if "tl.store" in line]
    assert len(stores) == 2 and "sort_v.to(tl.float32)" in stores[0]
    assert "sort_k.to(tl.int64)" in stores[1]
    assert "for roffset" not in source
    assert rendered.grid.describe() == "cdiv(64, XBLOCK)"


def test_topk_stores_the_first_k_lanes_in_descending_order() -> None:
    source = _render(lambda x: torch.topk(x, 3, 0), randn(100, 8)).source
    assert "ember_sort_rows(sort_v, sort_k, rnumel, 7, True, tl.int32)" in source
    assert "rmask = rindex < 3" in source


@pytest.mark.parametrize(
    ("dtype", "carried", "bits"),
    [
        (torch.bfloat16, "tl.float32", "tl.int32"),
        (torch.float64, "tl.float64", "tl.int64"),
        (torch.int64, "tl.int64", "tl.int64"),
        (torch.int16, "tl.int16", "tl.int16"),
        (torch.bool, "tl.int8", "tl.int8"),
    ],
)
def test_values_move_as_bits_of_their_width(dtype: torch.dtype, carried: str, bits: str) -> None:
    source = _render(lambda x: torch.sort(x, 1, descending=True), randn(4, 16).to(dtype)).source
    assert f".to({carried}), [XBLOCK, RBLOCK])" in source
    assert f"rnumel, 4, True, {bits})" in source


def test_rows_longer_than_a_block_are_refused() -> None:
    (kernel,) = fused_kernels(lambda x: torch.sort(x, 1), randn(2, MAX_SORT_LENGTH + 1))
    with pytest.raises(UnsupportedKernelError, match="at most 1024"):
        render_kernel(kernel)


def test_members_sorting_different_rows_are_refused() -> None:
    (kernel,) = fused_kernels(lambda x: torch.sort(x, 1), randn(4, 8))
    values, indices = kernel.members
    assert indices.sort is not None
    flipped = replace(indices, sort=replace(indices.sort, descending=True))
    with pytest.raises(UnsupportedKernelError, match="different rows"):
        render_kernel(replace(kernel, members=(values, flipped)))


def test_rendered_sorts_are_valid_python() -> None:
    for fn in (lambda x: torch.sort(x, 0), lambda x: torch.topk(x, 2, 1), torch.msort):
        compile(_render(fn, randn(40, 30)).source, "<sort>", "exec")
