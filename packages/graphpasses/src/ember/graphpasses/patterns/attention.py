"""Attention: softmax(q @ k^T * scale [+ mask]) @ v -> aten.scaled_dot_product_attention.

Hand-written attention reaches ember as two batched matmuls (each an expand/view/bmm
chain after decomposition) around a softmax, materialising the L x S score matrix. One
`scaled_dot_product_attention` call computes the same thing with ATen's fused kernels
(flash attention on GPUs) without storing the scores. The common spellings are covered:
scale by division (`/ math.sqrt(d)`) or multiplication, applied to the scores or to q
first, no scale at all, and an additive float mask before the softmax (either operand
order). Dropout on the attention weights is not matched: replacing it would change
which random numbers are drawn. Boolean masks are not matched either: `scores + mask`
with a bool mask adds 0/1, which is not what SDPA's boolean mask means.
"""

from __future__ import annotations

from typing import Any

import torch

from ember.graphpasses.matcher import Match
from ember.graphpasses.pattern import Pattern

aten = torch.ops.aten


def _qkv() -> list[torch.Tensor]:
    # Distinct sizes, none equal to 1, so that no view or expand becomes a no-op here
    # that would be real elsewhere. L=5 queries, S=6 keys, E=4, Ev=7.
    return [torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 7)]


def _qkv_mask() -> list[torch.Tensor]:
    return [*_qkv(), torch.randn(2, 3, 5, 6)]


def _check(match: Match) -> bool:
    q, k, v = match.value("q"), match.value("k"), match.value("v")
    if not q.is_floating_point() or not (q.dtype == k.dtype == v.dtype):
        return False
    if q.dim() < 3 or not (q.dim() == k.dim() == v.dim()):
        return False
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        return False
    if "mask" in match.inputs:
        mask = match.value("mask")
        if mask.dtype != q.dtype:
            return False
    return True


def _sdpa(q: Any, k: Any, v: Any, mask: Any, scale: float) -> Any:
    return aten.scaled_dot_product_attention.default(q, k, v, mask, 0.0, False, scale=scale)


def _scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return q @ k.transpose(-2, -1)


def _pattern(name: str, search: Any, replace: Any, masked: bool, scaled: bool) -> Pattern:
    return Pattern(
        name=name,
        search=search,
        replace=replace,
        inputs=("q", "k", "v", "mask") if masked else ("q", "k", "v"),
        example_inputs=_qkv_mask if masked else _qkv,
        scalars=("scale",) if scaled else (),
        check=_check,
        description="hand-written attention -> aten.scaled_dot_product_attention",
        requires=frozenset({aten.bmm.default, aten._softmax.default}),
    )


ATTENTION_PATTERNS: tuple[Pattern, ...] = (
    _pattern(
        "attention_div_mask",
        lambda q, k, v, m, s: ((_scores(q, k) / s) + m).softmax(-1) @ v,
        lambda q, k, v, m, s: _sdpa(q, k, v, m, 1.0 / s),
        masked=True,
        scaled=True,
    ),
    _pattern(
        "attention_mul_mask",
        lambda q, k, v, m, s: ((_scores(q, k) * s) + m).softmax(-1) @ v,
        lambda q, k, v, m, s: _sdpa(q, k, v, m, s),
        masked=True,
        scaled=True,
    ),
    _pattern(
        "attention_mask",
        lambda q, k, v, m: (_scores(q, k) + m).softmax(-1) @ v,
        lambda q, k, v, m: _sdpa(q, k, v, m, 1.0),
        masked=True,
        scaled=False,
    ),
    _pattern(
        "attention_div",
        lambda q, k, v, s: (_scores(q, k) / s).softmax(-1) @ v,
        lambda q, k, v, s: _sdpa(q, k, v, None, 1.0 / s),
        masked=False,
        scaled=True,
    ),
    _pattern(
        "attention_mul",
        lambda q, k, v, s: (_scores(q, k) * s).softmax(-1) @ v,
        lambda q, k, v, s: _sdpa(q, k, v, None, s),
        masked=False,
        scaled=True,
    ),
    _pattern(
        "attention_scaled_q",
        lambda q, k, v, s: _scores(q * s, k).softmax(-1) @ v,
        lambda q, k, v, s: _sdpa(q, k, v, None, s),
        masked=False,
        scaled=True,
    ),
    _pattern(
        "attention_unscaled",
        lambda q, k, v: _scores(q, k).softmax(-1) @ v,
        lambda q, k, v: _sdpa(q, k, v, None, 1.0),
        masked=False,
        scaled=False,
    ),
)
