"""Comparison helpers: run a model eagerly and through ember, compare everything."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from ember.runtime import compile_records, config
from ember.runtime.testing import assert_no_eager_fallback


def compiled_copy(model: nn.Module, **kwargs: Any) -> tuple[nn.Module, Callable[..., Any]]:
    twin = copy.deepcopy(model)
    return twin, torch.compile(twin, backend="ember", **kwargs)


def check_inference(
    model: nn.Module, inputs: Sequence[Any], *, rtol: float = 1e-5, atol: float = 1e-5
) -> None:
    model.eval()
    twin, compiled = compiled_copy(model)
    twin.eval()
    start = len(compile_records)
    with torch.no_grad():
        expected = model(*inputs)
        actual = compiled(*inputs)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    assert_compiled_by_ember(start)


def check_training(
    model: nn.Module,
    inputs: Sequence[Any],
    *,
    loss: Callable[[Any], torch.Tensor] | None = None,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    steps: int = 2,
) -> None:
    """Forward + backward, twice (so running statistics and state updates compound):
    outputs, every gradient and every buffer must match eager."""
    model.train()
    twin, compiled = compiled_copy(model)
    twin.train()
    loss_fn = loss or (lambda out: out.float().square().mean())
    start = len(compile_records)
    for _ in range(steps):
        for m in (model, twin):
            m.zero_grad(set_to_none=True)
        expected = model(*inputs)
        actual = compiled(*inputs)
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
        loss_fn(expected).backward()
        loss_fn(actual).backward()
        for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(q.grad, p.grad, rtol=rtol, atol=atol, msg=f"grad {name}")
        for (name, b), c in zip(model.named_buffers(), twin.buffers(), strict=True):
            torch.testing.assert_close(c, b, rtol=rtol, atol=atol, msg=f"buffer {name}")
    assert_compiled_by_ember(start, backward=True)


def assert_compiled_by_ember(start: int, *, backward: bool = False) -> None:
    """The graphs went through ember's pipeline (not an eager fallback)."""
    records = compile_records[start:]
    assert_no_eager_fallback(records)
    assert all(r.wrapper_path is not None and r.wrapper_path.exists() for r in records)
    if backward:
        assert any(r.graph.startswith("backward") for r in records)


class LastHiddenState(nn.Module):
    """A `transformers` model as a tensor -> tensor module (its last hidden state)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(input_ids=ids).last_hidden_state
        return out


def gpt2(transformers: Any, *, vocab: int, width: int) -> nn.Module:
    """A 2-layer GPT-2 with random weights and no dropout, built from a config."""
    config = transformers.GPT2Config(
        vocab_size=vocab, n_embd=width, n_layer=2, n_head=4, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip
    return LastHiddenState(transformers.GPT2Model(config))


def train_batch_norm_with_dynamic_batch(device: str, batches: tuple[int, ...]) -> None:
    """A conv + batch norm block trained with `dynamic=True` over several batch sizes,
    compiled once, against eager: outputs, every gradient, the running statistics.
    Batch norm's unbiased variance scales by `n / (n - 1)` and its backward by `1 / n`,
    with `n` symbolic: both were held as integers (truncated to 1 and 0), and the C++
    codegen could not print the true divisions at all."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()
    ).to(device)
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin, backend="ember", dynamic=True)
    start = len(compile_records)
    after_first_step = None
    with config.scope(strict=True):
        for batch in batches:
            x = torch.randn(batch, 3, 10, 10, device=device)
            outputs = []
            for run, module in ((model, model), (compiled, twin)):
                module.zero_grad(set_to_none=True)
                out = run(x)
                out.square().mean().backward()
                outputs.append(out.detach())
            torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
            for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
            for (name, b), c in zip(model.named_buffers(), twin.buffers(), strict=True):
                torch.testing.assert_close(c, b, rtol=1e-5, atol=1e-6, msg=name)
            after_first_step = after_first_step or len(compile_records)
    assert_compiled_by_ember(start, backward=True)
    assert len(compile_records) == after_first_step  # one compile serves every batch
    assert all(
        "sym_" in r.wrapper_path.read_text() for r in compile_records[start:] if r.wrapper_path
    )
