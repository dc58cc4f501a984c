"""Lowerings of index_reduce, scatter_reduce's mean, put, masked_scatter,
as_strided_scatter, frexp and _trilinear (bilinear), run by the reference interpreter
against eager: duplicate indices, include_self on and off, 0-d and empty inputs,
bfloat16, and eager's errors for bad indices. (Max pooling's backward, once a
scatter-add here, is a gather: test_max_pooling.py.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ir_helpers import check, computed, lower

from ember.ir import ExternKernel, IndexOutOfBounds, Reduction, Scatter, run_program

aten = torch.ops.aten
G = torch.Generator().manual_seed(0)
X = torch.randn(5, 3, generator=G)
SRC = torch.randn(6, 3, generator=G)
DUPS = torch.tensor([0, 4, 4, 1, 0, 4])  # rows 0 and 4 take several, 2 and 3 none


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_with_duplicates_matches_eager(reduce: str, include_self: bool) -> None:
    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x.index_reduce(0, i, s, reduce, include_self=include_self)

    program = check(fn, X, DUPS, SRC)
    assert any(isinstance(n.loop, Scatter) for n in computed(program))
    check(lambda x, i, s: x.index_reduce(1, i, s, reduce), X, torch.tensor([2, 2]), SRC[:5, :2])


def test_index_reduce_edge_cases() -> None:
    zero_d = torch.tensor(2.5)
    check(lambda x, i, s: x.index_reduce(0, i, s, "mean"), zero_d, torch.tensor([0]), zero_d * 3)
    empty = torch.zeros(0, dtype=torch.int64)
    check(lambda x, i, s: x.index_reduce(0, i, s, "amax"), X, empty, SRC[:0])
    ints = torch.arange(15).view(5, 3)
    check(lambda x, i, s: x.index_reduce(0, i, s, "mean", include_self=False), ints, DUPS,
          torch.arange(18).view(6, 3) * 7)  # fmt: skip  # floor division, as eager
    half = X.bfloat16(), SRC.bfloat16()
    check(lambda x, i, s: x.index_reduce(0, i, s, "mean"), half[0], DUPS, half[1],
          rtol=1e-2, atol=1e-2)  # fmt: skip


@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_mean_matches_eager(include_self: bool) -> None:
    index = torch.tensor([[0, 1, 0], [4, 4, 0], [4, 1, 1]])

    def fn(x: torch.Tensor, i: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x.scatter_reduce(0, i, s, "mean", include_self=include_self)

    check(fn, X, index, SRC)
    check(fn, torch.arange(15).view(5, 3), index, torch.arange(18).view(6, 3) * 5)
    check(fn, X.bfloat16(), index, SRC.bfloat16(), rtol=1e-2, atol=1e-2)


def test_put_matches_eager() -> None:
    index = torch.tensor([[0, -1], [7, 14]])  # negative counts from the end
    source = torch.tensor([1.0, 2.0, 3.0, 4.0])  # any shape of as many elements
    check(lambda x, i, s: x.put(i, s), X, index, source)
    dups = torch.tensor([3, 3, -12, 0, 3])
    check(lambda x, i, s: x.put(i, s, accumulate=True), X, dups, torch.arange(5.0))
    check(lambda x, i, s: x.put(i, s, accumulate=True), X.bfloat16(), dups,
          torch.arange(5.0).bfloat16(), rtol=1e-2, atol=1e-2)  # fmt: skip
    check(lambda x, i, s: x.put(i, s), torch.tensor(1.5), torch.tensor([-1]), torch.tensor([7.0]))
    check(lambda x, i, s: x.put(i, s), X, torch.zeros(0, dtype=torch.int64), torch.zeros(0))
    check(lambda x, i, s: x.t().put(i, s) * 2, X, index, source)  # a transposed destination


def test_masked_scatter_matches_eager() -> None:
    mask = torch.rand(5, 3, generator=G) > 0.5
    source = torch.arange(20.0).view(4, 5)
    check(lambda x, m, s: x.masked_scatter(m, s), X, mask, source)
    check(lambda x, m, s: x.masked_scatter(m, s), X, mask[0], source)  # broadcast mask
    check(lambda x, m, s: x.t().masked_scatter(m.t(), s.t()), X, mask, source)
    check(lambda x, m, s: x.masked_scatter(m, s), X.bfloat16(), mask, source.bfloat16())
    check(lambda x, m, s: x.masked_scatter(m, s), X[:0], mask[:0], source)


def test_masked_scatter_with_too_small_a_source_raises() -> None:
    def fn(x: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x.masked_scatter(m, s)

    args = (X, torch.ones(5, 3, dtype=torch.bool), torch.arange(4.0))
    with pytest.raises(RuntimeError):
        fn(*args)
    with pytest.raises(IndexOutOfBounds):
        run_program(lower(fn, *args, mode="fake"), list(args), seed=0)


def test_as_strided_scatter_matches_eager() -> None:
    base = torch.randn(4, 6, generator=G)
    check(lambda x, s: x.as_strided_scatter(s, (2, 3), (6, 2), 1), base, torch.randn(2, 3))
    check(lambda x, s: x.t().as_strided_scatter(s, (3,), (5,)), base, torch.randn(3))
    check(lambda x, s: x.as_strided_scatter(s, (0, 3), (6, 1)), base, torch.randn(0, 3))


BAD: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
    ("index_reduce", lambda x, i, s: x.index_reduce(0, i, s, "amax"),
     (X, torch.tensor([0, 5]), SRC[:2])),
    ("index_reduce_negative", lambda x, i, s: x.index_reduce(0, i, s, "prod"),
     (X, torch.tensor([-1]), SRC[:1])),
    ("put", lambda x, i, s: x.put(i, s), (X, torch.tensor([0, 15]), torch.ones(2))),
    ("put_negative", lambda x, i, s: x.put(i, s, accumulate=True),
     (X, torch.tensor([-16]), torch.ones(1))),
    ("scatter_mean", lambda x, i, s: x.scatter_reduce(0, i, s, "mean"),
     (X, torch.tensor([[5]]), SRC[:1, :1])),
]  # fmt: skip


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_out_of_range_indices_raise_like_eager(case: Any) -> None:
    _name, fn, args = case
    with pytest.raises((IndexError, RuntimeError)):
        fn(*args)
    program = lower(fn, *args, mode="fake")  # a real trace would run the bad index
    with pytest.raises(IndexOutOfBounds):
        run_program(program, list(args), seed=0)


def test_frexp_matches_eager_on_edge_values() -> None:
    values = [0.0, -0.0, 1.0, 0.5, -3.0, 2.0**127, 3.4e38, 1e-45, 1.2e-38, 0.99999994, 1e-8]
    values += [float("inf"), float("-inf"), float("nan"), 7.0, -1024.0, 1023.9999]
    x = torch.tensor(values)
    check(lambda x: torch.frexp(x), x, rtol=0, atol=0)
    check(lambda x: torch.frexp(x), x.double() * 1e-300, rtol=0, atol=0)  # subnormal doubles
    check(lambda x: torch.frexp(x), x.bfloat16(), rtol=0, atol=0)
    powers = torch.tensor([2.0**k for k in range(-149, 128)])  # log2 is exact or one off
    check(lambda x: torch.frexp(x * 0.999999), powers, rtol=0, atol=0)
    check(lambda x: torch.frexp(x), powers, rtol=0, atol=0)


def test_bilinear_is_one_reduction_and_matches_eager() -> None:
    a, b = torch.randn(4, 3, generator=G), torch.randn(4, 5, generator=G)
    w, bias = torch.randn(2, 3, 5, generator=G), torch.randn(2, generator=G)
    program = check(lambda a, b, w, c: F.bilinear(a, b, w, c), a, b, w, bias)
    assert not any(isinstance(n, ExternKernel) for n in program.nodes)
    assert sum(isinstance(n.loop, Reduction) for n in computed(program)) == 1
    check(lambda a, b, w: F.bilinear(a, b, w), a[:0], b[:0], w)
    check(lambda a, b, w: F.bilinear(a, b, w), a.bfloat16(), b.bfloat16(), w.bfloat16(),
          rtol=2e-2, atol=2e-2)  # fmt: skip
