"""Cumulative ops end to end on the CPU: torch.compile(backend="ember") against eager,
with strict mode and fallbacks off (`EMBER_STRICT=1`, `EMBER_FALLBACK=0`), so a scan
that failed to lower, generate or compile raises instead of running eagerly.

Covers cumsum, cumprod, logcumsumexp, cummax and cummin along every dim, integer and
bool promotion, half types, non-contiguous inputs, empty dims, NaN and ties, symbolic
sizes, training (their backward graphs hold scans too) and position ids the way
Hugging Face models compute them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import assert_compiled_by_ember

from ember.runtime import compile_records, config

NAN, INF = float("nan"), float("inf")


def _check(
    fn: Callable[..., Any],
    *args: torch.Tensor,
    dynamic: bool = False,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    exact: bool = False,
) -> list[Any]:
    """Compile `fn`, compare with eager (bit for bit when `exact`), and return the
    records of the graphs it compiled."""
    start = len(compile_records)
    compiled = torch.compile(fn, backend="ember", dynamic=dynamic)
    with config.scope(strict=True, fallback=False):
        actual = compiled(*args)
    expected = fn(*args)
    tolerance = {"rtol": 0.0, "atol": 0.0} if exact else {"rtol": rtol, "atol": atol}
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance)  # type: ignore[arg-type]
    assert_compiled_by_ember(start)
    records = compile_records[start:]
    assert all(r.kernel_fallback is None and not r.fallback_ops for r in records)
    return records


def _scan_kernels(records: list[Any]) -> int:
    """Generated scan kernels in the graphs' wrappers (named `k<n>_scan_...`)."""
    text = "".join(r.wrapper_path.read_text() for r in records)
    return len(set(word for word in text.replace("(", " ").split() if "_scan_" in word))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.bool])
def test_cumulative_ops_along_every_dim(dim: int, dtype: torch.dtype) -> None:
    x = (torch.randn(6, 33, 5) * 3).to(dtype)

    def fn(x: torch.Tensor) -> Any:
        return x.cumsum(dim), torch.cummax(x, dim), torch.cummin(x, dim), x.cumprod(dim)

    records = _check(fn, x, rtol=1e-5 if dtype == torch.float32 else 1e-7)
    assert _scan_kernels(records) >= 1


def test_float32_cumsum_is_bit_for_bit_eagers() -> None:
    """Eager's CPU cumsum carries float32 in float64; so do ember's kernels."""
    _check(lambda x: x.cumsum(0), torch.randn(1 << 20), exact=True)
    _check(lambda x: x.cumsum(1), torch.randn(64, 4096), exact=True)
    _check(lambda x: x.cumsum(0), torch.randn(4096, 64), exact=True)


def test_integer_cumsum_promotes_to_int64() -> None:
    x = torch.randint(-100, 100, (16, 300), dtype=torch.int8)
    (record,) = _check(lambda x: (x.cumsum(1), (x > 0).cumsum(0), x.cumprod(1)), x)
    assert record.fused_kernels >= 1


def test_half_types() -> None:
    x = torch.randn(8, 500)
    for dtype in (torch.bfloat16, torch.float16):
        _check(
            lambda x: (x.cumsum(1), torch.logcumsumexp(x, 1), torch.cummax(x, 0)),
            x.to(dtype),
            rtol=1e-2,
            atol=1e-2,
        )


def test_non_contiguous_inputs() -> None:
    base = torch.randn(40, 30, 20)
    _check(lambda x: x.transpose(0, 2).cumsum(1), base)
    _check(lambda x: torch.cummax(x[::2, 5:, ::3], 1), base)
    _check(lambda x: torch.logcumsumexp(x.permute(2, 0, 1), 2), base)
    _check(lambda x: x.expand(4, 30, 20).cumprod(0), torch.randn(1, 30, 20))


def test_empty_dims() -> None:
    _check(lambda x: (x.cumsum(1), torch.cummax(x, 1), torch.logcumsumexp(x, 0)), torch.randn(5, 0))
    _check(lambda x: (x.cumsum(0), torch.cummin(x, 1)), torch.randn(0, 7))


def test_nan_and_ties_follow_eager() -> None:
    x = torch.randint(0, 3, (20, 300)).float()
    x[2, 10] = x[2, 200] = x[7, 0] = NAN
    x[3] = -INF
    x[4, ::2] = -0.0
    _check(lambda x: (torch.cummax(x, 1), torch.cummin(x, 1), torch.cummax(x, 0)), x)
    y = torch.randn(6, 200) * 40
    y[0, :5] = -INF
    y[1, 3] = y[1, 9] = INF
    y[2, 100] = NAN
    y[3] = -INF
    _check(lambda y: (torch.logcumsumexp(y, 1), torch.logcumsumexp(y, 0)), y)


def test_symbolic_sizes() -> None:
    fn = torch.compile(
        lambda x: (x.cumsum(1) * 2, torch.cummax(x, 0)), backend="ember", dynamic=True
    )
    start = len(compile_records)
    with config.scope(strict=True, fallback=False):
        for shape in ((3, 50), (7, 2000), (2, 3)):  # size 1 would recompile
            x = torch.randn(shape)
            torch.testing.assert_close(fn(x), (x.cumsum(1) * 2, torch.cummax(x, 0)))
    assert_compiled_by_ember(start)
    assert len(compile_records) - start == 1  # one graph for all the sizes


def test_position_ids_as_hugging_face_computes_them() -> None:
    """`(mask.cumsum(1) * mask) - 1 + padding_idx`, RoBERTa's and OPT's position ids."""

    def positions(mask: torch.Tensor) -> torch.Tensor:
        return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1

    mask = torch.ones(4, 128, dtype=torch.int64)
    mask[1, :20] = 0
    mask[3, 100:] = 0
    records = _check(positions, mask)
    assert _scan_kernels(records) == 1


def test_training_through_a_cumsum() -> None:
    """cumsum's backward is a flipped cumsum: both graphs hold scans."""
    x = torch.randn(8, 64, requires_grad=True)
    twin = x.detach().clone().requires_grad_(True)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (x.cumsum(1).tanh() * torch.logcumsumexp(x, 1)).sum()

    start = len(compile_records)
    compiled = torch.compile(fn, backend="ember")
    with config.scope(strict=True, fallback=False):
        compiled(twin).backward()
    fn(x).backward()
    torch.testing.assert_close(twin.grad, x.grad, rtol=1e-4, atol=1e-5)
    assert_compiled_by_ember(start, backward=True)
