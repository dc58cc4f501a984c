"""Rendering of scan kernels: the plan (persistent or looped, row or column configs),
`tl.associative_scan` with the kind's combine, the carry of a looped scan, and one
pair scan for cummax's values and indices."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from triton_cases import fused_kernels, randn

from ember.codegen.triton import UnsupportedKernelError, render_kernel
from ember.codegen.triton.plan import LOOPED_SCAN, PERSISTENT_SCAN


def _render(fn: object, *args: torch.Tensor, **options: object) -> object:
    (kernel,) = fused_kernels(fn, *args)
    assert kernel.is_scan
    return render_kernel(kernel, **options)  # type: ignore[arg-type]


def test_short_rows_scan_in_registers_at_once() -> None:
    rendered = _render(lambda x: x.cumsum(1), randn(64, 300))
    assert rendered.kind == PERSISTENT_SCAN
    assert "tl.cumsum(a1_x, 1)" in rendered.source and "for roffset" not in rendered.source
    assert all(c.block("RBLOCK") == 512 for c in rendered.configs)
    assert rendered.grid.describe() == "cdiv(64, XBLOCK)"


def test_long_rows_loop_and_carry_the_running_value() -> None:
    rendered = _render(lambda x: x.cumsum(1), randn(4, 100000))
    assert rendered.kind == LOOPED_SCAN
    source = rendered.source
    carry = "a1_carry = tl.full([XBLOCK, 1], 0, tl.float64)"
    assert carry in source and source.index(carry) < source.index("for roffset in range")
    assert "a1_scan = a1_carry + a1_scan" in source
    assert "a1_carry = a1_carry + tl.sum(a1_x, 1)[:, None]" in source
    assert rendered.configs[0].block("XBLOCK") == 1


def test_column_scans_tile_many_outer_points() -> None:
    rendered = _render(lambda x: x.cumsum(0), randn(3000, 256))
    assert rendered.kind == LOOPED_SCAN
    assert rendered.configs[0].block("XBLOCK") == 64


def test_cummax_scans_value_index_pairs_once_for_both_results() -> None:
    rendered = _render(lambda x: torch.cummax(x, 1), randn(8, 5000))
    source = rendered.source
    assert source.count("tl.associative_scan(") == 1
    assert "def ember_cummax_combine(a, a_index, b, b_index):" in source
    assert "tl.reduce((a1_x, a1_i), 1, ember_cummax_combine)" in source  # the carry
    stores = [line for line in source.splitlines() if "tl.store" in line]
    assert len(stores) == 2 and "a1_v.to(tl.float32)" in stores[0] and "a1_k" in stores[1]


def test_logcumsumexp_uses_its_combine_and_libdevice() -> None:
    rendered = _render(lambda x: torch.logcumsumexp(x, 1), randn(8, 64))
    assert "tl.associative_scan(a1_x, 1, ember_logaddexp_combine)" in rendered.source
    assert "from triton.language.extra import libdevice" in rendered.source
    assert 'tl.where(xmask & rmask, t1, float("-inf"))' in rendered.source


def test_looped_form_can_be_forced() -> None:
    rendered = _render(lambda x: x.cumprod(1), randn(4, 64), reduction="looped")
    assert rendered.kind == LOOPED_SCAN
    assert "a1_carry = a1_carry * tl.reduce(a1_x, 1, ember_prod_combine)[:, None]" in (
        rendered.source
    )


def test_rendered_scans_are_valid_python() -> None:
    for fn in (lambda x: x.cumsum(0), lambda x: torch.cummin(x, 1), lambda x: (x > 0).cumsum(1)):
        compile(_render(fn, randn(40, 3000)).source, "<scan>", "exec")


def test_an_unknown_scan_is_refused_with_its_kernel() -> None:
    (kernel,) = fused_kernels(lambda x: x.cumsum(1), randn(4, 8))
    bad = replace(kernel, members=(replace(kernel.members[0], scan="median"),))
    with pytest.raises(UnsupportedKernelError, match="scan 'median'"):
        render_kernel(bad)
