"""Inputs whose storage offset (or strides) differ from the ones a graph was compiled
for are read correctly: Dynamo does not guard storage offsets, and AOTAutograd hands
the backward what the forward returned."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import ember.runtime  # noqa: F401  (registers the backend)
from ember.runtime.layouts import InputLayout, guard_layouts
from ember.runtime.testing import no_eager_fallback


def test_views_at_other_offsets_are_read_where_they_are() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda t: t * 2 + 1, backend="ember")
    base = torch.randn(4, 8)
    with no_eager_fallback():
        for row in (1, 2, 0):  # compiled for offset 8, then called at 16 and 0
            torch.testing.assert_close(f(base[row]), base[row] * 2 + 1)
        fresh = torch.randn(8)
        torch.testing.assert_close(f(fresh), fresh * 2 + 1)


def test_an_input_written_in_place_is_written_where_it_is() -> None:
    def bump(t: torch.Tensor) -> torch.Tensor:
        t.add_(1)
        return t.sum()

    torch._dynamo.reset()
    f = torch.compile(bump, backend="ember")
    base = torch.zeros(3, 4)
    with no_eager_fallback():
        f(base[1])
        f(base[2])
        f(base[2])
    torch.testing.assert_close(base, torch.tensor([[0.0] * 4, [1.0] * 4, [2.0] * 4]))


def test_saved_views_reach_the_backward_at_the_offset_it_assumes() -> None:
    """The forward returns `x[1]` (saved for the backward) in a buffer of its own; the
    backward was traced with the view's storage offset (found in review: the gradient
    read uninitialised memory)."""

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = torch.zeros(8, 8)
        b = torch.zeros(8, 8)
        a[0] = x[0] * w[0]
        b[1] = x[1] * w[1]
        return (a + b).sum() + (a * b).sum()

    torch.manual_seed(0)
    x0, w0 = torch.randn(16, 8), torch.randn(8)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    f(x, w).backward()
    expected = (x.grad, w.grad)
    torch._dynamo.reset()
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    with no_eager_fallback() as graphs:
        torch.compile(f, backend="ember")(x, w).backward()
    assert any(g.graph.startswith("backward") for g in graphs)
    for ours, eager in zip((x.grad, w.grad), expected, strict=True):
        torch.testing.assert_close(ours, eager)


def test_the_guard_copies_only_mismatched_inputs() -> None:
    seen: list[tuple[int, tuple[int, ...]]] = []

    def call(args: list[torch.Tensor]) -> None:
        seen.extend((a.storage_offset(), a.stride()) for a in args)

    layouts = [InputLayout(0, (2, 3), (3, 1), 0, False), InputLayout(1, (2, 3), (1, 2), 5, False)]
    guarded = guard_layouts(call, layouts, "g")
    ok = torch.randn(2, 3)
    odd = torch.randn(2, 3)
    guarded([ok, odd])
    assert seen == [(0, (3, 1)), (5, (1, 2))]
    assert guard_layouts(call, [], "g") is call


def test_broadcast_layouts_and_size_one_dimensions() -> None:
    """An input traced as an expand (stride 0) but passed materialised is handed over
    with stride 0 again (BERT's backward, a saved expand of the token-type ids); the
    stride of a size-1 dimension is never compared."""
    got: list[torch.Tensor] = []
    guarded = guard_layouts(
        lambda args: got.extend(args),
        [InputLayout(0, (2, 3), (0, 1), 0, False), InputLayout(1, (1, 3), (3, 1), 0, False)],
        "g",
    )
    row = torch.randn(3)
    materialised, single = row.expand(2, 3).contiguous(), torch.randn(3, 1).t()
    guarded([materialised, single])
    assert got[0].stride() == (0, 1)
    torch.testing.assert_close(got[0], materialised)
    assert got[1] is single  # stride (1, 1) against (3, 1): only the size-1 dim differs


def test_parameters_are_checked_until_one_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A static input (a parameter) is checked at the first call and skipped while
    it stays where it was; one at a new address is checked again (and copied when it
    does not conform); a plain input is checked at every call."""
    from ember.runtime import layouts as module

    checked: list[int] = []
    real = module._conform

    def counting(args: list[Any], index: int, *rest: Any) -> None:
        checked.append(index)
        real(args, index, *rest)

    monkeypatch.setattr(module, "_conform", counting)
    got: list[torch.Tensor] = []
    layouts = [InputLayout(0, (2, 3), (3, 1), 0, False), InputLayout(1, (2, 3), (3, 1), 0, False)]
    guarded = guard_layouts(lambda args: got.extend(args), layouts, "g", static_inputs=[0])
    weight, x = torch.randn(2, 3), torch.randn(2, 3)
    for _ in range(3):
        guarded([weight, x])
    assert checked == [0, 1, 1, 1]
    moved = torch.randn(3, 2).t()  # new storage, and strides (1, 2): copied
    got.clear()
    guarded([moved, x])
    assert checked[4:] == [0, 1]
    assert got[0].stride() == (3, 1)
    torch.testing.assert_close(got[0], moved)
    guarded([moved, x])  # did not conform: checked again
    assert checked[6:] == [0, 1]
