"""Regression: attention gradients through ember match eager.

torch 2.15's core-ATen decomposition of `_scaled_dot_product_flash_attention_for_cpu`
produced gradients off by ~40x on CPU (seen while testing GPT-2 from a transformers
config). Ember keeps attention whole (an intentional extern), which this test pins.
Hand-written attention becomes SDPA before AOTAutograd (`rewrite_attention_pregrad`),
so its gradients go through the same kernels: pinned here too.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from helpers import check_training

from ember.runtime import backend
from ember.runtime.models import TransformerBlock
from ember.runtime.testing import no_eager_fallback


@pytest.mark.parametrize("variant", ["plain", "causal", "bool_mask"])
def test_sdpa_gradients_match_eager(variant: str) -> None:
    kwargs: dict[str, object] = {}
    if variant == "causal":
        kwargs["is_causal"] = True
    elif variant == "bool_mask":
        kwargs["attn_mask"] = torch.tril(torch.ones(16, 16, dtype=torch.bool))

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)  # type: ignore[arg-type]

    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))
    attention(q, k, v).square().sum().backward()
    expected = [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    with no_eager_fallback() as graphs:
        out = torch.compile(attention, backend="ember")(q, k, v)
        torch.testing.assert_close(out, attention(q, k, v))
        out.square().sum().backward()
    assert any(g.graph.startswith("backward") for g in graphs)
    for name, t, ref in zip("qkv", (q, k, v), expected, strict=True):
        torch.testing.assert_close(t.grad, ref, msg=f"grad of {name}")


def _record_graphs(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Record the ATen targets of every graph the backend hands to `compile_graph`."""
    seen: dict[str, list[str]] = {}
    real = backend.compile_graph

    def recording(gm: torch.fx.GraphModule, example_inputs: Any, *, name: str, **kw: Any) -> Any:
        targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
        seen[name] = targets
        return real(gm, example_inputs, name=name, **kw)

    monkeypatch.setattr(backend, "compile_graph", recording)
    return seen


def test_transformer_block_training_uses_sdpa_forward_and_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hand-written attention becomes SDPA before AOTAutograd: no softmax is left in
    either graph, and outputs and every gradient match eager."""
    seen = _record_graphs(monkeypatch)
    torch._dynamo.reset()
    check_training(TransformerBlock(32, 4, 64), [torch.randn(2, 16, 32)])
    assert set(seen) == {"forward", "backward"}
    for name, targets in seen.items():
        assert any("scaled_dot_product" in t for t in targets), (name, targets)
        assert not any("softmax" in t for t in targets), (name, targets)


@pytest.mark.parametrize("mask", ["none", "causal", "broadcast_learned"])
def test_hand_written_attention_gradients_match_eager(mask: str) -> None:
    """Every gradient through the rewritten attention (q, k, v and a float mask) on CPU."""

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> Any:
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask != "none":
            scores = scores + m
        return scores.softmax(dim=-1) @ v

    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.float64) for _ in range(3))
    if mask == "causal":
        m = torch.full((16, 16), float("-inf"), dtype=torch.float64).triu(1)
    else:
        m = torch.randn(2, 1, 16, 16, dtype=torch.float64)
    leaves = [t.requires_grad_() for t in (q, k, v, m)]
    attention(*leaves).square().sum().backward()
    expected = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    torch._dynamo.reset()
    with no_eager_fallback() as graphs:
        out = torch.compile(attention, backend="ember")(*leaves)
        torch.testing.assert_close(out, attention(*leaves))
        out.square().sum().backward()
    assert any(g.graph.startswith("backward") for g in graphs)
    for name, t, ref in zip("qkvm", leaves, expected, strict=True):
        if mask == "none" and name == "m":
            continue
        torch.testing.assert_close(t.grad, ref, msg=f"grad of {name}")
