"""Sorting ops end to end on the CPU: torch.compile(backend="ember") against eager, with
strict mode and fallbacks off (`EMBER_STRICT=1`, `EMBER_FALLBACK=0`), so a sort that
failed to lower, generate or compile raises instead of running eagerly.

Covers sort (stable and not, both directions), argsort, msort and topk along every dim,
float32, float64, bfloat16, integer and bool inputs, NaN, signed zeros and ties,
non-contiguous inputs, empty dims, symbolic sizes and training through a topk. A stable
sort matches eager bit for bit; an unstable one gives eager's values and a permutation
that gathers them (eager's own order of ties is arbitrary); topk matches eager where
values are distinct (with ties ember takes the earliest positions)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from helpers import assert_compiled_by_ember

from ember.runtime import compile_records, config

NAN, INF = float("nan"), float("inf")


def _compile(fn: Callable[..., Any], *args: torch.Tensor, dynamic: bool = False) -> Any:
    start = len(compile_records)
    compiled = torch.compile(fn, backend="ember", dynamic=dynamic)
    with config.scope(strict=True, fallback=False):
        actual = compiled(*args)
    assert_compiled_by_ember(start)
    records = compile_records[start:]
    assert all(r.kernel_fallback is None and not r.fallback_ops for r in records)
    text = "".join(r.wrapper_path.read_text() for r in records)
    assert "_sort_" in text, "no sort kernel was generated"
    return actual


def _exact(fn: Callable[..., Any], *args: torch.Tensor, dynamic: bool = False) -> None:
    actual = _compile(fn, *args, dynamic=dynamic)
    torch.testing.assert_close(actual, fn(*args), rtol=0, atol=0, equal_nan=True)


def _stable(dim: int, descending: bool = False) -> Callable[[torch.Tensor], Any]:
    return lambda x: torch.sort(x, dim=dim, descending=descending, stable=True)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool]
)
def test_stable_sort_along_every_dim_is_eagers(dim: int, dtype: torch.dtype) -> None:
    x = (torch.randn(6, 33, 5) * 3).to(dtype)
    _exact(lambda x: (_stable(dim)(x), _stable(dim, True)(x)), x)


def test_unstable_sort_gives_eagers_values_and_a_valid_permutation() -> None:
    x = torch.randint(0, 5, (8, 500)).float()
    for descending in (False, True):
        values, indices = _compile(lambda x, d=descending: torch.sort(x, 1, descending=d), x)
        expected = torch.sort(x, 1, descending=descending)
        assert torch.equal(values, expected.values)
        assert torch.equal(indices.sort(1).values, torch.arange(500).expand(8, 500))
        assert torch.equal(x.gather(1, indices), values)


def test_argsort_and_msort() -> None:
    x = torch.randn(40, 70)
    _exact(lambda x: (torch.argsort(x, dim=0, stable=True), torch.msort(x)), x)
    _exact(lambda x: torch.argsort(x, dim=1, descending=True, stable=True), x)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_topk_matches_eager_on_distinct_values(largest: bool, dim: int) -> None:
    x = (torch.randperm(40 * 90).float() / 7).view(40, 90)
    _exact(lambda x: torch.topk(x, 5, dim, largest=largest), x)
    _exact(lambda x: torch.topk(x * 2 - 1, 1, dim, largest=largest, sorted=False), x)
    _exact(lambda x: torch.topk((x * 7).round().long(), 9, dim, largest=largest), x)


def test_topk_with_ties_takes_the_earliest_positions() -> None:
    x = torch.tensor([[1.0, 2.0, 2.0, 2.0, 1.0, 3.0, 3.0]])
    values, indices = _compile(lambda x: torch.topk(x, 4, 1), x)
    assert values.tolist() == [[3.0, 3.0, 2.0, 2.0]] and indices.tolist() == [[5, 6, 1, 2]]


def test_nan_signed_zeros_and_ties_follow_eager() -> None:
    x = torch.randint(0, 3, (20, 300)).float()
    x[2, 10] = x[2, 200] = x[7, 0] = NAN
    x[3] = -INF
    x[4, ::2] = -0.0
    x[5, ::3] = -NAN
    x[6, 1::2] = INF
    _exact(lambda x: (_stable(1)(x), _stable(1, True)(x), _stable(0)(x)), x)
    values = _compile(lambda x: _stable(1)(x).values, x)
    assert torch.equal(values.signbit(), torch.sort(x, dim=1, stable=True).values.signbit())
    y = torch.tensor([[3.0, NAN, 1.0, -INF, 2.0, INF, -0.5]])
    _exact(lambda y: (torch.topk(y, 3, 1), torch.topk(y, 3, 1, largest=False)), y)


def test_non_contiguous_inputs() -> None:
    base = torch.randn(40, 30, 20)
    _exact(lambda x: _stable(1)(x.transpose(0, 2)), base)
    _exact(lambda x: _stable(0, True)(x[::2, 5:, ::3]), base)
    _exact(
        lambda x: torch.topk(x.permute(2, 0, 1), 4, 2),
        (torch.randperm(24000).float()).view(40, 30, 20),
    )
    _exact(lambda x: _stable(0)(x.expand(4, 30, 20)), torch.randn(1, 30, 20))


def test_fused_producers_and_consumers() -> None:
    """The producer is inlined into the sort's body (ember's exp may differ from
    eager's in the last bit, hence the tolerance)."""
    x = torch.randn(64, 128)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return _stable(1)((x * 2).exp()).values.cumsum(1)[:, -1]

    torch.testing.assert_close(_compile(fn, x), fn(x), rtol=1e-6, atol=0)


def test_empty_dims() -> None:
    _exact(lambda x: (torch.sort(x, 1), torch.topk(x, 0, 1)), torch.randn(5, 0))
    _exact(lambda x: (_stable(0)(x), torch.topk(x, 3, 1)), torch.randn(0, 7))


def test_long_rows() -> None:
    x = torch.randn(3, 100_000)
    _exact(lambda x: _stable(1)(x), x)
    y = torch.randperm(300_000).float().view(3, 100_000)
    _exact(lambda y: torch.topk(y, 50, 1), y)


def test_symbolic_sizes() -> None:
    fn = torch.compile(
        lambda x: (_stable(1)(x), torch.topk(x, 2, 0)), backend="ember", dynamic=True
    )
    start = len(compile_records)
    with config.scope(strict=True, fallback=False):
        for shape in ((3, 50), (7, 2000), (2, 3)):
            x = (torch.randperm(shape[0] * shape[1]).float()).view(shape)
            torch.testing.assert_close(fn(x), (_stable(1)(x), torch.topk(x, 2, 0)), rtol=0, atol=0)
    assert_compiled_by_ember(start)
    assert len(compile_records) - start == 1  # one graph for all the sizes


def test_training_through_topk_and_sort() -> None:
    x = torch.randn(8, 64, requires_grad=True)
    twin = x.detach().clone().requires_grad_(True)

    def fn(x: torch.Tensor) -> torch.Tensor:
        top = torch.topk(x, 5, 1).values
        return top.tanh().sum() + torch.sort(x * 3, 0).values[:2].square().sum()

    start = len(compile_records)
    compiled = torch.compile(fn, backend="ember")
    with config.scope(strict=True, fallback=False):
        compiled(twin).backward()
    fn(x).backward()
    torch.testing.assert_close(twin.grad, x.grad, rtol=1e-5, atol=1e-6)
    assert_compiled_by_ember(start, backward=True)
