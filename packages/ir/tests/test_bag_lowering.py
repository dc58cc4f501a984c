"""embedding_bag lowered (ember.ir.bags) and run by the interpreter against eager: all
four outputs of `_embedding_bag` and `_embedding_bag_forward_only` in every mode, with
padding, per-sample weights, empty bags and `include_last_offset`; eager's rule for
NaN and ties in max mode; the work linear in the positions; and eager's errors for bad
indices and offsets."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ir_helpers import check, computed, lower

from ember.ir import IndexOutOfBounds, Reduction, Scan, Scatter, run_program

aten = torch.ops.aten
G = torch.Generator().manual_seed(0)
TABLE = torch.randn(6, 3, generator=G)
INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 0])
WEIGHTS = torch.randn(8, generator=G)
# (offsets, include_last_offset): an empty bag inside, an empty bag at the end (its
# offset is N), and the last offset closing the last bag at N
OFFSETS = [([0, 2, 2, 5], False), ([0, 2, 2, 5, 8], True), ([0, 8], False), ([0, 3, 8], True)]


def _bag_op(op: Any, mode: int, last: bool, padding: int, weighted: bool) -> Any:
    if weighted:
        return lambda w, i, o, p: op(w, i, o, False, mode, False, p, last, padding)
    return lambda w, i, o: op(w, i, o, False, mode, False, None, last, padding)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["sum", "mean", "max"])
def test_every_output_matches_eager(mode: int, dtype: torch.dtype) -> None:
    """result, offset2bag (empty for the CPU's plain float sum), bag_size (0 for a sum;
    one per offset for the forward-only op) and max_indices (the maximum's row; a
    copy of bag_size outside max mode), with and without a padding row."""
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    table = TABLE.to(dtype)
    forms = itertools.product(
        (aten._embedding_bag.default, aten._embedding_bag_forward_only.default),
        OFFSETS,
        (-1, 4),
        (False, True) if mode == 0 else (False,),
    )
    for op, (offsets, last), padding, weighted in forms:
        fn = _bag_op(op, mode, last, padding, weighted)
        args = [table, INDICES, torch.tensor(offsets)] + ([WEIGHTS.to(dtype)] if weighted else [])
        check(fn, *args, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_functional_forms_match_eager(mode: str) -> None:
    """2-d indices (fixed-size bags: offsets from an arange), int32 indices and
    offsets, a padding row given from the end, and no positions at all."""
    w = torch.randn(10, 4, generator=G)
    ids = torch.randint(0, 10, (3, 4), generator=G)
    check(lambda w, i: F.embedding_bag(i, w, mode=mode, padding_idx=-2), w, ids)
    offsets = torch.tensor([0, 5, 5], dtype=torch.int32)
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), w, ids.view(-1).int(), offsets)
    empty = torch.zeros(0, dtype=torch.int64)
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), w, empty, torch.zeros(2).long())


NAN_TABLE = torch.tensor(
    [
        [1.0, float("nan"), 0.0],
        [2.0, 5.0, float("-inf")],
        [2.0, float("nan"), float("-inf")],
        [-1.0, 7.0, float("-inf")],
    ]
)
NAN_IDS = torch.tensor([1, 2, 0, 3, 2, 1, 0, 2])  # bags [1, 2, 0], [3, 2, 1], [0, 2]
NAN_OFFSETS = torch.tensor([0, 3, 6])


@pytest.mark.parametrize("padding", [None, 3])
def test_max_matches_eager_with_nan_and_ties(padding: int | None) -> None:
    check(
        lambda w, i, o: F.embedding_bag(i, w, o, mode="max", padding_idx=padding),
        NAN_TABLE,
        NAN_IDS,
        NAN_OFFSETS,
    )


def test_max_follows_eager_for_nan_and_ties() -> None:
    """Eager keeps a bag's first value, then takes each strictly greater one: a NaN
    that comes first wins, a later NaN is passed over, ties go to the first row, and
    a bag of -inf after a padding position picks its first non-padding row."""
    bag = aten._embedding_bag.default
    fn = lambda w, i, o: bag(w, i, o, False, 2, False, None, False, 3)  # noqa: E731
    args = [NAN_TABLE, NAN_IDS, NAN_OFFSETS]
    result, _, _, rows = run_program(lower(fn, *args), args, seed=0)
    assert result[0, 1] == 5.0 and rows[0, 1] == 1  # NaNs after the first value
    assert result[0, 0] == 2.0 and rows[0, 0] == 1  # a tie: the first row
    assert torch.isnan(result[1, 1]) and rows[1, 1] == 2  # the first non-padding is NaN
    assert result[1, 2] == float("-inf") and rows[1, 2] == 2
    assert torch.isnan(result[2, 1]) and rows[2, 1] == 0


N, BAGS, WIDTH = 40, 7, 5
LINEAR_ARGS = (
    torch.randn(11, WIDTH, generator=G),
    torch.randint(0, 11, (N,), generator=G),
    torch.tensor([0, 3, 9, 9, 20, 31, 38]),
)


def test_a_sum_is_three_passes_over_the_positions() -> None:
    """The positions are counted into bags once (a scatter of the offsets, a scan over
    the N positions), then the rows are scattered into their bags: no reduction."""
    program = check(lambda w, i, o: F.embedding_bag(i, w, o, mode="sum"), *LINEAR_ARGS)
    loops = [b.loop for b in computed(program)]
    assert not any(isinstance(loop, Reduction) for loop in loops)
    (counted,) = [loop for loop in loops if isinstance(loop, Scan)]
    assert counted.length == N
    scatters = sorted(loop.ranges for loop in loops if isinstance(loop, Scatter))
    assert scatters == [(BAGS,), (N, WIDTH)]


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_work_is_linear_in_the_positions(mode: str) -> None:
    """No loop runs over bags x positions (280 here, more than positions x columns)."""
    program = check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), *LINEAR_ARGS)
    for loop in (b.loop for b in computed(program)):
        extents = list(loop.ranges)
        if isinstance(loop, Reduction):
            extents += loop.reduction_ranges
        if isinstance(loop, Scan):
            extents.append(loop.length)
        assert math.prod(int(e) for e in extents) <= N * WIDTH + 1, loop


BAD = [
    ("index", torch.tensor([1, 2, 6, 0]), torch.tensor([0, 2])),
    ("negative_index", torch.tensor([1, -1]), torch.tensor([0, 1])),
    ("first_offset", torch.tensor([1, 2, 3]), torch.tensor([1, 2])),
    ("offset_past_the_end", torch.tensor([1, 2, 3]), torch.tensor([0, 4])),
    ("negative_offset", torch.tensor([1, 2, 3]), torch.tensor([0, -1])),
]


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_indices_and_offsets_raise_like_eager(case: Any, mode: str) -> None:
    _name, ids, offsets = case

    def fn(w: torch.Tensor, i: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return F.embedding_bag(i, w, o, mode=mode, padding_idx=1)

    with pytest.raises((RuntimeError, IndexError)):
        fn(TABLE, ids, offsets)
    program = lower(fn, TABLE, ids, offsets, mode="fake")  # a real trace would run them
    with pytest.raises(IndexOutOfBounds, match=r"aten\._embedding_bag"):
        run_program(program, [TABLE, ids, offsets], seed=0)
