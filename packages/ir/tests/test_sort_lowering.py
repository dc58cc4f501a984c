"""sort, argsort, msort and topk lowered to `Sort` nodes, checked against eager through
the interpreter, and the node's invariants (verifier, printer, device limits)."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import sympy
import torch
from ir_helpers import check, computed, lower  # type: ignore[import-not-found]  # tests/ on sys.path

from ember.ir import ComputedBuffer, ExternKernel, Sort, VerificationError, format_program, verify

NAN, INF = float("nan"), float("inf")


def _sorts(program: object) -> list[Sort]:
    return [b.loop for b in computed(program) if isinstance(b.loop, Sort)]


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_sort_matches_eager_along_every_dim(dim: int) -> None:
    x = torch.randn(3, 5, 4)
    program = check(lambda x: (torch.sort(x, dim), torch.sort(x * 2 + 1, dim, descending=True)), x)
    sorts = _sorts(program)
    assert [(s.descending, s.indices) for s in sorts] == [
        (False, False), (False, True), (True, False), (True, True)
    ]  # fmt: skip
    assert all(s.axis == dim % 3 and s.count == s.length == x.shape[dim] for s in sorts)
    # the producer (x * 2 + 1) is inlined: nothing stored but the four sort results
    assert len(computed(program)) == 4


def test_stable_sort_keeps_ties_in_input_order_both_ways() -> None:
    x = torch.randint(0, 4, (6, 200)).float()
    x[0, ::3] = -0.0
    x[1, 1::3] = 0.0
    check(
        lambda x: (
            torch.sort(x, dim=1, stable=True),
            torch.sort(x, dim=1, descending=True, stable=True),
            torch.sort(x, dim=0, stable=True),
        ),
        x,
    )


def test_nan_sorts_as_the_largest_value() -> None:
    x = torch.tensor(
        [
            [0.0, -0.0, NAN, 1.0, -NAN, -INF, INF, 0.0],
            [NAN, NAN, NAN, 2.0, -INF, -INF, NAN, 3.0],
        ]
    )
    check(
        lambda x: (
            torch.sort(x, dim=1, stable=True),
            torch.sort(x, dim=1, descending=True, stable=True),
        ),
        x,
    )
    # topk picks among equal values as it likes: one NaN, the rest distinct
    y = torch.tensor([[3.0, NAN, 1.0, -INF, 2.0, INF], [NAN, -1.0, 0.5, 7.0, -INF, 0.0]])
    check(lambda y: (torch.topk(y, 3, 1), torch.topk(y, 3, 1, largest=False)), y)


def test_unstable_sort_is_a_valid_order_with_eagers_values() -> None:
    """Eager's CPU sort orders ties arbitrarily past a few dozen elements: compare the
    values, and check the indices are a permutation that gathers them."""
    x = torch.randint(0, 5, (4, 300)).float()
    program = lower(lambda x: torch.sort(x, 1, descending=True), x)
    from ember.ir import run_program

    values, indices = run_program(program, [x])
    expected = torch.sort(x, 1, descending=True)
    assert torch.equal(values, expected.values)
    assert torch.equal(indices.sort(1).values, torch.arange(300).expand(4, 300))
    assert torch.equal(x.gather(1, indices), values)
    # the order is the stable one
    assert torch.equal(indices, torch.sort(x, dim=1, descending=True, stable=True).indices)


def test_argsort_and_msort_are_sorts() -> None:
    x = torch.randn(7, 9)
    program = check(lambda x: (torch.argsort(x, dim=1, stable=True), torch.msort(x)), x)
    assert {(s.axis, s.indices) for s in _sorts(program)} >= {(1, True), (0, False)}


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [0, 1])
def test_topk_keeps_the_first_k_of_the_order(largest: bool, dim: int) -> None:
    x = torch.randn(12, 10)  # distinct values: indices are eager's
    program = check(lambda x: torch.topk(x, 3, dim, largest=largest), x)
    sorts = _sorts(program)
    assert all(s.count == 3 and s.descending == largest for s in sorts)
    assert "first 3" in format_program(program)
    check(lambda x: torch.topk(x, 1, dim, largest=largest, sorted=False).values, x)


def test_topk_with_ties_takes_the_earliest_positions() -> None:
    x = torch.tensor([1.0, 2.0, 2.0, 2.0, 1.0, 3.0, 3.0])
    program = lower(lambda x: torch.topk(x, 4), x)
    from ember.ir import run_program

    values, indices = run_program(program, [x])
    assert values.tolist() == [3.0, 3.0, 2.0, 2.0]
    assert indices.tolist() == [5, 6, 1, 2]  # eager's CPU kernel gives [6, 5, 3, 2]


@pytest.mark.parametrize(
    "dtype", [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.float64]
)
def test_integer_bool_and_double_sorts(dtype: torch.dtype) -> None:
    x = torch.randint(-50, 50, (5, 40)).to(dtype)
    check(lambda x: (torch.sort(x, dim=1, stable=True), torch.sort(x, dim=0, stable=True)), x)
    if dtype != torch.bool:
        check(lambda x: torch.topk(x, 4, 1), torch.randperm(200).view(5, 40).to(dtype))


def test_half_types_sort_exactly() -> None:
    x = torch.randn(4, 64).to(torch.bfloat16)
    program = check(lambda x: torch.sort(x, dim=1, stable=True), x, rtol=0, atol=0)
    assert {b.layout.dtype for b in computed(program)} == {torch.bfloat16, torch.int64}
    check(lambda x: torch.topk(x, 5, 0), torch.randn(64, 3).to(torch.float16), rtol=0, atol=0)


def test_non_contiguous_inputs() -> None:
    base = torch.randn(6, 8, 5)
    check(lambda x: torch.sort(x.transpose(0, 2), dim=1, stable=True), base)
    check(lambda x: torch.topk(x[:, ::2, 1:], 2, 1), base)
    check(lambda x: torch.sort(x.expand(3, 4, 5), dim=0, stable=True), torch.randn(4, 1))


def test_empty_and_size_one_dims() -> None:
    check(lambda x: (torch.sort(x, 1), torch.topk(x, 0, 1)), torch.randn(3, 0))
    check(lambda x: (torch.sort(x, 0), torch.topk(x, 2, 1)), torch.randn(0, 4))
    check(lambda x: (torch.sort(x, 1), torch.topk(x, 1, 2)), torch.randn(1, 1, 7))


def test_zero_dim_inputs_are_the_element_itself() -> None:
    program = check(lambda x: (torch.sort(x), torch.topk(x, 1)), torch.tensor(2.5))
    assert not _sorts(program)


def test_symbolic_sizes() -> None:
    program = check(
        lambda x: (torch.sort(x, 1), torch.topk(x, 2, 0)), torch.randn(5, 7), mode="symbolic"
    )
    assert any(s.length.free_symbols for s in _sorts(program))


def test_rows_longer_than_a_devices_limit_stay_aten_calls(caplog: pytest.LogCaptureFixture) -> None:
    limits = (("cpu", 64),)
    with caplog.at_level(logging.INFO, logger="ember.ir"):
        program = lower(lambda x: torch.sort(x, 1), torch.randn(4, 100), sort_limits=limits)
    (extern,) = [n for n in program.nodes if isinstance(n, ExternKernel)]
    assert not extern.fallback and extern.op is torch.ops.aten.sort.default
    assert not _sorts(program)
    assert "longer than the 64" in caplog.text
    short = lower(lambda x: torch.topk(x, 3, 1), torch.randn(4, 64), sort_limits=limits)
    assert len(_sorts(short)) == 2
    other = lower(lambda x: torch.sort(x, 1), torch.randn(4, 100), sort_limits=(("cuda", 64),))
    assert len(_sorts(other)) == 2
    symbolic = lower(lambda x: torch.sort(x, 1), torch.randn(4, 9), mode="symbolic",
                     sort_limits=limits)  # fmt: skip
    assert not _sorts(symbolic)
    with caplog.at_level(logging.INFO, logger="ember.ir"):
        off = lower(lambda x: torch.topk(x, 2, 1), torch.randn(4, 3), sort_limits=(("cpu", 0),))
    assert not _sorts(off)  # a limit of 0: the device's sort kernels are off
    assert "ember's cpu sort kernels are off" in caplog.text


def test_verifier_rejects_a_malformed_sort() -> None:
    program = lower(lambda x: torch.topk(x, 2, 1), torch.randn(2, 3))
    values, indices = computed(program)

    def broken(buffer: ComputedBuffer, **changes: object) -> None:
        assert isinstance(buffer.loop, Sort)
        loop = replace(buffer.loop, **changes)
        nodes = [replace(n, loop=loop) if n is buffer else n for n in program.nodes]
        with pytest.raises(VerificationError):
            verify(replace(program, nodes=nodes))

    broken(values, axis=3)
    broken(values, count=sympy.Integer(3))  # the layout holds 2 along the axis
    broken(indices, dtype=torch.float32)
    broken(values, indices=True)  # indices are int64, the layout float32
