"""Long scans in segments (ember.ir.scan._segmented): each segment's total, the totals
before each segment, each segment scanned, then combined. CUDA takes this path for a
long row with few beside it; here the CPU is routed through it too, so the C++
codegen renders the same loops and the values are checked against eager. On CUDA,
scans carried in float32 (float32, bfloat16) take one look-back kernel instead
(ember.codegen.triton.lookback); integer ones keep the segments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import ember.runtime  # noqa: F401  # registers backend="ember"
from ember.ir import scan as ir_scan
from ember.runtime.accuracy import compare_outputs
from ember.runtime.compiler import compile_records
from ember.runtime.config import config

CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], torch.Tensor]] = {
    # 32771 is prime: no segment length divides it, the last segment is partial
    "cumsum_row": (lambda x: x.cumsum(0), torch.randn(32771)),
    "cumsum_rows_dim1": (lambda x: x.cumsum(1), torch.randn(3, 32771)),
    "cumsum_columns": (lambda x: x.cumsum(0), torch.randn(32771, 2)),
    "cumsum_int64": (lambda x: x.cumsum(0), torch.randint(-5, 5, (32771,))),
    "cumsum_bfloat16": (lambda x: x.cumsum(0), torch.randn(32771).bfloat16()),
    "cumprod_row": (lambda x: x.cumprod(0), 1 + torch.randn(32771) * 1e-3),
    # 40960 = 20 segments of 2048, 40000 = 20 of 2000: segments scanned into the result
    "cumsum_divided_row": (lambda x: x.cumsum(0), torch.randn(40960)),
    "cumsum_divided_rows_dim1": (lambda x: x.cumsum(1), torch.randn(3, 40000)),
    "cumsum_divided_bfloat16": (lambda x: x.cumsum(0), torch.randn(40960).bfloat16()),
    "cumsum_divided_middle": (lambda x: x.cumsum(1), torch.randn(2, 40960, 3)),
    "cumsum_divided_int32": (
        lambda x: x.cumsum(0),
        torch.randint(-9, 9, (36864,), dtype=torch.int32),
    ),
    "cumprod_divided_row": (lambda x: x.cumprod(-1), 1 + torch.randn(2, 32768) * 1e-3),
}


def _segment_kernels(case: str) -> int:
    """Totals, their scan and the segments scanned into the result; a fourth kernel
    combines them when no segment length divides the row."""
    return 3 if "divided" in case else 4


def test_segment_lengths() -> None:
    assert ir_scan.segment_length(1 << 20) == (2048, True)
    assert ir_scan.segment_length(40000) == (2000, True)
    assert ir_scan.segment_length(9 * 1024) == (1024, True)  # whole blocks before 2304
    assert ir_scan.segment_length(3 * 1111) == (3333, True)
    assert ir_scan.segment_length(32771) == (ir_scan.SEGMENT, False)  # a prime


def _compiled(fn: Callable[..., Any], x: torch.Tensor) -> tuple[torch.Tensor, int]:
    torch._dynamo.reset()
    first = len(compile_records)
    with config.scope(strict=True):
        got = torch.compile(fn, backend="ember")(x)
    return got, sum(r.kernels for r in compile_records[first:])


@pytest.mark.parametrize("case", sorted(CASES))
def test_segmented_scans_match_eager(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ir_scan, "SEGMENTED_DEVICES", ("cpu", "cuda"))
    fn, x = CASES[case]
    got, kernels = _compiled(fn, x)
    assert kernels == _segment_kernels(case), "not split into segments as planned"
    want = fn(x)
    reference = fn(x.double()) if x.is_floating_point() else None
    verdict = compare_outputs(got, want, reference=reference)
    assert verdict is None, verdict[0].describe() if verdict else ""


def test_short_rows_and_many_rows_stay_one_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ir_scan, "SEGMENTED_DEVICES", ("cpu", "cuda"))
    for x in (torch.randn(1000), torch.randn(64, 40000)):  # short; many rows
        got, kernels = _compiled(lambda t: t.cumsum(-1), x)
        assert kernels == 1
        torch.testing.assert_close(got, x.cumsum(-1), rtol=1e-4, atol=1e-3)


@pytest.mark.cuda
@pytest.mark.parametrize("case", sorted(CASES))
def test_segmented_scans_on_gpu(case: str) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    fn, x = CASES[case]
    x = x.cuda()
    got, kernels = _compiled(fn, x)
    assert kernels == (1 if x.is_floating_point() else _segment_kernels(case))
    reference = fn(x.double()) if x.is_floating_point() else None
    verdict = compare_outputs(got, fn(x), reference=reference)
    assert verdict is None, verdict[0].describe() if verdict else ""
