"""Bias add after a matmul -> one `addmm` / `baddbmm` call.

`x @ w + b` on 2-D operands reaches ember as `mm` followed by `add`; BLAS adds the bias
while it writes the product (beta = 1), saving one pass over the output. The same holds
for batched `bmm` + bias. Fires only when the bias has the product's dtype and
broadcasts to the product's shape without growing it (a bias with more dimensions
would make the add produce a bigger tensor than addmm can).
"""

from __future__ import annotations

from typing import Any

import torch

from ember.graphpasses.fake import same_shape
from ember.graphpasses.matcher import Match
from ember.graphpasses.pattern import Pattern

aten = torch.ops.aten


def _check(match: Match) -> bool:
    a, b, bias = match.value("a"), match.value("b"), match.value("bias")
    product = match.anchor.meta.get("val")
    if not isinstance(product, torch.Tensor) or not a.dtype == b.dtype == bias.dtype:
        return False
    if not a.is_floating_point() or bias.dim() > a.dim():
        return False
    matmul = next(iter(n for n in match.nodes.values() if n is not match.anchor), None)
    matmul_value = matmul.meta.get("val") if matmul is not None else None
    return isinstance(matmul_value, torch.Tensor) and same_shape(matmul_value, product)


def _example(batched: bool) -> Any:
    def make() -> list[torch.Tensor]:
        lead = (2,) if batched else ()
        return [torch.randn(*lead, 3, 4), torch.randn(*lead, 4, 5), torch.randn(5)]

    return make


MATMUL_BIAS_PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        name="mm_bias_to_addmm",
        search=lambda a, b, bias: torch.mm(a, b) + bias,
        replace=lambda a, b, bias: aten.addmm.default(bias, a, b),
        inputs=("a", "b", "bias"),
        example_inputs=_example(batched=False),
        check=_check,
        description="mm + bias -> addmm",
        requires=frozenset({aten.mm.default}),
    ),
    Pattern(
        name="bmm_bias_to_baddbmm",
        search=lambda a, b, bias: torch.bmm(a, b) + bias,
        replace=lambda a, b, bias: aten.baddbmm.default(bias, a, b),
        inputs=("a", "b", "bias"),
        example_inputs=_example(batched=True),
        check=_check,
        description="bmm + bias -> baddbmm",
        requires=frozenset({aten.bmm.default}),
    ),
)
