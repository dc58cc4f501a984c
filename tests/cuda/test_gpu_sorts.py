"""Sorting ops end to end on a CUDA GPU, strict and with fallbacks off: sorts stay
declared ATen calls with the reason logged (ember's Triton sort kernels order NaNs
with the sign bit set otherwise than eager's CUDA sort; see
`ember.runtime.kernels.sort_limits`), so the values are eager's bit for bit.
Run on the GPU machine with `python3 -m pytest -m cuda` (see README)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import assert_compiled_by_ember

from ember.runtime import compile_records, config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
DEVICE = "cuda"
NAN, INF = float("nan"), float("inf")


def _run(fn: Callable[..., Any], *args: torch.Tensor) -> tuple[Any, list[str]]:
    start = len(compile_records)
    compiled = torch.compile(fn, backend="ember")
    with config.scope(strict=True, fallback=False):
        actual = compiled(*args)
    assert_compiled_by_ember(start)
    records = compile_records[start:]
    assert all(r.kernel_fallback is None and not r.fallback_ops for r in records)
    # each kernel's kind: the word after its number (`k3_sort_...` is a sort kernel)
    kinds = [n.split("_")[1] for r in records for n in r.artifact.launchers]
    return actual, kinds


def _stable(dim: int, descending: bool = False) -> Callable[[torch.Tensor], Any]:
    return lambda x: torch.sort(x, dim=dim, descending=descending, stable=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_short_rows_stay_aten_calls_with_eager_values(dtype: torch.dtype) -> None:
    x = (torch.randn(64, 1000, device=DEVICE) * 4).to(dtype)

    def fn(x: torch.Tensor) -> Any:
        return _stable(1)(x), _stable(0, True)(x[:300])

    actual, kinds = _run(fn, x)
    torch.testing.assert_close(actual, fn(x), rtol=0, atol=0)
    assert "sort" not in kinds


def test_nan_ties_and_topk() -> None:
    x = torch.randint(0, 3, (20, 300), device=DEVICE).float()
    x[2, 10] = x[2, 200] = NAN
    x[4, ::2] = -0.0
    x[5, 1::2] = INF

    def fn(x: torch.Tensor) -> Any:
        return _stable(1)(x), _stable(1, True)(x)

    actual, _ = _run(fn, x)
    torch.testing.assert_close(actual, fn(x), rtol=0, atol=0, equal_nan=True)
    y = (torch.randperm(64 * 500, device=DEVICE).float() / 3).view(64, 500)
    actual, kinds = _run(lambda y: (torch.topk(y, 8, 1), torch.topk(y, 3, 0, largest=False)), y)
    torch.testing.assert_close(actual, (torch.topk(y, 8, 1), torch.topk(y, 3, 0, largest=False)))
    assert "sort" not in kinds


def test_long_rows_stay_aten_calls_with_a_reason(caplog: pytest.LogCaptureFixture) -> None:
    from ember.ir import lowering as ir_lowering

    x = torch.randn(8, 5003, device=DEVICE)
    ir_lowering._fallbacks_logged.clear()  # each reason is logged once per process
    logger = logging.getLogger("ember.ir")  # the 'ember' logger does not propagate
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="ember.ir"):
            actual, kinds = _run(lambda x: _stable(1)(x * 2), x)
    finally:
        logger.removeHandler(caplog.handler)
    torch.testing.assert_close(actual, _stable(1)(x * 2), rtol=0, atol=0)
    assert "sort" not in kinds
    assert "ember's cuda sort kernels are off" in caplog.text
