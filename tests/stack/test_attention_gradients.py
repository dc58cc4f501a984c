"""Regression: attention gradients through ember match eager.

torch 2.15's core-ATen decomposition of `_scaled_dot_product_flash_attention_for_cpu`
produced gradients off by ~40x on CPU (seen while testing GPT-2 from a transformers
config). Ember keeps attention whole (an intentional extern), which this test pins.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


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
    out = torch.compile(attention, backend="ember")(q, k, v)
    torch.testing.assert_close(out, attention(q, k, v))
    out.square().sum().backward()
    for name, t, ref in zip("qkv", (q, k, v), expected, strict=True):
        torch.testing.assert_close(t.grad, ref, msg=f"grad of {name}")
