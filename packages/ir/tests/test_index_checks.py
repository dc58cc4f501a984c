"""Index checks in the IR: every data-dependent index is a `CheckIndex` node that the
reference interpreter raises on, with eager's range per op (negative indices wrap for
index and index_put only), and integer division by zero raises as eager's does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ir_helpers import check, lower

from ember.ir import CheckIndex, IndexOutOfBounds, format_program, run_program, walk
from ember.ir.nodes import ComputedBuffer
from ember.ir.program import Program


def _checks(program: Program) -> list[CheckIndex]:
    found: list[CheckIndex] = []
    for item in program.nodes:
        if isinstance(item, ComputedBuffer):
            from ember.ir.loops import loop_bodies

            for root in loop_bodies(item.loop):
                found += [n for n in walk(root) if isinstance(n, CheckIndex)]
    return found


W = torch.arange(40.0).view(10, 4)
X = torch.arange(10.0)

# (name, function, args with a bad index, eager's exception type)
BAD: list[tuple[str, Callable[..., Any], tuple[Any, ...], type[Exception]]] = [
    ("embedding", lambda i, w: F.embedding(i, w) * 2, (torch.tensor([1, 2, 10]), W), IndexError),
    ("embedding_negative", lambda i, w: F.embedding(i, w), (torch.tensor([-1]), W), IndexError),
    ("gather", lambda x, i: torch.gather(x, 0, i) + 1, (X, torch.tensor([3, 10])), RuntimeError),
    ("gather_negative", lambda x, i: torch.gather(x, 0, i), (X, torch.tensor([-1])), RuntimeError),
    ("index_select", lambda x, i: x.index_select(0, i), (X, torch.tensor([12])), IndexError),
    ("index", lambda x, i: x[i] + 1, (X, torch.tensor([0, -11])), IndexError),
    (
        "index_put",
        lambda x, i: x.index_put((i,), torch.tensor([1.0])),
        (X, torch.tensor([10])),
        IndexError,
    ),
    (
        "index_put_huge",
        lambda x, i: x.index_put((i,), torch.tensor([1.0]), accumulate=True),
        (X, torch.tensor([2**40])),
        IndexError,
    ),
    (
        "scatter",
        lambda x, i: x.scatter(0, i, torch.tensor([5.0])),
        (X, torch.tensor([-1])),
        RuntimeError,
    ),
    (
        "scatter_add",
        lambda x, i: x.scatter_add(0, i, torch.tensor([5.0])),
        (X, torch.tensor([10])),
        RuntimeError,
    ),
    (
        "scatter_reduce",
        lambda x, i: x.scatter_reduce(0, i, torch.tensor([5.0]), "amax"),
        (X, torch.tensor([11])),
        RuntimeError,
    ),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_out_of_range_index_raises_like_eager(case: Any) -> None:
    _name, fn, args, eager_error = case
    with pytest.raises(eager_error):
        fn(*args)
    program = lower(fn, *args, mode="fake")  # a real trace would run the bad index
    assert _checks(program), format_program(program)
    with pytest.raises(IndexOutOfBounds, match="out of bounds for dimension 0") as info:
        run_program(program, list(args), seed=0)
    # catchable as what eager raises, and naming the op and its graph node
    assert isinstance(info.value, eager_error)
    assert "aten." in str(info.value) and "graph node" in str(info.value)


def test_in_range_and_wrapping_indices_match_eager() -> None:
    i = torch.tensor([0, 9, 3, 3])
    check(lambda i, w: F.embedding(i, w) * 2, i, W)
    check(lambda x, i: (x[i], x[-i - 1]), X, i)
    check(lambda x, i: x.index_put((i - 10,), torch.ones(4), accumulate=True), X, i)
    check(lambda x, i: torch.gather(x, 0, i) + x.index_select(0, i), X, i)
    check(lambda x, i: x.scatter_add(0, i, torch.ones(4)), X, i)


def test_message_names_the_index_and_size() -> None:
    program = lower(lambda i, w: F.embedding(i, w), torch.tensor([1, 2, 10]), W, mode="fake")
    with pytest.raises(IndexOutOfBounds) as info:
        run_program(program, [torch.tensor([1, 2, 10]), W], seed=0)
    assert (info.value.index, info.value.size) == (10, 10)
    assert "index 10 is out of bounds for dimension 0 with size 10" in str(info.value)
    assert "aten.embedding" in str(info.value)


def test_checks_can_be_turned_off() -> None:
    program = lower(lambda i, w: F.embedding(i, w), torch.tensor([1]), W, index_checks=False)
    assert not _checks(program)


def test_a_masked_piece_does_not_check_lanes_outside_it() -> None:
    # cat reads `ids - 1` only inside its piece; outside, the masked read gives 0 and
    # the index -1, which must not raise
    def fn(ids: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.embedding(ids - 1, w), y]) * 2

    check(fn, torch.tensor([1, 10]), W, torch.randn(3, 4))
    bad = (torch.tensor([0, 1]), W, torch.randn(3, 4))  # ids - 1 = -1 inside the piece
    with pytest.raises(IndexOutOfBounds):
        run_program(lower(fn, *bad, mode="fake"), list(bad), seed=0)


def test_integer_division_by_zero_raises_like_eager() -> None:
    a, b = torch.tensor([5, -7]), torch.tensor([2, 0])
    for fn in (
        lambda a, b: a // b,
        lambda a, b: torch.div(a, b, rounding_mode="trunc"),
        lambda a, b: torch.remainder(a, b),
        lambda a, b: torch.fmod(a, b),
    ):
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(a, b)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            run_program(lower(fn, a, b, mode="fake"), [a, b], seed=0)
