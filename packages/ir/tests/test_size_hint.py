"""The one size guess (`ember.ir.SIZE_HINT`): what a size symbol counts as in every
heuristic of the stack, and the stride order of lowering's non-overlap proof, which
no guess can make pass for an overlapping layout."""

from __future__ import annotations

import sympy
import torch

from ember.ir import SIZE_HINT, Layout, size_hint
from ember.ir.lowering import non_overlapping

s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)


def test_every_size_symbol_counts_as_the_one_guess() -> None:
    assert size_hint(sympy.Integer(7)) == 7
    assert size_hint(2 * s0 + 1) == 2 * SIZE_HINT + 1
    assert size_hint(s0 * s1) == SIZE_HINT**2


def _layout(size: tuple[sympy.Expr, ...], stride: tuple[sympy.Expr, ...]) -> Layout:
    return Layout(torch.device("cpu"), torch.float32, size, stride)


def test_the_non_overlap_proof_holds_for_every_size_not_only_the_guess() -> None:
    n = sympy.Integer(SIZE_HINT)
    # dense and transposed layouts of symbolic sizes: proven
    assert non_overlapping(_layout((s0, s1), (s1, sympy.Integer(1))))
    assert non_overlapping(_layout((s0, s1), (sympy.Integer(1), s0)))
    # a row stride of exactly the guess's width: dense only where s1 <= SIZE_HINT
    # (at the guess itself the rows just touch), so not proven for every size
    assert not non_overlapping(_layout((s0, s1), (n, sympy.Integer(1))))
    assert non_overlapping(_layout((s0, n), (n, sympy.Integer(1))))
