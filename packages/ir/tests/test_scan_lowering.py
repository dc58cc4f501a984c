"""Cumulative ops lowered to `Scan` nodes, checked against eager through the interpreter,
and the node's invariants (verifier, printer, linear body)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import sympy
import torch
from ir_helpers import check, computed, lower  # type: ignore[import-not-found]  # tests/ on sys.path

from ember.ir import (
    ComputedBuffer,
    Reduction,
    Scan,
    VerificationError,
    format_program,
    verify,
)
from ember.ir.scan import carried_dtype

NAN, INF = float("nan"), float("inf")


def _scans(program: object) -> list[Scan]:
    return [b.loop for b in computed(program) if isinstance(b.loop, Scan)]


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_cumsum_and_cumprod_match_eager_along_every_dim(dim: int) -> None:
    x = torch.randn(3, 5, 4)
    program = check(lambda x: (x.cumsum(dim), (x * 0.5 + 1).cumprod(dim)), x)
    scans = _scans(program)
    assert [s.kind for s in scans] == ["sum", "prod"]
    assert all(s.axis == dim % 3 and s.length == x.shape[dim] for s in scans)
    # the product's producer (x * 0.5 + 1) is inlined: one buffer per scan, nothing else
    assert len(computed(program)) == 2


def test_a_scan_is_linear_not_a_reduction_over_a_prefix() -> None:
    program = lower(lambda x: x.cumsum(1), torch.randn(4, 1000))
    (buffer,) = computed(program)
    assert isinstance(buffer.loop, Scan) and not isinstance(buffer.loop, Reduction)
    assert buffer.loop.ranges == (sympy.Integer(4),)
    assert buffer.loop.length == 1000
    assert "scan sum [4] along [1000] at dim 1 (float64)" in format_program(program)


@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool, torch.float64]
)
def test_integer_and_bool_scans_promote_like_eager(dtype: torch.dtype) -> None:
    x = torch.randint(-3, 4, (4, 6)).to(dtype)
    program = check(lambda x: (x.cumsum(1), x.cumprod(0), torch.cummax(x, 1), x.cummin(0)), x)
    sums = [s for s in _scans(program) if s.kind == "sum"]
    assert sums[0].body.dtype == (torch.float64 if dtype == torch.float64 else torch.int64)


def test_cumsum_with_dtype_converts_before_accumulating() -> None:
    x = torch.randn(3, 300) * 100
    check(lambda x: x.cumsum(1, dtype=torch.float16), x, rtol=1e-3, atol=1e-2)
    check(lambda x: x.to(torch.int32).cumsum(1, dtype=torch.float64), x)
    check(lambda x: (x > 0).cumsum(0, dtype=torch.int32), x)


def test_half_types_accumulate_in_float32() -> None:
    x = torch.randn(4, 64).to(torch.bfloat16)
    program = check(lambda x: (x.cumsum(1), torch.logcumsumexp(x, 1)), x)
    assert {s.body.dtype for s in _scans(program)} == {torch.float32}
    assert {b.layout.dtype for b in computed(program)} == {torch.bfloat16}


def test_float32_accumulates_as_eager_does_on_each_device() -> None:
    assert carried_dtype(torch.float32, torch.device("cpu")) == torch.float64
    assert carried_dtype(torch.float32, torch.device("cuda")) == torch.float32
    assert carried_dtype(torch.float16, torch.device("cpu")) == torch.float32
    assert carried_dtype(torch.bool, torch.device("cpu")) == torch.int64
    # a long float32 cumsum matches eager's float64 running sum exactly
    x = torch.randn(20000)
    check(lambda x: x.cumsum(0), x, rtol=0, atol=0)


def test_cummax_and_cummin_follow_eagers_tie_and_nan_rules() -> None:
    x = torch.tensor(
        [
            [1.0, 3.0, 3.0, 2.0, NAN, 5.0, NAN, 1.0, 3.0],
            [-0.0, 0.0, -0.0, -INF, -INF, 2.0, 2.0, INF, INF],
            [NAN, 1.0, 0.0, NAN, -1.0, -1.0, 4.0, 4.0, 0.0],
        ]
    )
    program = check(lambda x: (torch.cummax(x, 1), torch.cummin(x, 1), x.cummax(0)), x)
    kinds = [s.kind for s in _scans(program)]
    assert kinds == ["max", "argmax", "min", "argmin", "max", "argmax"]
    ints = torch.tensor([[2, 1, 1, 2, 2, 0], [0, 0, 0, 0, 0, 0]])
    check(lambda x: (torch.cummax(x, 1), torch.cummin(x, 1)), ints)
    check(lambda x: (torch.cummax(x, 1), torch.cummin(x, 0)), ints > 0)


def test_logcumsumexp_matches_eager_with_infinities_and_nan() -> None:
    x = torch.tensor(
        [
            [-INF, -INF, 2.0, INF, 1.0, INF],
            [1.0, NAN, 2.0, 3.0, -INF, 0.0],
            [INF, -INF, 0.0, 1e30, -1e30, 5.0],
            [-INF, -INF, -INF, -INF, -INF, -INF],
        ]
    )
    check(lambda x: (torch.logcumsumexp(x, 1), torch.logcumsumexp(x, 0)), x)
    check(lambda x: torch.logcumsumexp(x, 1), torch.randn(5, 700, dtype=torch.float64))


def test_non_contiguous_and_strided_inputs() -> None:
    base = torch.randn(6, 8, 5)
    check(lambda x: x.transpose(0, 2).cumsum(1), base)
    check(lambda x: torch.cummax(x[:, ::2, 1:], 2), base)
    check(lambda x: x.permute(2, 0, 1)[1:].cumprod(0), base)
    check(lambda x: torch.cummin(x.expand(3, 4, 5), 0), torch.randn(4, 1))


def test_empty_and_size_one_dims() -> None:
    check(lambda x: (x.cumsum(1), torch.cummax(x, 1), torch.logcumsumexp(x, 0)), torch.randn(3, 0))
    check(lambda x: (x.cumsum(0), torch.cummin(x, 1)), torch.randn(0, 4))
    check(lambda x: (x.cumsum(1), torch.cummax(x, 0), x.cumprod(2)), torch.randn(1, 1, 7))


def test_zero_dim_inputs_are_the_element_itself() -> None:
    x = torch.tensor(-2.5)
    program = check(
        lambda x: (x.cumsum(0), x.cumprod(-1), torch.cummax(x, 0), torch.logcumsumexp(x, 0)), x
    )
    assert not _scans(program)


def test_symbolic_sizes() -> None:
    program = check(lambda x: (x.cumsum(1), torch.cummax(x, 0)), torch.randn(5, 7), mode="symbolic")
    assert any(s.length.free_symbols for s in _scans(program))


def test_verifier_rejects_a_malformed_scan() -> None:
    program = lower(lambda x: torch.cummax(x, 1), torch.randn(2, 3))
    values, indices = computed(program)

    def broken(buffer: ComputedBuffer, **changes: object) -> None:
        assert isinstance(buffer.loop, Scan)
        loop = replace(buffer.loop, **changes)
        nodes = [replace(n, loop=loop) if n is buffer else n for n in program.nodes]
        with pytest.raises(VerificationError):
            verify(replace(program, nodes=nodes))

    broken(values, kind="cumulative")
    broken(values, axis=3)
    broken(values, length=sympy.Integer(4))  # the layout holds 3 along the axis
    with pytest.raises(VerificationError):
        loop = replace(indices.loop, dtype=torch.int32)
        layout = replace(indices.layout, dtype=torch.int32)
        nodes = [replace(n, loop=loop, layout=layout) if n is indices else n for n in program.nodes]
        verify(replace(program, nodes=nodes))
