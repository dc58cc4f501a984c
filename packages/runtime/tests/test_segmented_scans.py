"""Long scans in segments (ember.ir.scan._segmented): each segment's total, the totals
before each segment, each segment scanned, then combined. CUDA takes this path for a
long row with few beside it; here the CPU is routed through it too, so the C++
codegen renders the same loops and the values are checked against eager."""

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
    # 40000 is no multiple of the segment: the last one is partial
    "cumsum_row": (lambda x: x.cumsum(0), torch.randn(40000)),
    "cumsum_rows_dim1": (lambda x: x.cumsum(1), torch.randn(3, 40000)),
    "cumsum_columns": (lambda x: x.cumsum(0), torch.randn(40000, 2)),
    "cumsum_int64": (lambda x: x.cumsum(0), torch.randint(-5, 5, (40000,))),
    "cumsum_bfloat16": (lambda x: x.cumsum(0), torch.randn(40000).bfloat16()),
    "cumprod_row": (lambda x: x.cumprod(0), 1 + torch.randn(40000) * 1e-3),
}


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
    assert kernels >= 3, "not split into segments"  # totals, their scan, the pieces
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
    assert kernels >= 3
    reference = fn(x.double()) if x.is_floating_point() else None
    verdict = compare_outputs(got, fn(x), reference=reference)
    assert verdict is None, verdict[0].describe() if verdict else ""
