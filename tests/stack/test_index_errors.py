"""End-to-end: a model whose inputs hold a bad index or an integer zero divisor raises
what eager raises, in the forward and in the backward, and never takes the process
down; with good inputs (negative indices where eager wraps them) it matches eager."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from ember.ir import IndexOutOfBounds
from ember.runtime import compile_records, config


class TokenScorer(nn.Module):
    """Embeds tokens, gathers one score per position, and writes the scores into a
    sparse per-class table (embedding, gather, index_put in one graph)."""

    def __init__(self, vocab: int = 50, dim: int = 16, classes: int = 8) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.proj(self.embed(tokens)).log_softmax(-1)
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        table = torch.zeros(logits.shape[-1]).index_put((labels[:, -1],), picked[:, -1], True)
        return picked.sum() + table.sum()


def _compiled(model: nn.Module) -> nn.Module:
    return torch.compile(model, backend="ember")  # type: ignore[return-value]


def test_good_indices_match_eager_with_gradients() -> None:
    model = TokenScorer()
    tokens, labels = torch.randint(0, 50, (4, 6)), torch.randint(0, 8, (4, 6))
    labels[0, 0] = 7
    expected = model(tokens, labels)
    expected.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    with config.scope(strict=True):
        actual = _compiled(model)(tokens, labels)
        actual.backward()
    torch.testing.assert_close(actual, expected)
    for p, g in zip((p for p in model.parameters() if p.grad is not None), grads, strict=True):
        torch.testing.assert_close(p.grad, g)
    assert any(r.fused_kernels for r in compile_records)


@pytest.mark.parametrize("bad", ["token", "label", "negative_label"])
def test_bad_index_raises_like_eager(bad: str) -> None:
    model = TokenScorer()
    tokens, labels = torch.randint(0, 50, (4, 6)), torch.randint(0, 8, (4, 6))
    with config.scope(strict=True):
        compiled = _compiled(model)
        compiled(tokens, labels)  # compiles with good inputs
        if bad == "token":
            tokens[2, 3] = 50
        elif bad == "label":
            labels[1, 2] = 8
        else:
            labels[1, 2] = -1  # gather does not wrap negative indices
        with pytest.raises((IndexError, RuntimeError)):
            model(tokens, labels)
        with pytest.raises(IndexOutOfBounds, match="is out of bounds for dimension"):
            compiled(tokens, labels)


def test_training_step_with_a_bad_index_raises() -> None:
    """Forward and backward (the backward scatters gradients at the token ids) run
    with good ids; a bad id raises in the forward, before any gradient is written."""
    weight = torch.randn(10, 3, requires_grad=True)

    def step(ids: torch.Tensor) -> torch.Tensor:
        return (torch.nn.functional.embedding(ids, weight) * 2).sum()

    with config.scope(strict=True):
        compiled = torch.compile(step, backend="ember")
        compiled(torch.tensor([1, 9, 9])).backward()
        expected = torch.zeros(10, 3)
        expected[1], expected[9] = 2.0, 4.0
        torch.testing.assert_close(weight.grad, expected)
        with pytest.raises(IndexOutOfBounds):
            compiled(torch.tensor([1, 10, 9])).backward()
        torch.testing.assert_close(weight.grad, expected)


def test_integer_division_by_zero_raises() -> None:
    def bucket(x: torch.Tensor, width: torch.Tensor) -> torch.Tensor:
        return (x // width) * width + x % width

    with config.scope(strict=True):
        compiled = torch.compile(bucket, backend="ember")
        x = torch.arange(-5, 5)
        torch.testing.assert_close(
            compiled(x, torch.full((10,), 3)), bucket(x, torch.full((10,), 3))
        )
        width = torch.full((10,), 3)
        width[4] = 0
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            bucket(x, width)
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            compiled(x, width)


def test_a_bad_index_does_not_kill_the_process(tmp_path: Path) -> None:
    """Before, this model's compiled forward corrupted the heap (exit 134) or
    segfaulted: a child process runs it so a crash fails the test, not pytest."""
    root = Path(__file__).parent
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(root)!r})
        import torch
        import ember.runtime
        from ember.runtime import config
        from test_index_errors import TokenScorer

        torch.manual_seed(0)
        model = TokenScorer()
        tokens, labels = torch.randint(0, 50, (4, 6)), torch.randint(0, 8, (4, 6))
        with config.scope(strict=True, cache_dir={str(tmp_path)!r}):
            compiled = torch.compile(model, backend="ember")
            compiled(tokens, labels)
            labels[3, -1] = 2**40
            try:
                compiled(tokens, labels)
                print("no error")
            except RuntimeError as error:
                print("raised", type(error).__name__)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    assert "raised IndexOutOfBounds" in done.stdout, done.stdout
